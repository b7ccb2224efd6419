package agent_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/client-go/rest"

	"github.com/fluidos-project/resource-broker/agent"
	"github.com/fluidos-project/resource-broker/internal/certauthority"
)

func TestAPIServerFrom(t *testing.T) {
	ca, err := certauthority.NewCA("cluster-ca")
	require.NoError(t, err)
	other, err := certauthority.NewCA("public-ca")
	require.NoError(t, err)
	dir := t.TempDir()
	write := func(name string, b []byte) string {
		p := filepath.Join(dir, name)
		require.NoError(t, os.WriteFile(p, b, 0o600))
		return p
	}
	// An in-cluster config: the ClusterIP, and the CA in a file, not in CAData.
	inCluster := &rest.Config{Host: "https://10.96.0.1:443", TLSClientConfig: rest.TLSClientConfig{CAFile: write("ca.crt", ca.CertPEM)}}
	fromKubeconfig := &rest.Config{Host: "https://127.0.0.1:6443", TLSClientConfig: rest.TLSClientConfig{CAData: ca.CertPEM}}
	otherCA := write("other.crt", other.CertPEM)

	for _, tc := range []struct {
		name            string
		cfg             *rest.Config
		address, caFile string
		want            agent.APIServer
		wantErr         string
	}{
		{name: "in-cluster config: its CA file is read", cfg: inCluster,
			want: agent.APIServer{Address: "https://10.96.0.1:443", CABundle: ca.CertPEM}},
		{name: "the flag's address, the config's CA", cfg: inCluster, address: "https://api.rome.example:6443",
			want: agent.APIServer{Address: "https://api.rome.example:6443", CABundle: ca.CertPEM}},
		{name: "the flags' address and CA", cfg: inCluster, address: "https://api.rome.example:6443", caFile: otherCA,
			want: agent.APIServer{Address: "https://api.rome.example:6443", CABundle: other.CertPEM}},
		{name: "kubeconfig with CAData", cfg: fromKubeconfig,
			want: agent.APIServer{Address: "https://127.0.0.1:6443", CABundle: ca.CertPEM}},
		{name: "the CA file wins over CAData", cfg: fromKubeconfig, caFile: otherCA,
			want: agent.APIServer{Address: "https://127.0.0.1:6443", CABundle: other.CertPEM}},
		{name: "a proxy's path is kept", cfg: fromKubeconfig, address: "https://rancher.example/k8s/clusters/c-1",
			want: agent.APIServer{Address: "https://rancher.example/k8s/clusters/c-1", CABundle: ca.CertPEM}},
		{name: "no CA at all: system roots", cfg: &rest.Config{Host: "https://api.example"},
			want: agent.APIServer{Address: "https://api.example"}},

		{name: "plain http", cfg: inCluster, address: "http://api.rome.example:6443",
			wantErr: `--api-server-address: "http://api.rome.example:6443" is not an https:// URL`},
		{name: "no scheme", cfg: inCluster, address: "api.rome.example:6443",
			wantErr: `--api-server-address: "api.rome.example:6443" is not an https:// URL`},
		{name: "a kubeconfig host without https", cfg: &rest.Config{Host: "http://127.0.0.1:8080"},
			wantErr: `the API server address of the agent's kubeconfig (set --api-server-address): "http://127.0.0.1:8080" is not an https:// URL`},
		{name: "a CA file that does not exist", cfg: inCluster, caFile: filepath.Join(dir, "nope.crt"),
			wantErr: "--api-server-ca-file: open " + filepath.Join(dir, "nope.crt")},
		{name: "a CA file without a certificate", cfg: inCluster, caFile: write("garbage.crt", []byte("not PEM")),
			wantErr: "--api-server-ca-file: " + filepath.Join(dir, "garbage.crt") + ": data does not contain any valid RSA or ECDSA certificates"},
		{name: "the config's CA file is gone", cfg: &rest.Config{Host: "https://10.96.0.1:443", TLSClientConfig: rest.TLSClientConfig{CAFile: filepath.Join(dir, "gone.crt")}},
			wantErr: "the CA of the agent's kubeconfig (set --api-server-ca-file): open " + filepath.Join(dir, "gone.crt")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := agent.APIServerFrom(tc.cfg, tc.address, tc.caFile)
			if tc.wantErr != "" {
				require.Error(t, err)
				assert.Contains(t, err.Error(), tc.wantErr)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.want, got)
		})
	}
}

func TestLocalityOf(t *testing.T) {
	env := func(m map[string]string) func(string) string { return func(k string) string { return m[k] } }
	pod := env(map[string]string{"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443"})
	assert.Equal(t, agent.Locality{ServiceHost: "10.96.0.1", InPod: true},
		agent.LocalityOf(&rest.Config{Host: "https://10.96.0.1:443"}, pod), "in-cluster config")
	assert.Equal(t, agent.Locality{ServiceHost: "10.96.0.1"},
		agent.LocalityOf(&rest.Config{Host: "https://127.0.0.1:6443"}, pod), "a kubeconfig, run where the environment is a pod's (CI in a pod)")
	assert.Equal(t, agent.Locality{}, agent.LocalityOf(&rest.Config{Host: "https://127.0.0.1:6443"}, env(nil)), "a process on a host")
	v6 := env(map[string]string{"KUBERNETES_SERVICE_HOST": "fd00::1", "KUBERNETES_SERVICE_PORT": "443"})
	assert.True(t, agent.LocalityOf(&rest.Config{Host: "https://[fd00::1]:443"}, v6).InPod, "IPv6 in-cluster config")
}

func TestCheckAPIServerAddress(t *testing.T) {
	pod := agent.Locality{ServiceHost: "10.96.0.1", InPod: true}
	host := agent.Locality{}
	for _, tc := range []struct {
		address  string
		where    agent.Locality
		refused  string // a part of the reason, empty: accepted
		warnedOf string
	}{
		{"https://10.96.0.1:443", pod, "the ClusterIP of Service default/kubernetes", ""},
		{"https://10.96.0.1", agent.Locality{ServiceHost: "10.96.0.1"}, "the ClusterIP of Service default/kubernetes", ""},
		{"https://kubernetes.default.svc:443", pod, "a Service's name in this cluster's DNS", ""},
		{"https://kubernetes.default.svc.cluster.local", host, "a Service's name in this cluster's DNS", ""},
		{"https://KUBERNETES.DEFAULT.SVC.", pod, "a Service's name in this cluster's DNS", ""},
		{"https://kubernetes", pod, "a Service's name in this cluster's DNS", ""},
		{"https://apiserver-proxy.kube-system.svc:6443", pod, "a Service's name in this cluster's DNS", ""},
		{"https://127.0.0.1:6443", pod, "a loopback address, which in a pod is the pod itself", ""},
		{"https://[::1]:6443", pod, "a loopback address, which in a pod is the pod itself", ""},
		{"https://localhost:6443", pod, "a loopback address, which in a pod is the pod itself", ""},
		{"https://0.0.0.0:6443", host, "an unspecified address", ""},
		{"https://169.254.10.1:6443", host, "a link-local address", ""},

		// Outside a pod, loopback is this host's: a test bed's clusters
		// share it. Accepted, with a warning.
		{"https://127.0.0.1:6443", host, "", "a loopback address: only requesters on this host reach it"},
		{"https://localhost:6443", host, "", "a loopback address: only requesters on this host reach it"},
		{"https://api.rome.example:6443", pod, "", ""},
		{"https://192.168.10.5:6443", pod, "", ""},
		{"https://svc.example.com", pod, "", ""},
		{"https://[2001:db8::5]:6443", pod, "", ""},
	} {
		t.Run(tc.address, func(t *testing.T) {
			warning, err := agent.CheckAPIServerAddress(tc.address, tc.where, false)
			if tc.refused == "" {
				require.NoError(t, err)
				assert.Equal(t, tc.warnedOf, warning)
				return
			}
			require.Error(t, err)
			assert.Contains(t, err.Error(), "requesters would be handed the API server address "+tc.address+", "+tc.refused)
			assert.Contains(t, err.Error(), "set --api-server-address (API_SERVER_ADDRESS in manifests/agent/config.env)")

			// The operator may say so explicitly; it is still logged.
			warning, err = agent.CheckAPIServerAddress(tc.address, tc.where, true)
			require.NoError(t, err)
			assert.Contains(t, warning, tc.refused)
			assert.Contains(t, warning, "allowed by --allow-local-api-server-address")
		})
	}
}
