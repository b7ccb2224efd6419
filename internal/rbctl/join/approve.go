package join

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrlclient "sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	"github.com/fluidos-project/resource-broker/broker/model"
	"github.com/fluidos-project/resource-broker/internal/certauthority"
	"github.com/fluidos-project/resource-broker/internal/certdir"
	"github.com/fluidos-project/resource-broker/internal/rbctl/member"
)

// ApproveOptions are what rbctl join approve is given.
type ApproveOptions struct {
	// Member names the broker's cluster (its --context).
	Member    *member.Options
	ClusterID string
	// CADir holds the members' CA (ca.crt, ca.key).
	CADir           string
	BrokerNamespace string
	// Validity is the longest to sign for; a request's shorter
	// expirationSeconds wins.
	Validity time.Duration
}

// Approve approves and signs the request of the member o.ClusterID in the
// broker's cluster, and publishes the CA for the member.
func Approve(ctx context.Context, o ApproveOptions, out io.Writer) error {
	if err := model.ValidateClusterID(o.ClusterID); err != nil {
		return err
	}
	if o.CADir == "" {
		return errors.New("--ca-dir is required: the directory of the members' CA (ca.crt, ca.key), as rbctl certs writes it")
	}
	ca, err := certauthority.LoadCA(o.CADir)
	if err != nil {
		return fmt.Errorf("--ca-dir: %w", err)
	}
	kc, err := o.Member.KubeClient()
	if err != nil {
		return err
	}
	return approveAndSign(ctx, kc, out, o.ClusterID, ca, o.Validity, o.BrokerNamespace)
}

// approveAndSign approves a member's request, after checking it names the
// member and asks for client authentication only, signs it, and publishes
// the CA's certificate for the member.
func approveAndSign(ctx context.Context, kc ctrlclient.Client, out io.Writer, id string, ca *certauthority.CA, validity time.Duration, namespace string) error {
	var csr certificatesv1.CertificateSigningRequest
	if err := kc.Get(ctx, ctrlclient.ObjectKey{Name: CSRName(id)}, &csr); err != nil {
		if apierrors.IsNotFound(err) {
			return fmt.Errorf("no CertificateSigningRequest %s: has rbctl join --cluster-id %s been run against this cluster?", CSRName(id), id)
		}
		return err
	}
	if csr.Spec.SignerName != SignerName {
		return fmt.Errorf("CertificateSigningRequest %s names signer %q, not %q", csr.Name, csr.Spec.SignerName, SignerName)
	}
	for _, u := range csr.Spec.Usages {
		if u != certificatesv1.UsageClientAuth && u != certificatesv1.UsageDigitalSignature && u != certificatesv1.UsageKeyEncipherment {
			return fmt.Errorf("CertificateSigningRequest %s asks for usage %q: a member certificate is for client authentication only", csr.Name, u)
		}
	}
	req, err := certauthority.ParseCSR(csr.Spec.Request)
	if err != nil {
		return fmt.Errorf("CertificateSigningRequest %s: %w", csr.Name, err)
	}
	if req.Subject.CommonName != id {
		return fmt.Errorf("CertificateSigningRequest %s asks for CN=%q, not the member %q", csr.Name, req.Subject.CommonName, id)
	}
	for _, c := range csr.Status.Conditions {
		if (c.Type == certificatesv1.CertificateDenied || c.Type == certificatesv1.CertificateFailed) && c.Status == corev1.ConditionTrue {
			return fmt.Errorf("CertificateSigningRequest %s is %s: %s", csr.Name, c.Type, c.Message)
		}
	}
	if len(csr.Status.Certificate) > 0 {
		fmt.Fprintf(out, "certificatesigningrequest/%s already signed\n", csr.Name)
		return publishCA(ctx, kc, out, namespace, ca)
	}
	if !IsApproved(&csr) {
		csr.Status.Conditions = append(csr.Status.Conditions, certificatesv1.CertificateSigningRequestCondition{
			Type: certificatesv1.CertificateApproved, Status: corev1.ConditionTrue, Reason: approvedReason,
			Message: "rbctl join approve: member " + id, LastUpdateTime: metav1.Now(),
		})
		if err := kc.SubResource("approval").Update(ctx, &csr); err != nil {
			return fmt.Errorf("approving CertificateSigningRequest %s: %w", csr.Name, err)
		}
		fmt.Fprintf(out, "certificatesigningrequest/%s approved\n", csr.Name)
	}
	if s := csr.Spec.ExpirationSeconds; s != nil && time.Duration(*s)*time.Second < validity {
		validity = time.Duration(*s) * time.Second
	}
	certPEM, err := ca.SignClientCSR(csr.Spec.Request, validity)
	if err != nil {
		return err
	}
	csr.Status.Certificate = certPEM
	if err := kc.Status().Update(ctx, &csr); err != nil {
		return fmt.Errorf("signing CertificateSigningRequest %s: %w", csr.Name, err)
	}
	fmt.Fprintf(out, "certificatesigningrequest/%s signed by %q for %s\n", csr.Name, ca.Cert.Subject.CommonName, validity)
	return publishCA(ctx, kc, out, namespace, ca)
}

// publishCA writes the CA's certificate into the ConfigMap members read it
// from, if it is not there already.
func publishCA(ctx context.Context, kc ctrlclient.Client, out io.Writer, namespace string, ca *certauthority.CA) error {
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: CAConfigMap}}
	res, err := controllerutil.CreateOrUpdate(ctx, kc, cm, func() error {
		cm.Data = map[string]string{certdir.CAFile: string(ca.CertPEM)}
		return nil
	})
	if err != nil {
		return fmt.Errorf("publishing the CA in ConfigMap %s/%s: %w", namespace, CAConfigMap, err)
	}
	if res != controllerutil.OperationResultNone {
		fmt.Fprintf(out, "configmap/%s %s in namespace %s (ca.crt: %q)\n", CAConfigMap, res, namespace, ca.Cert.Subject.CommonName)
	}
	return nil
}

// IsApproved says whether the request has been approved (by rbctl join
// approve or kubectl certificate approve).
func IsApproved(csr *certificatesv1.CertificateSigningRequest) bool {
	for _, c := range csr.Status.Conditions {
		if c.Type == certificatesv1.CertificateApproved && c.Status == corev1.ConditionTrue {
			return true
		}
	}
	return false
}
