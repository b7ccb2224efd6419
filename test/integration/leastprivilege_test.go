package integration

// TestLeastPrivilege*: what rb-agent, rb-scheduler and a tenant's token may
// and may not do, on a real kube-apiserver with the manifests' own RBAC and
// admission policies (kustomize build of manifests/agent and
// manifests/scheduler, applied server-side as `kubectl apply -k` would).
// Every check is a real request with a real ServiceAccount token (what the
// pod mounts, or what the provider hands a requester), not an access review:
// the admission policies decide only on real writes. The test beds run every
// agent and scheduler with the same identities (internal/testbed,
// identities.go), so the other tests prove that these permissions suffice.

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	autoscalingv1 "k8s.io/api/autoscaling/v1"
	certificatesv1 "k8s.io/api/certificates/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	schedulingv1 "k8s.io/api/scheduling/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/fluidos-project/resource-broker/agent"
	"github.com/fluidos-project/resource-broker/agent/bridge/virtualkubelet"
	"github.com/fluidos-project/resource-broker/agent/home"
	"github.com/fluidos-project/resource-broker/agent/provider"
	rbv1 "github.com/fluidos-project/resource-broker/api/v1alpha1"
	"github.com/fluidos-project/resource-broker/broker/api"
	"github.com/fluidos-project/resource-broker/internal/kubelet"
	"github.com/fluidos-project/resource-broker/internal/kustomize"
	"github.com/fluidos-project/resource-broker/internal/testbed"
	"github.com/fluidos-project/resource-broker/internal/testenv"
)

const lpNamespace = testbed.AgentNamespace

// lpCluster is a real API server with the manifests' identities, RBAC and
// admission policies applied.
type lpCluster struct {
	t     *testing.T
	ctx   context.Context
	env   *envtest.Environment
	cfg   *rest.Config // system:masters
	admin client.Client
	cs    kubernetes.Interface
}

func startLPCluster(t *testing.T) *lpCluster {
	t.Helper()
	env, err := testenv.New(testenv.WithCRDDirectories(testenv.ModulePath(t, "manifests", "crds")))
	require.NoError(t, err)
	cfg, err := env.Start()
	if err != nil {
		_ = env.Stop()
		t.Fatalf("control plane: %v", err)
	}
	t.Cleanup(func() { _ = env.Stop() })
	c := &lpCluster{t: t, ctx: context.Background(), env: env, cfg: cfg}
	c.admin, err = client.New(cfg, client.Options{Scheme: testbed.Scheme})
	require.NoError(t, err)
	c.cs, err = kubernetes.NewForConfig(cfg)
	require.NoError(t, err)
	objs, err := testbed.Identities(testenv.ModulePath(t))
	require.NoError(t, err)
	require.NoError(t, kustomize.Apply(c.ctx, cfg, "rb-test", objs))
	return c
}

// tokenConfig is a config with a token of ServiceAccount ns/name, as its pod
// would mount.
func (c *lpCluster) tokenConfig(ns, name string) *rest.Config {
	tr, err := c.cs.CoreV1().ServiceAccounts(ns).CreateToken(c.ctx, name, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To(int64(3600))}}, metav1.CreateOptions{})
	require.NoError(c.t, err)
	return c.bearer(tr.Status.Token)
}

func (c *lpCluster) bearer(token string) *rest.Config {
	return &rest.Config{Host: c.cfg.Host, BearerToken: token, TLSClientConfig: rest.TLSClientConfig{CAData: c.cfg.CAData}}
}

// as is a client and clientset of cfg.
func (c *lpCluster) as(cfg *rest.Config) (client.Client, kubernetes.Interface) {
	cl, err := client.New(cfg, client.Options{Scheme: testbed.Scheme})
	require.NoError(c.t, err)
	cs, err := kubernetes.NewForConfig(cfg)
	require.NoError(c.t, err)
	return cl, cs
}

// waitPolicy waits until the API server enforces an admission policy:
// probe (a dry run) is refused by it.
func (c *lpCluster) waitPolicy(name string, probe func() error) {
	c.t.Helper()
	var err error
	require.Eventually(c.t, func() bool {
		err = probe()
		return err != nil && strings.Contains(err.Error(), "ValidatingAdmissionPolicy '"+name+"'")
	}, 20*time.Second, 50*time.Millisecond, "admission policy %s not enforced; last answer: %v", name, err)
}

// refused asserts that err is a Forbidden answer whose message has every
// part (the admission policy's name and message, or RBAC's "cannot").
func refused(t *testing.T, err error, what string, parts ...string) {
	t.Helper()
	if !assert.Truef(t, apierrors.IsForbidden(err), "%s: want Forbidden, got %v", what, err) {
		return
	}
	for _, p := range parts {
		assert.Containsf(t, err.Error(), p, "%s", what)
	}
}

const (
	byAgentPolicy  = "ValidatingAdmissionPolicy 'rb-agent'"
	byTenantPods   = "ValidatingAdmissionPolicy 'rb-tenant-pods'"
	byTenantSvcs   = "ValidatingAdmissionPolicy 'rb-tenant-services'"
	byRBAC         = "cannot"
	agentLeaseName = "rb-agent." + "broker.fluidos.eu"
)

var dryRun = metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}

func tenantNamespaceObject(requester string) *corev1.Namespace {
	return &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: provider.TenantNamespace(requester), Labels: map[string]string{
		rbv1.TenantLabel: requester, rbv1.ManagedByLabel: rbv1.ManagedByValue, "pod-security.kubernetes.io/enforce": "baseline"}}}
}

func simplePod(ns, name string) *corev1.Pod {
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "registry.example/app:1",
			Resources: corev1.ResourceRequirements{Requests: requests("100m", "64Mi")}}}}}
}

// csrPEM is a kubelet serving certificate request for node.
func csrPEM(t *testing.T, node string) []byte {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{
		Subject:     pkix.Name{CommonName: "system:node:" + node, Organization: []string{"system:nodes"}},
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}}, key)
	require.NoError(t, err)
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der})
}

func kubeletServingCSR(t *testing.T, name, node string) *certificatesv1.CertificateSigningRequest {
	return &certificatesv1.CertificateSigningRequest{ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: certificatesv1.CertificateSigningRequestSpec{Request: csrPEM(t, node), SignerName: certificatesv1.KubeletServingSignerName,
			Usages: []certificatesv1.KeyUsage{certificatesv1.UsageDigitalSignature, certificatesv1.UsageServerAuth}}}
}

func approve(csr *certificatesv1.CertificateSigningRequest) *certificatesv1.CertificateSigningRequest {
	csr = csr.DeepCopy()
	csr.Status.Conditions = append(csr.Status.Conditions, certificatesv1.CertificateSigningRequestCondition{
		Type: certificatesv1.CertificateApproved, Status: corev1.ConditionTrue, Reason: "Test", Message: "approved"})
	return csr
}

// TestLeastPrivilegeAgent: rb-agent's ServiceAccount does every kind of
// request the agent makes (provider side: tenant namespace, quota,
// LimitRange, ServiceAccount, token, RoleBinding, placeholder, eviction,
// PriorityClasses, tenant policy; requester side: virtual node, its status
// and Lease, the pods bound to it, the binding that lets it read a
// namespace's ConfigMaps and Secrets, Reservations; its own
// ProviderInstructions, leader Lease, Advertisement, kubelet serving
// certificate), and none of a list of things it must not do.
func TestLeastPrivilegeAgent(t *testing.T) {
	c := startLPCluster(t)
	ctx := c.ctx
	ag, agcs := c.as(c.tokenConfig(lpNamespace, testbed.AgentServiceAccount))
	c.waitPolicy("rb-agent", func() error {
		_, err := agcs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "probe"}}, dryRun)
		return err
	})

	// What exists before: a user's namespace with a Secret, one that opted
	// out of offloading, a Secret in kube-system, a real node with its
	// Lease and a pod, another ServiceAccount.
	for _, ns := range []*corev1.Namespace{
		{ObjectMeta: metav1.ObjectMeta{Name: "shop"}},
		{ObjectMeta: metav1.ObjectMeta{Name: "vault", Labels: map[string]string{"broker.fluidos.eu/offload": "false"}}},
	} {
		require.NoError(t, c.admin.Create(ctx, ns))
	}
	for _, s := range []*corev1.Secret{
		{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "creds"}, StringData: map[string]string{"k": "v"}},
		{ObjectMeta: metav1.ObjectMeta{Namespace: "vault", Name: "keys"}, StringData: map[string]string{"k": "v"}},
		{ObjectMeta: metav1.ObjectMeta{Namespace: metav1.NamespaceSystem, Name: "root"}, StringData: map[string]string{"k": "v"}},
	} {
		require.NoError(t, c.admin.Create(ctx, s))
	}
	_, err := kubelet.ReadyNode(ctx, c.cs, "worker-1", requests("8", "16Gi"), map[string]string{corev1.LabelHostname: "worker-1"})
	require.NoError(t, err)
	require.NoError(t, c.admin.Create(ctx, &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: corev1.NamespaceNodeLease, Name: "worker-1"},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To("worker-1")}}))
	onWorker := simplePod("shop", "on-worker")
	onWorker.Spec.NodeName = "worker-1"
	require.NoError(t, c.admin.Create(ctx, onWorker))

	t.Run("may", func(t *testing.T) {
		// Provider side, as agent/provider makes a tenant.
		ns := tenantNamespaceObject("rome")
		require.NoError(t, ag.Create(ctx, ns), "tenant namespace")
		ns.Labels["extra"] = "x"
		require.NoError(t, ag.Update(ctx, ns), "its labels")
		sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: ns.Name, Name: provider.TenantServiceAccount}}
		require.NoError(t, ag.Create(ctx, sa), "the tenant's ServiceAccount")
		require.NoError(t, ag.Create(ctx, &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Namespace: ns.Name, Name: provider.TenantRoleBinding},
			RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: provider.TenantClusterRole},
			Subjects: []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: ns.Name, Name: provider.TenantServiceAccount}}}),
			"its RoleBinding to rb-tenant")
		quota := &corev1.ResourceQuota{ObjectMeta: metav1.ObjectMeta{Namespace: ns.Name, Name: provider.TenantQuota},
			Spec: corev1.ResourceQuotaSpec{Hard: corev1.ResourceList{"requests.cpu": resource.MustParse("2")}, ScopeSelector: provider.QuotaScope}}
		require.NoError(t, ag.Create(ctx, quota), "its quota")
		require.NoError(t, ag.Delete(ctx, quota), "replaced (its scope is immutable)")
		require.NoError(t, ag.Create(ctx, provider.NewTenantLimitRange(ns.Name)), "its LimitRange")
		require.NoError(t, ag.Create(ctx, provider.NewTenantObjectQuota(ns.Name)), "its object quota")
		_, err := agcs.CoreV1().ServiceAccounts(ns.Name).CreateToken(ctx, provider.TenantServiceAccount, &authenticationv1.TokenRequest{}, metav1.CreateOptions{})
		require.NoError(t, err, "a token of the tenant's ServiceAccount")
		pi := provider.InstructionFor(lpNamespace, "r1", "rome", api.Quantities{CPU: ptr.To(resource.MustParse("1"))}, "")
		placeholder := provider.NewPlaceholder(pi, ns.Name, "registry.k8s.io/pause:3.10")
		require.NoError(t, ag.Create(ctx, placeholder), "a placeholder")
		require.NoError(t, ag.SubResource("eviction").Create(ctx, placeholder,
			&policyv1.Eviction{ObjectMeta: metav1.ObjectMeta{Namespace: ns.Name, Name: placeholder.Name}}), "evicting a tenant pod")
		// The hold's PriorityClasses, replaced when --hold-priority changed.
		pcs := provider.NewPriorityClasses(provider.DefaultHoldPriority)
		require.NoError(t, ag.Delete(ctx, pcs[0]))
		require.NoError(t, ag.Create(ctx, pcs[0]))
		// The tenant policy kept up to date, by the agent's own code.
		require.NoError(t, (&provider.ClusterObjects{Client: ag, HoldPriority: provider.DefaultHoldPriority}).Ensure(ctx), "tenant policy")

		// Its ProviderInstructions, leader Lease and Advertisement.
		require.NoError(t, ag.Create(ctx, pi))
		pi.Status.TenantNamespace = ns.Name
		require.NoError(t, ag.Status().Update(ctx, pi))
		require.NoError(t, ag.List(ctx, &rbv1.ProviderInstructionList{}, client.InNamespace(lpNamespace)))
		require.NoError(t, ag.Delete(ctx, pi))
		lease := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: lpNamespace, Name: agentLeaseName},
			Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To("rb-agent-1")}}
		require.NoError(t, ag.Create(ctx, lease), "leader election")
		lease.Spec.HolderIdentity = ptr.To("rb-agent-2")
		require.NoError(t, ag.Update(ctx, lease))
		adv := &rbv1.Advertisement{ObjectMeta: metav1.ObjectMeta{Name: "paris"}, Spec: rbv1.AdvertisementSpec{
			ClusterID: "paris", Capacity: requests("8", "16Gi"), Allocatable: requests("8", "16Gi"), Allocated: requests("1", "1Gi")}}
		require.NoError(t, ag.Create(ctx, adv))
		adv.Labels = map[string]string{"x": "y"}
		require.NoError(t, ag.Update(ctx, adv))
		require.NoError(t, ag.Status().Update(ctx, adv))

		// Requester side: a virtual node, its status and Lease.
		node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: virtualkubelet.NodeName("paris"), Labels: map[string]string{
			rbv1.ProviderLabel: "paris", rbv1.ManagedByLabel: rbv1.ManagedByValue, corev1.LabelHostname: virtualkubelet.NodeName("paris")}}}
		require.NoError(t, ag.Create(ctx, node), "a virtual node")
		node.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "Test"}}
		require.NoError(t, ag.Status().Update(ctx, node), "its status")
		nodeLease := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: corev1.NamespaceNodeLease, Name: node.Name},
			Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To(node.Name)}}
		require.NoError(t, ag.Create(ctx, nodeLease), "its Lease")
		nodeLease.Spec.RenewTime = ptr.To(metav1.NowMicro())
		require.NoError(t, ag.Update(ctx, nodeLease))
		// A pod bound to it: status reflected, deleted once gone there.
		bound := simplePod("shop", "web-0")
		bound.Spec.NodeName = node.Name
		require.NoError(t, c.admin.Create(ctx, bound))
		bound.Status.Phase = corev1.PodRunning
		require.NoError(t, ag.Status().Update(ctx, bound), "the status of a pod on its virtual node")
		require.NoError(t, ag.Delete(ctx, bound), "a pod on its virtual node")
		require.NoError(t, ag.Delete(ctx, nodeLease))
		require.NoError(t, ag.Delete(ctx, node))
		// Reading the ConfigMaps and Secrets of a namespace whose pods it
		// mirrors: after binding rb-agent-mirror to itself there.
		require.NoError(t, ag.Create(ctx, mirrorBinding("shop", lpNamespace, testbed.AgentServiceAccount)), "RoleBinding rb-agent-mirror")
		require.Eventually(t, func() bool {
			_, err := agcs.CoreV1().Secrets("shop").Get(ctx, "creds", metav1.GetOptions{})
			return err == nil
		}, 10*time.Second, 20*time.Millisecond, "reading a Secret of shop")
		_, err = agcs.CoreV1().ConfigMaps("shop").List(ctx, metav1.ListOptions{})
		require.NoError(t, err)
		// With --borrowed-pod-network=home: that namespace's Services, and
		// Services default/kubernetes and kube-system/kube-dns by name.
		_, err = agcs.CoreV1().Services("shop").List(ctx, metav1.ListOptions{})
		require.NoError(t, err, "the Services of a namespace it mirrors")
		assert.True(t, canI(t, agcs, authorizationv1.ResourceAttributes{Namespace: metav1.NamespaceDefault, Resource: "services", Verb: "get", Name: "kubernetes"}))
		assert.True(t, canI(t, agcs, authorizationv1.ResourceAttributes{Namespace: metav1.NamespaceSystem, Resource: "services", Verb: "get", Name: "kube-dns"}))
		assert.False(t, canI(t, agcs, authorizationv1.ResourceAttributes{Namespace: metav1.NamespaceSystem, Resource: "services", Verb: "get", Name: "metrics-server"}),
			"another Service of kube-system")
		// A token of a mirrored pod's ServiceAccount, bound to the pod, for
		// its copy to call this cluster's API; where that API server is.
		require.NoError(t, c.admin.Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "web"}}))
		withSA := simplePod("shop", "web-1")
		withSA.Spec.ServiceAccountName = "web"
		require.NoError(t, c.admin.Create(ctx, withSA))
		_, err = agcs.CoreV1().ServiceAccounts("shop").CreateToken(ctx, "web", boundToken(withSA), metav1.CreateOptions{})
		require.NoError(t, err, "a token bound to a mirrored pod")
		_, err = agcs.DiscoveryV1().EndpointSlices(metav1.NamespaceDefault).Get(ctx, "kubernetes", metav1.GetOptions{})
		require.NoError(t, err, "the API server's advertised address")
		// Reservations in any namespace.
		rsv := reservation("shop", "web-0", "100m", "64Mi")
		require.NoError(t, c.admin.Create(ctx, rsv))
		require.NoError(t, ag.Patch(ctx, rsv, client.RawPatch(types.MergePatchType, []byte(`{"metadata":{"finalizers":["`+rbv1.ReleaseFinalizer+`"]}}`))))
		rsv.Status.Phase = rbv1.ReservationPending
		require.NoError(t, ag.Status().Update(ctx, rsv))
		require.NoError(t, ag.List(ctx, &rbv1.ReservationList{}))
		require.NoError(t, ag.Delete(ctx, rsv))
		// Its kubelet endpoint's serving certificate, approved by itself.
		csr, err := agcs.CertificatesV1().CertificateSigningRequests().Create(ctx, kubeletServingCSR(t, "rb-paris-serving", node.Name), metav1.CreateOptions{})
		require.NoError(t, err, "a kubelet-serving CSR")
		_, err = agcs.CertificatesV1().CertificateSigningRequests().UpdateApproval(ctx, csr.Name, approve(csr), metav1.UpdateOptions{})
		require.NoError(t, err, "approving it")
		_, err = agcs.CertificatesV1().CertificateSigningRequests().Get(ctx, csr.Name, metav1.GetOptions{})
		require.NoError(t, err)
		// Its kubelet endpoint authenticates and authorizes callers.
		_, err = agcs.AuthenticationV1().TokenReviews().Create(ctx, &authenticationv1.TokenReview{Spec: authenticationv1.TokenReviewSpec{Token: "x"}}, metav1.CreateOptions{})
		require.NoError(t, err)
		_, err = agcs.AuthorizationV1().SubjectAccessReviews().Create(ctx, &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
			User: "u", ResourceAttributes: &authorizationv1.ResourceAttributes{Verb: "get", Resource: "pods"}}}, metav1.CreateOptions{})
		require.NoError(t, err)
		_, err = agcs.CoreV1().ConfigMaps(metav1.NamespaceSystem).Get(ctx, "extension-apiserver-authentication", metav1.GetOptions{})
		require.NoError(t, err, "the client CA its kubelet endpoint trusts")
		// Return home: a borrowed pod's deletion cost, on any node; a
		// Deployment's move in its annotations, and its scale by one.
		require.NoError(t, ag.Patch(ctx, onWorker, client.RawPatch(types.MergePatchType,
			[]byte(`{"metadata":{"annotations":{"`+home.DeletionCostAnnotation+`":"-31","`+home.CostSetAnnotation+`":"paris"}}}`))), "a pod's deletion cost")
		dep := lpDeployment("shop", "web")
		require.NoError(t, c.admin.Create(ctx, dep))
		require.NoError(t, ag.Get(ctx, client.ObjectKeyFromObject(dep), dep), "a Deployment")
		require.NoError(t, ag.Patch(ctx, dep, client.RawPatch(types.MergePatchType,
			[]byte(`{"metadata":{"annotations":{"`+home.MoveAnnotation+`":"{}"}}}`))), "a move home in a Deployment's annotations")
		require.NoError(t, ag.SubResource("scale").Update(ctx, dep, client.WithSubResourceBody(&autoscalingv1.Scale{Spec: autoscalingv1.ScaleSpec{Replicas: 3}})),
			"a Deployment scaled out by one")
		require.NoError(t, ag.SubResource("scale").Update(ctx, dep, client.WithSubResourceBody(&autoscalingv1.Scale{Spec: autoscalingv1.ScaleSpec{Replicas: 2}})),
			"and back")
		assert.True(t, canI(t, agcs, authorizationv1.ResourceAttributes{Group: "apps", Resource: "replicasets", Verb: "get", Namespace: "shop"}),
			"the ReplicaSet between a pod and its Deployment")
		// Reads: the collector's, the bridge's, the tenant reconciler's.
		require.NoError(t, ag.List(ctx, &corev1.NodeList{}))
		require.NoError(t, ag.List(ctx, &corev1.PodList{}))
		require.NoError(t, ag.List(ctx, &corev1.NamespaceList{}))
		_, err = agcs.CoreV1().Events("shop").Create(ctx, &corev1.Event{ObjectMeta: metav1.ObjectMeta{GenerateName: "e-"},
			InvolvedObject: corev1.ObjectReference{Kind: "Pod", Namespace: "shop", Name: "web-0"}, Reason: "Test", Message: "m", Type: corev1.EventTypeNormal}, metav1.CreateOptions{})
		require.NoError(t, err, "events")
		// Liqo mode's objects (no Liqo here: an access review).
		for _, ra := range []authorizationv1.ResourceAttributes{
			{Group: "authentication.liqo.io", Resource: "resourceslices", Verb: "create", Namespace: "liqo-tenant-paris"},
			{Group: "authentication.liqo.io", Resource: "resourceslices", Verb: "delete", Namespace: "liqo-tenant-paris"},
			{Group: "authentication.liqo.io", Resource: "resourceslices", Verb: "watch"},
			{Group: "offloading.liqo.io", Resource: "virtualnodes", Verb: "list"},
		} {
			assert.True(t, canI(t, agcs, ra), "%+v", ra)
		}
		// The tenant goes with its namespace.
		require.NoError(t, ag.Delete(ctx, ns), "its tenant namespace")
	})

	t.Run("must not", func(t *testing.T) {
		ns := tenantNamespaceObject("oslo")
		require.NoError(t, ag.Create(ctx, ns))
		_, err := agcs.CoreV1().Secrets(metav1.NamespaceSystem).Get(ctx, "root", metav1.GetOptions{})
		refused(t, err, "read a Secret in kube-system", byRBAC)
		_, err = agcs.CoreV1().Secrets("").List(ctx, metav1.ListOptions{})
		refused(t, err, "list the cluster's Secrets", byRBAC)
		_, err = agcs.CoreV1().Secrets("vault").Get(ctx, "keys", metav1.GetOptions{})
		refused(t, err, "read a Secret where it mirrors nothing", byRBAC)
		refused(t, ag.Create(ctx, mirrorBinding(metav1.NamespaceSystem, lpNamespace, testbed.AgentServiceAccount), client.DryRunAll),
			"bind itself to read kube-system", byAgentPolicy)
		refused(t, ag.Create(ctx, mirrorBinding("vault", lpNamespace, testbed.AgentServiceAccount), client.DryRunAll),
			"bind itself to read a namespace that opted out", byAgentPolicy)
		refused(t, ag.Create(ctx, mirrorBinding(lpNamespace, lpNamespace, testbed.AgentServiceAccount), client.DryRunAll),
			"bind itself to read its own namespace", byAgentPolicy)
		refused(t, ag.Create(ctx, mirrorBinding("shop", "shop", "default"), client.DryRunAll), "let another read a namespace", byAgentPolicy)

		refused(t, ag.Delete(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "shop"}}), "delete a namespace it did not make", byAgentPolicy)
		var shop corev1.Namespace
		require.NoError(t, c.admin.Get(ctx, types.NamespacedName{Name: "shop"}, &shop))
		shop.Labels = map[string]string{rbv1.ManagedByLabel: rbv1.ManagedByValue, rbv1.TenantLabel: "shop"}
		refused(t, ag.Update(ctx, &shop, client.DryRunAll), "claim a namespace as its own", byAgentPolicy)
		refused(t, ag.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "prod"}}, client.DryRunAll), "create any namespace", byAgentPolicy)
		wrong := tenantNamespaceObject("milan")
		wrong.Labels[rbv1.TenantLabel] = "rome"
		refused(t, ag.Create(ctx, wrong, client.DryRunAll), "a tenant namespace named for another", byAgentPolicy)

		for _, sa := range []*corev1.ServiceAccount{
			{ObjectMeta: metav1.ObjectMeta{Namespace: metav1.NamespaceSystem, Name: "builder"}},
			{ObjectMeta: metav1.ObjectMeta{Namespace: ns.Name, Name: "default"}},
			{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: provider.TenantServiceAccount}},
		} {
			require.NoError(t, c.admin.Create(ctx, sa))
		}
		_, err = agcs.CoreV1().ServiceAccounts(metav1.NamespaceSystem).CreateToken(ctx, "builder", &authenticationv1.TokenRequest{}, metav1.CreateOptions{})
		refused(t, err, "create a token for another ServiceAccount", byAgentPolicy)
		_, err = agcs.CoreV1().ServiceAccounts("shop").CreateToken(ctx, provider.TenantServiceAccount, &authenticationv1.TokenRequest{}, metav1.CreateOptions{})
		refused(t, err, "a token of an rb-tenant outside its tenant namespaces", byAgentPolicy)
		_, err = agcs.CoreV1().ServiceAccounts(ns.Name).CreateToken(ctx, "default", &authenticationv1.TokenRequest{}, metav1.CreateOptions{})
		refused(t, err, "a token of another ServiceAccount of its tenant namespace", byAgentPolicy)
		require.NoError(t, c.admin.Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: "vault", Name: "web"}}))
		inVault := simplePod("vault", "web-0")
		inVault.Spec.ServiceAccountName = "web"
		require.NoError(t, c.admin.Create(ctx, inVault))
		_, err = agcs.CoreV1().ServiceAccounts("vault").CreateToken(ctx, "web", boundToken(inVault), metav1.CreateOptions{})
		refused(t, err, "a token bound to a pod of a namespace that opted out", byAgentPolicy)
		_, err = agcs.DiscoveryV1().EndpointSlices(metav1.NamespaceDefault).List(ctx, metav1.ListOptions{})
		refused(t, err, "list EndpointSlices", byRBAC)
		refused(t, ag.Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: ns.Name, Name: "admin"}}, client.DryRunAll),
			"another ServiceAccount in a tenant namespace", byAgentPolicy)

		clusterAdmin := rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "cluster-admin"}
		me := []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: lpNamespace, Name: testbed.AgentServiceAccount}}
		refused(t, ag.Create(ctx, &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "mine"}, RoleRef: clusterAdmin, Subjects: me}, client.DryRunAll),
			"bind cluster-admin", byRBAC)
		refused(t, ag.Create(ctx, &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Namespace: ns.Name, Name: provider.TenantRoleBinding}, RoleRef: clusterAdmin,
			Subjects: []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: ns.Name, Name: provider.TenantServiceAccount}}}, client.DryRunAll),
			"bind cluster-admin in a tenant namespace", "not currently held")
		refused(t, ag.Create(ctx, &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Namespace: metav1.NamespaceSystem, Name: provider.TenantRoleBinding},
			RoleRef: rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: provider.TenantClusterRole}, Subjects: me}, client.DryRunAll),
			"bind rb-tenant (Secrets) to itself in kube-system", byAgentPolicy)
		refused(t, ag.Create(ctx, &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Namespace: ns.Name, Name: "secrets"},
			Rules: []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"secrets"}, Verbs: []string{"*"}}}}, client.DryRunAll),
			"escalate: a Role of its own", byRBAC)
		role := provider.NewTenantClusterRole()
		require.NoError(t, c.admin.Get(ctx, client.ObjectKeyFromObject(role), role))
		role.Rules = append(role.Rules, rbacv1.PolicyRule{APIGroups: []string{"*"}, Resources: []string{"*"}, Verbs: []string{"*"}})
		refused(t, ag.Update(ctx, role, client.DryRunAll), "escalate: widen rb-tenant", byRBAC)
		imp := rest.CopyConfig(c.tokenConfig(lpNamespace, testbed.AgentServiceAccount))
		imp.Impersonate = rest.ImpersonationConfig{UserName: "system:admin", Groups: []string{"system:masters"}}
		_, impcs := c.as(imp)
		_, err = impcs.CoreV1().Secrets(metav1.NamespaceSystem).List(ctx, metav1.ListOptions{})
		refused(t, err, "impersonate", byRBAC)

		refused(t, ag.Create(ctx, simplePod(metav1.NamespaceSystem, "p"), client.DryRunAll), "create a pod in kube-system", byAgentPolicy)
		refused(t, ag.Create(ctx, simplePod("shop", "p"), client.DryRunAll), "create a pod outside its tenant namespaces", byAgentPolicy)
		refused(t, ag.Delete(ctx, onWorker, client.DryRunAll), "delete a pod of a real node", byAgentPolicy)
		onWorker.Status.Phase = corev1.PodFailed
		refused(t, ag.Status().Update(ctx, onWorker, client.DryRunAll), "write the status of a pod of a real node", byAgentPolicy)
		refused(t, ag.SubResource("eviction").Create(ctx, onWorker, &policyv1.Eviction{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: onWorker.Name}}, client.DryRunAll),
			"evict a pod outside its tenant namespaces", byAgentPolicy)

		relabel := onWorker.DeepCopy()
		refused(t, ag.Patch(ctx, relabel, client.RawPatch(types.MergePatchType, []byte(`{"metadata":{"labels":{"app":"other"}}}`)), client.DryRunAll),
			"relabel a pod of a real node", byAgentPolicy)
		refused(t, ag.Patch(ctx, relabel, client.RawPatch(types.MergePatchType, []byte(`{"metadata":{"annotations":{"other":"x"}}}`)), client.DryRunAll),
			"annotate a pod of a real node with anything but its deletion cost", byAgentPolicy)
		dep := lpDeployment("shop", "api")
		require.NoError(t, c.admin.Create(ctx, dep))
		refused(t, ag.Patch(ctx, dep, client.RawPatch(types.MergePatchType, []byte(`{"spec":{"template":{"spec":{"containers":[{"name":"app","image":"evil"}]}}}}`)), client.DryRunAll),
			"change a Deployment's pods", byAgentPolicy)
		refused(t, ag.Patch(ctx, dep, client.RawPatch(types.MergePatchType, []byte(`{"metadata":{"annotations":{"other":"x"}}}`)), client.DryRunAll),
			"annotate a Deployment with anything but a move home", byAgentPolicy)
		refused(t, ag.SubResource("scale").Update(ctx, dep, client.WithSubResourceBody(&autoscalingv1.Scale{Spec: autoscalingv1.ScaleSpec{Replicas: 9}}), client.DryRunAll),
			"scale a Deployment by more than one", byAgentPolicy)
		refused(t, ag.Delete(ctx, dep, client.DryRunAll), "delete a Deployment", byRBAC)

		var worker corev1.Node
		require.NoError(t, c.admin.Get(ctx, types.NamespacedName{Name: "worker-1"}, &worker))
		worker.Spec.Unschedulable = true
		refused(t, ag.Update(ctx, &worker, client.DryRunAll), "change a real node", byAgentPolicy)
		refused(t, ag.Delete(ctx, &worker, client.DryRunAll), "delete a real node", byAgentPolicy)
		worker.Status.Conditions = nil
		refused(t, ag.Status().Update(ctx, &worker, client.DryRunAll), "write a real node's status", byAgentPolicy)
		refused(t, ag.Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "rb-fake"}}, client.DryRunAll), "a node not labelled its own", byAgentPolicy)
		var workerLease coordinationv1.Lease
		require.NoError(t, c.admin.Get(ctx, types.NamespacedName{Namespace: corev1.NamespaceNodeLease, Name: "worker-1"}, &workerLease))
		workerLease.Spec.HolderIdentity = ptr.To("rb-agent")
		refused(t, ag.Update(ctx, &workerLease, client.DryRunAll), "take a real node's Lease", byAgentPolicy)
		refused(t, ag.Create(ctx, &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: metav1.NamespaceSystem, Name: "kube-scheduler"}}, client.DryRunAll),
			"take a Lease in kube-system", byRBAC)
		refused(t, ag.Create(ctx, &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "x"}}, client.DryRunAll),
			"take a Lease in another namespace", byRBAC)

		refused(t, ag.Create(ctx, &schedulingv1.PriorityClass{ObjectMeta: metav1.ObjectMeta{Name: "urgent"}, Value: 999999999}, client.DryRunAll),
			"create another PriorityClass", byAgentPolicy)
		var guard = &unstructuredVAP{name: "rb-agent"}
		refused(t, guard.delete(ctx, agcs), "remove its own admission policy", byRBAC)
		csr, err := c.cs.CertificatesV1().CertificateSigningRequests().Create(ctx, kubeletServingCSR(t, "worker-1-serving", "worker-1"), metav1.CreateOptions{})
		require.NoError(t, err)
		_, err = agcs.CertificatesV1().CertificateSigningRequests().UpdateApproval(ctx, csr.Name, approve(csr), metav1.UpdateOptions{})
		refused(t, err, "approve another's CSR", byAgentPolicy)
		client := kubeletServingCSR(t, "admin-client", "x")
		client.Spec.SignerName = certificatesv1.KubeAPIServerClientSignerName
		client.Spec.Usages = []certificatesv1.KeyUsage{certificatesv1.UsageDigitalSignature, certificatesv1.UsageClientAuth}
		_, err = agcs.CertificatesV1().CertificateSigningRequests().Create(ctx, client, dryRun)
		refused(t, err, "request a client certificate", byAgentPolicy)
	})
}

// unstructuredVAP deletes an admission policy by name.
type unstructuredVAP struct{ name string }

func (u *unstructuredVAP) delete(ctx context.Context, cs kubernetes.Interface) error {
	return cs.AdmissionregistrationV1().ValidatingAdmissionPolicies().Delete(ctx, u.name, metav1.DeleteOptions{DryRun: []string{metav1.DryRunAll}})
}

// boundToken is the TokenRequest of the bridge for a mirrored pod's copy.
func boundToken(pod *corev1.Pod) *authenticationv1.TokenRequest {
	return &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To(int64(600)),
		BoundObjectRef: &authenticationv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: pod.Name, UID: pod.UID}}}
}

func mirrorBinding(ns, saNamespace, sa string) *rbacv1.RoleBinding {
	return &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: virtualkubelet.MirrorRole,
		Labels: map[string]string{rbv1.ManagedByLabel: rbv1.ManagedByValue}},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: virtualkubelet.MirrorRole},
		Subjects: []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: saNamespace, Name: sa}}}
}

// canI asks whether cs's identity may do ra (SelfSubjectAccessReview).
func canI(t *testing.T, cs kubernetes.Interface, ra authorizationv1.ResourceAttributes) bool {
	r, err := cs.AuthorizationV1().SelfSubjectAccessReviews().Create(context.Background(), &authorizationv1.SelfSubjectAccessReview{
		Spec: authorizationv1.SelfSubjectAccessReviewSpec{ResourceAttributes: &ra}}, metav1.CreateOptions{})
	require.NoError(t, err)
	return r.Status.Allowed
}

// TestLeastPrivilegeScheduler: rb-scheduler's ServiceAccount does what
// kube-scheduler and the ResourceBroker plugin do (read pods and nodes,
// bind, write pod status, preempt, its Reservations, its leader Lease, the
// authentication ConfigMap), and none of a list of things it must not do.
func TestLeastPrivilegeScheduler(t *testing.T) {
	c := startLPCluster(t)
	ctx := c.ctx
	sc, sccs := c.as(c.tokenConfig(lpNamespace, testbed.SchedulerServiceAccount))
	require.NoError(t, c.admin.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "shop"}}))
	_, err := kubelet.ReadyNode(ctx, c.cs, "worker-1", requests("8", "16Gi"), map[string]string{corev1.LabelHostname: "worker-1"})
	require.NoError(t, err)
	require.NoError(t, c.admin.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: metav1.NamespaceSystem, Name: "root"}}))

	t.Run("may", func(t *testing.T) {
		require.NoError(t, sc.List(ctx, &corev1.PodList{}))
		require.NoError(t, sc.List(ctx, &corev1.NodeList{}))
		pending := simplePod("shop", "web-0")
		require.NoError(t, c.admin.Create(ctx, pending))
		pending.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodScheduled, Status: corev1.ConditionFalse, Reason: corev1.PodReasonUnschedulable}}
		require.NoError(t, sc.Status().Update(ctx, pending), "a pod's status")
		require.NoError(t, sc.SubResource("binding").Create(ctx, pending, &corev1.Binding{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "web-0"},
			Target: corev1.ObjectReference{Kind: "Node", Name: "worker-1"}}), "binding")
		require.NoError(t, sc.Delete(ctx, pending), "preemption")
		rsv := reservation("shop", "web-1", "1", "1Gi")
		require.NoError(t, sc.Create(ctx, rsv), "a Reservation")
		require.NoError(t, sc.List(ctx, &rbv1.ReservationList{}))
		require.NoError(t, sc.Delete(ctx, rsv))
		lease := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: lpNamespace, Name: "rb-scheduler"}, Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To("a")}}
		require.NoError(t, sc.Create(ctx, lease), "leader election")
		lease.Spec.HolderIdentity = ptr.To("b")
		require.NoError(t, sc.Update(ctx, lease))
		_, err := sccs.CoreV1().ConfigMaps(metav1.NamespaceSystem).Get(ctx, "extension-apiserver-authentication", metav1.GetOptions{})
		require.NoError(t, err, "the client CA of its metrics endpoint")
		_, err = sccs.AuthenticationV1().TokenReviews().Create(ctx, &authenticationv1.TokenReview{Spec: authenticationv1.TokenReviewSpec{Token: "x"}}, metav1.CreateOptions{})
		require.NoError(t, err)
		// What its informers list and watch.
		for _, ra := range []authorizationv1.ResourceAttributes{
			{Resource: "persistentvolumes", Verb: "watch"}, {Resource: "persistentvolumeclaims", Verb: "watch"},
			{Resource: "namespaces", Verb: "watch"}, {Resource: "services", Verb: "watch"},
			{Group: "storage.k8s.io", Resource: "storageclasses", Verb: "watch"}, {Group: "storage.k8s.io", Resource: "csinodes", Verb: "watch"},
			{Group: "storage.k8s.io", Resource: "csidrivers", Verb: "watch"}, {Group: "storage.k8s.io", Resource: "csistoragecapacities", Verb: "watch"},
			{Group: "policy", Resource: "poddisruptionbudgets", Verb: "watch"}, {Group: "apps", Resource: "replicasets", Verb: "watch"},
			{Group: "resource.k8s.io", Resource: "resourceclaims", Verb: "watch"}, {Group: "resource.k8s.io", Resource: "resourceslices", Verb: "watch"},
			{Group: "resource.k8s.io", Resource: "deviceclasses", Verb: "watch"},
			{Group: "broker.fluidos.eu", Resource: "reservations", Verb: "watch"},
		} {
			assert.True(t, canI(t, sccs, ra), "%+v", ra)
		}
	})

	t.Run("must not", func(t *testing.T) {
		_, err := sccs.CoreV1().Secrets(metav1.NamespaceSystem).Get(ctx, "root", metav1.GetOptions{})
		refused(t, err, "read a Secret in kube-system", byRBAC)
		_, err = sccs.CoreV1().Secrets("").List(ctx, metav1.ListOptions{})
		refused(t, err, "list Secrets", byRBAC)
		rsv := reservation("shop", "web-2", "1", "1Gi")
		require.NoError(t, c.admin.Create(ctx, rsv))
		rsv.Status.Phase = rbv1.ReservationActive
		refused(t, sc.Status().Update(ctx, rsv, client.DryRunAll), "write a Reservation's status (the agent's)", byRBAC)
		refused(t, sc.Create(ctx, simplePod("shop", "p"), client.DryRunAll), "create pods", byRBAC)
		refused(t, sc.Delete(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "worker-1"}}, client.DryRunAll), "delete nodes", byRBAC)
		refused(t, sc.Create(ctx, &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "x"},
			RoleRef: rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "cluster-admin"}}, client.DryRunAll), "bind roles", byRBAC)
		agentLease := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: lpNamespace, Name: agentLeaseName}}
		require.NoError(t, c.admin.Create(ctx, agentLease))
		agentLease.Spec.HolderIdentity = ptr.To("rb-scheduler")
		refused(t, sc.Update(ctx, agentLease, client.DryRunAll), "take the agent's Lease", byRBAC)
		_, err = sccs.CoreV1().ServiceAccounts(lpNamespace).CreateToken(ctx, testbed.AgentServiceAccount, &authenticationv1.TokenRequest{}, metav1.CreateOptions{})
		refused(t, err, "create tokens", byRBAC)
	})
}

// TestLeastPrivilegeTenant: the token a provider hands a requester, made by
// the agent's own tenant reconciler running as rb-agent, with the
// provider's quota controller (kube-controller-manager) counting: the
// bridge's copy of a pod is admitted, a pod without requests gets the
// LimitRange's, the quotas hold (pods per reservation, object counts), and
// every rule of the tenant policy refuses what it must, with its message.
func TestLeastPrivilegeTenant(t *testing.T) {
	c := startLPCluster(t)
	ctx := c.ctx
	startQuotaController(t, c)
	agentCfg := c.tokenConfig(lpNamespace, testbed.AgentServiceAccount)
	g := &recordedGrants{}
	startTenantReconciler(t, agentCfg, g)
	require.NoError(t, c.admin.Create(ctx, provider.InstructionFor(lpNamespace, "r1", "rome",
		api.Quantities{CPU: ptr.To(resource.MustParse("1")), Memory: ptr.To(resource.MustParse("1Gi"))}, "")))
	var grant api.Grant
	require.Eventually(t, func() bool {
		var ok bool
		grant, ok = g.last("rome/r1")
		return ok
	}, 30*time.Second, 50*time.Millisecond, "the agent grants rome its tenant namespace")
	require.Equal(t, "rb-rome", grant.Namespace)
	tenant, tcs := c.as(c.bearer(grant.Token))
	ns := grant.Namespace
	// The quota controller has counted the namespace (until it has, quotas
	// are not enforced).
	require.Eventually(t, func() bool {
		var qs corev1.ResourceQuotaList
		require.NoError(t, c.admin.List(ctx, &qs, client.InNamespace(ns)))
		counted := 0
		for _, q := range qs.Items {
			if len(q.Status.Hard) > 0 && len(q.Status.Used) > 0 {
				counted++
			}
		}
		return counted == 2
	}, 30*time.Second, 100*time.Millisecond, "quotas rb-reservations and rb-objects counted")
	pod := func(name string) *corev1.Pod { return simplePod(ns, name) }
	c.waitPolicy("rb-tenant-pods", func() error {
		p := pod("probe")
		p.Spec.NodeName = "paris-node-1"
		return tenant.Create(ctx, p, client.DryRunAll)
	})
	c.waitPolicy("rb-tenant-services", func() error {
		s := headless(ns, "probe")
		s.Spec.Type, s.Spec.ClusterIP = corev1.ServiceTypeNodePort, ""
		return tenant.Create(ctx, s, client.DryRunAll)
	})

	t.Run("admitted", func(t *testing.T) {
		// The bridge's copy: rb-tenant, pinned to its placeholder's node by
		// a required node affinity (agent/bridge/virtualkubelet's remotePod).
		cp := pod("shop.web-0")
		cp.Labels = map[string]string{rbv1.RequesterLabel: "rome", rbv1.ReservationLabel: "r1"}
		cp.Spec.PriorityClassName = rbv1.TenantPriorityClass
		cp.Spec.AutomountServiceAccountToken = ptr.To(false)
		cp.Spec.Affinity = &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{
			NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchExpressions: []corev1.NodeSelectorRequirement{{
				Key: corev1.LabelHostname, Operator: corev1.NodeSelectorOpIn, Values: []string{"paris-node-1"}}}}}}}}
		cp.Spec.Tolerations = []corev1.Toleration{{Key: "nvidia.com/gpu", Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule}}
		cp.Spec.Containers[0].Resources.Requests = requests("500m", "512Mi")
		// Its home cluster's token, in the Secret the bridge writes.
		cp.Spec.Volumes = []corev1.Volume{{Name: "kube-api-access-x7k2p", VolumeSource: corev1.VolumeSource{
			Secret: &corev1.SecretVolumeSource{SecretName: "shop.web-0.kube-api-access", DefaultMode: ptr.To(int32(0o644))}}}}
		cp.Spec.Containers[0].VolumeMounts = []corev1.VolumeMount{{Name: "kube-api-access-x7k2p", MountPath: virtualkubelet.ServiceAccountMountPath, ReadOnly: true}}
		require.NoError(t, tenant.Create(ctx, cp), "the bridge's copy")
		// A container without requests gets the scheduler's defaults.
		bare := pod("shop.bare")
		bare.Spec.Containers[0].Resources = corev1.ResourceRequirements{}
		require.NoError(t, tenant.Create(ctx, bare))
		got, err := tcs.CoreV1().Pods(ns).Get(ctx, bare.Name, metav1.GetOptions{})
		require.NoError(t, err)
		assert.Equal(t, "100m", got.Spec.Containers[0].Resources.Requests.Cpu().String(), "LimitRange default")
		assert.Equal(t, "200Mi", got.Spec.Containers[0].Resources.Requests.Memory().String(), "LimitRange default")
		// Two pods per reservation.
		require.Eventually(t, func() bool {
			var q corev1.ResourceQuota
			require.NoError(t, c.admin.Get(ctx, types.NamespacedName{Namespace: ns, Name: provider.TenantQuota}, &q))
			return q.Status.Used.Pods().Value() == 2
		}, 10*time.Second, 50*time.Millisecond)
		err = tenant.Create(ctx, pod("shop.third"))
		refused(t, err, "a third pod for one reservation", "exceeded quota: "+provider.TenantQuota, "pods")
		// A Service inside the cluster.
		require.NoError(t, tenant.Create(ctx, headless(ns, "web")))
	})

	t.Run("refused", func(t *testing.T) {
		// In the agent's tenant namespace, Pod Security "baseline" and the
		// tenant policy both refuse host access; nodeName and tolerations are
		// the policy's alone.
		for _, tc := range podRules {
			p := pod("bad")
			tc.mutate(p)
			err := tenant.Create(ctx, p, client.DryRunAll)
			if tc.psa {
				refused(t, err, tc.name)
			} else {
				refused(t, err, tc.name, byTenantPods, tc.message)
			}
		}
		// The policy alone, where Pod Security is not enforced (an admin
		// removed the label, or runs without the plugin), and for anyone.
		require.NoError(t, c.admin.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "rb-bare",
			Labels: map[string]string{rbv1.TenantLabel: "bare"}}}))
		for _, tc := range podRules {
			p := simplePod("rb-bare", "bad")
			tc.mutate(p)
			refused(t, c.admin.Create(ctx, p, client.DryRunAll), tc.name+" (policy alone)", byTenantPods, tc.message)
		}
		p := pod("placeholder-class")
		p.Spec.PriorityClassName = rbv1.PlaceholderPriorityClass
		refused(t, tenant.Create(ctx, p, client.DryRunAll), "the placeholders' class", byTenantPods, "rb-tenant or none only")
		p.Spec.PriorityClassName = "system-cluster-critical"
		refused(t, tenant.Create(ctx, p, client.DryRunAll), "a system class", byTenantPods)

		for _, tc := range []struct {
			name    string
			mutate  func(*corev1.Service)
			message string
		}{
			{"a NodePort Service", func(s *corev1.Service) { s.Spec.Type = corev1.ServiceTypeNodePort; s.Spec.ClusterIP = "" }, "ClusterIP only"},
			{"a LoadBalancer Service", func(s *corev1.Service) { s.Spec.Type = corev1.ServiceTypeLoadBalancer; s.Spec.ClusterIP = "" }, "ClusterIP only"},
			{"an ExternalName Service", func(s *corev1.Service) {
				s.Spec.Type, s.Spec.ClusterIP, s.Spec.ExternalName = corev1.ServiceTypeExternalName, "", "db.example.org"
			}, "ClusterIP only"},
			{"externalIPs", func(s *corev1.Service) { s.Spec.ClusterIP = ""; s.Spec.ExternalIPs = []string{"203.0.113.7"} }, "externalIPs"},
		} {
			s := headless(ns, "svc")
			tc.mutate(s)
			refused(t, tenant.Create(ctx, s, client.DryRunAll), tc.name, byTenantSvcs, tc.message)
		}

		// Object counts: Services up to the quota's 16 (one exists).
		made := 1
		for i := range 20 {
			if err := tenant.Create(ctx, headless(ns, fmt.Sprintf("svc-%d", i))); err != nil {
				refused(t, err, "a Service beyond the count", "exceeded quota: rb-objects", "services")
				break
			}
			made++
		}
		assert.Equal(t, 16, made, "Services a tenant may have")

		// Nothing outside its namespace, nothing of its namespace's rules.
		_, err := tcs.CoreV1().Secrets(lpNamespace).List(ctx, metav1.ListOptions{})
		refused(t, err, "read the agent's Secrets", byRBAC)
		_, err = tcs.CoreV1().Pods("").List(ctx, metav1.ListOptions{})
		refused(t, err, "list the cluster's pods", byRBAC)
		refused(t, tenant.Create(ctx, simplePod("default", "p"), client.DryRunAll), "create pods elsewhere", byRBAC)
		var q corev1.ResourceQuota
		require.NoError(t, c.admin.Get(ctx, types.NamespacedName{Namespace: ns, Name: provider.TenantQuota}, &q))
		q.Spec.Hard[corev1.ResourceRequestsCPU] = resource.MustParse("64")
		refused(t, tenant.Update(ctx, &q, client.DryRunAll), "raise its quota", byRBAC)
		refused(t, tenant.Delete(ctx, provider.NewTenantLimitRange(ns), client.DryRunAll), "remove its LimitRange", byRBAC)
		refused(t, tenant.Create(ctx, &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "x"},
			RoleRef: rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: provider.TenantClusterRole}}, client.DryRunAll), "bind roles", byRBAC)
	})
}

// podRules are the tenant policy's pod rules, each broken once; psa: Pod
// Security "baseline" refuses it too, first.
var podRules = []struct {
	name    string
	psa     bool
	mutate  func(*corev1.Pod)
	message string
}{
	{"nodeName", false, func(p *corev1.Pod) { p.Spec.NodeName = "paris-node-1" }, "spec.nodeName must be empty"},
	{"hostNetwork", true, func(p *corev1.Pod) { p.Spec.HostNetwork = true }, "network, PID or IPC namespace"},
	{"hostPID", true, func(p *corev1.Pod) { p.Spec.HostPID = true }, "network, PID or IPC namespace"},
	{"hostIPC", true, func(p *corev1.Pod) { p.Spec.HostIPC = true }, "network, PID or IPC namespace"},
	{"privileged", true, func(p *corev1.Pod) {
		p.Spec.Containers[0].SecurityContext = &corev1.SecurityContext{Privileged: ptr.To(true)}
	}, "may not be privileged"},
	{"privileged init container", true, func(p *corev1.Pod) {
		p.Spec.InitContainers = []corev1.Container{{Name: "i", Image: "registry.example/app:1", SecurityContext: &corev1.SecurityContext{Privileged: ptr.To(true)}}}
	}, "may not be privileged"},
	{"hostPath", true, func(p *corev1.Pod) {
		p.Spec.Volumes = []corev1.Volume{{Name: "h", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/"}}}}
	}, "hostPath"},
	{"hostPort", true, func(p *corev1.Pod) {
		p.Spec.Containers[0].Ports = []corev1.ContainerPort{{ContainerPort: 80, HostPort: 80}}
	}, "host ports"},
	{"toleration of every taint", false, func(p *corev1.Pod) {
		p.Spec.Tolerations = []corev1.Toleration{{Operator: corev1.TolerationOpExists}}
	}, "tolerate only taints they name"},
	{"toleration of the control plane", false, func(p *corev1.Pod) {
		p.Spec.Tolerations = []corev1.Toleration{{Key: "node-role.kubernetes.io/control-plane", Operator: corev1.TolerationOpExists}}
	}, "not the control plane's"},
	{"a token of this cluster's ServiceAccount", false, func(p *corev1.Pod) {
		p.Spec.ServiceAccountName = "default"
		p.Spec.Volumes = []corev1.Volume{{Name: "t", VolumeSource: corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{
			Sources: []corev1.VolumeProjection{{ServiceAccountToken: &corev1.ServiceAccountTokenProjection{Path: "token"}}}}}}}
	}, "no token of this cluster's ServiceAccounts"},
}

func headless(ns, name string) *corev1.Service {
	return &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: corev1.ServiceSpec{ClusterIP: corev1.ClusterIPNone, Ports: []corev1.ServicePort{{Port: 80}}}}
}

// recordedGrants records the grants a TenantReconciler sends.
type recordedGrants struct {
	mu  sync.Mutex
	all map[string]api.Grant
}

func (g *recordedGrants) GrantTo(_ context.Context, requester, id string, gr api.Grant) (api.Reservation, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.all == nil {
		g.all = map[string]api.Grant{}
	}
	g.all[requester+"/"+id] = gr
	return api.Reservation{ID: id, Requester: requester}, nil
}

func (g *recordedGrants) last(key string) (api.Grant, bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	gr, ok := g.all[key]
	return gr, ok
}

// startTenantReconciler runs the agent's provider side (tenant reconciler
// and tenant policy) as the agent does, with cfg's identity.
func startTenantReconciler(t *testing.T, cfg *rest.Config, g provider.Granter) {
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{Scheme: testbed.Scheme, Cache: agent.CacheOptions(lpNamespace),
		Metrics: metricsserver.Options{BindAddress: "0"}, HealthProbeBindAddress: "0"})
	require.NoError(t, err)
	policy := &provider.ClusterObjects{Client: mgr.GetClient(), HoldPriority: provider.DefaultHoldPriority}
	require.NoError(t, mgr.Add(policy))
	r := &provider.TenantReconciler{Client: mgr.GetClient(), APIReader: mgr.GetAPIReader(), Broker: g,
		Recorder: mgr.GetEventRecorder("rb-agent"), Namespace: lpNamespace, Endpoint: cfg.Host, CABundle: cfg.CAData,
		TokenTTL: 10 * time.Minute, PolicyReady: policy.Ready}
	require.NoError(t, r.SetupWithManager(mgr))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- mgr.Start(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
}

// startQuotaController runs kube-controller-manager (bin/k8s) with its
// ResourceQuota controller only: without it no quota is enforced.
func startQuotaController(t *testing.T, c *lpCluster) {
	dir, err := testenv.AssetsDir()
	require.NoError(t, err)
	path := filepath.Join(dir, "kube-controller-manager")
	if _, err := os.Stat(path); err != nil {
		t.Fatalf("%s: %v (make envtest-bin builds it)", path, err)
	}
	// The test's own controller, as an admin (kube-controller-manager's
	// own roles are its controllers' ServiceAccounts').
	user, err := c.env.AddUser(envtest.User{Name: "lp-kube-controller-manager", Groups: []string{"system:masters"}}, nil)
	require.NoError(t, err)
	kc, err := user.KubeConfig()
	require.NoError(t, err)
	kubeconfig := filepath.Join(t.TempDir(), "kcm.kubeconfig")
	require.NoError(t, os.WriteFile(kubeconfig, kc, 0o600))
	log, err := os.Create(filepath.Join(t.TempDir(), "kcm.log"))
	require.NoError(t, err)
	cmd := exec.Command(path, "--kubeconfig="+kubeconfig, "--controllers=resourcequota", "--leader-elect=false",
		"--secure-port=0", "--resource-quota-sync-period=5s", "--v=1")
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	require.NoError(t, cmd.Start())
	t.Cleanup(func() {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGTERM)
		_ = cmd.Wait()
		if t.Failed() {
			if b, err := os.ReadFile(log.Name()); err == nil {
				t.Logf("kube-controller-manager:\n%s", tail(string(b), 40))
			}
		}
	})
}

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

// lpDeployment is a Deployment of two pods that nothing schedules here.
func lpDeployment(ns, name string) *appsv1.Deployment {
	labels := map[string]string{"app": name}
	return &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Spec: appsv1.DeploymentSpec{
		Replicas: ptr.To[int32](2), Selector: &metav1.LabelSelector{MatchLabels: labels},
		Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels},
			Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "app", Image: "registry.k8s.io/pause:3.10"}}}}}}
}
