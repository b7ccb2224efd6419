package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	logsapi "k8s.io/component-base/logs/api/v1"

	"github.com/fluidos-project/resource-broker/internal/certauthority"
	"github.com/fluidos-project/resource-broker/internal/version"
)

// The tests run the command many times in one process; the logging
// configuration, the same every time, is applied once.
func init() { logsapi.ReapplyHandling = logsapi.ReapplyHandlingIgnoreUnchanged }

func TestStartupRefusesBadConfiguration(t *testing.T) {
	ca, err := certauthority.NewCA("test")
	require.NoError(t, err)
	pair, err := ca.IssueClient("paris")
	require.NoError(t, err)
	certs := filepath.Join(t.TempDir(), "paris")
	require.NoError(t, certauthority.WriteTLSDir(certs, pair, ca.CertPEM))
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	require.NoError(t, os.WriteFile(kubeconfig, []byte(`apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:1"}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: c, context: {cluster: c, user: u}}]
current-context: c
`), 0o600))
	t.Setenv("KUBECONFIG", kubeconfig)

	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--broker-url=https://b"}, "--cluster-id is required"},
		{[]string{"--cluster-id=rome"}, "--broker-url is required"},
		{[]string{"--cluster-id=rome", "--broker-url=http://b"}, "only reachable over https://"},
		{[]string{"--cluster-id=rome", "--broker-url=https://b", "--price-cpu=cheap"}, "--price-cpu"},
		{[]string{"--cluster-id=rome", "--broker-url=https://b", "--price-gpu=-1"}, "--price-gpu"},
		{[]string{"--cluster-id=rome", "--broker-url=https://b", "--broker-cert-dir=/nonexistent"}, "/nonexistent"},
		{[]string{"--cluster-id=Rome_1", "--broker-url=https://b", "--broker-cert-dir=" + certs}, "--cluster-id"},
		{[]string{"--cluster-id=rome", "--broker-url=https://b", "--broker-cert-dir=" + certs}, `differs from the broker certificate's CN "paris"`},
		{[]string{"--cluster-id=paris", "--broker-url=https://b", "--broker-cert-dir=" + certs, "--token-ttl=1m"}, "below the TokenRequest minimum"},
		{[]string{"--cluster-id=paris", "--broker-url=https://b", "--broker-cert-dir=" + certs, "--bridge=submariner"}, `--bridge "submariner"`},
		{[]string{"--cluster-id=paris", "--broker-url=https://b", "--reservation-workers=0"}, "--reservation-workers 0: want at least 1"},
		{[]string{"--cluster-id=paris", "--broker-url=https://b", "--kubelet-serving-cert=acme"}, `--kubelet-serving-cert "acme": want csr or self-signed`},
		{[]string{"--cluster-id=paris", "--broker-url=https://b", "--kubelet-serving-cert-timeout=0s"}, "--kubelet-serving-cert-timeout must be positive"},
		{[]string{"--cluster-id=paris", "--broker-url=https://b", "--kubelet-ports=0"}, "--kubelet-ports 0: want at least 1"},
		{[]string{"--cluster-id=paris", "--broker-url=https://b", "--home-api-token-ttl=5m"}, "--home-api-token-ttl 5m0s: at least 10m0s"},
		{[]string{"--cluster-id=paris", "--broker-url=https://b", "--provider-metrics-period=500ms"}, "--provider-metrics-period 500ms: want at least 1s"},
		{[]string{"--cluster-id=paris", "--broker-url=https://b", "--lease-renew-interval=0s"}, "must be positive"},
		{[]string{"--cluster-id=paris", "--broker-url=https://b", "--advertise-band=1"}, "--advertise-band must be below 1"},
		{[]string{"--cluster-id=paris", "--broker-url=https://b", "--lease-renew-interval=1m"}, "want at most a third of --lease-length 2m0s"},
		{[]string{"--cluster-id=paris", "--broker-url=https://b", "--lease-length=10m", "--hold-time=1m"}, "want at most a third of --hold-time 1m0s"},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			cmd := newCommand()
			cmd.SetArgs(tc.args)
			err := cmd.Execute()
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.want)
		})
	}
}

func TestVersion(t *testing.T) {
	var out bytes.Buffer
	cmd := newCommand()
	cmd.SetOut(&out)
	cmd.SetArgs([]string{"--version"}) // and nothing else: it quits before checking the flags
	require.NoError(t, cmd.Execute())
	assert.Equal(t, "rb-agent "+version.Get().String()+"\n", out.String())
}

// An agent deployed in a pod, with the in-cluster config and nothing else,
// would hand requesters the ClusterIP of Service kubernetes: it refuses to
// start and says what to set; so it does for the other addresses only its
// own cluster reaches, and for an API server CA that is not one.
func TestStartupRefusesAnAPIServerAddressOnlyThisClusterReaches(t *testing.T) {
	ca, err := certauthority.NewCA("test")
	require.NoError(t, err)
	pair, err := ca.IssueClient("paris")
	require.NoError(t, err)
	certs := filepath.Join(t.TempDir(), "paris")
	require.NoError(t, certauthority.WriteTLSDir(certs, pair, ca.CertPEM))
	dir := t.TempDir()
	clusterCA := filepath.Join(dir, "ca.crt")
	require.NoError(t, os.WriteFile(clusterCA, ca.CertPEM, 0o600))
	garbage := filepath.Join(dir, "garbage.crt")
	require.NoError(t, os.WriteFile(garbage, []byte("not a certificate"), 0o600))
	// What rest.InClusterConfig gives a pod: the kubernetes Service's
	// ClusterIP from the kubelet's environment, the CA in a file.
	kubeconfig := filepath.Join(dir, "kubeconfig")
	require.NoError(t, os.WriteFile(kubeconfig, []byte(`apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://10.96.0.1:443", certificate-authority: "`+clusterCA+`"}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: c, context: {cluster: c, user: u}}]
current-context: c
`), 0o600))
	t.Setenv("KUBECONFIG", kubeconfig)
	t.Setenv("KUBERNETES_SERVICE_HOST", "10.96.0.1")
	t.Setenv("KUBERNETES_SERVICE_PORT", "443")

	base := []string{"--cluster-id=paris", "--broker-url=https://b", "--broker-cert-dir=" + certs}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{nil, "requesters would be handed the API server address https://10.96.0.1:443, the ClusterIP of Service default/kubernetes"},
		{[]string{"--api-server-address=https://kubernetes.default.svc"}, "a Service's name in this cluster's DNS"},
		{[]string{"--api-server-address=https://127.0.0.1:6443"}, "a loopback address, which in a pod is the pod itself"},
		{[]string{"--endpoint=https://127.0.0.1:6443"}, "a loopback address, which in a pod is the pod itself"}, // the old flag's name
		{[]string{"--api-server-address=http://paris.example:6443"}, `--api-server-address: "http://paris.example:6443" is not an https:// URL`},
		{[]string{"--api-server-address=https://paris.example:6443", "--api-server-ca-file=" + garbage}, "--api-server-ca-file: " + garbage},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			cmd := newCommand()
			cmd.SetArgs(append(base, tc.args...))
			err := cmd.Execute()
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.want)
			if !strings.Contains(tc.want, "--api-server") {
				assert.Contains(t, err.Error(), "set --api-server-address (API_SERVER_ADDRESS in manifests/agent/config.env)")
			}
		})
	}
}
