package virtualkubelet

import (
	"context"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	rbv1 "github.com/fluidos-project/resource-broker/api/v1alpha1"
	"github.com/fluidos-project/resource-broker/internal/kustomize"
	"github.com/fluidos-project/resource-broker/internal/testenv"
)

// TestMirrorAccess: an agent running as its ServiceAccount, with
// manifests/agent's RBAC and admission policy, reads no namespace's Secrets
// until it mirrors a pod of it; then it binds rb-agent-mirror to itself
// there and reads them, but cannot in a namespace that opted out nor in
// kube-system, and says why. An identity that may already read binds
// nothing; one that may not and is no ServiceAccount is told what to do.
func TestMirrorAccess(t *testing.T) {
	env, err := testenv.New(testenv.WithCRDDirectories(testenv.ModulePath(t, "manifests", "crds")))
	require.NoError(t, err)
	cfg, err := env.Start()
	require.NoError(t, err)
	t.Cleanup(func() { _ = env.Stop() })
	ctx := context.Background()
	admin, err := kubernetes.NewForConfig(cfg)
	require.NoError(t, err)
	objs, err := kustomize.Build(testenv.ModulePath(t, "manifests", "agent"))
	require.NoError(t, err)
	require.NoError(t, kustomize.Apply(ctx, cfg, "rb-test", kustomize.Kinds(objs, append([]string{"Namespace"}, kustomize.RBAC...)...)))
	for _, ns := range []*corev1.Namespace{
		{ObjectMeta: metav1.ObjectMeta{Name: "shop"}},
		{ObjectMeta: metav1.ObjectMeta{Name: "vault", Labels: map[string]string{"broker.fluidos.eu/offload": "false"}}},
	} {
		_, err := admin.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{})
		require.NoError(t, err)
	}
	_, err = admin.CoreV1().Secrets("shop").Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "creds"},
		StringData: map[string]string{"password": "s3cret"}}, metav1.CreateOptions{})
	require.NoError(t, err)

	tr, err := admin.CoreV1().ServiceAccounts("resource-broker").CreateToken(ctx, "rb-agent", &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To(int64(3600))}}, metav1.CreateOptions{})
	require.NoError(t, err)
	agentCfg := &rest.Config{Host: cfg.Host, BearerToken: tr.Status.Token, TLSClientConfig: rest.TLSClientConfig{CAData: cfg.CAData}}
	agent, err := kubernetes.NewForConfig(agentCfg)
	require.NoError(t, err)
	// The API server enforces the admission policy a moment after it is made.
	require.Eventually(t, func() bool {
		_, err := agent.RbacV1().RoleBindings(metav1.NamespaceSystem).Create(ctx, &rbacv1.RoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: MirrorRole},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: MirrorRole},
			Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: "resource-broker", Name: "rb-agent"}},
		}, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		return apierrors.IsForbidden(err)
	}, 20*time.Second, 50*time.Millisecond, "policy rb-agent enforced")
	bctx, cancel := context.WithCancel(ctx)
	t.Cleanup(cancel)
	b := &Bridge{local: agent, log: logr.Discard(), ctx: bctx}

	_, err = agent.CoreV1().Secrets("shop").Get(ctx, "creds", metav1.GetOptions{})
	require.True(t, apierrors.IsForbidden(err), "no Secret before a pod of shop is mirrored: %v", err)
	objects, err := b.localObjects(ctx, "shop")
	require.NoError(t, err)
	require.True(t, cache.WaitForCacheSync(ctx.Done(), objects.synced...))
	s, err := objects.secrets.Get("creds")
	require.NoError(t, err)
	assert.Equal(t, "s3cret", string(s.Data["password"]))
	rb, err := admin.RbacV1().RoleBindings("shop").Get(ctx, MirrorRole, metav1.GetOptions{})
	require.NoError(t, err)
	assert.Equal(t, rbv1.ManagedByValue, rb.Labels[rbv1.ManagedByLabel])
	assert.Equal(t, "system:serviceaccount:resource-broker:rb-agent", b.whoami)
	again, err := b.localObjects(ctx, "shop")
	require.NoError(t, err)
	assert.Same(t, objects, again, "one set of informers per namespace")

	// A token of a mirrored pod's ServiceAccount, bound to the pod, for its
	// copy; the API server's advertised address.
	for _, ns := range []string{"shop", "vault"} {
		_, err = admin.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "web"}}, metav1.CreateOptions{})
		require.NoError(t, err)
	}
	web, err := admin.CoreV1().Pods("shop").Create(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "web-0"},
		Spec: corev1.PodSpec{ServiceAccountName: "web", Containers: []corev1.Container{{Name: "c", Image: "nginx"}}}}, metav1.CreateOptions{})
	require.NoError(t, err)
	bound := func(pod *corev1.Pod) *authenticationv1.TokenRequest {
		return &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To(int64(600)),
			BoundObjectRef: &authenticationv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: pod.Name, UID: pod.UID}}}
	}
	_, err = agent.CoreV1().ServiceAccounts("shop").CreateToken(ctx, "web", bound(web), metav1.CreateOptions{})
	require.NoError(t, err, "a token bound to a mirrored pod")
	_, err = agent.DiscoveryV1().EndpointSlices(metav1.NamespaceDefault).Get(ctx, "kubernetes", metav1.GetOptions{})
	require.NoError(t, err, "the API server's advertised address")
	_, err = agent.CoreV1().ServiceAccounts("shop").CreateToken(ctx, "web", &authenticationv1.TokenRequest{}, metav1.CreateOptions{})
	assert.True(t, apierrors.IsForbidden(err), "a token bound to nothing: %v", err)
	assert.ErrorContains(t, err, "ValidatingAdmissionPolicy 'rb-agent'")
	_, err = agent.CoreV1().ServiceAccounts("vault").CreateToken(ctx, "web", bound(web), metav1.CreateOptions{})
	assert.True(t, apierrors.IsForbidden(err), "a token where it may not mirror: %v", err)
	_, err = agent.DiscoveryV1().EndpointSlices(metav1.NamespaceDefault).List(ctx, metav1.ListOptions{})
	assert.True(t, apierrors.IsForbidden(err), "the other EndpointSlices: %v", err)

	// Refused where the policy says so.
	err = b.ensureMirrorAccess(ctx, "vault")
	require.Error(t, err, "a namespace that opted out")
	assert.True(t, apierrors.IsForbidden(err), "%v", err)
	assert.Contains(t, err.Error(), "ValidatingAdmissionPolicy 'rb-agent'")
	assert.Contains(t, err.Error(), "namespace vault")
	err = b.ensureMirrorAccess(ctx, metav1.NamespaceSystem)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "ValidatingAdmissionPolicy 'rb-agent'")
	_, err = agent.CoreV1().Secrets(metav1.NamespaceSystem).List(ctx, metav1.ListOptions{})
	assert.True(t, apierrors.IsForbidden(err))

	// An admin reads already: nothing bound.
	ab := &Bridge{local: admin, log: logr.Discard(), ctx: bctx}
	require.NoError(t, ab.ensureMirrorAccess(ctx, "vault"))
	_, err = admin.RbacV1().RoleBindings("vault").Get(ctx, MirrorRole, metav1.GetOptions{})
	assert.True(t, apierrors.IsNotFound(err), "%v", err)
	// A user that may not read and is no ServiceAccount.
	u, err := env.AddUser(envtest.User{Name: "someone", Groups: []string{"system:authenticated"}}, nil)
	require.NoError(t, err)
	ucs, err := kubernetes.NewForConfig(u.Config())
	require.NoError(t, err)
	err = (&Bridge{local: ucs, log: logr.Discard(), ctx: bctx}).ensureMirrorAccess(ctx, "shop")
	require.Error(t, err)
	assert.Contains(t, err.Error(), "is no ServiceAccount to bind ClusterRole rb-agent-mirror to")
}
