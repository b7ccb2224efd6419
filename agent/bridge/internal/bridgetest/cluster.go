// Package bridgetest runs member clusters for the bridge's tests: real API
// servers (envtest) whose API server can be stopped and started again on the
// same address with the same certificates and data, a client CA of the
// test's own (so the API server presents a kubelet client certificate to
// kubelet endpoints), an optional audit log, Ready nodes, a fake kubelet
// that runs the pods of one namespace as a kubelet would, the part of
// kube-controller-manager's node lifecycle controller that lifts the
// not-ready taint of a node once it is Ready, and, on demand, its
// kubelet-serving CSR signer (with the API server verifying kubelets'
// serving certificates).
package bridgetest

import (
	"bufio"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	rbv1 "github.com/fluidos-project/resource-broker/api/v1alpha1"
	"github.com/fluidos-project/resource-broker/internal/kubelet"
	"github.com/fluidos-project/resource-broker/internal/testenv"
)

// Scheme knows the built-in types and ours.
var Scheme = func() *runtime.Scheme {
	s := runtime.NewScheme()
	_ = clientgoscheme.AddToScheme(s)
	_ = rbv1.AddToScheme(s)
	return s
}()

// Options of a test cluster.
type Options struct {
	// CRDDirs are installed before Start returns.
	CRDDirs []string
	// Audit writes an audit log of the writes in AuditNamespaces, and of the
	// streams opened there (exec, attach, port-forward).
	AuditNamespaces []string
	// Scheme for Client (default Scheme).
	Scheme *runtime.Scheme
	// KubeletCA, when set, is what the API server verifies kubelets' serving
	// certificates with (--kubelet-certificate-authority): a kubelet
	// endpoint must then serve a certificate of that CA for the address the
	// API server dials (the node's address). See RunKubeletServingSigner.
	KubeletCA *SigningCA
}

// Cluster is one member cluster.
type Cluster struct {
	t         testing.TB
	Name      string
	Env       *envtest.Environment
	Config    *rest.Config // system:masters
	Client    client.Client
	Clientset kubernetes.Interface
	Authn     *CertAuthn
	AuditLog  string
}

// Start runs a cluster until the test ends.
func Start(t testing.TB, name string, o Options) *Cluster {
	t.Helper()
	dir := t.TempDir()
	authn, err := NewCertAuthn()
	require.NoError(t, err)
	c := &Cluster{t: t, Name: name, Authn: authn}
	opts := []testenv.Option{
		testenv.WithCRDDirectories(o.CRDDirs...),
		testenv.WithEnvironment(func(env *envtest.Environment) {
			api := env.ControlPlane.GetAPIServer()
			api.CertDir = dir // kept across restarts: same serving certificate, same service account keys
			api.Authn = authn
			// Open watches hold the API server's graceful shutdown for long: kill it after 5 s.
			env.ControlPlaneStopTimeout = 5 * time.Second
		}),
	}
	if o.KubeletCA != nil {
		opts = append(opts, testenv.WithAPIServerArg("kubelet-certificate-authority", o.KubeletCA.CertFile))
	}
	if len(o.AuditNamespaces) > 0 {
		policy := filepath.Join(dir, "audit-policy.yaml")
		ns, _ := json.Marshal(o.AuditNamespaces)
		require.NoError(t, os.WriteFile(policy, []byte(`apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived"]
rules:
- level: Metadata
  namespaces: `+string(ns)+`
  verbs: ["create", "update", "patch", "delete"]
- level: Metadata
  namespaces: `+string(ns)+`
  resources: [{group: "", resources: ["pods/exec", "pods/attach", "pods/portforward"]}]
- level: None
`), 0o600))
		c.AuditLog = filepath.Join(dir, "audit.log")
		opts = append(opts, testenv.WithAPIServerArg("audit-policy-file", policy), testenv.WithAPIServerArg("audit-log-path", c.AuditLog))
	}
	env, err := testenv.New(opts...)
	require.NoError(t, err)
	began := time.Now()
	cfg, err := env.Start()
	if err != nil {
		_ = env.Stop()
		t.Fatalf("starting %s: %v", name, err)
	}
	t.Logf("%s: control plane up in %s (%s)", name, time.Since(began).Round(time.Millisecond), cfg.Host)
	t.Cleanup(func() {
		if err := env.Stop(); err != nil && !killed(err) {
			t.Errorf("stopping %s: %v", name, err)
		}
	})
	c.Env, c.Config = env, cfg
	scheme := o.Scheme
	if scheme == nil {
		scheme = Scheme
	}
	c.Client, err = client.New(cfg, client.Options{Scheme: scheme})
	require.NoError(t, err)
	c.Clientset, err = kubernetes.NewForConfig(cfg)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	require.NoError(t, kubelet.LiftNotReadyTaints(ctx, c.Clientset))
	return c
}

// killed: the API server did not stop within its StopTimeout and was killed.
func killed(err error) bool {
	return strings.Contains(err.Error(), "timeout waiting for process kube-apiserver to stop") ||
		strings.Contains(err.Error(), "timeout waiting for process etcd to stop")
}

// StopAPIServer stops the API server (etcd keeps running): killed if it
// does not stop within 5 s.
func (c *Cluster) StopAPIServer(t testing.TB) {
	t.Helper()
	api := c.Env.ControlPlane.APIServer
	if err := api.Stop(); err != nil && !killed(err) {
		require.NoError(t, err)
	}
	require.Eventually(t, func() bool {
		conn, err := net.DialTimeout("tcp", api.HostPort(), 100*time.Millisecond)
		if err == nil {
			conn.Close()
		}
		return err != nil
	}, 10*time.Second, 20*time.Millisecond, "the API server's port is closed")
}

// StartAPIServer starts it again, on the same address, with the same
// certificates and data, and waits until it serves.
func (c *Cluster) StartAPIServer(t testing.TB) {
	t.Helper()
	require.NoError(t, c.Env.ControlPlane.APIServer.Start())
	require.Eventually(t, func() bool {
		_, err := c.Clientset.Discovery().ServerVersion()
		return err == nil
	}, 60*time.Second, 100*time.Millisecond)
}

// ReadyNode creates a Node that looks like a healthy kubelet's: no taints,
// Ready, with capacity as allocatable too and, when port is not 0, a kubelet
// endpoint at 127.0.0.1:port.
func (c *Cluster) ReadyNode(name string, capacity corev1.ResourceList, port int32) {
	c.t.Helper()
	ctx := context.Background()
	node, err := c.Clientset.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name,
		Labels: map[string]string{corev1.LabelHostname: name, corev1.LabelOSStable: "linux"}}}, metav1.CreateOptions{})
	require.NoError(c.t, err)
	node.Spec.Taints = nil // the API server adds node.kubernetes.io/not-ready
	node, err = c.Clientset.CoreV1().Nodes().Update(ctx, node, metav1.UpdateOptions{})
	require.NoError(c.t, err)
	node.Status.Capacity, node.Status.Allocatable = capacity, capacity
	node.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "KubeletReady",
		LastHeartbeatTime: metav1.Now(), LastTransitionTime: metav1.Now()}}
	if port != 0 {
		node.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "127.0.0.1"}}
		node.Status.DaemonEndpoints.KubeletEndpoint.Port = port
	}
	_, err = c.Clientset.CoreV1().Nodes().UpdateStatus(ctx, node, metav1.UpdateOptions{})
	require.NoError(c.t, err)
}

// AuditEvent is the part of an audit event the tests look at.
type AuditEvent struct {
	Verb      string                    `json:"verb"`
	User      struct{ Username string } `json:"user"`
	ObjectRef struct {
		Resource, Namespace, Name, Subresource string
	} `json:"objectRef"`
	ResponseStatus struct{ Code int } `json:"responseStatus"`
}

// AuditEvents reads the audit log written so far.
func (c *Cluster) AuditEvents() []AuditEvent {
	c.t.Helper()
	f, err := os.Open(c.AuditLog)
	require.NoError(c.t, err)
	defer f.Close()
	var out []AuditEvent
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		var e AuditEvent
		if json.Unmarshal(sc.Bytes(), &e) == nil {
			out = append(out, e)
		}
	}
	require.NoError(c.t, sc.Err())
	return out
}

// CertAuthn is an envtest authenticator with a client CA of the test's own:
// users get certificates from it, and the API server gets a kubelet client
// certificate (CN kube-apiserver-kubelet-client, group system:masters), so a
// kubelet endpoint can authenticate it as a real cluster's would.
type CertAuthn struct {
	mu     sync.Mutex
	cert   *x509.Certificate
	key    *ecdsa.PrivateKey
	CAPEM  []byte
	dir    string
	serial int64
}

// NewCertAuthn makes a CA.
func NewCertAuthn() (*CertAuthn, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "bridgetest client CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, err
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	return &CertAuthn{cert: cert, key: key, serial: 1, CAPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}, nil
}

// Issue returns a client certificate and key (PEM) for a user.
func (a *CertAuthn) Issue(name string, groups ...string) (certPEM, keyPEM []byte, err error) {
	a.mu.Lock()
	a.serial++
	serial := a.serial
	a.mu.Unlock()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: name, Organization: groups},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, a.cert, &key.PublicKey, a.key)
	if err != nil {
		return nil, nil, err
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}), nil
}

// Configure points the API server at the CA and its kubelet client certificate.
func (a *CertAuthn) Configure(workDir string, args *envtest.Arguments) error {
	a.dir = workDir
	certPEM, keyPEM, err := a.Issue("kube-apiserver-kubelet-client", "system:masters")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(workDir, "kubelet-client.crt"), certPEM, 0o600); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(workDir, "kubelet-client.key"), keyPEM, 0o600); err != nil {
		return err
	}
	args.Set("client-ca-file", filepath.Join(workDir, "client-ca.crt"))
	args.Set("kubelet-client-certificate", filepath.Join(workDir, "kubelet-client.crt"))
	args.Set("kubelet-client-key", filepath.Join(workDir, "kubelet-client.key"))
	return nil
}

// Start writes the CA for the API server.
func (a *CertAuthn) Start() error {
	return os.WriteFile(filepath.Join(a.dir, "client-ca.crt"), a.CAPEM, 0o600)
}

// AddUser returns baseCfg authenticated as user.
func (a *CertAuthn) AddUser(user envtest.User, baseCfg *rest.Config) (*rest.Config, error) {
	certPEM, keyPEM, err := a.Issue(user.Name, user.Groups...)
	if err != nil {
		return nil, err
	}
	cfg := rest.CopyConfig(baseCfg)
	cfg.CertData, cfg.KeyData = certPEM, keyPEM
	return cfg, nil
}

// Stop does nothing: the files live in the test's temporary directory.
func (a *CertAuthn) Stop() error { return nil }
