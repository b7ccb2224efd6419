package provider_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/kubernetes"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/fluidos-project/resource-broker/agent"
	"github.com/fluidos-project/resource-broker/agent/provider"
	rbv1 "github.com/fluidos-project/resource-broker/api/v1alpha1"
	"github.com/fluidos-project/resource-broker/broker/api"
	"github.com/fluidos-project/resource-broker/internal/kubelet"
	"github.com/fluidos-project/resource-broker/internal/testenv"
)

const agentNamespace = "resource-broker"

var scheme = func() *runtime.Scheme {
	s := runtime.NewScheme()
	_ = clientgoscheme.AddToScheme(s)
	_ = rbv1.AddToScheme(s)
	return s
}()

func TestInstructionName(t *testing.T) {
	assert.Equal(t, "rome.r1", provider.InstructionName("rome", "r1"))
	assert.NotEqual(t, provider.InstructionName("rome", "r1"), provider.InstructionName("oslo", "r1"), "ids are scoped per requester")
	long := strings.Repeat("a", 250)
	a, b := provider.InstructionName("rome", long), provider.InstructionName("oslo", long)
	assert.NotEqual(t, a, b)
	assert.Empty(t, validation.IsDNS1123Subdomain(a), a)
	assert.Equal(t, a, provider.InstructionName("rome", long), "stable")
	assert.NotEqual(t, provider.InstructionName("rome", long), provider.InstructionName("rome", long[:249]+"b"))
	assert.Empty(t, validation.IsDNS1123Subdomain(provider.PlaceholderName(long)))
}

// grants records the grants sent, per "<requester>/<id>".
type grants struct {
	mu  sync.Mutex
	all map[string][]api.Grant
}

func (g *grants) GrantTo(_ context.Context, requester, id string, gr api.Grant) (api.Reservation, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.all == nil {
		g.all = map[string][]api.Grant{}
	}
	g.all[requester+"/"+id] = append(g.all[requester+"/"+id], gr)
	return api.Reservation{ID: id, Requester: requester}, nil
}

func (g *grants) of(key string) []api.Grant {
	g.mu.Lock()
	defer g.mu.Unlock()
	return append([]api.Grant(nil), g.all[key]...)
}

type env struct {
	t   *testing.T
	ctx context.Context
	cfg *rest.Config
	c   client.Client
	cs  kubernetes.Interface
}

func newEnv(t *testing.T) *env {
	cfg := testenv.Start(t, testenv.WithCRDDirectories(testenv.ModulePath(t, "manifests", "crds")))
	c, err := client.New(cfg, client.Options{Scheme: scheme})
	require.NoError(t, err)
	cs, err := kubernetes.NewForConfig(cfg)
	require.NoError(t, err)
	ctx := context.Background()
	require.NoError(t, c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: agentNamespace}}))
	require.NoError(t, c.Create(ctx, provider.NewTenantClusterRole()))
	require.NoError(t, (&provider.ClusterObjects{Client: c, HoldPriority: provider.DefaultHoldPriority}).Ensure(ctx))
	return &env{t: t, ctx: ctx, cfg: cfg, c: c, cs: cs}
}

// start runs a TenantReconciler as the agent does (its cache options).
func (e *env) start(r *provider.TenantReconciler) {
	mgr, err := ctrl.NewManager(e.cfg, ctrl.Options{Scheme: scheme, Cache: agent.CacheOptions(agentNamespace),
		Metrics: metricsserver.Options{BindAddress: "0"}, HealthProbeBindAddress: "0",
		Controller: config.Controller{SkipNameValidation: ptr.To(true)}})
	require.NoError(e.t, err)
	r.Client, r.Recorder, r.Namespace = mgr.GetClient(), mgr.GetEventRecorder("rb-agent"), agentNamespace
	r.Endpoint, r.TokenTTL = e.cfg.Host, 10*time.Minute
	require.NoError(e.t, r.SetupWithManager(mgr))
	ctx, cancel := context.WithCancel(e.ctx)
	done := make(chan error, 1)
	go func() { done <- mgr.Start(ctx) }()
	e.t.Cleanup(func() { cancel(); <-done })
}

func (e *env) instruction(requester, id, cpu, node string) *rbv1.ProviderInstruction {
	pi := provider.InstructionFor(agentNamespace, id, requester, api.Quantities{
		CPU: ptr.To(resource.MustParse(cpu)), Memory: ptr.To(resource.MustParse("1Gi")), GPU: ptr.To(resource.MustParse("1"))}, node)
	require.NoError(e.t, e.c.Create(e.ctx, pi))
	return pi
}

func (e *env) get(pi *rbv1.ProviderInstruction) *rbv1.ProviderInstruction {
	var out rbv1.ProviderInstruction
	if err := e.c.Get(e.ctx, client.ObjectKeyFromObject(pi), &out); err != nil {
		return nil
	}
	return &out
}

// bind does what the scheduler would: binds the pod to node.
func (e *env) bind(ns, name, node string) {
	require.NoError(e.t, e.cs.CoreV1().Pods(ns).Bind(e.ctx, &corev1.Binding{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Target:     corev1.ObjectReference{Kind: "Node", Name: node},
	}, metav1.CreateOptions{}))
}

func (e *env) events(name, reason string) []corev1.Event {
	var list corev1.EventList
	require.NoError(e.t, e.c.List(e.ctx, &list, client.InNamespace(agentNamespace)))
	var out []corev1.Event
	for _, ev := range list.Items {
		if ev.InvolvedObject.Name == name && ev.Reason == reason {
			out = append(out, ev)
		}
	}
	return out
}

func tenantPod(name, id string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "rb-rome", Labels: map[string]string{rbv1.ReservationLabel: id}},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "app", Resources: corev1.ResourceRequirements{
			Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("100m")}}}}},
	}
}

// TestHoldGrantAndEnd: placeholders (class, requests, affinity), grants that
// wait for the placeholder's binding and carry its placement, the timeout
// path, the scoped quota, two requesters sharing an id; then the end: no
// eviction while live (an old expiresAt in the past changes nothing),
// eviction only after the grace, the namespace kept while another
// instruction lives and removed after the last.
func TestHoldGrantAndEnd(t *testing.T) {
	e := newEnv(t)
	for _, n := range []string{"n1", "n2"} {
		_, err := kubelet.ReadyNode(e.ctx, e.cs, n, corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("8"),
			corev1.ResourceMemory: resource.MustParse("16Gi"), "nvidia.com/gpu": resource.MustParse("2")}, nil)
		require.NoError(t, err)
	}
	g := &grants{}
	const grace, holdTimeout = 2 * time.Second, 2 * time.Second
	e.start(&provider.TenantReconciler{Broker: g, Hold: true, PlaceholderImage: "rb.test/pause:3.10",
		HoldTimeout: holdTimeout, EvictionGrace: grace})

	r1 := e.instruction("rome", "r1", "2", "n2")
	oslo := e.instruction("oslo", "r1", "1", "") // the same id, another requester
	assert.NotEqual(t, r1.Name, oslo.Name)

	// The placeholder: rb-placeholder, the reservation's requests, limits
	// for the GPU, preferred affinity to the broker's node, no token.
	var ph corev1.Pod
	require.Eventually(t, func() bool {
		return e.c.Get(e.ctx, types.NamespacedName{Namespace: "rb-rome", Name: provider.PlaceholderName("r1")}, &ph) == nil
	}, 10*time.Second, 20*time.Millisecond)
	assert.Equal(t, rbv1.PlaceholderPriorityClass, ph.Spec.PriorityClassName)
	assert.Equal(t, int32(provider.DefaultHoldPriority), ptr.Deref(ph.Spec.Priority, 0), "admission resolved the class")
	assert.Equal(t, corev1.PreemptNever, ptr.Deref(ph.Spec.PreemptionPolicy, ""))
	assert.Equal(t, "rb.test/pause:3.10", ph.Spec.Containers[0].Image)
	req := ph.Spec.Containers[0].Resources
	assert.Equal(t, "2", ptr.To(req.Requests[corev1.ResourceCPU]).String())
	assert.Equal(t, "1Gi", ptr.To(req.Requests[corev1.ResourceMemory]).String())
	assert.Equal(t, "1", ptr.To(req.Requests["nvidia.com/gpu"]).String())
	assert.Equal(t, corev1.ResourceList{"nvidia.com/gpu": resource.MustParse("1")}, req.Limits)
	assert.False(t, ptr.Deref(ph.Spec.AutomountServiceAccountToken, true))
	assert.Equal(t, "r1", ph.Labels[rbv1.ReservationLabel])
	assert.Equal(t, rbv1.RolePlaceholder, ph.Labels[rbv1.RoleLabel])
	assert.Equal(t, "r1", ph.Annotations[rbv1.ReservationIDAnnotation])
	pref := ph.Spec.Affinity.NodeAffinity.PreferredDuringSchedulingIgnoredDuringExecution
	require.Len(t, pref, 1)
	assert.Equal(t, corev1.NodeSelectorRequirement{Key: corev1.LabelHostname, Operator: corev1.NodeSelectorOpIn, Values: []string{"n2"}},
		pref[0].Preference.MatchExpressions[0])
	assert.Nil(t, ph.Spec.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution)

	// The quota leaves placeholders out.
	var quota corev1.ResourceQuota
	require.NoError(t, e.c.Get(e.ctx, types.NamespacedName{Namespace: "rb-rome", Name: provider.TenantQuota}, &quota))
	assert.Equal(t, provider.QuotaScope, quota.Spec.ScopeSelector)
	assert.Equal(t, "2", ptr.To(quota.Spec.Hard["requests.cpu"]).String())
	assert.Equal(t, "2", ptr.To(quota.Spec.Hard[corev1.ResourcePods]).String(), "two pods for one reservation")
	// The namespace's defaults and object counts (manifests/agent/tenant-namespace.yaml).
	var lr corev1.LimitRange
	require.NoError(t, e.c.Get(e.ctx, types.NamespacedName{Namespace: "rb-rome", Name: "rb-tenant"}, &lr))
	assert.Equal(t, provider.NewTenantLimitRange("rb-rome").Spec, lr.Spec)
	var objects corev1.ResourceQuota
	require.NoError(t, e.c.Get(e.ctx, types.NamespacedName{Namespace: "rb-rome", Name: "rb-objects"}, &objects))
	assert.Equal(t, "0", ptr.To(objects.Spec.Hard["services.nodeports"]).String())
	assert.Equal(t, "rome", objects.Labels[rbv1.TenantLabel])

	// No grant before the placeholder is bound; bound, the grant carries it.
	time.Sleep(300 * time.Millisecond)
	assert.Empty(t, g.of("rome/r1"), "the first grant waits for the placeholder")
	e.bind("rb-rome", ph.Name, "n2")
	require.Eventually(t, func() bool { return len(g.of("rome/r1")) > 0 }, 5*time.Second, 20*time.Millisecond)
	assert.Equal(t, &api.Placement{Node: "n2", PriorityClassName: rbv1.TenantPriorityClass}, g.of("rome/r1")[0].Placement)
	assert.Less(t, len(g.of("rome/r1")), 2)
	require.Eventually(t, func() bool {
		pi := e.get(r1)
		return pi.Status.Enforced && pi.Status.Held && pi.Status.HeldNode == "n2" && pi.Status.PlacementNode == "n2" &&
			meta.IsStatusConditionTrue(pi.Status.Conditions, rbv1.ConditionHeld)
	}, 5*time.Second, 20*time.Millisecond)
	assert.NotEmpty(t, e.events(r1.Name, "Held"))

	// oslo's placeholder is never bound: granted without placement after
	// the timeout (HoldUnplaced); bound later, a new grant carries it.
	require.Eventually(t, func() bool { return len(g.of("oslo/r1")) > 0 }, holdTimeout+5*time.Second, 20*time.Millisecond)
	assert.Nil(t, g.of("oslo/r1")[0].Placement)
	assert.Equal(t, "rb-oslo", g.of("oslo/r1")[0].Namespace)
	require.Eventually(t, func() bool { return len(e.events(oslo.Name, "HoldUnplaced")) > 0 }, 5*time.Second, 20*time.Millisecond)
	e.bind("rb-oslo", provider.PlaceholderName("r1"), "n1")
	require.Eventually(t, func() bool { return len(g.of("oslo/r1")) == 2 }, 5*time.Second, 20*time.Millisecond)
	assert.Equal(t, &api.Placement{Node: "n1", PriorityClassName: rbv1.TenantPriorityClass}, g.of("oslo/r1")[1].Placement)

	// rome's tenant pod comes and preempts the placeholder (deleted here by
	// hand): the placeholder is not made again.
	require.NoError(t, e.c.Create(e.ctx, tenantPod("web-1", "r1")))
	require.Eventually(t, func() bool { return e.get(r1).Status.Superseded }, 5*time.Second, 20*time.Millisecond)
	require.NoError(t, e.c.Delete(e.ctx, &ph))
	e.bind("rb-rome", "web-1", "n2")

	// A second reservation of rome, whose spec says it expired long ago:
	// only the broker's word ends it.
	r2 := e.instruction("rome", "r2", "1", "")
	old := e.get(r2)
	before := old.DeepCopy() // patched, not updated: the agent writes r2's status meanwhile
	old.Spec.ExpiresAt = &metav1.Time{Time: time.Now().Add(-time.Hour)}
	require.NoError(t, e.c.Patch(e.ctx, old, client.MergeFrom(before)))
	require.NoError(t, e.c.Create(e.ctx, tenantPod("web-2", "r2")))
	time.Sleep(time.Second)
	require.NotNil(t, e.get(r2), "a live instruction stays, whatever its old expiresAt")
	assert.False(t, provider.IsEnded(e.get(r2)))
	var pod corev1.Pod
	require.NoError(t, e.c.Get(e.ctx, types.NamespacedName{Namespace: "rb-rome", Name: "web-2"}, &pod))
	assert.True(t, pod.DeletionTimestamp.IsZero())
	var ph1 corev1.Pod
	err := e.c.Get(e.ctx, types.NamespacedName{Namespace: "rb-rome", Name: provider.PlaceholderName("r1")}, &ph1)
	assert.True(t, apierrors.IsNotFound(err), "a superseded placeholder is not recreated: %v", err)

	// r1's lease lapses: marked at once, its pod evicted after the grace.
	ended := time.Now()
	require.NoError(t, provider.MarkEnded(e.ctx, e.c, nil, e.get(r1), provider.EndedLeaseLapsed, "lease lapsed"))
	pi := e.get(r1)
	require.NotNil(t, pi)
	assert.Equal(t, provider.EndedLeaseLapsed, meta.FindStatusCondition(pi.Status.Conditions, rbv1.ConditionEnded).Reason)
	require.NotNil(t, pi.Status.EndedAt)
	gone := func(name string) bool {
		var p corev1.Pod
		err := e.c.Get(e.ctx, types.NamespacedName{Namespace: "rb-rome", Name: name}, &p)
		return apierrors.IsNotFound(err) || !p.DeletionTimestamp.IsZero()
	}
	require.Eventually(t, func() bool { return gone("web-1") }, grace+10*time.Second, 20*time.Millisecond)
	assert.GreaterOrEqual(t, time.Since(ended), grace-100*time.Millisecond, "not before the grace")
	require.Eventually(t, func() bool { return e.get(r1) == nil }, 5*time.Second, 20*time.Millisecond, "the instruction goes")
	evicted := e.events(r1.Name, "Evicted")
	require.NotEmpty(t, evicted)
	assert.Contains(t, evicted[0].Message, "web-1")
	assert.False(t, gone("web-2"), "r2's pod is untouched")
	var ns corev1.Namespace
	require.NoError(t, e.c.Get(e.ctx, types.NamespacedName{Name: "rb-rome"}, &ns))
	assert.True(t, ns.DeletionTimestamp.IsZero(), "kept while r2 lives")

	// r2 released: in its grace the namespace stays; after it, it goes.
	require.NoError(t, provider.MarkEnded(e.ctx, e.c, nil, e.get(r2), provider.EndedReleased, "released"))
	time.Sleep(grace / 2)
	require.NoError(t, e.c.Get(e.ctx, types.NamespacedName{Name: "rb-rome"}, &ns))
	assert.True(t, ns.DeletionTimestamp.IsZero(), "kept while r2's pods have their grace")
	require.Eventually(t, func() bool {
		err := e.c.Get(e.ctx, types.NamespacedName{Name: "rb-rome"}, &ns)
		// envtest runs no namespace controller: a deleted namespace stays Terminating.
		return apierrors.IsNotFound(err) || !ns.DeletionTimestamp.IsZero()
	}, grace+10*time.Second, 20*time.Millisecond, "the last one gone, the namespace goes")
	assert.True(t, gone("web-2"))
	require.NoError(t, e.c.Get(e.ctx, types.NamespacedName{Name: "rb-oslo"}, &ns))
	assert.True(t, ns.DeletionTimestamp.IsZero(), "oslo's tenant is another's")
}

// TestTenantPodPolicy: the API server enforces the admission policy: a
// tenant's ServiceAccount cannot create a placeholder-class pod, may create
// rb-tenant pods in its namespace, and no one creates rb-tenant pods
// outside tenant namespaces.
func TestTenantPodPolicy(t *testing.T) {
	e := newEnv(t)
	require.NoError(t, e.c.Create(e.ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "rb-rome",
		Labels: map[string]string{rbv1.TenantLabel: "rome"}}}))
	require.NoError(t, e.c.Create(e.ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: provider.TenantServiceAccount, Namespace: "rb-rome"}}))
	binding := rbacBinding.DeepCopy() // Create writes into it: the var stays as declared
	require.NoError(t, e.c.Create(e.ctx, binding))
	impersonated := rest.CopyConfig(e.cfg)
	impersonated.Impersonate = rest.ImpersonationConfig{UserName: "system:serviceaccount:rb-rome:rb-tenant",
		Groups: []string{"system:serviceaccounts", "system:serviceaccounts:rb-rome", "system:authenticated"}}
	tenant, err := client.New(impersonated, client.Options{Scheme: scheme})
	require.NoError(t, err)
	pod := func(ns, class string) *corev1.Pod {
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{GenerateName: "p-", Namespace: ns},
			Spec: corev1.PodSpec{PriorityClassName: class, Containers: []corev1.Container{{Name: "c", Image: "app"}}}}
	}
	dry := client.DryRunAll
	// The policy is enforced once the API server has loaded it (a 403
	// before that may be RBAC's, the binding not yet in its cache: the
	// policy's own message tells them apart).
	require.Eventually(t, func() bool {
		err := tenant.Create(e.ctx, pod("rb-rome", rbv1.PlaceholderPriorityClass), dry)
		return apierrors.IsForbidden(err) && strings.Contains(err.Error(), "rb-tenant or none only")
	}, 10*time.Second, 50*time.Millisecond, "a tenant creating a placeholder-class pod is refused")
	err = tenant.Create(e.ctx, pod("rb-rome", rbv1.PlaceholderPriorityClass), dry)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "rb-tenant or none only")
	assert.True(t, apierrors.IsForbidden(tenant.Create(e.ctx, pod("rb-rome", "system-node-critical"), dry)), "nor any other class")
	assert.NoError(t, tenant.Create(e.ctx, pod("rb-rome", rbv1.TenantPriorityClass), dry), "rb-tenant in its namespace")
	assert.NoError(t, tenant.Create(e.ctx, pod("rb-rome", ""), dry), "no class")
	err = e.c.Create(e.ctx, pod("default", rbv1.TenantPriorityClass), dry)
	assert.True(t, apierrors.IsForbidden(err), "rb-tenant outside tenant namespaces, even by an admin: %v", err)
	err = e.c.Create(e.ctx, pod("default", rbv1.PlaceholderPriorityClass), dry)
	assert.True(t, apierrors.IsForbidden(err), "%v", err)
	assert.NoError(t, e.c.Create(e.ctx, pod("rb-rome", rbv1.PlaceholderPriorityClass), dry), "the agent's placeholders")
	assert.NoError(t, e.c.Create(e.ctx, pod("default", ""), dry), "ordinary pods are not concerned")
}

var rbacBinding = rbacv1.RoleBinding{
	ObjectMeta: metav1.ObjectMeta{Name: provider.TenantRoleBinding, Namespace: "rb-rome"},
	RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: provider.TenantClusterRole},
	Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: provider.TenantServiceAccount, Namespace: "rb-rome"}},
}

// TestStuckCopyRequeued: a tenant pod unschedulable for a while, its
// placeholder gone and its node with room (kube-scheduler lost it after a
// preemption, kubernetes/kubernetes#141694) is deleted so that its requester
// makes it anew, with an Event; one its node cannot hold is left alone.
func TestStuckCopyRequeued(t *testing.T) {
	e := newEnv(t)
	_, err := kubelet.ReadyNode(e.ctx, e.cs, "n1", corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("8"),
		corev1.ResourceMemory: resource.MustParse("16Gi"), "nvidia.com/gpu": resource.MustParse("2")}, nil)
	require.NoError(t, err)
	g := &grants{}
	e.start(&provider.TenantReconciler{Broker: g, Hold: true, APIReader: e.c, PlaceholderImage: "rb.test/pause:3.10",
		HoldTimeout: time.Minute, EvictionGrace: time.Minute})
	r1 := e.instruction("rome", "r1", "2", "n1")
	require.Eventually(t, func() bool {
		var ph corev1.Pod
		return e.c.Get(e.ctx, types.NamespacedName{Namespace: "rb-rome", Name: provider.PlaceholderName("r1")}, &ph) == nil
	}, 10*time.Second, 20*time.Millisecond)
	e.bind("rb-rome", provider.PlaceholderName("r1"), "n1")
	require.Eventually(t, func() bool { return e.get(r1).Status.PlacementNode == "n1" }, 5*time.Second, 20*time.Millisecond)

	unschedulable := func(name string, since time.Time) {
		p, err := e.cs.CoreV1().Pods("rb-rome").Get(e.ctx, name, metav1.GetOptions{})
		require.NoError(t, err)
		p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodScheduled, Status: corev1.ConditionFalse,
			Reason: corev1.PodReasonUnschedulable, LastTransitionTime: metav1.NewTime(since)}}
		_, err = e.cs.CoreV1().Pods("rb-rome").UpdateStatus(e.ctx, p, metav1.UpdateOptions{})
		require.NoError(t, err)
	}
	big := tenantPod("big", "r1")
	big.Spec.Containers[0].Resources.Requests[corev1.ResourceCPU] = resource.MustParse("64")
	require.NoError(t, e.c.Create(e.ctx, big))
	require.Eventually(t, func() bool { return e.get(r1).Status.Superseded }, 5*time.Second, 20*time.Millisecond)
	require.NoError(t, e.c.Delete(e.ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "rb-rome", Name: provider.PlaceholderName("r1")}}))
	unschedulable("big", time.Now().Add(-time.Minute))
	stuck := tenantPod("stuck", "r1")
	require.NoError(t, e.c.Create(e.ctx, stuck))
	unschedulable("stuck", time.Now().Add(-time.Minute))

	require.Eventually(t, func() bool {
		var p corev1.Pod
		return apierrors.IsNotFound(e.c.Get(e.ctx, types.NamespacedName{Namespace: "rb-rome", Name: "stuck"}, &p))
	}, 10*time.Second, 20*time.Millisecond, "the lost pod is deleted to be made anew")
	require.Eventually(t, func() bool { return len(e.events(r1.Name, "CopyRequeued")) == 1 }, 5*time.Second, 20*time.Millisecond)
	assert.Contains(t, e.events(r1.Name, "CopyRequeued")[0].Message, "kubernetes/kubernetes#141694")
	time.Sleep(time.Second)
	var p corev1.Pod
	require.NoError(t, e.c.Get(e.ctx, types.NamespacedName{Namespace: "rb-rome", Name: "big"}, &p), "a pod its node cannot hold stays")
	assert.True(t, p.DeletionTimestamp.IsZero())
}

// advertised answers Cluster with fixed labels per cluster.
type advertised map[string]map[string]string

func (a advertised) Cluster(_ context.Context, id string) (api.Cluster, error) {
	return api.Cluster{ClusterID: id, Labels: a[id]}, nil
}

// TestNoHoldForLiqoRequester: a requester that advertises it offloads with
// Liqo (which cannot pin its pods to a held node) gets no placeholder, and
// its grant goes at once, without placement; another requester is held.
func TestNoHoldForLiqoRequester(t *testing.T) {
	e := newEnv(t)
	_, err := kubelet.ReadyNode(e.ctx, e.cs, "n1", corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("8"),
		corev1.ResourceMemory: resource.MustParse("16Gi"), "nvidia.com/gpu": resource.MustParse("2")}, nil)
	require.NoError(t, err)
	g := &grants{}
	e.start(&provider.TenantReconciler{Broker: g, Hold: true, PlaceholderImage: "rb.test/pause:3.10",
		HoldTimeout: time.Minute, EvictionGrace: time.Minute,
		Clusters: advertised{"milan": {rbv1.BridgeLabel: "liqo"}, "rome": {"region": "it"}}})
	e.instruction("milan", "m1", "1", "n1")
	e.instruction("rome", "r1", "1", "n1")
	require.Eventually(t, func() bool { return len(g.of("milan/m1")) > 0 }, 5*time.Second, 20*time.Millisecond,
		"granted at once: nothing to wait for")
	assert.Nil(t, g.of("milan/m1")[0].Placement)
	require.Eventually(t, func() bool {
		var ph corev1.Pod
		return e.c.Get(e.ctx, types.NamespacedName{Namespace: "rb-rome", Name: provider.PlaceholderName("r1")}, &ph) == nil
	}, 5*time.Second, 20*time.Millisecond, "rome pins its pods: held")
	var pods corev1.PodList
	require.NoError(t, e.c.List(e.ctx, &pods, client.InNamespace("rb-milan")))
	assert.Empty(t, pods.Items, "no placeholder for milan")
	assert.Empty(t, g.of("rome/r1"), "rome's first grant waits for its placeholder")
}
