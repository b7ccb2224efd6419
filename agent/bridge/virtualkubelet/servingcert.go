package virtualkubelet

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/events"

	rbv1 "github.com/fluidos-project/resource-broker/api/v1alpha1"
	"github.com/fluidos-project/resource-broker/internal/backoff"
)

// Where the kubelet endpoint's serving certificate comes from
// (Config.KubeletServingCert, rb-agent --kubelet-serving-cert).
const (
	// ServingCertCSR: a CertificateSigningRequest to the cluster's
	// kubernetes.io/kubelet-serving signer, which the agent approves itself,
	// as a kubelet's serving certificate (the default). Until it is issued,
	// and if it is not, the endpoint serves a self-signed one.
	ServingCertCSR = "csr"
	// ServingCertSelfSigned: a self-signed certificate only (API servers that
	// do not verify kubelets, --kubelet-certificate-authority unset).
	ServingCertSelfSigned = "self-signed"
)

// Reasons of the Events about the serving certificate's CSR.
const (
	ReasonServingCertNotIssued = "KubeletServingCertNotIssued"
	ReasonServingCertIssued    = "KubeletServingCertIssued"
)

// servingCertRenewal is the fraction of a certificate's life after which a
// new one is requested (the kubelet's certificate manager renews at 70-90%).
const servingCertRenewal = 0.7

// servingCert is the kubelet endpoint's serving certificate, served by the
// listener of every virtual node of the agent (each on its own port of the
// same address). The API server verifies a kubelet's certificate (with
// --kubelet-certificate-authority) against the node address it dials, the IP
// SAN, never against the CN or the node's name, with no SNI: so one
// certificate, for the agent's IP, serves them all. It is
// named after the agent, system:node:rb-<cluster>-vk, because the
// kubelet-serving signer only signs CNs "system:node:*" of organization
// system:nodes.
//
// TLS reads it per handshake (getCertificate), so a renewed certificate is
// served at once, without restarting the listener.
type servingCert struct {
	client   kubernetes.Interface
	recorder events.EventRecorder // may be nil
	log      logr.Logger
	name     string // rb-<cluster>-vk: CN system:node:<name>, DNS SAN
	address  string // the node address, an IP SAN (a DNS SAN if it is a name)
	timeout  time.Duration
	// poll is how often a CSR is read until it is issued or timeout has
	// passed, slowPoll how often after that.
	poll, slowPoll time.Duration

	cur        atomic.Pointer[tls.Certificate]
	selfSigned atomic.Bool
}

func newServingCert(client kubernetes.Interface, recorder events.EventRecorder, log logr.Logger, clusterID, address string, timeout time.Duration) (*servingCert, error) {
	s := &servingCert{client: client, recorder: recorder, log: log, name: NodePrefix + clusterID + "-vk", address: address,
		timeout: timeout, poll: time.Second, slowPoll: 30 * time.Second}
	if err := s.useSelfSigned(); err != nil {
		return nil, err
	}
	return s, nil
}

// getCertificate is tls.Config.GetCertificate.
func (s *servingCert) getCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	return s.cur.Load(), nil
}

func (s *servingCert) useSelfSigned() error {
	cert, err := selfSignedCert(s.address)
	if err != nil {
		return err
	}
	s.cur.Store(&cert)
	s.selfSigned.Store(true)
	return nil
}

// run keeps a certificate issued by the kubelet-serving signer until ctx
// ends: one now, and a new one after servingCertRenewal of its life. A
// request that fails is made again after a back-off (a minute, doubling up
// to 30 minutes); meanwhile the current certificate is served.
func (s *servingCert) run(ctx context.Context) {
	first := backoff.Exponential(time.Minute, 30*time.Minute)
	retry := first
	for ctx.Err() == nil {
		cert, err := s.request(ctx)
		var next time.Duration
		switch {
		case ctx.Err() != nil:
			return
		case err != nil:
			next = retry.Step()
			s.log.Error(err, "kubelet endpoint: no serving certificate from the kubelet-serving signer, retrying", "in", next)
		default:
			retry = first
			s.cur.Store(cert)
			s.selfSigned.Store(false)
			renew := renewalTime(cert.Leaf)
			s.log.Info("kubelet endpoint: serving the certificate issued by the kubelet-serving signer",
				"subject", cert.Leaf.Subject.String(), "notAfter", cert.Leaf.NotAfter, "renewAt", renew)
			next = max(time.Until(renew), s.poll)
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(next):
		}
	}
}

// renewalTime is when a certificate is renewed: servingCertRenewal of its life.
func renewalTime(leaf *x509.Certificate) time.Time {
	life := leaf.NotAfter.Sub(leaf.NotBefore)
	return leaf.NotBefore.Add(time.Duration(float64(life) * servingCertRenewal))
}

// request creates a CSR for a new key, approves it and waits for the signer.
func (s *servingCert) request(ctx context.Context) (*tls.Certificate, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	tmpl := &x509.CertificateRequest{
		Subject:  pkix.Name{CommonName: "system:node:" + s.name, Organization: []string{"system:nodes"}},
		DNSNames: []string{s.name},
	}
	if ip := net.ParseIP(s.address); ip != nil {
		tmpl.IPAddresses = []net.IP{ip}
	} else if s.address != "" {
		tmpl.DNSNames = append(tmpl.DNSNames, s.address)
	}
	der, err := x509.CreateCertificateRequest(rand.Reader, tmpl, key)
	if err != nil {
		return nil, err
	}
	csr, err := s.client.CertificatesV1().CertificateSigningRequests().Create(ctx, &certificatesv1.CertificateSigningRequest{
		ObjectMeta: metav1.ObjectMeta{GenerateName: s.name + "-", Labels: map[string]string{rbv1.ManagedByLabel: rbv1.ManagedByValue}},
		Spec: certificatesv1.CertificateSigningRequestSpec{
			Request:    pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der}),
			SignerName: certificatesv1.KubeletServingSignerName,
			// An ECDSA key: no key encipherment (the signer requires exactly
			// these two usages, or these and key encipherment for RSA).
			Usages: []certificatesv1.KeyUsage{certificatesv1.UsageDigitalSignature, certificatesv1.UsageServerAuth},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		return nil, fmt.Errorf("creating a CertificateSigningRequest: %w", err)
	}
	log := s.log.WithValues("csr", csr.Name)
	log.V(1).Info("kubelet endpoint: serving certificate requested", "signer", csr.Spec.SignerName, "subject", tmpl.Subject.String(), "address", s.address)
	// No node asks for this certificate, so no kubelet-serving approver (one
	// that checks the requester is the node) would approve it: the agent
	// approves its own request, as Liqo's virtual kubelet does. A refusal
	// (no approve permission on the signer) is not fatal: someone else may
	// approve it.
	csr.Status.Conditions = append(csr.Status.Conditions, certificatesv1.CertificateSigningRequestCondition{
		Type: certificatesv1.CertificateApproved, Status: corev1.ConditionTrue, Reason: "RBAgentApproved",
		Message: "rb-agent approved the serving certificate of its virtual nodes' kubelet endpoint", LastUpdateTime: metav1.Now(),
	})
	if _, err := s.client.CertificatesV1().CertificateSigningRequests().UpdateApproval(ctx, csr.Name, csr, metav1.UpdateOptions{}); err != nil {
		log.Error(err, "kubelet endpoint: cannot approve the serving certificate's CSR; it waits for someone else's approval (the agent needs approve on signers kubernetes.io/kubelet-serving)")
	}
	certPEM, err := s.waitIssued(ctx, log, csr)
	if err != nil {
		return nil, err
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, err
	}
	cert, err := tls.X509KeyPair(certPEM, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}))
	if err != nil {
		return nil, fmt.Errorf("the certificate issued for CSR %s: %w", csr.Name, err)
	}
	return &cert, nil
}

// waitIssued reads the CSR until the signer writes status.certificate, it is
// denied or failed, or it is gone. Past s.timeout it says so (log and a
// Warning Event on the CSR) and goes on waiting, more slowly: a signer may
// come up later, and creating a new request each time would leave a trail of
// pending ones in a cluster that has no signer.
func (s *servingCert) waitIssued(ctx context.Context, log logr.Logger, csr *certificatesv1.CertificateSigningRequest) ([]byte, error) {
	deadline := time.Now().Add(s.timeout)
	period := s.poll
	late := false
	for {
		cur, err := s.client.CertificatesV1().CertificateSigningRequests().Get(ctx, csr.Name, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
			return nil, fmt.Errorf("CSR %s was deleted before it was issued", csr.Name)
		case err != nil:
			log.V(1).Info("kubelet endpoint: reading the serving certificate's CSR", "error", err.Error())
		case len(cur.Status.Certificate) > 0:
			if late {
				s.event(cur, corev1.EventTypeNormal, ReasonServingCertIssued, "issued after all; the kubelet endpoint serves it")
			}
			return cur.Status.Certificate, nil
		default:
			for _, c := range cur.Status.Conditions {
				if (c.Type == certificatesv1.CertificateDenied || c.Type == certificatesv1.CertificateFailed) && c.Status == corev1.ConditionTrue {
					return nil, fmt.Errorf("CSR %s %s: %s: %s", csr.Name, c.Type, c.Reason, c.Message)
				}
			}
		}
		if !late && time.Now().After(deadline) {
			late, period = true, s.slowPoll
			meanwhile := "keeping the current certificate while it is valid"
			if s.selfSigned.Load() {
				meanwhile = "serving a self-signed certificate meanwhile, which an API server run with --kubelet-certificate-authority rejects"
			}
			msg := fmt.Sprintf("the kubelet-serving signer did not issue the virtual kubelet's serving certificate within %s (is kube-controller-manager's csrsigning controller running, with --cluster-signing-cert-file or --cluster-signing-kubelet-serving-cert-file?); %s", s.timeout, meanwhile)
			log.Info("kubelet endpoint: "+msg, "level", "warning")
			s.event(csr, corev1.EventTypeWarning, ReasonServingCertNotIssued, msg)
		}
		if leaf := s.cur.Load().Leaf; !s.selfSigned.Load() && leaf != nil && time.Now().After(leaf.NotAfter) {
			log.Info("kubelet endpoint: the serving certificate expired before a new one was issued: serving a self-signed one", "notAfter", leaf.NotAfter)
			if err := s.useSelfSigned(); err != nil {
				return nil, err
			}
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(period):
		}
	}
}

func (s *servingCert) event(csr *certificatesv1.CertificateSigningRequest, eventType, reason, msg string) {
	if s.recorder != nil {
		s.recorder.Eventf(csr, nil, eventType, reason, "Certify", "%s", msg)
	}
}

// selfSignedCert is the endpoint's certificate when none is issued (the API
// server does not verify kubelet serving certificates unless told a CA to).
func selfSignedCert(address string) (tls.Certificate, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, err
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	if err != nil {
		return tls.Certificate{}, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: "rb-agent virtual kubelet"},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(5 * 365 * 24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		DNSNames:     []string{"localhost"},
	}
	if ip := net.ParseIP(address); ip != nil {
		tmpl.IPAddresses = []net.IP{ip}
	} else if address != "" {
		tmpl.DNSNames = append(tmpl.DNSNames, address)
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return tls.Certificate{}, err
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		return tls.Certificate{}, err
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf}, nil
}
