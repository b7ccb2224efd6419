package virtualkubelet

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/utils/ptr"

	"github.com/fluidos-project/resource-broker/broker/api"
)

var testHome = &homeAPI{server: &homeAPIServer{host: "10.0.0.1", port: "6443"}, secret: "shop.web-0.kube-api-access"}

// The copy's token volume carries the home token, mounted where it was; a
// token projected elsewhere (another audience) is dropped as before; the
// home API server's variables come first, but for those a container sets.
func TestRemotePodHomeAPI(t *testing.T) {
	local := testPod()
	local.Spec.Volumes = append(local.Spec.Volumes, corev1.Volume{Name: "vault-token", VolumeSource: corev1.VolumeSource{
		Projected: &corev1.ProjectedVolumeSource{Sources: []corev1.VolumeProjection{{ServiceAccountToken: &corev1.ServiceAccountTokenProjection{Audience: "vault", Path: "t"}}}}}})
	local.Spec.Containers[0].VolumeMounts = append(local.Spec.Containers[0].VolumeMounts, corev1.VolumeMount{Name: "vault-token", MountPath: "/vault"})
	local.Spec.Containers[0].Env = append(local.Spec.Containers[0].Env, corev1.EnvVar{Name: "KUBERNETES_SERVICE_HOST", Value: "mine"})
	local.Spec.InitContainers = []corev1.Container{{Name: "init", Image: "busybox",
		Env: []corev1.EnvVar{{Name: "URL", Value: "https://$(KUBERNETES_SERVICE_HOST)"}}}}

	remote, err := remotePod(local, mirrorParams{clusterID: "rome", namespace: "rb-rome", home: testHome})
	require.NoError(t, err)
	byName := map[string]corev1.Volume{}
	for _, v := range remote.Spec.Volumes {
		byName[v.Name] = v
	}
	assert.Equal(t, corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: "shop.web-0.kube-api-access", DefaultMode: ptr.To(int32(0o644))}},
		byName["kube-api-access-abcde"].VolumeSource)
	assert.NotContains(t, byName, "vault-token", "a token of another audience is still dropped")
	assert.Equal(t, "shop.web-creds", byName["creds"].Secret.SecretName, "the pod's own Secrets still renamed")
	assert.Equal(t, []corev1.VolumeMount{{Name: "config", MountPath: "/etc/web"}, {Name: "kube-api-access-abcde", MountPath: ServiceAccountMountPath}},
		remote.Spec.Containers[0].VolumeMounts)
	assert.Equal(t, ptr.To(false), remote.Spec.AutomountServiceAccountToken, "never the provider's token")

	env := remote.Spec.Containers[0].Env
	assert.Equal(t, corev1.EnvVar{Name: "KUBERNETES_SERVICE_PORT", Value: "6443"}, env[0], "first: the container's own may refer to them")
	assert.Contains(t, env, corev1.EnvVar{Name: "KUBERNETES_PORT_443_TCP", Value: "tcp://10.0.0.1:6443"})
	assert.Contains(t, env, corev1.EnvVar{Name: "KUBERNETES_SERVICE_HOST", Value: "mine"}, "the container's own wins")
	assert.NotContains(t, env, corev1.EnvVar{Name: "KUBERNETES_SERVICE_HOST", Value: "10.0.0.1"})
	init := remote.Spec.InitContainers[0].Env
	assert.Equal(t, corev1.EnvVar{Name: "KUBERNETES_SERVICE_HOST", Value: "10.0.0.1"}, init[0])
	assert.Equal(t, corev1.EnvVar{Name: "URL", Value: "https://$(KUBERNETES_SERVICE_HOST)"}, init[len(init)-1])

	// Without p.home: no token at all, as before.
	plain, err := remotePod(local, mirrorParams{clusterID: "rome", namespace: "rb-rome"})
	require.NoError(t, err)
	for _, v := range plain.Spec.Volumes {
		assert.Nil(t, v.Projected, v.Name)
		assert.NotEqual(t, "kube-api-access-abcde", v.Name)
	}
	assert.Len(t, plain.Spec.Containers[0].Env, len(local.Spec.Containers[0].Env))
}

func TestHomeAPIVolumes(t *testing.T) {
	assert.Equal(t, map[string]bool{"kube-api-access-abcde": true}, homeAPIVolumes(testPod()))

	legacy := testPod()
	legacy.Spec.Volumes[2] = corev1.Volume{Name: "default-token-x", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: "default-token-x"}}}
	legacy.Spec.Containers[0].VolumeMounts[1].Name = "default-token-x"
	assert.Equal(t, map[string]bool{"default-token-x": true}, homeAPIVolumes(legacy), "the legacy token Secret's mount")

	unmounted := testPod()
	unmounted.Spec.Containers[0].VolumeMounts = unmounted.Spec.Containers[0].VolumeMounts[:1]
	assert.Empty(t, homeAPIVolumes(unmounted), "a token not mounted where client-go reads it")

	other := testPod()
	other.Spec.Volumes[2].VolumeSource = corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}
	assert.Empty(t, homeAPIVolumes(other), "no token at that path")
}

func TestHomeAPIServer(t *testing.T) {
	s, err := parseHomeAPIServer("https://api.rome.example:6443")
	require.NoError(t, err)
	assert.Equal(t, &homeAPIServer{host: "api.rome.example", port: "6443"}, s)
	s, err = parseHomeAPIServer("https://[fd00::1]")
	require.NoError(t, err)
	assert.Equal(t, &homeAPIServer{host: "fd00::1", port: "443"}, s)
	assert.Contains(t, s.env(), corev1.EnvVar{Name: "KUBERNETES_PORT", Value: "tcp://[fd00::1]:443"})
	for _, bad := range []string{"http://api:6443", "api:6443", "https://", "https://api:6443/prefix"} {
		_, err := parseHomeAPIServer(bad)
		assert.Error(t, err, bad)
	}

	slice := &discoveryv1.EndpointSlice{
		Ports: []discoveryv1.EndpointPort{{Name: ptr.To("https"), Port: ptr.To(int32(6443))}},
		Endpoints: []discoveryv1.Endpoint{
			{Addresses: []string{"10.0.0.9"}, Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(false)}},
			{Addresses: []string{"10.0.0.1"}},
		},
	}
	assert.Equal(t, &homeAPIServer{host: "10.0.0.1", port: "6443"}, advertisedAddress(slice), "the first ready one")
	slice.Endpoints = slice.Endpoints[:1]
	assert.Nil(t, advertisedAddress(slice))
}

func TestHomeAPIConfig(t *testing.T) {
	b, err := New(Config{ClusterID: "rome", Grants: noGrants{}})
	require.NoError(t, err)
	assert.Equal(t, DefaultHomeTokenTTL, b.cfg.HomeTokenTTL)
	assert.Nil(t, b.homeAPI, "the advertised address, read when needed")
	_, err = New(Config{ClusterID: "rome", Grants: noGrants{}, HomeTokenTTL: 5 * time.Minute})
	assert.ErrorContains(t, err, "at least 10m0s")
	_, err = New(Config{ClusterID: "rome", Grants: noGrants{}, HomeAPIServer: "api:6443"})
	assert.ErrorContains(t, err, "want https://host:port")
	b, err = New(Config{ClusterID: "rome", Grants: noGrants{}, HomeAPIServer: "https://api.rome.example:6443"})
	require.NoError(t, err)
	assert.Equal(t, &homeAPIServer{host: "api.rome.example", port: "6443"}, b.homeAPI)
}

type noGrants struct{}

func (noGrants) Reservation(context.Context, string) (api.Reservation, error) {
	return api.Reservation{}, nil
}
