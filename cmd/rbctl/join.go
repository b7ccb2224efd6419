package main

import (
	"context"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/spf13/cobra"
	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"
	ctrlclient "sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	"github.com/fluidos-project/resource-broker/broker/client"
	"github.com/fluidos-project/resource-broker/broker/model"
	"github.com/fluidos-project/resource-broker/internal/certdir"
	"github.com/fluidos-project/resource-broker/internal/devcerts"
)

const (
	// memberSignerName is the signer of members' client certificates: rbctl
	// join approve, holding the broker's client CA. Kubernetes' own signers
	// ignore it.
	memberSignerName = "broker.fluidos.eu/member-client"
	clusterIDLabel   = "broker.fluidos.eu/cluster-id"
	// brokerCAConfigMap publishes, in ca.crt, the CA that signs the members'
	// certificates and the broker's: public, unlike the broker's Secret
	// (its key). rbctl join approve writes it.
	brokerCAConfigMap = "rb-broker-ca"
	approvedReason    = "RbctlJoinApprove"
)

// csrName is the CertificateSigningRequest of a member, one per cluster id.
func csrName(id string) string { return "rb-member-" + id }

type joinOptions struct {
	g               *globalOptions
	clusterID       string
	brokerContext   string
	brokerNamespace string
	caDir           string
	caFile          string
	validity        time.Duration
	timeout         time.Duration
	overwrite       bool
}

func newJoinCommand(g *globalOptions) *cobra.Command {
	o := &joinOptions{g: g}
	cmd := &cobra.Command{
		Use:   "join",
		Short: "Make a cluster a member: its client certificate, by a CSR the broker's side approves",
		Long: `join gives the member cluster of --context its identity at the broker: a
client certificate with CN = --cluster-id, signed by the CA the broker trusts
for members, in the member's Secret resource-broker/rb-agent-tls, which its
agent mounts (manifests/agent).

The key is made by rbctl and goes only into the member's Secret. Its
certificate signing request goes to the broker's cluster (--broker-context)
as a CertificateSigningRequest rb-member-<cluster id> with signer
` + memberSignerName + `, for the operator of the broker to approve and
sign with the CA: rbctl join approve. With --ca-dir (the CA directory of
rbctl certs) join approves and signs the request itself: one command for an
operator of both clusters.

The CA the member trusts for the broker (ca.crt of its Secret) is that of
--ca-dir, or --broker-ca-file, or else ca.crt of the ConfigMap
resource-broker/rb-broker-ca in the broker's cluster, which rbctl join
approve publishes.`,
		Example: `  # An operator of both clusters, holding the CA:
  rbctl join --context paris --cluster-id paris --broker-context rome --ca-dir rb-install/certs/ca

  # The member's operator asks; the broker's operator approves:
  rbctl join --context paris --cluster-id paris --broker-context rome
  rbctl join approve paris --context rome --ca-dir rb-install/certs/ca`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return o.run(cmd.Context(), cmd.OutOrStdout())
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.clusterID, "cluster-id", "", "the member's cluster id: its certificate's CN (a DNS-1123 label)")
	f.StringVar(&o.brokerContext, "broker-context", "", "kubeconfig context of the broker's cluster, where the request is approved")
	f.StringVar(&o.brokerNamespace, "broker-namespace", defaultAgentNamespace, "the broker's namespace, of its ConfigMap "+brokerCAConfigMap)
	f.StringVar(&o.caDir, "ca-dir", "", "directory with the members' CA (ca.crt, ca.key, as rbctl certs writes it): approve and sign at once")
	f.StringVar(&o.caFile, "broker-ca-file", "", "PEM file of the CA the member trusts for the broker (default: ca.crt of ConfigMap "+brokerCAConfigMap+")")
	f.DurationVar(&o.validity, "duration", 365*24*time.Hour, "how long the certificate is valid")
	f.DurationVar(&o.timeout, "timeout", 10*time.Minute, "how long to wait for the request to be approved and signed")
	f.BoolVar(&o.overwrite, "overwrite", false, "replace the member's Secret if it has one (a new key and certificate)")
	cmd.AddCommand(newJoinApproveCommand(g))
	return cmd
}

func (o *joinOptions) run(ctx context.Context, out io.Writer) error {
	if o.clusterID == "" {
		return errors.New("--cluster-id is required: the member's id at the broker (its certificate's CN)")
	}
	if err := model.ValidateClusterID(o.clusterID); err != nil {
		return fmt.Errorf("--cluster-id: %w", err)
	}
	if o.brokerContext == "" {
		return errors.New("--broker-context is required: the kubeconfig context of the broker's cluster, where the request is approved")
	}
	if *o.g.kube.Context == "" {
		return errors.New("--context is required: the kubeconfig context of the cluster that joins")
	}
	var ca *devcerts.CA
	if o.caDir != "" {
		var err error
		if ca, err = devcerts.LoadCA(o.caDir); err != nil {
			return fmt.Errorf("--ca-dir: %w", err)
		}
	}
	member, err := o.g.kubeClient()
	if err != nil {
		return err
	}
	brokerCfg, err := o.g.restConfigFor(o.brokerContext)
	if err != nil {
		return fmt.Errorf("--broker-context: %w", err)
	}
	broker, err := newKubeClient(brokerCfg)
	if err != nil {
		return err
	}

	secretKey := ctrlclient.ObjectKey{Namespace: o.g.agentNamespace, Name: agentSecretName}
	var existing corev1.Secret
	switch err := member.Get(ctx, secretKey, &existing); {
	case err == nil && !o.overwrite:
		cn := "?"
		if c, err := leafOf(existing.Data[certdir.CertFile]); err == nil {
			cn = c.Subject.CommonName
		}
		return fmt.Errorf("context %q already has Secret %s (cluster id %q): rbctl leave first, or --overwrite for a new key", *o.g.kube.Context, secretKey, cn)
	case err != nil && !apierrors.IsNotFound(err):
		return fmt.Errorf("reading the member's Secret: %w", err)
	}

	csrPEM, keyPEM, err := devcerts.NewClientCSR(o.clusterID)
	if err != nil {
		return err
	}
	csr := &certificatesv1.CertificateSigningRequest{
		ObjectMeta: metav1.ObjectMeta{Name: csrName(o.clusterID), Labels: map[string]string{clusterIDLabel: o.clusterID}},
		Spec: certificatesv1.CertificateSigningRequestSpec{
			Request:           csrPEM,
			SignerName:        memberSignerName,
			ExpirationSeconds: ptr.To(int32(o.validity / time.Second)),
			Usages:            []certificatesv1.KeyUsage{certificatesv1.UsageDigitalSignature, certificatesv1.UsageClientAuth},
		},
	}
	// One request per member: an earlier one (a join that timed out, or the
	// certificate being replaced) is withdrawn.
	if err := broker.Delete(ctx, &certificatesv1.CertificateSigningRequest{ObjectMeta: metav1.ObjectMeta{Name: csr.Name}}); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("withdrawing the earlier request %s: %w", csr.Name, err)
	}
	if err := broker.Create(ctx, csr); err != nil {
		return fmt.Errorf("creating CertificateSigningRequest %s in context %q: %w", csr.Name, o.brokerContext, err)
	}
	fmt.Fprintf(out, "certificatesigningrequest/%s created in context %q (signer %s, CN=%s)\n", csr.Name, o.brokerContext, memberSignerName, o.clusterID)

	if ca != nil {
		if err := approveAndSign(ctx, broker, out, o.clusterID, ca, o.validity, o.brokerNamespace); err != nil {
			return err
		}
	} else {
		fmt.Fprintf(out, "waiting up to %s for the broker's operator to run:\n  rbctl join approve %s --context %s --ca-dir <the members' CA>\n",
			o.timeout, o.clusterID, o.brokerContext)
	}
	certPEM, err := waitForCertificate(ctx, broker, csr.Name, o.timeout)
	if err != nil {
		return err
	}
	caPEM, caFrom, err := o.brokerCA(ctx, broker, ca)
	if err != nil {
		return err
	}
	leaf, err := verifyMemberCert(certPEM, caPEM, o.clusterID)
	if err != nil {
		return err
	}

	if err := ensureNamespace(ctx, member, o.g.agentNamespace); err != nil {
		return err
	}
	secret := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: secretKey.Namespace, Name: secretKey.Name, Labels: map[string]string{clusterIDLabel: o.clusterID}},
		Type:       corev1.SecretTypeTLS,
		Data:       map[string][]byte{certdir.CertFile: certPEM, certdir.KeyFile: keyPEM, certdir.CAFile: caPEM},
	}
	if existing.Name != "" {
		// A Secret's type is immutable: one made by hand (Opaque) stays so.
		secret.ResourceVersion, secret.Type = existing.ResourceVersion, existing.Type
		err = member.Update(ctx, secret)
	} else {
		err = member.Create(ctx, secret)
	}
	if err != nil {
		return fmt.Errorf("writing Secret %s in context %q: %w", secretKey, *o.g.kube.Context, err)
	}
	fmt.Fprintf(out, "secret/%s written in namespace %s of context %q: tls.crt (CN=%s, serial %x, valid until %s), tls.key, ca.crt (%s)\n",
		agentSecretName, secretKey.Namespace, *o.g.kube.Context, o.clusterID, leaf.SerialNumber, leaf.NotAfter.UTC().Format(time.RFC3339), caFrom)

	if o.g.brokerURL == "" {
		fmt.Fprintf(out, "not checked with the broker (no --broker-url); the member's agent authenticates as %q with it\n", o.clusterID)
		return nil
	}
	tlsCfg, err := o.g.memberTLS(ctx, member)
	if err != nil {
		return err
	}
	c, err := client.NewWithTLS(o.g.brokerURL, tlsCfg, client.WithUserAgent("rbctl"))
	if err != nil {
		return err
	}
	if _, err := c.Clusters(ctx); err != nil {
		return fmt.Errorf("the broker at %s refuses the new certificate: %w", o.g.brokerURL, err)
	}
	fmt.Fprintf(out, "the broker at %s accepts %q\n", o.g.brokerURL, o.clusterID)
	return nil
}

// brokerCA is the CA the member trusts for the broker: that of --ca-dir or
// --broker-ca-file, or the one the approver published.
func (o *joinOptions) brokerCA(ctx context.Context, broker ctrlclient.Client, ca *devcerts.CA) ([]byte, string, error) {
	switch {
	case ca != nil:
		return ca.CertPEM, filepath.Join(o.caDir, devcerts.CACertFile), nil
	case o.caFile != "":
		data, err := os.ReadFile(o.caFile)
		if err != nil {
			return nil, "", fmt.Errorf("--broker-ca-file: %w", err)
		}
		return data, o.caFile, nil
	}
	var cm corev1.ConfigMap
	key := ctrlclient.ObjectKey{Namespace: o.brokerNamespace, Name: brokerCAConfigMap}
	if err := broker.Get(ctx, key, &cm); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, "", fmt.Errorf("no ConfigMap %s in context %q for the broker's CA (rbctl join approve publishes it; or pass --broker-ca-file): the request %s is signed, run join again once it is there", key, o.brokerContext, csrName(o.clusterID))
		}
		return nil, "", fmt.Errorf("reading the broker's CA from ConfigMap %s in context %q: %w", key, o.brokerContext, err)
	}
	if cm.Data[certdir.CAFile] == "" {
		return nil, "", fmt.Errorf("ConfigMap %s in context %q has no %s", key, o.brokerContext, certdir.CAFile)
	}
	return []byte(cm.Data[certdir.CAFile]), fmt.Sprintf("from configmap %s of context %q", key, o.brokerContext), nil
}

func newJoinApproveCommand(g *globalOptions) *cobra.Command {
	var (
		caDir, namespace string
		validity         time.Duration
	)
	cmd := &cobra.Command{
		Use:   "approve CLUSTER_ID",
		Short: "Approve and sign a member's join request, in the broker's cluster",
		Long: `approve approves the CertificateSigningRequest rb-member-<CLUSTER_ID> of the
cluster of --context (the broker's) and signs it with the members' CA of
--ca-dir, after checking that it asks for a client certificate with
CN = CLUSTER_ID and nothing else. A request approved with kubectl
certificate approve is signed the same way. It publishes the CA's
certificate (never its key) in the ConfigMap resource-broker/rb-broker-ca,
where the member's rbctl join reads it.`,
		Example: `  rbctl join approve paris --context rome --ca-dir rb-install/certs/ca`,
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := model.ValidateClusterID(args[0]); err != nil {
				return err
			}
			if caDir == "" {
				return errors.New("--ca-dir is required: the directory of the members' CA (ca.crt, ca.key), as rbctl certs writes it")
			}
			ca, err := devcerts.LoadCA(caDir)
			if err != nil {
				return fmt.Errorf("--ca-dir: %w", err)
			}
			kc, err := g.kubeClient()
			if err != nil {
				return err
			}
			return approveAndSign(cmd.Context(), kc, cmd.OutOrStdout(), args[0], ca, validity, namespace)
		},
	}
	cmd.Flags().StringVar(&caDir, "ca-dir", "", "directory with the members' CA (ca.crt, ca.key)")
	cmd.Flags().StringVar(&namespace, "broker-namespace", defaultAgentNamespace, "the broker's namespace, where the CA is published (ConfigMap "+brokerCAConfigMap+")")
	cmd.Flags().DurationVar(&validity, "duration", 365*24*time.Hour, "the longest validity to sign for (the request's expirationSeconds, if shorter, wins)")
	return cmd
}

// approveAndSign approves a member's request, after checking it names the
// member and asks for client authentication only, signs it, and publishes
// the CA's certificate for the member.
func approveAndSign(ctx context.Context, kc ctrlclient.Client, out io.Writer, id string, ca *devcerts.CA, validity time.Duration, namespace string) error {
	var csr certificatesv1.CertificateSigningRequest
	if err := kc.Get(ctx, ctrlclient.ObjectKey{Name: csrName(id)}, &csr); err != nil {
		if apierrors.IsNotFound(err) {
			return fmt.Errorf("no CertificateSigningRequest %s: has rbctl join --cluster-id %s been run against this cluster?", csrName(id), id)
		}
		return err
	}
	if csr.Spec.SignerName != memberSignerName {
		return fmt.Errorf("CertificateSigningRequest %s names signer %q, not %q", csr.Name, csr.Spec.SignerName, memberSignerName)
	}
	for _, u := range csr.Spec.Usages {
		if u != certificatesv1.UsageClientAuth && u != certificatesv1.UsageDigitalSignature && u != certificatesv1.UsageKeyEncipherment {
			return fmt.Errorf("CertificateSigningRequest %s asks for usage %q: a member certificate is for client authentication only", csr.Name, u)
		}
	}
	req, err := parseCSR(csr.Spec.Request)
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
	if !isApproved(&csr) {
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
func publishCA(ctx context.Context, kc ctrlclient.Client, out io.Writer, namespace string, ca *devcerts.CA) error {
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: brokerCAConfigMap}}
	res, err := controllerutil.CreateOrUpdate(ctx, kc, cm, func() error {
		cm.Data = map[string]string{certdir.CAFile: string(ca.CertPEM)}
		return nil
	})
	if err != nil {
		return fmt.Errorf("publishing the CA in ConfigMap %s/%s: %w", namespace, brokerCAConfigMap, err)
	}
	if res != controllerutil.OperationResultNone {
		fmt.Fprintf(out, "configmap/%s %s in namespace %s (ca.crt: %q)\n", brokerCAConfigMap, res, namespace, ca.Cert.Subject.CommonName)
	}
	return nil
}

func isApproved(csr *certificatesv1.CertificateSigningRequest) bool {
	for _, c := range csr.Status.Conditions {
		if c.Type == certificatesv1.CertificateApproved && c.Status == corev1.ConditionTrue {
			return true
		}
	}
	return false
}

// waitForCertificate waits for the request to be signed, denied or failed.
func waitForCertificate(ctx context.Context, kc ctrlclient.Client, name string, timeout time.Duration) ([]byte, error) {
	var cert []byte
	err := wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		var csr certificatesv1.CertificateSigningRequest
		if err := kc.Get(ctx, ctrlclient.ObjectKey{Name: name}, &csr); err != nil {
			return false, fmt.Errorf("reading CertificateSigningRequest %s: %w", name, err)
		}
		for _, c := range csr.Status.Conditions {
			if (c.Type == certificatesv1.CertificateDenied || c.Type == certificatesv1.CertificateFailed) && c.Status == corev1.ConditionTrue {
				return false, fmt.Errorf("CertificateSigningRequest %s %s: %s %s", name, c.Type, c.Reason, c.Message)
			}
		}
		cert = csr.Status.Certificate
		return len(cert) > 0, nil
	})
	if wait.Interrupted(err) {
		return nil, fmt.Errorf("CertificateSigningRequest %s not signed within %s: it stays for rbctl join approve; run join again to wait again", name, timeout)
	}
	return cert, err
}

// verifyMemberCert checks that the signed certificate names the member and
// is a client certificate of the CA the member will trust for the broker.
func verifyMemberCert(certPEM, caPEM []byte, id string) (*x509.Certificate, error) {
	leaf, err := leafOf(certPEM)
	if err != nil {
		return nil, fmt.Errorf("the signed certificate: %w", err)
	}
	if leaf.Subject.CommonName != id {
		return nil, fmt.Errorf("the signed certificate names CN=%q, not %q", leaf.Subject.CommonName, id)
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(caPEM) {
		return nil, errors.New("the broker's ca.crt holds no PEM certificate")
	}
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: roots, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
		return nil, fmt.Errorf("the signed certificate is not a client certificate of the broker's CA: %w", err)
	}
	return leaf, nil
}

func leafOf(certPEM []byte) (*x509.Certificate, error) {
	block, _ := pem.Decode(certPEM)
	if block == nil || block.Type != "CERTIFICATE" {
		return nil, errors.New("no PEM CERTIFICATE block")
	}
	return x509.ParseCertificate(block.Bytes)
}

func parseCSR(csrPEM []byte) (*x509.CertificateRequest, error) {
	block, _ := pem.Decode(csrPEM)
	if block == nil || block.Type != "CERTIFICATE REQUEST" {
		return nil, errors.New("no PEM CERTIFICATE REQUEST block")
	}
	req, err := x509.ParseCertificateRequest(block.Bytes)
	if err != nil {
		return nil, err
	}
	return req, req.CheckSignature()
}

func ensureNamespace(ctx context.Context, kc ctrlclient.Client, name string) error {
	err := kc.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("creating namespace %s: %w", name, err)
	}
	return nil
}
