package bridgetest

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"k8s.io/client-go/informers"
	"k8s.io/kubernetes/pkg/controller/certificates/signer"
)

// SigningCA is the CA of a cluster's kubernetes.io/kubelet-serving signer:
// what kube-controller-manager signs kubelet serving certificates with
// (--cluster-signing-kubelet-serving-cert-file and -key-file, or
// --cluster-signing-cert-file and -key-file), and what the API server
// verifies them with (--kubelet-certificate-authority, see
// Options.KubeletCA).
type SigningCA struct {
	CertFile, KeyFile string
	CertPEM           []byte
	Pool              *x509.CertPool
}

// NewSigningCA makes a CA in the test's temporary directory.
func NewSigningCA(t testing.TB) *SigningCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "bridgetest kubelet-serving signer"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	require.NoError(t, err)
	cert, err := x509.ParseCertificate(der)
	require.NoError(t, err)
	keyDER, err := x509.MarshalECPrivateKey(key)
	require.NoError(t, err)
	dir := t.TempDir()
	ca := &SigningCA{CertFile: filepath.Join(dir, "signer.crt"), KeyFile: filepath.Join(dir, "signer.key"),
		CertPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), Pool: x509.NewCertPool()}
	ca.Pool.AddCert(cert)
	require.NoError(t, os.WriteFile(ca.CertFile, ca.CertPEM, 0o600))
	require.NoError(t, os.WriteFile(ca.KeyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}), 0o600))
	return ca
}

// RunKubeletServingSigner runs, until the test ends, the signer a cluster
// would run in kube-controller-manager: its csrsigning-kubelet-serving
// controller (the real one, in-process), which issues the approved
// CertificateSigningRequests of signer kubernetes.io/kubelet-serving that
// pass its checks (CN system:node:*, O system:nodes, a DNS or IP SAN, the
// usages) with ca, for ttl (or less when the CSR asks for less).
func (c *Cluster) RunKubeletServingSigner(ca *SigningCA, ttl time.Duration) {
	c.t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	factory := informers.NewSharedInformerFactory(c.Clientset, 0)
	ctrl, err := signer.NewKubeletServingCSRSigningController(ctx, c.Clientset, factory.Certificates().V1().CertificateSigningRequests(),
		ca.CertFile, ca.KeyFile, ttl)
	if err != nil {
		cancel()
		c.t.Fatalf("kubelet-serving signer: %v", err)
	}
	factory.Start(ctx.Done())
	done := make(chan struct{})
	go func() {
		defer close(done)
		ctrl.Run(ctx, 1)
	}()
	c.t.Cleanup(func() {
		cancel()
		<-done
		factory.Shutdown()
	})
}
