// Package join makes a cluster a member of the federation: its client
// certificate (CN = cluster id) by a CertificateSigningRequest in the
// broker's cluster, which Approve checks and signs with the members' CA and
// for which it publishes that CA; Join writes the key, the certificate and
// the CA into the member's Secret and, given the broker's URL, checks that
// the broker accepts it.
package join

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	ctrlclient "sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/fluidos-project/resource-broker/broker/client"
	"github.com/fluidos-project/resource-broker/broker/model"
	"github.com/fluidos-project/resource-broker/internal/certauthority"
	"github.com/fluidos-project/resource-broker/internal/certdir"
	"github.com/fluidos-project/resource-broker/internal/rbctl/member"
)

const (
	// SignerName is the signer of members' client certificates: rbctl
	// join approve, holding the broker's client CA. Kubernetes' own signers
	// ignore it.
	SignerName = "broker.fluidos.eu/member-client"
	// ClusterIDLabel names the member on its request and its Secret.
	ClusterIDLabel = "broker.fluidos.eu/cluster-id"
	// CAConfigMap publishes, in ca.crt, the CA that signs the members'
	// certificates and the broker's: public, unlike the broker's Secret
	// (its key). rbctl join approve writes it.
	CAConfigMap    = "rb-broker-ca"
	approvedReason = "RbctlJoinApprove"
)

// CSRName is the CertificateSigningRequest of a member, one per cluster id.
func CSRName(id string) string { return "rb-member-" + id }

// Options are what rbctl join is given.
type Options struct {
	// Member is the cluster that joins (its --context).
	Member          *member.Options
	ClusterID       string
	BrokerContext   string
	BrokerNamespace string
	// CADir, if set, holds the members' CA: Join approves and signs itself.
	CADir string
	// CAFile is the CA the member trusts for the broker, if not CADir's
	// nor the one published in the broker's cluster.
	CAFile    string
	Validity  time.Duration
	Timeout   time.Duration
	Overwrite bool
}

// Join gives the member its identity at the broker, reporting each step to out.
func Join(ctx context.Context, o Options, out io.Writer) error {
	if o.ClusterID == "" {
		return errors.New("--cluster-id is required: the member's id at the broker (its certificate's CN)")
	}
	if err := model.ValidateClusterID(o.ClusterID); err != nil {
		return fmt.Errorf("--cluster-id: %w", err)
	}
	if o.BrokerContext == "" {
		return errors.New("--broker-context is required: the kubeconfig context of the broker's cluster, where the request is approved")
	}
	memberContext := o.Member.Context()
	if memberContext == "" {
		return errors.New("--context is required: the kubeconfig context of the cluster that joins")
	}
	var ca *certauthority.CA
	if o.CADir != "" {
		var err error
		if ca, err = certauthority.LoadCA(o.CADir); err != nil {
			return fmt.Errorf("--ca-dir: %w", err)
		}
	}
	kc, err := o.Member.KubeClient()
	if err != nil {
		return err
	}
	brokerCfg, err := o.Member.RESTConfigFor(o.BrokerContext)
	if err != nil {
		return fmt.Errorf("--broker-context: %w", err)
	}
	broker, err := member.NewKubeClient(brokerCfg)
	if err != nil {
		return err
	}

	secretKey := ctrlclient.ObjectKey{Namespace: o.Member.AgentNamespace, Name: member.SecretName}
	var existing corev1.Secret
	switch err := kc.Get(ctx, secretKey, &existing); {
	case err == nil && !o.Overwrite:
		cn := "?"
		if c, err := ParseCertificate(existing.Data[certdir.CertFile]); err == nil {
			cn = c.Subject.CommonName
		}
		return fmt.Errorf("context %q already has Secret %s (cluster id %q): rbctl leave first, or --overwrite for a new key", memberContext, secretKey, cn)
	case err != nil && !apierrors.IsNotFound(err):
		return fmt.Errorf("reading the member's Secret: %w", err)
	}

	csrPEM, keyPEM, err := certauthority.NewClientCSR(o.ClusterID)
	if err != nil {
		return err
	}
	csr := &certificatesv1.CertificateSigningRequest{
		ObjectMeta: metav1.ObjectMeta{Name: CSRName(o.ClusterID), Labels: map[string]string{ClusterIDLabel: o.ClusterID}},
		Spec: certificatesv1.CertificateSigningRequestSpec{
			Request:           csrPEM,
			SignerName:        SignerName,
			ExpirationSeconds: ptr.To(int32(o.Validity / time.Second)),
			Usages:            []certificatesv1.KeyUsage{certificatesv1.UsageDigitalSignature, certificatesv1.UsageClientAuth},
		},
	}
	// One request per member: an earlier one (a join that timed out, or the
	// certificate being replaced) is withdrawn.
	if err := broker.Delete(ctx, &certificatesv1.CertificateSigningRequest{ObjectMeta: metav1.ObjectMeta{Name: csr.Name}}); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("withdrawing the earlier request %s: %w", csr.Name, err)
	}
	if err := broker.Create(ctx, csr); err != nil {
		return fmt.Errorf("creating CertificateSigningRequest %s in context %q: %w", csr.Name, o.BrokerContext, err)
	}
	fmt.Fprintf(out, "certificatesigningrequest/%s created in context %q (signer %s, CN=%s)\n", csr.Name, o.BrokerContext, SignerName, o.ClusterID)

	if ca != nil {
		if err := approveAndSign(ctx, broker, out, o.ClusterID, ca, o.Validity, o.BrokerNamespace); err != nil {
			return err
		}
	} else {
		fmt.Fprintf(out, "waiting up to %s for the broker's operator to run:\n  rbctl join approve %s --context %s --ca-dir <the members' CA>\n",
			o.Timeout, o.ClusterID, o.BrokerContext)
	}
	certPEM, err := waitForCertificate(ctx, broker, csr.Name, o.Timeout)
	if err != nil {
		return err
	}
	caPEM, caFrom, err := o.brokerCA(ctx, broker, ca)
	if err != nil {
		return err
	}
	leaf, err := verifyMemberCert(certPEM, caPEM, o.ClusterID)
	if err != nil {
		return err
	}

	if err := EnsureNamespace(ctx, kc, o.Member.AgentNamespace); err != nil {
		return err
	}
	secret := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: secretKey.Namespace, Name: secretKey.Name, Labels: map[string]string{ClusterIDLabel: o.ClusterID}},
		Type:       corev1.SecretTypeTLS,
		Data:       map[string][]byte{certdir.CertFile: certPEM, certdir.KeyFile: keyPEM, certdir.CAFile: caPEM},
	}
	if existing.Name != "" {
		// A Secret's type is immutable: one made by hand (Opaque) stays so.
		secret.ResourceVersion, secret.Type = existing.ResourceVersion, existing.Type
		err = kc.Update(ctx, secret)
	} else {
		err = kc.Create(ctx, secret)
	}
	if err != nil {
		return fmt.Errorf("writing Secret %s in context %q: %w", secretKey, memberContext, err)
	}
	fmt.Fprintf(out, "secret/%s written in namespace %s of context %q: tls.crt (CN=%s, serial %x, valid until %s), tls.key, ca.crt (%s)\n",
		member.SecretName, secretKey.Namespace, memberContext, o.ClusterID, leaf.SerialNumber, leaf.NotAfter.UTC().Format(time.RFC3339), caFrom)

	return o.check(ctx, kc, out)
}

// check asks the broker, with the member's new Secret, for its clusters:
// the broker accepts the certificate.
func (o *Options) check(ctx context.Context, kc ctrlclient.Client, out io.Writer) error {
	url := o.Member.BrokerURL
	if url == "" {
		fmt.Fprintf(out, "not checked with the broker (no --broker-url); the member's agent authenticates as %q with it\n", o.ClusterID)
		return nil
	}
	tlsCfg, err := o.Member.TLS(ctx, kc)
	if err != nil {
		return err
	}
	c, err := client.NewWithTLS(url, tlsCfg, client.WithUserAgent("rbctl"))
	if err != nil {
		return err
	}
	if _, err := c.Clusters(ctx); err != nil {
		return fmt.Errorf("the broker at %s refuses the new certificate: %w", url, err)
	}
	fmt.Fprintf(out, "the broker at %s accepts %q\n", url, o.ClusterID)
	return nil
}

// brokerCA is the CA the member trusts for the broker: that of --ca-dir or
// --broker-ca-file, or the one the approver published.
func (o *Options) brokerCA(ctx context.Context, broker ctrlclient.Client, ca *certauthority.CA) ([]byte, string, error) {
	switch {
	case ca != nil:
		return ca.CertPEM, filepath.Join(o.CADir, certauthority.CACertFile), nil
	case o.CAFile != "":
		data, err := os.ReadFile(o.CAFile)
		if err != nil {
			return nil, "", fmt.Errorf("--broker-ca-file: %w", err)
		}
		return data, o.CAFile, nil
	}
	var cm corev1.ConfigMap
	key := ctrlclient.ObjectKey{Namespace: o.BrokerNamespace, Name: CAConfigMap}
	if err := broker.Get(ctx, key, &cm); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, "", fmt.Errorf("no ConfigMap %s in context %q for the broker's CA (rbctl join approve publishes it; or pass --broker-ca-file): the request %s is signed, run join again once it is there", key, o.BrokerContext, CSRName(o.ClusterID))
		}
		return nil, "", fmt.Errorf("reading the broker's CA from ConfigMap %s in context %q: %w", key, o.BrokerContext, err)
	}
	if cm.Data[certdir.CAFile] == "" {
		return nil, "", fmt.Errorf("ConfigMap %s in context %q has no %s", key, o.BrokerContext, certdir.CAFile)
	}
	return []byte(cm.Data[certdir.CAFile]), fmt.Sprintf("from configmap %s of context %q", key, o.BrokerContext), nil
}

// EnsureNamespace creates the namespace name unless it exists.
func EnsureNamespace(ctx context.Context, kc ctrlclient.Client, name string) error {
	err := kc.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("creating namespace %s: %w", name, err)
	}
	return nil
}
