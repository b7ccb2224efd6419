package virtualkubelet

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

func service(ns, name, clusterIP string, ports ...corev1.ServicePort) *corev1.Service {
	return &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: corev1.ServiceSpec{ClusterIP: clusterIP, Ports: ports}}
}

func envValue(env []corev1.EnvVar, name string) (string, int) {
	value, n := "", 0
	for _, e := range env {
		if e.Name == name {
			value, n = e.Value, n+1
		}
	}
	return value, n
}

func TestServiceEnvAsTheKubeletWould(t *testing.T) {
	master := service("default", "kubernetes", "198.18.100.1", corev1.ServicePort{Name: "https", Port: 443, Protocol: corev1.ProtocolTCP})
	backend := service("shop", "backend", "198.18.100.23", corev1.ServicePort{Name: "http", Port: 8080, Protocol: corev1.ProtocolTCP})
	headless := service("shop", "peers", corev1.ClusterIPNone, corev1.ServicePort{Port: 7000, Protocol: corev1.ProtocolTCP})

	env := serviceEnv(master, []*corev1.Service{backend, headless}, true)
	v, _ := envValue(env, "BACKEND_SERVICE_HOST")
	assert.Equal(t, "198.18.100.23", v)
	v, _ = envValue(env, "BACKEND_PORT_8080_TCP")
	assert.Equal(t, "tcp://198.18.100.23:8080", v)
	v, _ = envValue(env, "KUBERNETES_SERVICE_HOST")
	assert.Equal(t, "198.18.100.1", v)
	_, n := envValue(env, "PEERS_SERVICE_HOST")
	assert.Zero(t, n, "a headless Service has no variables")

	env = serviceEnv(master, []*corev1.Service{backend}, false)
	_, n = envValue(env, "BACKEND_SERVICE_HOST")
	assert.Zero(t, n, "enableServiceLinks false: the namespace's Services give none")
	v, _ = envValue(env, "KUBERNETES_SERVICE_PORT")
	assert.Equal(t, "443", v, "Service kubernetes's always")
}

func TestRemotePodKeepsTheHomeNetwork(t *testing.T) {
	local := testPod()
	local.Spec.Containers[0].Env = append(local.Spec.Containers[0].Env, corev1.EnvVar{Name: "BACKEND_SERVICE_HOST", Value: "mine"})
	home := &homeView{network: HomeNetwork{DNS: "198.18.100.10"},
		env: []corev1.EnvVar{{Name: "BACKEND_SERVICE_HOST", Value: "198.18.100.23"}, {Name: "KUBERNETES_SERVICE_HOST", Value: "198.18.100.1"}}}
	remote, err := remotePod(local, mirrorParams{clusterID: "rome", namespace: "rb-rome", network: home})
	require.NoError(t, err)

	assert.Equal(t, corev1.DNSNone, remote.Spec.DNSPolicy)
	require.NotNil(t, remote.Spec.DNSConfig)
	assert.Equal(t, []string{"198.18.100.10"}, remote.Spec.DNSConfig.Nameservers)
	assert.Equal(t, []string{"shop.svc.cluster.local", "svc.cluster.local", "cluster.local"}, remote.Spec.DNSConfig.Searches,
		"the home namespace's search path, not the tenant namespace's")
	assert.Equal(t, []corev1.PodDNSConfigOption{{Name: "ndots", Value: ptr.To("5")}}, remote.Spec.DNSConfig.Options)
	assert.Equal(t, ptr.To(false), remote.Spec.EnableServiceLinks, "the provider's Services give no variables")

	env := remote.Spec.Containers[0].Env
	v, n := envValue(env, "BACKEND_SERVICE_HOST")
	assert.Equal(t, "mine", v, "the container's own variable wins")
	assert.Equal(t, 1, n)
	v, _ = envValue(env, "KUBERNETES_SERVICE_HOST")
	assert.Equal(t, "198.18.100.1", v)
	assert.Equal(t, "KUBERNETES_SERVICE_HOST", env[0].Name, "the home Services' variables come first")

	// A pod that chose its own DNS keeps it; its own dnsConfig follows the home one's.
	local = testPod()
	local.Spec.DNSPolicy = corev1.DNSDefault
	remote, err = remotePod(local, mirrorParams{clusterID: "rome", namespace: "rb-rome", network: home})
	require.NoError(t, err)
	assert.Equal(t, corev1.DNSDefault, remote.Spec.DNSPolicy)
	assert.Nil(t, remote.Spec.DNSConfig)

	local = testPod()
	local.Spec.DNSConfig = &corev1.PodDNSConfig{Searches: []string{"corp.example"}}
	remote, err = remotePod(local, mirrorParams{clusterID: "rome", namespace: "rb-rome", network: home})
	require.NoError(t, err)
	assert.Equal(t, []string{"shop.svc.cluster.local", "svc.cluster.local", "cluster.local", "corp.example"}, remote.Spec.DNSConfig.Searches)

	// Without it, the provider's network: nothing changes.
	remote, err = remotePod(testPod(), mirrorParams{clusterID: "rome", namespace: "rb-rome"})
	require.NoError(t, err)
	assert.Nil(t, remote.Spec.DNSConfig)
	assert.Nil(t, remote.Spec.EnableServiceLinks)
}
