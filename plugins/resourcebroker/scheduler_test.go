package resourcebroker_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	nodev1 "k8s.io/api/node/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"

	brokerv1alpha1 "github.com/fluidos-project/resource-broker/api/v1alpha1"
	"github.com/fluidos-project/resource-broker/plugins/resourcebroker"
)

// Generous bounds for a loaded 2-core CI machine; the measured figures are logged.
const (
	bindTimeout        = 30 * time.Second
	reservedToBoundMax = 5 * time.Second
)

var controlPlaneTaint = v1.Taint{Key: "node-role.kubernetes.io/control-plane", Effect: v1.TaintEffectNoSchedule}

// localNodes: one worker with 2 CPUs and 4Gi, and a tainted control-plane
// node (the plugin enforces its taint in place of TaintToleration's
// filter); pods that tolerate it fit there only up to 1 CPU.
func localNodes(t *testing.T) {
	setNodes(t,
		nodeSpec{name: "local-1", cpu: "2", memory: "4Gi"},
		nodeSpec{name: "control-plane", cpu: "1", memory: "2Gi", taints: []v1.Taint{controlPlaneTaint}},
	)
}

func TestLocalFitIsBoundLocallyWithoutReservation(t *testing.T) {
	localNodes(t)
	ns := newNamespace(t)
	for i := 0; i < 3; i++ {
		createPod(t, newPod(ns, fmt.Sprintf("fits-%d", i), "500m", "512Mi"))
	}
	for i := 0; i < 3; i++ {
		if node := waitBound(t, ns, fmt.Sprintf("fits-%d", i), bindTimeout); node != "local-1" {
			t.Errorf("fits-%d bound to %s, want local-1 (the control-plane node is tainted)", i, node)
		}
	}
	// Nothing was asked of the broker: PostFilter never ran.
	time.Sleep(300 * time.Millisecond)
	if rs := reservations(t, ns); len(rs) != 0 {
		t.Errorf("reservations were created for pods that fit locally: %v", names(rs))
	}
}

// TestNoFitReservationThenVirtualNode: the main path, from no fit to bound
// on the provider's virtual node.
func TestNoFitReservationThenVirtualNode(t *testing.T) {
	localNodes(t)
	ns := newNamespace(t)
	ctx := context.Background()

	// Effective requests: a sidecar (restartable init container) started
	// before an init container, a main container, a RuntimeClass overhead.
	//   init phase:  setup 3 CPU/1Gi + sidecar 500m/256Mi     = 3500m / 1280Mi
	//   run phase:   main 2 CPU/2Gi  + sidecar 500m/256Mi     = 2500m / 2304Mi
	//   max of both (3500m / 2304Mi) + overhead 100m/64Mi     = 3600m / 2368Mi, 1 GPU
	rc := &nodev1.RuntimeClass{ObjectMeta: metav1.ObjectMeta{Name: "rb-test-" + ns}, Handler: "runc",
		Overhead: &nodev1.Overhead{PodFixed: v1.ResourceList{v1.ResourceCPU: resource.MustParse("100m"), v1.ResourceMemory: resource.MustParse("64Mi")}}}
	if _, err := cs.NodeV1().RuntimeClasses().Create(ctx, rc, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cs.NodeV1().RuntimeClasses().Delete(context.Background(), rc.Name, metav1.DeleteOptions{}) })
	always := v1.ContainerRestartPolicyAlways
	pod := createPod(t, newPod(ns, "big", "2", "2Gi", func(p *v1.Pod) {
		p.Spec.RuntimeClassName = &rc.Name
		p.Spec.Containers[0].Resources.Limits = v1.ResourceList{brokerv1alpha1.ResourceGPU: resource.MustParse("1")}
		p.Spec.InitContainers = []v1.Container{
			{Name: "sidecar", Image: "registry.k8s.io/pause:3.10", RestartPolicy: &always, Resources: v1.ResourceRequirements{Requests: v1.ResourceList{
				v1.ResourceCPU: resource.MustParse("500m"), v1.ResourceMemory: resource.MustParse("256Mi")}}},
			{Name: "setup", Image: "registry.k8s.io/pause:3.10", Resources: v1.ResourceRequirements{Requests: v1.ResourceList{
				v1.ResourceCPU: resource.MustParse("3"), v1.ResourceMemory: resource.MustParse("1Gi")}}},
		}
	}))
	if pod.Spec.Overhead == nil {
		t.Fatalf("the RuntimeClass admission did not set the pod's overhead")
	}

	rsv := waitReservation(t, pod, bindTimeout)
	if want := resourcebroker.ReservationName(pod); rsv.Name != want {
		t.Errorf("reservation name %q, want %q", rsv.Name, want)
	}
	checkSize(t, rsv, "3600m", "2368Mi", "1")
	if rsv.Spec.Duration != nil {
		t.Errorf("duration %v, want none: a lease (the args' reservationDuration is deprecated and ignored)", rsv.Spec.Duration)
	}
	if rsv.Labels[brokerv1alpha1.PodLabel] != pod.Name || rsv.Spec.PodName != pod.Name {
		t.Errorf("label %s=%q, spec.podName %q; want %q", brokerv1alpha1.PodLabel, rsv.Labels[brokerv1alpha1.PodLabel], rsv.Spec.PodName, pod.Name)
	}
	checkOwner(t, rsv, pod)
	waitCondition(t, ns, pod.Name, "waiting for broker reservation "+rsv.Name, bindTimeout)

	// Many more scheduling attempts (every new node is an event the pod's
	// rejectors care about): still exactly one reservation.
	attempts := func() float64 {
		return schedulerCounter(t, "scheduler_schedule_attempts_total", map[string]string{"result": "unschedulable", "profile": rbProfile})
	}
	before := attempts()
	for i := 0; i < 8; i++ {
		createNode(t, nodeSpec{name: fmt.Sprintf("small-%d", i), cpu: "1", memory: "1Gi"})
		time.Sleep(150 * time.Millisecond)
	}
	waitFor(t, bindTimeout, "more scheduling attempts", func() (bool, error) { return attempts()-before >= 5, nil })
	time.Sleep(300 * time.Millisecond)
	if rs := reservations(t, ns); len(rs) != 1 {
		t.Fatalf("after %.0f more unschedulable attempts there are %d reservations, want 1: %v", attempts()-before, len(rs), names(rs))
	}
	t.Logf("%.0f unschedulable attempts after the reservation was made; still one reservation", attempts()-before)

	// The agent's part: Reserved on paris, then the virtual node appears.
	w, err := cs.CoreV1().Pods(ns).Watch(ctx, metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("metadata.name", pod.Name).String()})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	reservedAt := time.Now()
	setStatus(t, rsv, brokerv1alpha1.ReservationStatus{Phase: brokerv1alpha1.ReservationReserved, Provider: "paris", VirtualNode: "rb-paris"})
	// Larger than the reservation, so that only the plugin's Filter (not
	// NodeResourcesFit) can keep another pod off it.
	createNode(t, nodeSpec{name: "rb-paris", cpu: "16", memory: "32Gi", gpu: "4",
		labels: map[string]string{brokerv1alpha1.ProviderLabel: "paris"},
		taints: []v1.Taint{{Key: brokerv1alpha1.VirtualNodeTaint, Effect: v1.TaintEffectNoSchedule}}})
	nodeReadyAt := time.Now()
	boundAt, node := waitBoundWatch(t, w, bindTimeout)
	if node != "rb-paris" {
		t.Fatalf("pod bound to %s, want rb-paris", node)
	}
	latency := boundAt.Sub(reservedAt)
	t.Logf("Reserved -> bound: %s (virtual node ready -> bound: %s)", latency.Round(time.Millisecond), boundAt.Sub(nodeReadyAt).Round(time.Millisecond))
	if latency > reservedToBoundMax {
		t.Errorf("Reserved -> bound took %s, want at most %s", latency, reservedToBoundMax)
	}
	if rs := reservations(t, ns); len(rs) != 1 || rs[0].DeletionTimestamp != nil {
		t.Errorf("after binding to the virtual node: reservations %v, want the one, kept", names(rs))
	}

	// A pod without a reservation (tolerating every taint, ours included,
	// and fitting the virtual node's free capacity) is never bound there.
	other := createPod(t, newPod(ns, "other", "3", "1Gi", func(p *v1.Pod) {
		p.Spec.Tolerations = []v1.Toleration{{Operator: v1.TolerationOpExists}}
	}))
	otherRsv := waitReservation(t, other, bindTimeout)
	c := waitCondition(t, ns, other.Name, "waiting for broker reservation "+otherRsv.Name, bindTimeout)
	// The first attempt's Filter refused the virtual node; later ones keep a
	// pod whose reservation is not usable to local nodes in PreFilter.
	// The scheduler words a PreFilter rejection "didn't satisfy plugin ResourceBroker"
	// or, when it merges the diagnosis, "didn't satisfy plugin(s) [ResourceBroker]".
	if !strings.Contains(c.Message, resourcebroker.ErrReasonVirtualNode) && !strings.Contains(c.Message, "didn't satisfy plugin ResourceBroker") &&
		!strings.Contains(c.Message, "didn't satisfy plugin(s) [ResourceBroker]") {
		t.Errorf("condition of the pod without a usable reservation does not say ResourceBroker kept it off the virtual node: %q", c.Message)
	}
	time.Sleep(time.Second)
	if p := getPod(t, ns, other.Name); p.Spec.NodeName != "" {
		t.Fatalf("pod without a usable reservation bound to %s", p.Spec.NodeName)
	}
	// A reservation on another provider does not open rb-paris either.
	setStatus(t, otherRsv, brokerv1alpha1.ReservationStatus{Phase: brokerv1alpha1.ReservationReserved, Provider: "berlin", VirtualNode: "rb-berlin"})
	waitCondition(t, ns, other.Name, "Reserved on provider berlin", bindTimeout)
	time.Sleep(500 * time.Millisecond)
	if p := getPod(t, ns, other.Name); p.Spec.NodeName != "" {
		t.Fatalf("pod reserved on berlin bound to %s", p.Spec.NodeName)
	}
}

func TestFailedReservationReasonInCondition(t *testing.T) {
	localNodes(t)
	ns := newNamespace(t)
	pod := createPod(t, newPod(ns, "huge", "64", "1Gi"))
	rsv := waitReservation(t, pod, bindTimeout)
	checkSize(t, rsv, "64", "1Gi", "")
	setStatus(t, rsv, brokerv1alpha1.ReservationStatus{Phase: brokerv1alpha1.ReservationFailed, Reason: "NoCapacity",
		Message: "no provider has 64 CPUs free"})
	want := fmt.Sprintf("broker reservation %s failed (NoCapacity): no provider has 64 CPUs free", rsv.Name)
	began := time.Now()
	c := waitCondition(t, ns, pod.Name, want, bindTimeout)
	t.Logf("Failed -> condition updated in %s: %q", time.Since(began).Round(time.Millisecond), c.Message)
	if c.Reason != v1.PodReasonUnschedulable {
		t.Errorf("condition reason %q, want %q", c.Reason, v1.PodReasonUnschedulable)
	}
	time.Sleep(500 * time.Millisecond)
	p := getPod(t, ns, pod.Name)
	if p.Spec.NodeName != "" || p.Status.Phase != v1.PodPending {
		t.Errorf("pod with a failed reservation: node %q, phase %s; want unbound and Pending", p.Spec.NodeName, p.Status.Phase)
	}
	if rs := reservations(t, ns); len(rs) != 1 {
		t.Errorf("a failed reservation must not be replaced on its own: %v", names(rs))
	}
}

// TestWaitingReservationReasonInCondition: a reservation the broker refused
// for lack of capacity stays Pending with Reserved=False while the agent
// keeps asking: the pod says why it waits, the reservation is not
// replaced, the agent's retries do not retry the pod, and once capacity is
// found the pod is bound.
func TestWaitingReservationReasonInCondition(t *testing.T) {
	localNodes(t)
	ns := newNamespace(t)
	pod := createPod(t, newPod(ns, "patient", "64", "1Gi"))
	rsv := waitReservation(t, pod, bindTimeout)
	waiting := func(attempts int32, msg string) brokerv1alpha1.ReservationStatus {
		return brokerv1alpha1.ReservationStatus{Phase: brokerv1alpha1.ReservationPending, Reason: "NoCapacity", Message: msg, Attempts: attempts,
			Conditions: []metav1.Condition{{Type: brokerv1alpha1.ConditionReserved, Status: metav1.ConditionFalse, Reason: "NoCapacity",
				Message: msg, LastTransitionTime: metav1.Now()}}}
	}
	setStatus(t, rsv, waiting(1, "no provider has 64 CPUs free"))
	want := fmt.Sprintf("waiting for broker reservation %s (NoCapacity): no provider has 64 CPUs free", rsv.Name)
	c := waitCondition(t, ns, pod.Name, want, bindTimeout)
	if c.Reason != v1.PodReasonUnschedulable {
		t.Errorf("condition reason %q, want %q", c.Reason, v1.PodReasonUnschedulable)
	}
	setStatus(t, rsv, waiting(2, "no provider has 64 CPUs free (again)"))
	time.Sleep(300 * time.Millisecond)
	if got := getPod(t, ns, pod.Name); got.Spec.NodeName != "" {
		t.Fatalf("waiting pod bound to %s", got.Spec.NodeName)
	}
	if rs := reservations(t, ns); len(rs) != 1 || rs[0].UID != rsv.UID {
		t.Fatalf("a waiting reservation must be kept, not replaced: %v", names(rs))
	}
	setStatus(t, rsv, brokerv1alpha1.ReservationStatus{Phase: brokerv1alpha1.ReservationActive, Provider: "lyon", VirtualNode: "rb-lyon",
		Conditions: []metav1.Condition{{Type: brokerv1alpha1.ConditionReserved, Status: metav1.ConditionTrue, Reason: "Active", LastTransitionTime: metav1.Now()}}})
	createNode(t, nodeSpec{name: "rb-lyon", cpu: "100", memory: "64Gi",
		labels: map[string]string{brokerv1alpha1.ProviderLabel: "lyon"},
		taints: []v1.Taint{{Key: brokerv1alpha1.VirtualNodeTaint, Effect: v1.TaintEffectNoSchedule}}})
	if node := waitBound(t, ns, pod.Name, bindTimeout); node != "rb-lyon" {
		t.Errorf("bound to %s, want rb-lyon", node)
	}
}

func TestLocalCapacityFreedReleasesReservation(t *testing.T) {
	localNodes(t)
	ns := newNamespace(t)
	ctx := context.Background()
	blocker := createPod(t, newPod(ns, "blocker", "1500m", "1Gi"))
	waitBound(t, ns, blocker.Name, bindTimeout)
	pod := createPod(t, newPod(ns, "waiting", "1", "1Gi"))
	rsv := waitReservation(t, pod, bindTimeout)
	waitCondition(t, ns, pod.Name, "waiting for broker reservation "+rsv.Name, bindTimeout)

	zero := int64(0)
	if err := cs.CoreV1().Pods(ns).Delete(ctx, blocker.Name, metav1.DeleteOptions{GracePeriodSeconds: &zero}); err != nil {
		t.Fatal(err)
	}
	if node := waitBound(t, ns, pod.Name, bindTimeout); node != "local-1" {
		t.Fatalf("pod bound to %s, want local-1", node)
	}
	waitFor(t, bindTimeout, "reservation released", func() (bool, error) {
		err := cl.Get(ctx, client.ObjectKeyFromObject(rsv), &brokerv1alpha1.Reservation{})
		return apierrors.IsNotFound(err), client.IgnoreNotFound(err)
	})
	var events v1.EventList
	if err := cl.List(ctx, &events, client.InNamespace(ns)); err == nil {
		found := false
		for _, e := range events.Items {
			found = found || e.Reason == "BrokerReservationReleased"
		}
		if !found {
			t.Logf("no BrokerReservationReleased event (yet)")
		}
	}
}

// TestReservedWithoutVirtualNodeStillLandsLocally: a reservation that is
// Reserved but whose virtual node is not there yet does not pin the pod;
// when local room appears first, the pod goes there and the reservation is
// released.
func TestReservedWithoutVirtualNodeStillLandsLocally(t *testing.T) {
	localNodes(t)
	ns := newNamespace(t)
	pod := createPod(t, newPod(ns, "early", "3", "1Gi"))
	rsv := waitReservation(t, pod, bindTimeout)
	setStatus(t, rsv, brokerv1alpha1.ReservationStatus{Phase: brokerv1alpha1.ReservationReserved, Provider: "rome", VirtualNode: "rb-rome"})
	waitCondition(t, ns, pod.Name, "Reserved on provider rome", bindTimeout)
	createNode(t, nodeSpec{name: "local-big", cpu: "8", memory: "16Gi"})
	if node := waitBound(t, ns, pod.Name, bindTimeout); node != "local-big" {
		t.Fatalf("pod bound to %s, want local-big", node)
	}
	waitFor(t, bindTimeout, "reservation released", func() (bool, error) {
		err := cl.Get(context.Background(), client.ObjectKeyFromObject(rsv), &brokerv1alpha1.Reservation{})
		return apierrors.IsNotFound(err), client.IgnoreNotFound(err)
	})
}

func TestNamespaceLimitAndOptOut(t *testing.T) {
	localNodes(t)
	ns := newNamespace(t)
	var pods []*v1.Pod
	for i := 0; i < maxOutstanding+1; i++ {
		pods = append(pods, createPod(t, newPod(ns, fmt.Sprintf("big-%d", i), "3", "1Gi")))
		if i < maxOutstanding {
			waitReservation(t, pods[i], bindTimeout)
		}
	}
	last := pods[maxOutstanding]
	waitCondition(t, ns, last.Name, "broker reservations outstanding", bindTimeout)
	if rs := reservations(t, ns); len(rs) != maxOutstanding {
		t.Fatalf("%d reservations, want the limit %d: %v", len(rs), maxOutstanding, names(rs))
	}
	// One ends (the broker refused it): the held-back pod gets its own.
	first := waitReservation(t, pods[0], bindTimeout)
	setStatus(t, first, brokerv1alpha1.ReservationStatus{Phase: brokerv1alpha1.ReservationFailed, Reason: "NoCapacity"})
	waitReservation(t, last, bindTimeout)

	// A pod that opts out (selector) or sits in an excluded namespace gets
	// none, and its condition says why.
	optOut := createPod(t, newPod(ns, "opt-out", "3", "1Gi", func(p *v1.Pod) { p.Labels[optOutLabel] = "false" }))
	excludedNS := createNamespace(t, "rb-excluded")
	excluded := createPod(t, newPod(excludedNS, "excluded", "3", "1Gi"))
	for p, why := range map[*v1.Pod]string{
		optOut:   `the pod's labels do not match the ResourceBroker selector "broker.fluidos.eu/offload notin (false)"`,
		excluded: "namespace rb-excluded is excluded (ResourceBroker args excludedNamespaces)",
	} {
		c := waitCondition(t, p.Namespace, p.Name, resourcebroker.NotOffloadedPrefix+why, bindTimeout)
		if !strings.Contains(c.Message, "Insufficient cpu") || strings.Contains(c.Message, "waiting for broker reservation") {
			t.Errorf("%s/%s: condition %q", p.Namespace, p.Name, c.Message)
		}
	}
	time.Sleep(500 * time.Millisecond)
	for _, r := range append(reservations(t, ns), reservations(t, excludedNS)...) {
		if r.Spec.PodName == optOut.Name || r.Spec.PodName == excluded.Name {
			t.Errorf("reservation %s made for a pod that is not eligible", r.Name)
		}
	}
}

func waitBoundWatch(t *testing.T, w watch.Interface, timeout time.Duration) (time.Time, string) {
	t.Helper()
	deadline := time.After(timeout)
	for {
		select {
		case ev, ok := <-w.ResultChan():
			if !ok {
				t.Fatal("pod watch closed")
			}
			if p, ok := ev.Object.(*v1.Pod); ok && p.Spec.NodeName != "" {
				return time.Now(), p.Spec.NodeName
			}
		case <-deadline:
			t.Fatalf("pod not bound within %s", timeout)
		}
	}
}

func checkSize(t *testing.T, r *brokerv1alpha1.Reservation, cpu, memory, gpu string) {
	t.Helper()
	want := v1.ResourceList{v1.ResourceCPU: resource.MustParse(cpu), v1.ResourceMemory: resource.MustParse(memory)}
	if gpu != "" {
		want[brokerv1alpha1.ResourceGPU] = resource.MustParse(gpu)
	}
	if len(r.Spec.Resources) != len(want) {
		t.Errorf("reservation resources %v, want %v", r.Spec.Resources, want)
	}
	for k, q := range want {
		if got, ok := r.Spec.Resources[k]; !ok || got.Cmp(q) != 0 {
			t.Errorf("reservation %s = %v, want %v (all: %v)", k, r.Spec.Resources[k], q.String(), r.Spec.Resources)
		}
	}
}

func checkOwner(t *testing.T, r *brokerv1alpha1.Reservation, pod *v1.Pod) {
	t.Helper()
	if len(r.OwnerReferences) != 1 {
		t.Fatalf("owner references %+v, want one (the pod)", r.OwnerReferences)
	}
	o := r.OwnerReferences[0]
	if o.APIVersion != "v1" || o.Kind != "Pod" || o.Name != pod.Name || o.UID != pod.UID ||
		o.Controller == nil || !*o.Controller || o.BlockOwnerDeletion == nil || !*o.BlockOwnerDeletion {
		t.Errorf("owner reference %+v, want controller and blockOwnerDeletion on v1 Pod %s (uid %s)", o, pod.Name, pod.UID)
	}
}

func names(rs []brokerv1alpha1.Reservation) []string {
	var out []string
	for _, r := range rs {
		out = append(out, fmt.Sprintf("%s(%s)", r.Name, r.Status.Phase))
	}
	return out
}

// TestQueueingHintsAloneRequeue: with the plugin's informer-driven retries
// on changes off (it still retries the pod once when its reservation first
// appears, which makes the plugin one of the pod's rejectors), the
// scheduler's queueing hints (Reservation events through
// its dynamic informer on reservations.v1alpha1.broker.fluidos.eu, Node
// events) still bring the pod back when its reservation turns Reserved and
// its virtual node appears.
func TestQueueingHintsAloneRequeue(t *testing.T) {
	localNodes(t)
	hintsOnly(t)
	ns := newNamespace(t)
	pod := createPod(t, newPod(ns, "hinted", "3", "1Gi"))
	rsv := waitReservation(t, pod, bindTimeout)
	waitCondition(t, ns, pod.Name, "waiting for broker reservation "+rsv.Name, bindTimeout)

	reservedAt := time.Now()
	setStatus(t, rsv, brokerv1alpha1.ReservationStatus{Phase: brokerv1alpha1.ReservationReserved, Provider: "milan", VirtualNode: "rb-milan"})
	// The hint on the Reservation requeues the pod: its condition changes
	// before any node event.
	waitCondition(t, ns, pod.Name, "Reserved on provider milan", bindTimeout)
	t.Logf("Reserved -> condition updated (Reservation hint): %s", time.Since(reservedAt).Round(time.Millisecond))
	nodeAt := time.Now()
	createNode(t, nodeSpec{name: "rb-milan", cpu: "4", memory: "8Gi",
		labels: map[string]string{brokerv1alpha1.ProviderLabel: "milan"},
		taints: []v1.Taint{{Key: brokerv1alpha1.VirtualNodeTaint, Effect: v1.TaintEffectNoSchedule}}})
	if node := waitBound(t, ns, pod.Name, bindTimeout); node != "rb-milan" {
		t.Fatalf("bound to %s, want rb-milan", node)
	}
	t.Logf("virtual node created -> bound (Node hint): %s; Reserved -> bound %s",
		time.Since(nodeAt).Round(time.Millisecond), time.Since(reservedAt).Round(time.Millisecond))
}

// TestNamespaceLimitCountsWaitingPodsOnly: a reservation whose pod is bound
// (capacity in use) no longer counts against maxOutstanding: a workload
// larger than the limit gets all its pods placed, the limit's worth at a
// time, instead of stopping at the limit.
func TestNamespaceLimitCountsWaitingPodsOnly(t *testing.T) {
	localNodes(t)
	ns := newNamespace(t)
	var pods []*v1.Pod
	for i := 0; i < maxOutstanding+1; i++ {
		pods = append(pods, createPod(t, newPod(ns, fmt.Sprintf("big-%d", i), "3", "1Gi")))
		if i < maxOutstanding {
			waitReservation(t, pods[i], bindTimeout)
		}
	}
	last := pods[maxOutstanding]
	waitCondition(t, ns, last.Name, "broker reservations outstanding", bindTimeout)
	// The first one is served: its virtual node appears and it is bound there.
	createNode(t, nodeSpec{name: "rb-lyon", cpu: "8", memory: "8Gi",
		labels: map[string]string{brokerv1alpha1.ProviderLabel: "lyon"},
		taints: []v1.Taint{{Key: brokerv1alpha1.VirtualNodeTaint, Effect: v1.TaintEffectNoSchedule}}})
	setStatus(t, waitReservation(t, pods[0], bindTimeout), brokerv1alpha1.ReservationStatus{Phase: brokerv1alpha1.ReservationActive, Provider: "lyon", VirtualNode: "rb-lyon"})
	if node := waitBound(t, ns, pods[0].Name, bindTimeout); node != "rb-lyon" {
		t.Fatalf("%s bound to %s, want rb-lyon", pods[0].Name, node)
	}
	// Its reservation is in use, not waiting: the held-back pod gets its own.
	waitReservation(t, last, bindTimeout)
	if rs := reservations(t, ns); len(rs) != maxOutstanding+1 {
		t.Errorf("%d reservations, want %d (one in use, %d waiting): %v", len(rs), maxOutstanding+1, maxOutstanding, names(rs))
	}
}
