package collector_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	nodev1 "k8s.io/api/node/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/fluidos-project/resource-broker/agent/collector"
	rbv1 "github.com/fluidos-project/resource-broker/api/v1alpha1"
	"github.com/fluidos-project/resource-broker/internal/testenv"
)

// rl builds a ResourceList from pairs: rl("cpu", "1", "memory", "1Gi").
func rl(kv ...string) corev1.ResourceList {
	out := corev1.ResourceList{}
	for i := 0; i < len(kv); i += 2 {
		out[corev1.ResourceName(kv[i])] = resource.MustParse(kv[i+1])
	}
	return out
}

// want is a measurement written by hand.
type want struct {
	capacity, allocatable, allocated corev1.ResourceList
	nodes, pods                      int
}

// equal compares every measured resource (absent in w means zero).
func equal(w want, m collector.Measurement) bool {
	same := func(a, b corev1.ResourceList) bool {
		for _, r := range collector.Resources {
			qa, qb := a[r], b[r]
			if qa.Cmp(qb) != 0 {
				return false
			}
		}
		return true
	}
	return same(w.capacity, m.Capacity) && same(w.allocatable, m.Allocatable) &&
		same(w.allocated, m.Allocated) && w.nodes == m.Nodes && w.pods == m.Pods
}

func describe(m collector.Measurement) string {
	s := func(l corev1.ResourceList) string {
		out := ""
		for _, r := range collector.Resources {
			q := l[r]
			out += string(r) + "=" + q.String() + " "
		}
		return out
	}
	return "capacity: " + s(m.Capacity) + "\nallocatable: " + s(m.Allocatable) + "\nallocated: " + s(m.Allocated) +
		"\nnodes=" + itoa(m.Nodes) + " pods=" + itoa(m.Pods)
}

func itoa(i int) string { return resource.NewQuantity(int64(i), resource.DecimalSI).String() }

// expect waits until the collector measures w.
func expect(t *testing.T, c *collector.Collector, w want, what string) {
	t.Helper()
	var last collector.Measurement
	ok := assertEventually(func() bool { last = c.Measure(); return equal(w, last) }, 10*time.Second)
	require.Truef(t, ok, "%s: measured\n%s\nwant capacity %v allocatable %v allocated %v nodes %d pods %d",
		what, describe(last), w.capacity, w.allocatable, w.allocated, w.nodes, w.pods)
}

func assertEventually(cond func() bool, within time.Duration) bool {
	deadline := time.Now().Add(within)
	for {
		if cond() {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(10 * time.Millisecond)
	}
}

type fixture struct {
	t   *testing.T
	ctx context.Context
	c   client.Client
}

func (f fixture) node(name string, labels map[string]string, ready, unschedulable bool, capacity, allocatable corev1.ResourceList) {
	f.t.Helper()
	status := corev1.ConditionTrue
	if !ready {
		status = corev1.ConditionFalse
	}
	n := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels},
		Spec:       corev1.NodeSpec{Unschedulable: unschedulable},
	}
	require.NoError(f.t, f.c.Create(f.ctx, n))
	n.Status = corev1.NodeStatus{
		Capacity: capacity, Allocatable: allocatable,
		Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: status, Reason: "Test", LastHeartbeatTime: metav1.Now()}},
	}
	require.NoError(f.t, f.c.Status().Update(f.ctx, n))
}

func container(name string, requests corev1.ResourceList) corev1.Container {
	return corev1.Container{Name: name, Image: "busybox", Resources: corev1.ResourceRequirements{Requests: requests}}
}

func (f fixture) pod(ns, name, node string, mutate func(*corev1.Pod), phase corev1.PodPhase) *corev1.Pod {
	f.t.Helper()
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec:       corev1.PodSpec{NodeName: node},
	}
	mutate(p)
	require.NoError(f.t, f.c.Create(f.ctx, p))
	if phase != "" {
		p.Status.Phase = phase
		require.NoError(f.t, f.c.Status().Update(f.ctx, p))
	}
	return p
}

func startManager(t *testing.T, cfg *rest.Config, setup func(ctrl.Manager)) {
	t.Helper()
	scheme := runtime.NewScheme()
	require.NoError(t, clientgoscheme.AddToScheme(scheme))
	require.NoError(t, rbv1.AddToScheme(scheme))
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{Scheme: scheme, Metrics: metricsserver.Options{BindAddress: "0"}})
	require.NoError(t, err)
	setup(mgr)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- mgr.Start(ctx) }()
	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-done)
	})
}

// TestCollectorCountsByHand builds a cluster with every kind of node and pod
// the rules distinguish and checks the totals against numbers computed by
// hand, then changes it and checks each change.
func TestCollectorCountsByHand(t *testing.T) {
	cfg := testenv.Start(t)
	scheme := runtime.NewScheme()
	require.NoError(t, clientgoscheme.AddToScheme(scheme))
	kc, err := client.New(cfg, client.Options{Scheme: scheme})
	require.NoError(t, err)
	ctx := context.Background()
	f := fixture{t: t, ctx: ctx, c: kc}

	// Namespaces: "apps" (local) and "rb-rome" (a tenant namespace: its pods
	// consume rome's reservations, not local capacity).
	require.NoError(t, kc.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "apps"}}))
	require.NoError(t, kc.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "rb-rome", Labels: map[string]string{rbv1.TenantLabel: "rome"}}}))
	// A runtime class with overhead; the RuntimeClass admission plugin
	// copies its overhead into the pods that use it.
	require.NoError(t, kc.Create(ctx, &nodev1.RuntimeClass{
		ObjectMeta: metav1.ObjectMeta{Name: "kata"}, Handler: "kata",
		Overhead: &nodev1.Overhead{PodFixed: rl("cpu", "250m", "memory", "128Mi")},
	}))

	// Nodes. Only n1 and n2 count.
	f.node("n1", nil, true, false,
		rl("cpu", "4", "memory", "8Gi", "ephemeral-storage", "100Gi"),
		rl("cpu", "3800m", "memory", "7Gi", "ephemeral-storage", "90Gi"))
	f.node("n2", nil, true, false,
		rl("cpu", "8", "memory", "16Gi", "nvidia.com/gpu", "2", "ephemeral-storage", "200Gi"),
		rl("cpu", "7500m", "memory", "15Gi", "nvidia.com/gpu", "2", "ephemeral-storage", "180Gi"))
	f.node("n3", nil, false, false, // NotReady
		rl("cpu", "16", "memory", "32Gi", "ephemeral-storage", "100Gi"),
		rl("cpu", "16", "memory", "32Gi", "ephemeral-storage", "100Gi"))
	f.node("n4", nil, true, true, // cordoned
		rl("cpu", "32", "memory", "64Gi"), rl("cpu", "32", "memory", "64Gi"))
	f.node("rb-paris", map[string]string{rbv1.ProviderLabel: "paris"}, true, false, // our virtual node
		rl("cpu", "100", "memory", "100Gi"), rl("cpu", "100", "memory", "100Gi"))
	f.node("liqo-milan", map[string]string{"liqo.io/type": "virtual-node"}, true, false, // Liqo's virtual node
		rl("cpu", "50", "memory", "50Gi"), rl("cpu", "50", "memory", "50Gi"))

	simple := func(cpu string) func(*corev1.Pod) {
		return func(p *corev1.Pod) { p.Spec.Containers = []corev1.Container{container("c", rl("cpu", cpu))} }
	}

	// Pods that count.
	// plain on n1: 500m, 1Gi, 1Gi of ephemeral storage.
	plain := f.pod("apps", "plain", "n1", func(p *corev1.Pod) {
		p.Spec.Containers = []corev1.Container{container("c", rl("cpu", "500m", "memory", "1Gi", "ephemeral-storage", "1Gi"))}
	}, "")
	// init on n1: an init container (2, 512Mi) larger than the container
	// (250m, 256Mi): the pod needs max(init, containers) = 2, 512Mi.
	initPod := f.pod("apps", "init", "n1", func(p *corev1.Pod) {
		p.Spec.InitContainers = []corev1.Container{container("setup", rl("cpu", "2", "memory", "512Mi"))}
		p.Spec.Containers = []corev1.Container{container("c", rl("cpu", "250m", "memory", "256Mi"))}
	}, "")
	// podlevel on n1: pod-level requests (1, 2Gi) replace the containers'
	// (200m, 100Mi): 1, 2Gi.
	f.pod("apps", "podlevel", "n1", func(p *corev1.Pod) {
		p.Spec.Resources = &corev1.ResourceRequirements{Requests: rl("cpu", "1", "memory", "2Gi")}
		p.Spec.Containers = []corev1.Container{container("c", rl("cpu", "200m", "memory", "100Mi"))}
	}, "")
	// sidecar on n2: a sidecar (restartable init container: 100m, 64Mi)
	// started before an init container (1, 128Mi), and a container (300m,
	// 256Mi). While the init container runs: 1 + 100m = 1100m, 128Mi + 64Mi =
	// 192Mi. Afterwards: container + sidecar = 400m, 320Mi. The pod needs
	// the maximum of each: 1100m, 320Mi.
	f.pod("apps", "sidecar", "n2", func(p *corev1.Pod) {
		sidecar := container("proxy", rl("cpu", "100m", "memory", "64Mi"))
		sidecar.RestartPolicy = ptr.To(corev1.ContainerRestartPolicyAlways)
		p.Spec.InitContainers = []corev1.Container{sidecar, container("setup", rl("cpu", "1", "memory", "128Mi"))}
		p.Spec.Containers = []corev1.Container{container("c", rl("cpu", "300m", "memory", "256Mi"))}
	}, "")
	// overhead on n2: a GPU container (1, 1Gi, 1 GPU) plus the runtime
	// class overhead (250m, 128Mi): 1250m, 1152Mi, 1 GPU.
	f.pod("apps", "overhead", "n2", func(p *corev1.Pod) {
		c := container("c", rl("cpu", "1", "memory", "1Gi", "nvidia.com/gpu", "1"))
		c.Resources.Limits = rl("nvidia.com/gpu", "1")
		p.Spec.Containers = []corev1.Container{c}
		p.Spec.RuntimeClassName = ptr.To("kata")
	}, "")

	// Pods that do not count.
	f.pod("apps", "succeeded", "n1", simple("3"), corev1.PodSucceeded) // terminal
	f.pod("apps", "failed", "n2", simple("3"), corev1.PodFailed)       // terminal
	f.pod("apps", "pending", "", simple("5"), "")                      // not bound
	f.pod("apps", "on-paris", "rb-paris", simple("7"), "")             // on our virtual node
	f.pod("apps", "on-milan", "liqo-milan", simple("6"), "")           // on Liqo's virtual node
	f.pod("rb-rome", "guest", "n1", simple("1500m"), "")               // runs on a reservation
	f.pod("apps", "on-n3", "n3", simple("2"), "")                      // on a NotReady node
	f.pod("apps", "on-n4", "n4", simple("1"), "")                      // on a cordoned node

	coll := collector.New(collector.Options{})
	startManager(t, cfg, func(mgr ctrl.Manager) { require.NoError(t, coll.SetupWithManager(mgr)) })
	syncCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	require.True(t, coll.WaitForSync(syncCtx), "collector did not sync")

	// Capacity: n1 + n2 = 4 + 8 = 12 cpu; 8Gi + 16Gi = 24Gi; 2 GPUs (n2);
	// 100Gi + 200Gi = 300Gi storage.
	// Allocatable: 3800m + 7500m = 11300m; 7Gi + 15Gi = 22Gi; 2 GPUs; 90Gi + 180Gi = 270Gi.
	// Allocated: plain + init + podlevel (n1) + sidecar + overhead (n2):
	//   cpu     500m + 2000m + 1000m + 1100m + 1250m = 5850m
	//   memory  1Gi + 512Mi + 2Gi + 320Mi + 1152Mi = 1024+512+2048+320+1152 Mi = 5056Mi
	//   gpu     1 (overhead)
	//   storage 1Gi (plain)
	full := want{
		capacity:    rl("cpu", "12", "memory", "24Gi", "nvidia.com/gpu", "2", "ephemeral-storage", "300Gi"),
		allocatable: rl("cpu", "11300m", "memory", "22Gi", "nvidia.com/gpu", "2", "ephemeral-storage", "270Gi"),
		allocated:   rl("cpu", "5850m", "memory", "5056Mi", "nvidia.com/gpu", "1", "ephemeral-storage", "1Gi"),
		nodes:       2, pods: 5,
	}
	expect(t, coll, full, "initial")
	m := coll.Measure()
	t.Logf("measured:\n%s", describe(m))

	drain := func() {
		select {
		case <-coll.Changed():
		default:
		}
	}
	changedWithin := func(what string) {
		t.Helper()
		select {
		case <-coll.Changed():
		case <-time.After(10 * time.Second):
			t.Fatalf("%s: no change signalled", what)
		}
	}

	// Cordon n2: its capacity and its pods (sidecar, overhead) leave.
	// Left: n1 alone; allocated = plain + init + podlevel = 500m + 2 + 1 = 3500m,
	// 1Gi + 512Mi + 2Gi = 3584Mi, no GPU, 1Gi storage; 3 pods.
	drain()
	var n2 corev1.Node
	require.NoError(t, kc.Get(ctx, client.ObjectKey{Name: "n2"}, &n2))
	n2.Spec.Unschedulable = true
	require.NoError(t, kc.Update(ctx, &n2))
	changedWithin("cordon n2")
	expect(t, coll, want{
		capacity:    rl("cpu", "4", "memory", "8Gi", "ephemeral-storage", "100Gi"),
		allocatable: rl("cpu", "3800m", "memory", "7Gi", "ephemeral-storage", "90Gi"),
		allocated:   rl("cpu", "3500m", "memory", "3584Mi", "ephemeral-storage", "1Gi"),
		nodes:       1, pods: 3,
	}, "n2 cordoned")

	// Uncordon: back to the full numbers.
	require.NoError(t, kc.Get(ctx, client.ObjectKey{Name: "n2"}, &n2))
	n2.Spec.Unschedulable = false
	require.NoError(t, kc.Update(ctx, &n2))
	expect(t, coll, full, "n2 uncordoned")

	// rb-rome stops being a tenant namespace: its pod on n1 (1500m) becomes
	// local usage: 5850m + 1500m = 7350m, 6 pods. Labelled again: back.
	var ns corev1.Namespace
	require.NoError(t, kc.Get(ctx, client.ObjectKey{Name: "rb-rome"}, &ns))
	delete(ns.Labels, rbv1.TenantLabel)
	require.NoError(t, kc.Update(ctx, &ns))
	withGuest := full
	withGuest.allocated = rl("cpu", "7350m", "memory", "5056Mi", "nvidia.com/gpu", "1", "ephemeral-storage", "1Gi")
	withGuest.pods = 6
	expect(t, coll, withGuest, "rb-rome no longer a tenant namespace")
	require.NoError(t, kc.Get(ctx, client.ObjectKey{Name: "rb-rome"}, &ns))
	ns.Labels = map[string]string{rbv1.TenantLabel: "rome"}
	require.NoError(t, kc.Update(ctx, &ns))
	expect(t, coll, full, "rb-rome a tenant namespace again")

	// The same namespace as Liqo marks the namespaces of pods offloaded
	// here (annotation, no label of ours): its pods are a tenant's too.
	require.NoError(t, kc.Get(ctx, client.ObjectKey{Name: "rb-rome"}, &ns))
	ns.Labels = nil
	ns.Annotations = map[string]string{"liqo.io/managed-by-namespace-map": "liqo-tenant-rome/rome"}
	require.NoError(t, kc.Update(ctx, &ns))
	expect(t, coll, full, "rb-rome a Liqo remote namespace")
	require.NoError(t, kc.Get(ctx, client.ObjectKey{Name: "rb-rome"}, &ns))
	ns.Labels, ns.Annotations = map[string]string{rbv1.TenantLabel: "rome"}, nil
	require.NoError(t, kc.Update(ctx, &ns))
	expect(t, coll, full, "rb-rome ours again")

	// plain succeeds: -500m, -1Gi, -1Gi storage: 5350m, 4032Mi, 0 storage, 4 pods.
	plain.Status.Phase = corev1.PodSucceeded
	require.NoError(t, kc.Status().Update(ctx, plain))
	afterPlain := full
	afterPlain.allocated = rl("cpu", "5350m", "memory", "4032Mi", "nvidia.com/gpu", "1")
	afterPlain.pods = 4
	expect(t, coll, afterPlain, "plain succeeded")

	// init is deleted: -2, -512Mi: 3350m, 3520Mi, 3 pods.
	require.NoError(t, kc.Delete(ctx, initPod, client.GracePeriodSeconds(0)))
	afterInit := afterPlain
	afterInit.allocated = rl("cpu", "3350m", "memory", "3520Mi", "nvidia.com/gpu", "1")
	afterInit.pods = 3
	expect(t, coll, afterInit, "init deleted")

	// n3 becomes Ready: +16 cpu, +32Gi, +100Gi storage to capacity and
	// allocatable, and its pod (2 cpu) counts: 5350m, 4 pods, 3 nodes.
	var n3 corev1.Node
	require.NoError(t, kc.Get(ctx, client.ObjectKey{Name: "n3"}, &n3))
	n3.Status.Conditions[0].Status = corev1.ConditionTrue
	require.NoError(t, kc.Status().Update(ctx, &n3))
	expect(t, coll, want{
		capacity:    rl("cpu", "28", "memory", "56Gi", "nvidia.com/gpu", "2", "ephemeral-storage", "400Gi"),
		allocatable: rl("cpu", "27300m", "memory", "54Gi", "nvidia.com/gpu", "2", "ephemeral-storage", "370Gi"),
		allocated:   rl("cpu", "5350m", "memory", "3520Mi", "nvidia.com/gpu", "1"),
		nodes:       3, pods: 4,
	}, "n3 Ready")

	// n1 is deleted: its capacity goes, and so does its pod (podlevel: 1,
	// 2Gi): 4350m, 1472Mi, 3 pods. (The pod stays bound to a node that no
	// longer exists; it would count again if the node returned.)
	require.NoError(t, kc.Delete(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}}))
	expect(t, coll, want{
		capacity:    rl("cpu", "24", "memory", "48Gi", "nvidia.com/gpu", "2", "ephemeral-storage", "300Gi"),
		allocatable: rl("cpu", "23500m", "memory", "47Gi", "nvidia.com/gpu", "2", "ephemeral-storage", "280Gi"),
		allocated:   rl("cpu", "4350m", "memory", "1472Mi", "nvidia.com/gpu", "1"),
		nodes:       2, pods: 3,
	}, "n1 deleted")
}

// TestCollectorNodeSummary: per node, the collector counts every pod bound
// to it, tenant pods included (capped at allocatable), lists the counted
// nodes only, and lists the reservations whose tenant pods are bound to a
// node (the reservation-id annotation, or the label the bridge puts on its
// copies); a tenant pod's arrival, which leaves the totals as they are, is
// signalled as a change.
func TestCollectorNodeSummary(t *testing.T) {
	cfg := testenv.Start(t)
	scheme := runtime.NewScheme()
	require.NoError(t, clientgoscheme.AddToScheme(scheme))
	kc, err := client.New(cfg, client.Options{Scheme: scheme})
	require.NoError(t, err)
	ctx := context.Background()
	f := fixture{t: t, ctx: ctx, c: kc}
	require.NoError(t, kc.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "apps"}}))
	require.NoError(t, kc.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "rb-rome", Labels: map[string]string{rbv1.TenantLabel: "rome"}}}))
	f.node("n1", nil, true, false, rl("cpu", "4", "memory", "8Gi"), rl("cpu", "4", "memory", "8Gi"))
	f.node("n2", nil, true, false, rl("cpu", "2", "memory", "4Gi", "nvidia.com/gpu", "1"), rl("cpu", "2", "memory", "4Gi", "nvidia.com/gpu", "1"))
	f.node("n3", nil, false, false, rl("cpu", "16", "memory", "32Gi"), rl("cpu", "16", "memory", "32Gi")) // NotReady
	withCPU := func(cpu string, annotations, labels map[string]string) func(*corev1.Pod) {
		return func(p *corev1.Pod) {
			p.Annotations, p.Labels = annotations, labels
			p.Spec.Containers = []corev1.Container{container("c", rl("cpu", cpu, "memory", "1Gi"))}
		}
	}
	f.pod("apps", "local", "n1", withCPU("1", nil, nil), "")
	f.pod("rb-rome", "guest-a", "n2", withCPU("1500m", map[string]string{rbv1.ReservationIDAnnotation: "resv-a"}, nil), "")
	f.pod("rb-rome", "guest-b", "n1", withCPU("500m", nil, map[string]string{rbv1.ReservationLabel: "resv-b"}), "")
	f.pod("rb-rome", "guest-c", "n1", withCPU("5", nil, nil), "") // no id; overruns n1 with the others
	f.pod("rb-rome", "guest-d", "n3", withCPU("1", map[string]string{rbv1.ReservationIDAnnotation: "resv-d"}, nil), "")
	f.pod("apps", "not-a-guest", "n2", withCPU("0", map[string]string{rbv1.ReservationIDAnnotation: "forged"}, nil), "")

	coll := collector.New(collector.Options{})
	startManager(t, cfg, func(mgr ctrl.Manager) { require.NoError(t, coll.SetupWithManager(mgr)) })
	syncCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	require.True(t, coll.WaitForSync(syncCtx), "collector did not sync")

	type node struct{ name, allocCPU, usedCPU, usedMem string }
	summary := func(m collector.Measurement) []node {
		var out []node
		for _, n := range m.NodeSummary {
			out = append(out, node{n.Name, n.Allocatable.Cpu().String(), n.Allocated.Cpu().String(), n.Allocated.Memory().String()})
		}
		return out
	}
	var m collector.Measurement
	require.True(t, assertEventually(func() bool { m = coll.Measure(); return m.Pods == 2 && len(m.ReservationsOnNodes) == 3 }, 10*time.Second))
	// n1: local 1 + guest-b 500m + guest-c 5 = 6.5 cpus on 4: capped at 4.
	// n2: guest-a 1500m (not-a-guest requests nothing). n3 does not count.
	require.Equal(t, []node{{"n1", "4", "4", "3Gi"}, {"n2", "2", "1500m", "2Gi"}}, summary(m))
	require.Equal(t, "1", func() string { q := m.NodeSummary[1].Allocatable[rbv1.ResourceGPU]; return q.String() }())
	require.True(t, m.NodeSummaryExact)
	require.Equal(t, []string{"rome/resv-a", "rome/resv-b", "rome/resv-d"}, m.ReservationsOnNodes,
		"tenant pods' ids, scoped by the requester, wherever they are bound")
	require.Zero(t, m.Allocated.Cpu().Cmp(resource.MustParse("1")), "the totals leave tenant pods out")

	// A new tenant pod changes no total, but the node figures and the list.
	select {
	case <-coll.Changed():
	default:
	}
	f.pod("rb-rome", "guest-e", "n2", withCPU("250m", map[string]string{rbv1.ReservationIDAnnotation: "resv-e"}, nil), "")
	select {
	case <-coll.Changed():
	case <-time.After(10 * time.Second):
		t.Fatal("a tenant pod's arrival was not signalled")
	}
	require.True(t, assertEventually(func() bool { m = coll.Measure(); return len(m.ReservationsOnNodes) == 4 }, 10*time.Second))
	require.Equal(t, []node{{"n1", "4", "4", "3Gi"}, {"n2", "2", "1750m", "3Gi"}}, summary(m))
	require.Zero(t, m.Allocated.Cpu().Cmp(resource.MustParse("1")))

	// A placeholder and the tenant pod of one reservation on one node count
	// once, the larger; the placeholder alone lists its reservation.
	placeholder := map[string]string{rbv1.ReservationLabel: "resv-f", rbv1.RoleLabel: rbv1.RolePlaceholder}
	f.pod("rb-rome", "rb-hold-resv-f", "n2", withCPU("200m", map[string]string{rbv1.ReservationIDAnnotation: "resv-f"}, placeholder), "")
	require.True(t, assertEventually(func() bool { m = coll.Measure(); return len(m.ReservationsOnNodes) == 5 }, 10*time.Second))
	require.Equal(t, []node{{"n1", "4", "4", "3Gi"}, {"n2", "2", "1950m", "4Gi"}}, summary(m))
	f.pod("rb-rome", "guest-f", "n2", withCPU("100m", nil, map[string]string{rbv1.ReservationLabel: "resv-f"}), "")
	time.Sleep(500 * time.Millisecond)
	m = coll.Measure()
	require.Equal(t, []node{{"n1", "4", "4", "3Gi"}, {"n2", "2", "1950m", "4Gi"}}, summary(m),
		"the tenant pod (100m, 1Gi) counts within its placeholder (200m, 1Gi)")
	require.Len(t, m.ReservationsOnNodes, 5)
	require.Zero(t, m.Allocated.Cpu().Cmp(resource.MustParse("1")), "neither is local usage")
}
