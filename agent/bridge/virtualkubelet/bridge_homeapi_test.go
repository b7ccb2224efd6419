package virtualkubelet_test

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/fluidos-project/resource-broker/agent/bridge/virtualkubelet"
	rbv1 "github.com/fluidos-project/resource-broker/api/v1alpha1"
)

// homeTokenRefresh is how often TestVirtualKubelet's bridge replaces the
// copies' home API tokens (at 80 % of an hour otherwise).
const homeTokenRefresh = 3 * time.Second

// homeNamespace makes namespace ns of m as kube-controller-manager would
// leave it for the pods of boundPod: their ServiceAccount web-sa, and the
// cluster's root CA in ConfigMap kube-root-ca.crt.
func homeNamespace(t *testing.T, m *member, ns string) {
	t.Helper()
	ctx := context.Background()
	require.NoError(t, m.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}))
	require.NoError(t, m.Client.Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "web-sa"}}))
	require.NoError(t, m.Client.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "kube-root-ca.crt"},
		Data: map[string]string{"ca.crt": string(m.Config.CAData)}}))
}

// homeAPIToken: the copy of web-0 finds, where a kubelet mounts a token, a
// token of web-0's ServiceAccount in rome bound to web-0, rome's CA and its
// namespace, and in its environment rome's API server: with them it calls
// rome's API as web-sa. The token is replaced before it expires.
func (vk *vkLifecycle) homeAPIToken(t *testing.T) {
	ctx, rome, paris := vk.ctx, vk.rome, vk.paris
	local, err := rome.pod("shop", "web-0")
	require.NoError(t, err)
	var remote corev1.Pod
	require.NoError(t, paris.Client.Get(ctx, types.NamespacedName{Namespace: "rb-rome", Name: "shop.web-0"}, &remote))

	// The volume: kube-api-access-x7k2p, now the Secret, mounted where it was.
	secretName := "shop.web-0.kube-api-access"
	var volume *corev1.Volume
	for i := range remote.Spec.Volumes {
		if remote.Spec.Volumes[i].Name == "kube-api-access-x7k2p" {
			volume = &remote.Spec.Volumes[i]
		}
		assert.Nil(t, remote.Spec.Volumes[i].Projected, "no token of paris: %s", remote.Spec.Volumes[i].Name)
	}
	require.NotNil(t, volume, "the token volume: %+v", remote.Spec.Volumes)
	require.NotNil(t, volume.Secret)
	assert.Equal(t, secretName, volume.Secret.SecretName)
	assert.Contains(t, remote.Spec.Containers[0].VolumeMounts, corev1.VolumeMount{Name: "kube-api-access-x7k2p",
		MountPath: virtualkubelet.ServiceAccountMountPath, ReadOnly: true})
	assert.Equal(t, false, *remote.Spec.AutomountServiceAccountToken, "paris mounts none of its own")

	// The environment: rome's API server as it advertises itself.
	var slice discoveryv1.EndpointSlice
	require.NoError(t, rome.Client.Get(ctx, types.NamespacedName{Namespace: "default", Name: "kubernetes"}, &slice))
	host, port := slice.Endpoints[0].Addresses[0], strconv.Itoa(int(*slice.Ports[0].Port))
	env := map[string]string{}
	for _, e := range remote.Spec.Containers[0].Env {
		env[e.Name] = e.Value
	}
	assert.Equal(t, map[string]string{
		"KUBERNETES_SERVICE_HOST": host, "KUBERNETES_SERVICE_PORT": port, "KUBERNETES_SERVICE_PORT_HTTPS": port,
		"KUBERNETES_PORT": "tcp://" + net.JoinHostPort(host, port), "KUBERNETES_PORT_443_TCP": "tcp://" + net.JoinHostPort(host, port),
		"KUBERNETES_PORT_443_TCP_PROTO": "tcp", "KUBERNETES_PORT_443_TCP_PORT": port, "KUBERNETES_PORT_443_TCP_ADDR": host,
	}, env)

	// The Secret, owned by nobody (the bridge deletes it with the pod: a
	// copy evicted and made again keeps it).
	var secret corev1.Secret
	require.NoError(t, paris.Client.Get(ctx, types.NamespacedName{Namespace: "rb-rome", Name: secretName}, &secret))
	assert.Equal(t, "shop", string(secret.Data["namespace"]))
	assert.Equal(t, string(rome.Config.CAData), string(secret.Data["ca.crt"]))
	assert.Equal(t, "true", secret.Labels[virtualkubelet.HomeTokenLabel])
	assert.Empty(t, secret.OwnerReferences, "owned by nobody")

	// The token: web-sa's, bound to web-0, for an hour.
	token := string(secret.Data["token"])
	user, err := rome.tokenReview(token)
	require.NoError(t, err)
	require.NotNil(t, user, "rome authenticates it")
	assert.Equal(t, "system:serviceaccount:shop:web-sa", user.Username)
	assert.Equal(t, authenticationv1.ExtraValue{"web-0"}, user.Extra["authentication.kubernetes.io/pod-name"])
	assert.Equal(t, authenticationv1.ExtraValue{string(local.UID)}, user.Extra["authentication.kubernetes.io/pod-uid"])
	claims := jwtClaims(t, token)
	assert.InDelta(t, time.Hour.Seconds(), claims.Exp-claims.Iat, 1, "lifetime")
	assert.Equal(t, "web-0", claims.Kubernetes.Pod.Name)
	elsewhere, err := paris.tokenReview(token)
	require.NoError(t, err)
	assert.Nil(t, elsewhere, "worth nothing at paris")

	// In-cluster config as the copy's client-go reads it: rome's API, as
	// web-sa (at the address the test reaches: envtest's API server
	// advertises a documentation address, 192.0.2.x).
	inCluster := &rest.Config{Host: rome.Config.Host, BearerToken: token, TLSClientConfig: rest.TLSClientConfig{CAData: secret.Data["ca.crt"]}}
	cs, err := kubernetes.NewForConfig(inCluster)
	require.NoError(t, err)
	who, err := cs.AuthenticationV1().SelfSubjectReviews().Create(ctx, &authenticationv1.SelfSubjectReview{}, metav1.CreateOptions{})
	require.NoError(t, err)
	assert.Equal(t, "system:serviceaccount:shop:web-sa", who.Status.UserInfo.Username)

	// paris admits no token of its own in a tenant namespace (policy
	// rb-tenant-pods): the copy's is the only one. (Not in rb-rome, whose
	// audit log the tenantToken step reads.)
	require.NoError(t, paris.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "rb-oslo",
		Labels: map[string]string{rbv1.TenantLabel: "oslo"}}}))
	own := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "rb-oslo", Name: "own-token"}, Spec: corev1.PodSpec{
		ServiceAccountName: "default", Containers: []corev1.Container{{Name: "c", Image: "nginx"}},
		Volumes: []corev1.Volume{{Name: "t", VolumeSource: corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{
			Sources: []corev1.VolumeProjection{{ServiceAccountToken: &corev1.ServiceAccountTokenProjection{Path: "token"}}}}}}}}}
	// The API server enforces a ValidatingAdmissionPolicy once its informer
	// has it, a moment after the agent wrote it.
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		err := paris.Client.Create(ctx, own, client.DryRunAll)
		assert.True(c, apierrors.IsForbidden(err), "%v", err)
		assert.ErrorContains(c, err, "no token of this cluster's ServiceAccounts")
	}, 10*time.Second, 200*time.Millisecond)

	// Replaced before it expires (here every homeTokenRefresh), still bound to web-0.
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		var again corev1.Secret
		require.NoError(c, paris.Client.Get(ctx, types.NamespacedName{Namespace: "rb-rome", Name: secretName}, &again))
		assert.NotEqual(c, token, string(again.Data["token"]), "a new token")
		assert.Empty(c, again.OwnerReferences)
		r, err := rome.tokenReview(string(again.Data["token"]))
		require.NoError(c, err)
		if assert.NotNil(c, r) {
			assert.Equal(c, authenticationv1.ExtraValue{string(local.UID)}, r.Extra["authentication.kubernetes.io/pod-uid"])
		}
	}, 4*homeTokenRefresh, 100*time.Millisecond)
}

// tokenReview is whom m's API server takes token for (nil: nobody).
func (m *member) tokenReview(token string) (*authenticationv1.UserInfo, error) {
	r, err := m.Clientset.AuthenticationV1().TokenReviews().Create(context.Background(),
		&authenticationv1.TokenReview{Spec: authenticationv1.TokenReviewSpec{Token: token}}, metav1.CreateOptions{})
	if err != nil || !r.Status.Authenticated {
		return nil, err
	}
	return &r.Status.User, nil
}

type tokenClaims struct {
	Iat, Exp   float64
	Kubernetes struct {
		Pod struct{ Name, UID string }
	} `json:"kubernetes.io"`
}

// jwtClaims decodes the claims of a JWT (not verifying it: TokenReview does).
func jwtClaims(t *testing.T, token string) tokenClaims {
	t.Helper()
	parts := strings.Split(token, ".")
	require.Len(t, parts, 3)
	payload, err := base64.RawURLEncoding.DecodeString(parts[1])
	require.NoError(t, err)
	var c tokenClaims
	require.NoError(t, json.Unmarshal(payload, &c))
	return c
}

// noHomeToken: the copy of pod (annotated broker.fluidos.eu/home-api:
// "false") has no token at all, and no Secret carries one.
func noHomeToken(t *testing.T, paris *member, pod string) {
	t.Helper()
	ctx := context.Background()
	var remote corev1.Pod
	require.NoError(t, paris.Client.Get(ctx, types.NamespacedName{Namespace: "rb-rome", Name: "shop." + pod}, &remote))
	for _, v := range remote.Spec.Volumes {
		assert.Nil(t, v.Projected, v.Name)
		assert.Nil(t, v.Secret, v.Name)
	}
	for _, m := range remote.Spec.Containers[0].VolumeMounts {
		assert.NotEqual(t, virtualkubelet.ServiceAccountMountPath, m.MountPath)
	}
	for _, e := range remote.Spec.Containers[0].Env {
		assert.False(t, strings.HasPrefix(e.Name, "KUBERNETES_"), e.Name)
	}
	err := paris.Client.Get(ctx, types.NamespacedName{Namespace: "rb-rome", Name: "shop." + pod + ".kube-api-access"}, &corev1.Secret{})
	assert.True(t, apierrors.IsNotFound(err), "no token Secret: %v", err)
}
