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
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/rest"
	clienttesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/events"
	"sigs.k8s.io/yaml"

	"github.com/fluidos-project/resource-broker/agent/bridge/internal/bridgetest"
	"github.com/fluidos-project/resource-broker/internal/testenv"
)

// nextEvent waits for an Event of the fake recorder.
func nextEvent(t *testing.T, rec *events.FakeRecorder, within time.Duration) string {
	t.Helper()
	select {
	case e := <-rec.Events:
		return e
	case <-time.After(within):
		t.Fatalf("no event within %s", within)
		return ""
	}
}

// serveTLS serves s's certificate on loopback and returns the certificate
// a client dialling 127.0.0.1 sees, with the error of verifying it against
// roots for that address (the API server's check, with
// --kubelet-certificate-authority: the IP SAN, no SNI).
func serveTLS(t *testing.T, s *servingCert, roots *x509.CertPool) (*x509.Certificate, error) {
	t.Helper()
	ln, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{GetCertificate: s.getCertificate, MinVersion: tls.VersionTLS12})
	require.NoError(t, err)
	defer ln.Close()
	go func() {
		if c, err := ln.Accept(); err == nil {
			_ = c.(*tls.Conn).Handshake()
			c.Close()
		}
	}()
	conn, err := tls.Dial("tcp", ln.Addr().String(), &tls.Config{InsecureSkipVerify: true}) //nolint:gosec // verified below
	require.NoError(t, err)
	defer conn.Close()
	leaf := conn.ConnectionState().PeerCertificates[0]
	_, verr := leaf.Verify(x509.VerifyOptions{Roots: roots, DNSName: "127.0.0.1", KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}})
	return leaf, verr
}

// agentClient is a client of c with the rb-agent ClusterRole of
// manifests/agent/rbac.yaml only.
func agentClient(t *testing.T, c *bridgetest.Cluster) kubernetes.Interface {
	t.Helper()
	data, err := os.ReadFile(testenv.ModulePath(t, "manifests", "agent", "rbac.yaml"))
	require.NoError(t, err)
	var role *rbacv1.ClusterRole
	for _, doc := range strings.Split(string(data), "\n---\n") {
		var r rbacv1.ClusterRole
		if yaml.Unmarshal([]byte(doc), &r) == nil && r.Kind == "ClusterRole" && r.Name == "rb-agent" {
			role = &r
		}
	}
	require.NotNil(t, role, "manifests/agent/rbac.yaml has the ClusterRole rb-agent")
	ctx := context.Background()
	_, err = c.Clientset.RbacV1().ClusterRoles().Create(ctx, role, metav1.CreateOptions{})
	require.NoError(t, err)
	_, err = c.Clientset.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "rb-agent"},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "rb-agent"},
		Subjects: []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: "rb-agent"}}}, metav1.CreateOptions{})
	require.NoError(t, err)
	cfg := rest.CopyConfig(c.Config)
	cfg.CertData, cfg.KeyData, err = c.Authn.Issue("rb-agent")
	require.NoError(t, err)
	cs, err := kubernetes.NewForConfig(cfg)
	require.NoError(t, err)
	return cs
}

// TestServingCertFromTheSigner: with no signer in the cluster, the endpoint
// serves a self-signed certificate and says so (a Warning Event on the CSR)
// once the timeout has passed; when kube-controller-manager's
// kubelet-serving signer runs (bridgetest runs the real controller), it
// issues the approved CSR, which therefore passes its checks, and the
// endpoint serves that certificate, which verifies for the node's IP. The
// agent has only the permissions of manifests/agent (approval included).
func TestServingCertFromTheSigner(t *testing.T) {
	c := bridgetest.Start(t, "rome", bridgetest.Options{})
	rec := events.NewFakeRecorder(10)
	s, err := newServingCert(agentClient(t, c), rec, bridgetest.Logger(t, 1), "rome", "127.0.0.1", 500*time.Millisecond)
	require.NoError(t, err)
	s.poll, s.slowPoll = 50*time.Millisecond, 100*time.Millisecond
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go s.run(ctx)

	e := nextEvent(t, rec, 10*time.Second)
	assert.True(t, strings.HasPrefix(e, "Warning "+ReasonServingCertNotIssued+" "), e)
	assert.Contains(t, e, "serving a self-signed certificate meanwhile")
	assert.True(t, s.selfSigned.Load())
	ca := bridgetest.NewSigningCA(t)
	_, verr := serveTLS(t, s, ca.Pool)
	assert.Error(t, verr, "self-signed")

	c.RunKubeletServingSigner(ca, time.Hour)
	e = nextEvent(t, rec, 30*time.Second)
	assert.True(t, strings.HasPrefix(e, "Normal "+ReasonServingCertIssued+" "), e)
	require.Eventually(t, func() bool { return !s.selfSigned.Load() }, 5*time.Second, 20*time.Millisecond)
	leaf, verr := serveTLS(t, s, ca.Pool)
	require.NoError(t, verr, "the API server dials the node's IP and verifies with the signer's CA")
	assert.Equal(t, pkix.Name{CommonName: "system:node:rb-rome-vk", Organization: []string{"system:nodes"}}.String(), leaf.Subject.String())
	assert.Equal(t, []string{"rb-rome-vk"}, leaf.DNSNames)

	csrs, err := c.Clientset.CertificatesV1().CertificateSigningRequests().List(ctx, metav1.ListOptions{})
	require.NoError(t, err)
	require.Len(t, csrs.Items, 1, "one request, waited for past the timeout, not one per retry")
	csr := csrs.Items[0]
	assert.True(t, strings.HasPrefix(csr.Name, "rb-rome-vk-"), csr.Name)
	assert.Equal(t, certificatesv1.KubeletServingSignerName, csr.Spec.SignerName)
	assert.Equal(t, []certificatesv1.KeyUsage{certificatesv1.UsageDigitalSignature, certificatesv1.UsageServerAuth}, csr.Spec.Usages)
	var approved bool
	for _, cond := range csr.Status.Conditions {
		approved = approved || cond.Type == certificatesv1.CertificateApproved && cond.Status == corev1.ConditionTrue
	}
	assert.True(t, approved, "approved by the agent: %+v", csr.Status.Conditions)
	block, _ := pem.Decode(csr.Spec.Request)
	require.NotNil(t, block)
	req, err := x509.ParseCertificateRequest(block.Bytes)
	require.NoError(t, err)
	assert.Equal(t, "system:node:rb-rome-vk", req.Subject.CommonName)
	assert.Equal(t, []string{"system:nodes"}, req.Subject.Organization)
	require.Len(t, req.IPAddresses, 1)
	assert.True(t, req.IPAddresses[0].Equal(net.ParseIP("127.0.0.1")))
	assert.IsType(t, &ecdsa.PublicKey{}, req.PublicKey)
}

// TestServingCertRenewal: a new certificate is requested after 70% of the
// current one's life and served at once. The test plays the signer (the job
// of kube-controller-manager's csrsigning controller): it writes
// status.certificate of approved requests, with 2 s certificates, on a fake
// API server.
func TestServingCertRenewal(t *testing.T) {
	api := fake.NewClientset()
	var n atomic.Int32
	api.PrependReactor("create", "certificatesigningrequests", func(a clienttesting.Action) (bool, runtime.Object, error) {
		csr := a.(clienttesting.CreateAction).GetObject().(*certificatesv1.CertificateSigningRequest)
		csr.Name = fmt.Sprintf("%s%d", csr.GenerateName, n.Add(1)) // the fake does not generate names
		return false, nil, nil
	})
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test signer"}, IsCA: true, BasicConstraintsValid: true,
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), KeyUsage: x509.KeyUsageCertSign}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	require.NoError(t, err)
	ca, err := x509.ParseCertificate(caDER)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { // the signer
		for ctx.Err() == nil {
			time.Sleep(10 * time.Millisecond)
			list, err := api.CertificatesV1().CertificateSigningRequests().List(ctx, metav1.ListOptions{})
			if err != nil {
				continue
			}
			for _, csr := range list.Items {
				if len(csr.Status.Certificate) > 0 || len(csr.Status.Conditions) == 0 || csr.Status.Conditions[0].Type != certificatesv1.CertificateApproved {
					continue
				}
				block, _ := pem.Decode(csr.Spec.Request)
				req, err := x509.ParseCertificateRequest(block.Bytes)
				if err != nil {
					continue
				}
				now := time.Now()
				der, err := x509.CreateCertificate(rand.Reader, &x509.Certificate{SerialNumber: big.NewInt(now.UnixNano()), Subject: req.Subject,
					IPAddresses: req.IPAddresses, DNSNames: req.DNSNames, NotBefore: now, NotAfter: now.Add(2 * time.Second),
					KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}, ca, req.PublicKey, caKey)
				if err != nil {
					continue
				}
				csr.Status.Certificate = pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
				_, _ = api.CertificatesV1().CertificateSigningRequests().UpdateStatus(ctx, &csr, metav1.UpdateOptions{})
			}
		}
	}()

	s, err := newServingCert(api, nil, bridgetest.Logger(t, 1), "rome", "10.0.0.7", 10*time.Second)
	require.NoError(t, err)
	s.poll = 20 * time.Millisecond
	go s.run(ctx)
	var first *x509.Certificate
	require.Eventually(t, func() bool {
		if s.selfSigned.Load() {
			return false
		}
		first = s.cur.Load().Leaf
		return true
	}, 5*time.Second, 10*time.Millisecond)
	assert.True(t, first.IPAddresses[0].Equal(net.ParseIP("10.0.0.7")))
	require.Eventually(t, func() bool {
		return s.cur.Load().Leaf.SerialNumber.Cmp(first.SerialNumber) != 0
	}, 5*time.Second, 10*time.Millisecond, "renewed")
	renewed := s.cur.Load().Leaf
	assert.False(t, renewed.NotBefore.Before(renewalTime(first).Add(-time.Second)), "not before 70%% of the first one's life")
	assert.True(t, time.Now().Before(first.NotAfter), "before the first one expired")
	assert.False(t, s.selfSigned.Load())
	assert.GreaterOrEqual(t, n.Load(), int32(2))
}

func TestRenewalTime(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	assert.Equal(t, t0.Add(7*time.Hour), renewalTime(&x509.Certificate{NotBefore: t0, NotAfter: t0.Add(10 * time.Hour)}))
	// kube-controller-manager backdates NotBefore by 5 minutes.
	assert.Equal(t, t0.Add(-5*time.Minute).Add(time.Duration(0.7*float64(365*24*time.Hour+5*time.Minute))),
		renewalTime(&x509.Certificate{NotBefore: t0.Add(-5 * time.Minute), NotAfter: t0.Add(365 * 24 * time.Hour)}))
}
