package resourcebroker

import (
	"context"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/apimachinery/pkg/util/validation"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"
	fwk "k8s.io/kube-scheduler/framework"
	"k8s.io/kubernetes/pkg/scheduler/framework"
	"k8s.io/utils/ptr"

	brokerv1alpha1 "github.com/fluidos-project/resource-broker/api/v1alpha1"
	"github.com/fluidos-project/resource-broker/plugins/apis/config"
)

func rl(pairs ...string) v1.ResourceList {
	out := v1.ResourceList{}
	for i := 0; i < len(pairs); i += 2 {
		out[v1.ResourceName(pairs[i])] = resource.MustParse(pairs[i+1])
	}
	return out
}

func assertResources(t *testing.T, want, got v1.ResourceList) {
	t.Helper()
	assert.Len(t, got, len(want), "got %v", got)
	for k, q := range want {
		g, ok := got[k]
		if assert.True(t, ok, "missing %s in %v", k, got) {
			assert.Zero(t, q.Cmp(g), "%s: got %s, want %s", k, g.String(), q.String())
		}
	}
}

func TestReservationResources(t *testing.T) {
	// A best-effort pod still gets a positive reservation (the CRD requires it).
	assertResources(t, rl("cpu", "100m", "memory", "200Mi"), ReservationResources(PodRequests(&v1.Pod{Spec: v1.PodSpec{Containers: []v1.Container{{Name: "c"}}}})))
	// GPUs and ephemeral storage ride along; other resources (hugepages) do not.
	pod := &v1.Pod{Spec: v1.PodSpec{Containers: []v1.Container{
		{Name: "a", Resources: v1.ResourceRequirements{Requests: rl("cpu", "1500m", "memory", "1Gi", "ephemeral-storage", "2Gi", "hugepages-2Mi", "4Mi", "nvidia.com/gpu", "2")}},
		{Name: "b", Resources: v1.ResourceRequirements{Requests: rl("cpu", "500m", "memory", "512Mi")}},
	}}}
	assertResources(t, rl("cpu", "2", "memory", "1536Mi", "ephemeral-storage", "2Gi", "nvidia.com/gpu", "2"), ReservationResources(PodRequests(pod)))
	// Init containers: the larger of the init peak and the running sum.
	pod = &v1.Pod{Spec: v1.PodSpec{
		InitContainers: []v1.Container{{Name: "i", Resources: v1.ResourceRequirements{Requests: rl("cpu", "4", "memory", "100Mi")}}},
		Containers:     []v1.Container{{Name: "c", Resources: v1.ResourceRequirements{Requests: rl("cpu", "1", "memory", "1Gi")}}},
		Overhead:       rl("cpu", "250m", "memory", "10Mi"),
	}}
	assertResources(t, rl("cpu", "4250m", "memory", "1034Mi"), ReservationResources(PodRequests(pod)))
}

func TestReservationName(t *testing.T) {
	pod := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "web-0", UID: "u1"}}
	a, b := ReservationName(pod), ReservationName(pod)
	assert.Equal(t, a, b, "deterministic")
	assert.True(t, strings.HasPrefix(a, "web-0-"))
	assert.NotEqual(t, a, ReservationName(&v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "web-0", UID: "u2"}}), "a pod recreated under the same name gets another reservation")
	long := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: strings.Repeat("a", 240) + "." + strings.Repeat("b", 12), UID: "u3"}}
	n := ReservationName(long)
	assert.LessOrEqual(t, len(n), 253)
	assert.Empty(t, validation.IsDNS1123Subdomain(n), n)
	for _, name := range []string{"short", strings.Repeat("x", 63), strings.Repeat("y", 62) + "-" + strings.Repeat("z", 40)} {
		v := podLabelValue(name)
		assert.Empty(t, validation.IsValidLabelValue(v), "%q -> %q", name, v)
	}
}

func TestNewReservation(t *testing.T) {
	prio := int32(1000)
	pod := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "p", UID: "uid-1"}, Spec: v1.PodSpec{Priority: &prio,
		Containers: []v1.Container{{Name: "c", Resources: v1.ResourceRequirements{Requests: rl("cpu", "3", "memory", "1Gi")}}}}}
	args, err := DecodeArgs(nil)
	require.NoError(t, err)
	r := newReservation(pod, args, map[string]string{v1.LabelTopologyRegion: "eu-west"})
	assert.Equal(t, ReservationName(pod), r.Name)
	assert.Equal(t, map[string]string{v1.LabelTopologyRegion: "eu-west"}, r.Spec.ProviderSelector)
	assert.Equal(t, "ns", r.Namespace)
	assert.Equal(t, "p", r.Labels[brokerv1alpha1.PodLabel])
	assert.Equal(t, "p", r.Spec.PodName)
	assert.Equal(t, int32(1000), r.Spec.Priority)
	assert.Nil(t, r.Spec.Duration, "a lease: the agent asks with its hold time and lease length")
	require.Len(t, r.OwnerReferences, 1)
	o := r.OwnerReferences[0]
	assert.Equal(t, metav1.OwnerReference{APIVersion: "v1", Kind: "Pod", Name: "p", UID: "uid-1", Controller: ptr.To(true), BlockOwnerDeletion: ptr.To(true)}, o)
	assert.Equal(t, types.UID("uid-1"), ownerPodUID(r))
	u, err := toUnstructured(r)
	require.NoError(t, err)
	assert.Equal(t, "broker.fluidos.eu/v1alpha1", u.GetAPIVersion())
	assert.Equal(t, "Reservation", u.GetKind())
}

func TestFitsReservation(t *testing.T) {
	reserved := rl("cpu", "2", "memory", "2Gi", "nvidia.com/gpu", "1")
	ok, _ := fitsReservation(rl("cpu", "2", "memory", "2Gi", "nvidia.com/gpu", "1"), reserved, nil)
	assert.True(t, ok)
	ok, name := fitsReservation(rl("cpu", "1", "memory", "1Gi"), reserved, rl("cpu", "1500m"))
	assert.False(t, ok)
	assert.Equal(t, v1.ResourceCPU, name)
	ok, name = fitsReservation(rl("cpu", "1", "ephemeral-storage", "1Gi"), reserved, nil)
	assert.False(t, ok, "a resource the reservation does not hold")
	assert.Equal(t, v1.ResourceEphemeralStorage, name)
	ok, _ = fitsReservation(rl("cpu", "1", "pods", "1", "hugepages-2Mi", "2Mi"), reserved, nil)
	assert.True(t, ok, "resources a reservation never holds are the node's business")
}

// testPlugin is a plugin with a reservation cache filled by hand (its
// informer is not run) and no scheduler around it.
func testPlugin(t testing.TB, rsvs ...*brokerv1alpha1.Reservation) *ResourceBroker {
	t.Helper()
	s := runtime.NewScheme()
	require.NoError(t, brokerv1alpha1.AddToScheme(s))
	c, err := newReservationCache(dynamicfake.NewSimpleDynamicClient(s))
	require.NoError(t, err)
	for _, r := range rsvs {
		require.NoError(t, c.informer.GetIndexer().Add(r))
	}
	return &ResourceBroker{rsvs: c, nodes: newNodeTracker(), selector: labels.Everything(), excluded: sets.New[string](),
		claims: map[types.UID]claim{}, blocked: map[string]sets.Set[types.UID]{}, told: map[types.UID]string{}}
}

// reservationFor is pod's reservation in phase; with a provider, it names
// the provider's virtual node rb-<provider>, as a bridge does once the node
// can take the pod.
func reservationFor(pod *v1.Pod, phase brokerv1alpha1.ReservationPhase, provider string) *brokerv1alpha1.Reservation {
	r := newReservation(pod, &config.ResourceBrokerArgs{}, nil)
	r.UID = types.UID("rsv-" + string(pod.UID))
	r.Status = brokerv1alpha1.ReservationStatus{Phase: phase, Provider: provider}
	if provider != "" {
		r.Status.VirtualNode = "rb-" + provider
	}
	return r
}

func unstructuredOf(t *testing.T, r *brokerv1alpha1.Reservation) *unstructured.Unstructured {
	t.Helper()
	u, err := toUnstructured(r)
	require.NoError(t, err)
	return u
}

func TestReservationQueueingHint(t *testing.T) {
	pod := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "p", UID: "p1"}}
	other := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "q", UID: "q1"}}
	pl := testPlugin(t)
	logger := klog.Background()
	hint := func(p *v1.Pod, old, new any) fwk.QueueingHint {
		t.Helper()
		h, err := pl.isSchedulableAfterReservationChange(logger, p, old, new)
		require.NoError(t, err)
		return h
	}
	pending := reservationFor(pod, brokerv1alpha1.ReservationPending, "")
	reserved := reservationFor(pod, brokerv1alpha1.ReservationReserved, "paris")
	failed := reservationFor(pod, brokerv1alpha1.ReservationFailed, "")
	pendingAgain := pending.DeepCopy()
	pendingAgain.Status.Attempts = 3

	// The scheduler's dynamic informer hands over unstructured objects.
	assert.Equal(t, fwk.QueueSkip, hint(pod, nil, unstructuredOf(t, pending)), "created Pending: nothing to do yet")
	assert.Equal(t, fwk.Queue, hint(pod, unstructuredOf(t, pending), unstructuredOf(t, reserved)), "turned Reserved, naming its virtual node")
	unnamed := reserved.DeepCopy()
	unnamed.Status.VirtualNode = ""
	assert.Equal(t, fwk.QueueSkip, hint(pod, unstructuredOf(t, pending), unstructuredOf(t, unnamed)), "Reserved, but no virtual node can take the pod yet")
	active := unnamed.DeepCopy()
	active.Status.Phase = brokerv1alpha1.ReservationActive
	assert.Equal(t, fwk.QueueSkip, hint(pod, unstructuredOf(t, unnamed), unstructuredOf(t, active)), "Active, still no virtual node")
	named := active.DeepCopy()
	named.Status.VirtualNode = "rb-paris"
	assert.Equal(t, fwk.Queue, hint(pod, unstructuredOf(t, active), unstructuredOf(t, named)), "its virtual node named")
	assert.Equal(t, fwk.QueueSkip, hint(pod, unstructuredOf(t, named), unstructuredOf(t, reserved)), "no news once named")
	assert.Equal(t, fwk.Queue, hint(pod, unstructuredOf(t, pending), unstructuredOf(t, failed)), "turned Failed: the condition must say why")
	assert.Equal(t, fwk.QueueSkip, hint(pod, unstructuredOf(t, pending), unstructuredOf(t, pendingAgain)), "a retry count is no news")

	// Pending with Reserved=False (the broker lacks capacity; the agent keeps
	// asking): the first refusal, and a new reason, are reported in the
	// pod's condition; the agent's retries every 2s are not news.
	noCapacity := pending.DeepCopy()
	noCapacity.Status.Reason, noCapacity.Status.Attempts = "NoCapacity", 1
	noCapacity.Status.Conditions = []metav1.Condition{{Type: brokerv1alpha1.ConditionReserved, Status: metav1.ConditionFalse,
		Reason: "NoCapacity", Message: "insufficient_cpu=1"}}
	retried := noCapacity.DeepCopy()
	retried.Status.Attempts = 2
	retried.Status.Conditions[0].Message = "insufficient_cpu=2"
	otherReason := retried.DeepCopy()
	otherReason.Status.Conditions[0].Reason = "SelectorMismatch"
	assert.Equal(t, fwk.Queue, hint(pod, unstructuredOf(t, pending), unstructuredOf(t, noCapacity)), "waiting for capacity: say why")
	assert.Equal(t, fwk.QueueSkip, hint(pod, unstructuredOf(t, noCapacity), unstructuredOf(t, retried)), "another attempt, same reason")
	assert.Equal(t, fwk.Queue, hint(pod, unstructuredOf(t, retried), unstructuredOf(t, otherReason)), "a new reason")
	assert.Equal(t, fwk.Queue, hint(pod, unstructuredOf(t, noCapacity), unstructuredOf(t, reserved)), "capacity found")
	assert.False(t, ended(noCapacity), "waiting is not the end: the pod keeps its reservation")
	assert.Contains(t, pl.describe(context.Background(), pod, noCapacity), "(NoCapacity): insufficient_cpu=1")
	assert.Equal(t, fwk.Queue, hint(pod, unstructuredOf(t, reserved), nil), "deleted: the pod may ask again")
	assert.Equal(t, fwk.Queue, hint(pod, cache.DeletedFinalStateUnknown{Obj: unstructuredOf(t, reserved)}, nil))
	assert.Equal(t, fwk.QueueSkip, hint(other, unstructuredOf(t, pending), unstructuredOf(t, reserved)), "another pod's reservation")
	elsewhere := reserved.DeepCopy()
	elsewhere.Namespace = "other"
	assert.Equal(t, fwk.QueueSkip, hint(pod, nil, unstructuredOf(t, elsewhere)))

	// A pod held back by the namespace limit is retried when another reservation ends.
	assert.Equal(t, fwk.QueueSkip, hint(other, unstructuredOf(t, pending), unstructuredOf(t, failed)))
	pl.block(other)
	assert.Equal(t, fwk.Queue, hint(other, unstructuredOf(t, pending), unstructuredOf(t, failed)))
	assert.Equal(t, fwk.Queue, hint(other, unstructuredOf(t, pending), nil))

	// A reservation made by hand for the pod's name counts as the pod's.
	byHand := &brokerv1alpha1.Reservation{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "h"}, Spec: brokerv1alpha1.ReservationSpec{PodName: "p"}}
	byHandReserved := byHand.DeepCopy()
	byHandReserved.Status = brokerv1alpha1.ReservationStatus{Phase: brokerv1alpha1.ReservationActive, Provider: "paris", VirtualNode: "rb-paris"}
	assert.Equal(t, fwk.Queue, hint(pod, unstructuredOf(t, byHand), unstructuredOf(t, byHandReserved)))

	_, err := pl.isSchedulableAfterReservationChange(logger, pod, nil, &v1.Node{})
	assert.Error(t, err, "a wrong object is an error (and the scheduler then queues the pod)")
}

func TestNodeQueueingHint(t *testing.T) {
	pod := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "p", UID: "p1"}}
	waiting := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "w", UID: "w1"}}
	pl := testPlugin(t, reservationFor(pod, brokerv1alpha1.ReservationReserved, "paris"), reservationFor(waiting, brokerv1alpha1.ReservationPending, ""))
	logger := klog.Background()
	virtual := func(provider string) *v1.Node {
		return &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "rb-" + provider, Labels: map[string]string{brokerv1alpha1.ProviderLabel: provider}},
			Spec: v1.NodeSpec{Taints: []v1.Taint{{Key: brokerv1alpha1.VirtualNodeTaint, Effect: v1.TaintEffectNoSchedule}}}}
	}
	hint := func(p *v1.Pod, old, new *v1.Node) fwk.QueueingHint {
		t.Helper()
		var o any
		if old != nil {
			o = old
		}
		h, err := pl.isSchedulableAfterNodeChange(logger, p, o, new)
		require.NoError(t, err)
		return h
	}
	assert.Equal(t, fwk.Queue, hint(pod, nil, virtual("paris")), "the virtual node of the pod's provider")
	assert.Equal(t, fwk.QueueSkip, hint(pod, nil, virtual("berlin")), "another provider's")
	assert.Equal(t, fwk.QueueSkip, hint(waiting, nil, virtual("paris")), "a pod whose reservation is still Pending")

	tainted := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n"}, Spec: v1.NodeSpec{Taints: []v1.Taint{{Key: "dedicated", Value: "gpu", Effect: v1.TaintEffectNoSchedule}}}}
	untainted := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n"}}
	assert.Equal(t, fwk.Queue, hint(pod, tainted, untainted), "the taint that kept the pod off went away")
	assert.Equal(t, fwk.QueueSkip, hint(pod, untainted, tainted))
	assert.Equal(t, fwk.QueueSkip, hint(pod, nil, tainted))
	tolerating := pod.DeepCopy()
	tolerating.Spec.Tolerations = []v1.Toleration{{Key: "dedicated", Operator: v1.TolerationOpExists}}
	assert.Equal(t, fwk.Queue, hint(tolerating, nil, tainted))
}

func TestNodeTracker(t *testing.T) {
	tr := newNodeTracker()
	assert.True(t, tr.plain())
	tr.set(&v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "a"}})
	assert.True(t, tr.plain())
	tr.set(&v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "b"}, Spec: v1.NodeSpec{Taints: []v1.Taint{{Key: "x", Effect: v1.TaintEffectPreferNoSchedule}}}})
	assert.True(t, tr.plain(), "PreferNoSchedule is a scoring matter")
	tr.set(&v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "b"}, Spec: v1.NodeSpec{Taints: []v1.Taint{{Key: "x", Effect: v1.TaintEffectNoExecute}}}})
	assert.False(t, tr.plain())
	tr.remove("b")
	assert.True(t, tr.plain())
	tr.set(&v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "rb-paris", Labels: map[string]string{brokerv1alpha1.ProviderLabel: "paris"}}})
	assert.False(t, tr.plain())
	assert.True(t, tr.isVirtual("rb-paris"))
	tr.set(&v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "rb-paris"}})
	assert.False(t, tr.isVirtual("rb-paris"), "label removed")
	assert.True(t, tr.plain())
}

// TestReservationSeenAhead: a version the scheduler's informer delivered
// (through the hint) before the plugin's is what reads return until the
// plugin's informer catches up.
func TestReservationSeenAhead(t *testing.T) {
	pod := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "p", UID: "p1"}}
	pending := reservationFor(pod, brokerv1alpha1.ReservationPending, "")
	pending.ResourceVersion = "10"
	pl := testPlugin(t, pending)
	reserved := reservationFor(pod, brokerv1alpha1.ReservationReserved, "paris")
	reserved.ResourceVersion = "11"

	h, err := pl.isSchedulableAfterReservationChange(klog.Background(), pod, unstructuredOf(t, pending), unstructuredOf(t, reserved))
	require.NoError(t, err)
	assert.Equal(t, fwk.Queue, h)
	assert.Equal(t, brokerv1alpha1.ReservationReserved, pl.rsvs.forPod(pod).Status.Phase, "the hint's version")

	older := pending.DeepCopy()
	older.ResourceVersion = "9"
	pl.rsvs.observe(older, false)
	assert.Equal(t, brokerv1alpha1.ReservationReserved, pl.rsvs.forPod(pod).Status.Phase, "an older version does not win")

	require.NoError(t, pl.rsvs.informer.GetIndexer().Update(reserved))
	pl.rsvs.caughtUp(reserved, false)
	assert.Empty(t, pl.rsvs.ahead)
	assert.Equal(t, "11", pl.rsvs.forPod(pod).ResourceVersion)

	pl.rsvs.observe(reserved, true)
	assert.Nil(t, pl.rsvs.forPod(pod), "deleted ahead of the informer")
	pl.rsvs.caughtUp(reserved, true)
	assert.Empty(t, pl.rsvs.ahead)
}

func nodeInfo(n *v1.Node, pods ...*v1.Pod) fwk.NodeInfo {
	ni := framework.NewNodeInfo(pods...)
	ni.SetNode(n)
	return ni
}

func sized(name, cpu, memory string, taints ...v1.Taint) *v1.Node {
	l := v1.ResourceList{v1.ResourceCPU: resource.MustParse(cpu), v1.ResourceMemory: resource.MustParse(memory), v1.ResourcePods: resource.MustParse("110")}
	return &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: v1.NodeSpec{Taints: taints}, Status: v1.NodeStatus{Capacity: l, Allocatable: l}}
}

func podRequesting(name, cpu, memory string) *v1.Pod {
	return &v1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name, UID: types.UID(name)}, Spec: v1.PodSpec{Containers: []v1.Container{{Name: "c",
		Resources: v1.ResourceRequirements{Requests: v1.ResourceList{v1.ResourceCPU: resource.MustParse(cpu), v1.ResourceMemory: resource.MustParse(memory)}}}}}}
}

// TestPreFilterNarrowing: who goes where before Filter runs.
func TestPreFilterNarrowing(t *testing.T) {
	ctx := context.Background()
	small := sized("local", "2", "4Gi")
	virtual := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "rb-paris", Labels: map[string]string{brokerv1alpha1.ProviderLabel: "paris"}},
		Spec: v1.NodeSpec{Taints: []v1.Taint{{Key: brokerv1alpha1.VirtualNodeTaint, Effect: v1.TaintEffectNoSchedule}}}}
	fits, big := podRequesting("fits", "1", "1Gi"), podRequesting("big", "3", "1Gi")
	pl := testPlugin(t)
	pl.selector, pl.excluded, pl.worker = labels.Everything(), sets.New[string](), newWorker(nil)
	prefilter := func(pod *v1.Pod, nodes ...fwk.NodeInfo) (*fwk.PreFilterResult, *fwk.Status) {
		return pl.PreFilter(ctx, framework.NewCycleState(), pod, nodes)
	}

	// No reservation, nothing tainted or virtual: Filter is skipped.
	_, st := prefilter(fits, nodeInfo(small))
	assert.True(t, st.IsSkip())
	// The tracker has not seen the virtual node the snapshot has: no skip.
	res, st := prefilter(fits, nodeInfo(small), nodeInfo(virtual))
	assert.True(t, st.IsSuccess())
	assert.Nil(t, res, "all nodes, the Filter keeps the pod off the virtual node")
	// No local room and nothing to preempt: no node at all (ResourceBroker the only rejector).
	res, st = prefilter(big, nodeInfo(small), nodeInfo(virtual))
	require.True(t, st.IsSuccess())
	require.NotNil(t, res)
	assert.Empty(t, res.NodeNames)
	// ... unless a local pod of lower priority could be preempted.
	important := big.DeepCopy()
	important.Spec.Priority = ptr.To(int32(1000))
	res, st = prefilter(important, nodeInfo(small, podRequesting("low", "2", "1Gi")))
	assert.True(t, st.IsSkip(), "the default path (nothing tainted: Filter skipped), where DefaultPreemption may make room")
	assert.Nil(t, res)
	never := v1.PreemptNever
	important.Spec.PreemptionPolicy = &never
	res, _ = prefilter(important, nodeInfo(small, podRequesting("low", "2", "1Gi")))
	require.NotNil(t, res)
	assert.Empty(t, res.NodeNames)
	// A tainted local node is no room for a pod that does not tolerate it,
	// but no lack of resources either: the filters run and say why (no
	// reservation, see TestPostFilterRules).
	dedicated := v1.Taint{Key: "dedicated", Effect: v1.TaintEffectNoSchedule}
	state := framework.NewCycleState()
	res, _ = pl.PreFilter(ctx, state, fits, []fwk.NodeInfo{nodeInfo(sized("tainted", "8", "8Gi", dedicated))})
	assert.Nil(t, res)
	assert.Nil(t, readState(state), "nothing decided: PostFilter reads the filters' statuses")
	// The same when the tainted node is also too small.
	res, _ = prefilter(big, nodeInfo(sized("tainted", "2", "4Gi", dedicated)))
	assert.Nil(t, res)
	// Mixed: a small untainted node lacks resources only: no node at all.
	state = framework.NewCycleState()
	res, _ = pl.PreFilter(ctx, state, big, []fwk.NodeInfo{nodeInfo(small), nodeInfo(sized("tainted", "8", "8Gi", dedicated))})
	require.NotNil(t, res)
	assert.Empty(t, res.NodeNames)
	assert.True(t, readState(state).short)
	// Node affinity: a node the pod may not go to is no lack of resources.
	zoned := big.DeepCopy()
	zoned.Spec.NodeSelector = map[string]string{v1.LabelTopologyZone: "a"}
	res, _ = prefilter(zoned, nodeInfo(small))
	assert.Nil(t, res)
	inZone := sized("local-a", "2", "4Gi")
	inZone.Labels = map[string]string{v1.LabelTopologyZone: "a"}
	res, _ = prefilter(zoned, nodeInfo(small), nodeInfo(inZone))
	require.NotNil(t, res, "local-a is in the pod's zone and too small")
	assert.Empty(t, res.NodeNames)
	// A cordoned node is no lack of resources (unless the pod tolerates it).
	cordoned := sized("cordoned", "2", "4Gi")
	cordoned.Spec.Unschedulable = true
	res, _ = prefilter(big, nodeInfo(cordoned))
	assert.Nil(t, res)
	tolerant := big.DeepCopy()
	tolerant.Spec.Tolerations = []v1.Toleration{{Key: v1.TaintNodeUnschedulable, Operator: v1.TolerationOpExists}}
	res, _ = prefilter(tolerant, nodeInfo(cordoned))
	require.NotNil(t, res)
	assert.Empty(t, res.NodeNames)
	// A pod the bridge cannot carry is left to the filters, whatever the room.
	hostNet := big.DeepCopy()
	hostNet.Spec.HostNetwork = true
	state = framework.NewCycleState()
	res, _ = pl.PreFilter(ctx, state, hostNet, []fwk.NodeInfo{nodeInfo(small)})
	assert.Nil(t, res)
	assert.Contains(t, readState(state).verdict.reason, "hostNetwork")

	// With a reservation that is Pending: the local nodes when one has room, else none.
	require.NoError(t, pl.rsvs.informer.GetIndexer().Add(reservationFor(big, brokerv1alpha1.ReservationPending, "")))
	res, _ = prefilter(big, nodeInfo(small), nodeInfo(virtual))
	require.NotNil(t, res)
	assert.Empty(t, res.NodeNames)
	res, _ = prefilter(big, nodeInfo(small), nodeInfo(sized("grown", "8", "8Gi")), nodeInfo(virtual))
	require.NotNil(t, res)
	assert.Equal(t, sets.New("local", "grown"), res.NodeNames)
}

func TestHasRoom(t *testing.T) {
	pl := testPlugin(t)
	logger := klog.Background()
	hasRoom := func(logger klog.Logger, pod *v1.Pod, requests v1.ResourceList, ni fwk.NodeInfo) bool {
		return pl.admits(logger, pod, requiredAffinity(pod), ni.Node()) && fitsResources(requests, ni)
	}
	node := sized("n", "2", "4Gi")
	assert.True(t, hasRoom(logger, podRequesting("p", "1", "1Gi"), PodRequests(podRequesting("p", "1", "1Gi")), nodeInfo(node, podRequesting("q", "1", "1Gi"))))
	assert.False(t, hasRoom(logger, podRequesting("p", "1500m", "1Gi"), PodRequests(podRequesting("p", "1500m", "1Gi")), nodeInfo(node, podRequesting("q", "1", "1Gi"))), "cpu")
	assert.False(t, hasRoom(logger, podRequesting("p", "1", "4Gi"), PodRequests(podRequesting("p", "1", "4Gi")), nodeInfo(node, podRequesting("q", "1", "1Gi"))), "memory")
	gpu := podRequesting("g", "1", "1Gi")
	gpu.Spec.Containers[0].Resources.Requests[brokerv1alpha1.ResourceGPU] = resource.MustParse("1")
	assert.False(t, hasRoom(logger, gpu, PodRequests(gpu), nodeInfo(node)), "no GPU on the node")
	cordoned := node.DeepCopy()
	cordoned.Spec.Unschedulable = true
	assert.False(t, hasRoom(logger, podRequesting("p", "1", "1Gi"), PodRequests(podRequesting("p", "1", "1Gi")), nodeInfo(cordoned)))
}

func TestPodAndLocalNodeQueueingHints(t *testing.T) {
	waiting := podRequesting("w", "3", "1Gi")
	pl := testPlugin(t, reservationFor(waiting, brokerv1alpha1.ReservationPending, ""))
	pl.nodes.set(&v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "rb-paris", Labels: map[string]string{brokerv1alpha1.ProviderLabel: "paris"}}})
	logger := klog.Background()
	gone := func(node string) *v1.Pod {
		p := podRequesting("gone", "1", "1Gi")
		p.Spec.NodeName = node
		return p
	}
	h, err := pl.isSchedulableAfterPodChange(logger, waiting, gone("local"), nil)
	require.NoError(t, err)
	assert.Equal(t, fwk.Queue, h, "a pod left a local node")
	h, _ = pl.isSchedulableAfterPodChange(logger, waiting, gone("rb-paris"), nil)
	assert.Equal(t, fwk.QueueSkip, h, "a pod left a virtual node: no local room")
	h, _ = pl.isSchedulableAfterPodChange(logger, waiting, podRequesting("unbound", "1", "1Gi"), nil)
	assert.Equal(t, fwk.QueueSkip, h, "an unbound pod frees nothing")

	// A local node that grows enough: Queue; one that grows too little, or only changes labels: Skip.
	before := sized("local", "2", "4Gi")
	h, _ = pl.isSchedulableAfterNodeChange(logger, waiting, before, sized("local", "4", "4Gi"))
	assert.Equal(t, fwk.Queue, h)
	h, _ = pl.isSchedulableAfterNodeChange(logger, waiting, before, sized("local", "2500m", "4Gi"))
	assert.Equal(t, fwk.QueueSkip, h)
	relabelled := before.DeepCopy()
	relabelled.Labels = map[string]string{"zone": "a"}
	h, _ = pl.isSchedulableAfterNodeChange(logger, waiting, before, relabelled)
	assert.Equal(t, fwk.QueueSkip, h)

	// A virtual node that grows: only for the pods whose reservation names it.
	named := podRequesting("n", "1", "1Gi")
	pl2 := testPlugin(t, reservationFor(named, brokerv1alpha1.ReservationActive, "paris"), reservationFor(waiting, brokerv1alpha1.ReservationActive, ""))
	grown := func(cpu string) *v1.Node {
		n := sized("rb-paris", cpu, "64Gi")
		n.Labels = map[string]string{brokerv1alpha1.ProviderLabel: "paris"}
		return n
	}
	h, _ = pl2.isSchedulableAfterNodeChange(logger, named, grown("1"), grown("2"))
	assert.Equal(t, fwk.Queue, h)
	h, _ = pl2.isSchedulableAfterNodeChange(logger, waiting, grown("1"), grown("2"))
	assert.Equal(t, fwk.QueueSkip, h, "Active, but no virtual node named yet: the resize is for others")
}
