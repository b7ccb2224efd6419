package virtualkubelet

import (
	"fmt"
	"reflect"
	"strings"
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

func TestServiceEnvChunks(t *testing.T) {
	assert.Equal(t, []map[string]string{{}}, serviceEnvChunks(nil), "one ConfigMap, empty")

	var env []corev1.EnvVar
	value := strings.Repeat("x", 1000)
	for i := range 2000 { // about 2 MB
		env = append(env, corev1.EnvVar{Name: fmt.Sprintf("S%04d_SERVICE_HOST", i), Value: value})
	}
	chunks := serviceEnvChunks(env)
	require.Len(t, chunks, 3)
	seen := map[string]bool{}
	for _, data := range chunks {
		size := 0
		for k, v := range data {
			size += len(k) + len(v)
			assert.False(t, seen[k], "%s in one ConfigMap only", k)
			seen[k] = true
		}
		assert.LessOrEqual(t, size, serviceEnvChunk)
	}
	assert.Len(t, seen, len(env))
}

func TestRemotePodReadsServiceEnvFromConfigMaps(t *testing.T) {
	local := testPod()
	own := corev1.EnvFromSource{ConfigMapRef: &corev1.ConfigMapEnvSource{LocalObjectReference: corev1.LocalObjectReference{Name: "web-env"}}}
	local.Spec.Containers[0].EnvFrom = []corev1.EnvFromSource{own}
	home := &homeView{network: HomeNetwork{DNS: "198.18.100.10"}, envFrom: []string{serviceEnvName("shop", 0), serviceEnvName("shop", 1)}}
	remote, err := remotePod(local, mirrorParams{clusterID: "rome", namespace: "rb-rome", network: home})
	require.NoError(t, err)

	from := remote.Spec.Containers[0].EnvFrom
	require.Len(t, from, 3)
	assert.Equal(t, "shop.rb-service-env-0", from[0].ConfigMapRef.Name, "the home Services' variables first: the container's own sources win")
	assert.Equal(t, "shop.rb-service-env-1", from[1].ConfigMapRef.Name)
	assert.Equal(t, "shop.web-env", from[2].ConfigMapRef.Name, "the container's own, renamed to its copy")
	_, n := envValue(remote.Spec.Containers[0].Env, "KUBERNETES_SERVICE_HOST")
	assert.Zero(t, n, "no Service variable in the copy itself")
	assert.Equal(t, ptr.To(false), remote.Spec.EnableServiceLinks)
}

func TestServiceEnvCache(t *testing.T) {
	master := service("default", "kubernetes", "198.18.100.1", corev1.ServicePort{Name: "https", Port: 443, Protocol: corev1.ProtocolTCP})
	a := service("shop", "a", "198.18.100.20", corev1.ServicePort{Port: 80, Protocol: corev1.ProtocolTCP})
	bsvc := service("shop", "b", "198.18.100.21", corev1.ServicePort{Port: 80, Protocol: corev1.ProtocolTCP})
	a.ResourceVersion, bsvc.ResourceVersion = "1", "1"
	var c serviceEnvCache
	first := c.get("shop", master, []*corev1.Service{a, bsvc})
	require.Len(t, first, 1)
	assert.Equal(t, "198.18.100.20", first[0]["A_SERVICE_HOST"])
	assert.Equal(t, "198.18.100.1", first[0]["KUBERNETES_SERVICE_HOST"])
	again := c.get("shop", master, []*corev1.Service{bsvc, a})
	assert.Equal(t, reflect.ValueOf(first[0]).Pointer(), reflect.ValueOf(again[0]).Pointer(), "the same Services in another order: computed once")

	moved := a.DeepCopy()
	moved.Spec.ClusterIP, moved.ResourceVersion = "198.18.100.30", "2"
	chunks := c.get("shop", master, []*corev1.Service{moved, bsvc})
	assert.Equal(t, "198.18.100.30", chunks[0]["A_SERVICE_HOST"], "a Service changed: computed again")
	chunks = c.get("shop", master, []*corev1.Service{moved})
	assert.NotContains(t, chunks[0], "B_SERVICE_HOST", "a Service gone: computed again")
}
