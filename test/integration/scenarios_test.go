// Package integration runs the resource broker end to end on one machine
// (internal/testbed): redis-server, two rb-broker replicas behind a TCP
// round-robin proxy, three member clusters (rome requests, paris and berlin
// provide) with their rb-agent and rb-scheduler, all real binaries.
// README.md lists the scenarios and what each proves.
package integration

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	rbv1 "github.com/fluidos-project/resource-broker/api/v1alpha1"
	"github.com/fluidos-project/resource-broker/internal/testbed"
)

// TestScenarios starts one bed and runs the scenarios on it in turn; each
// leaves the bed as it found it (no live reservation, every rb:{b}:cluster
// hash as before), which each checks at its end.
func TestScenarios(t *testing.T) {
	began := time.Now()
	bed := testbed.Start(t, testbed.Options{})
	figures.Lock()
	figures.lines = nil
	figures.Unlock()
	figureLine(t, "testbed", "up in %s (%s)", bed.Timings["total"].Round(time.Millisecond), timings(bed))

	runScenarios(t, bed, []scenario{
		{"testbed", testTestbed},
		{"transparent", testTransparent},
		{"release", testRelease},
		{"gpu", testGPU},
		{"nothing-fits", testNothingFits},
		{"priority", testPriority},
		{"broker-killed", testBrokerKilled},
		{"redis-restarted", testRedisRestarted},
		{"stale-provider", testStaleProvider},
	})
	figures.Lock()
	t.Logf("figures (total %s):\n%s", time.Since(began).Round(time.Second), strings.Join(figures.lines, "\n"))
	figures.Unlock()
}

func figureLine(t *testing.T, name, format string, args ...any) {
	line := fmt.Sprintf("%-16s ", name) + fmt.Sprintf(format, args...)
	figures.Lock()
	figures.lines = append(figures.lines, line)
	figures.Unlock()
	t.Log(line)
}

func timings(bed *testbed.Bed) string {
	var parts []string
	for _, k := range []string{"build", "control plane rome", "control plane paris", "control plane berlin", "redis and brokers",
		"agent rome", "scheduler rome", "controllers rome"} {
		if d, ok := bed.Timings[k]; ok {
			parts = append(parts, fmt.Sprintf("%s %s", k, d.Round(time.Millisecond)))
		}
	}
	return strings.Join(parts, ", ")
}

// testTestbed checks the stand-ins the flow relies on in a provider: its own
// scheduler binds a pod to a real node, the kubelet stand-in runs it, the
// agent advertises it as used, and a deletion completes.
func testTestbed(t *testing.T, bed *testbed.Bed) {
	ctx := context.Background()
	paris := bed.Cluster("paris")
	for _, c := range bed.Clusters {
		cl, err := bed.Store.Cluster(ctx, c.Name)
		require.NoError(t, err)
		t.Logf("%s advertised: cpu %dm, memory %d, gpu %d", c.Name, cl.Allocatable.CPU, cl.Allocatable.Memory, cl.Allocatable.GPU)
	}
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "local"},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "main", Image: "registry.k8s.io/pause:3.10",
			Resources: corev1.ResourceRequirements{Requests: requests("1", "1Gi")}}}}}
	created := time.Now()
	require.NoError(t, paris.Client.Create(ctx, pod))
	var running time.Duration
	eventually(t, 30*time.Second, "paris's pod Running on paris-node-1", func() (bool, string) {
		var p corev1.Pod
		if err := paris.Client.Get(ctx, client.ObjectKeyFromObject(pod), &p); err != nil {
			return false, err.Error()
		}
		running = time.Since(created)
		return p.Spec.NodeName == "paris-node-1" && p.Status.Phase == corev1.PodRunning, fmt.Sprintf("node %q phase %q", p.Spec.NodeName, p.Status.Phase)
	})
	eventually(t, 15*time.Second, "paris advertises the pod as used", func() (bool, string) {
		cl, err := bed.Store.Cluster(ctx, "paris")
		return err == nil && cl.Allocated.CPU == 1000, fmt.Sprintf("%+v %v", cl.Allocated, err)
	})
	require.NoError(t, paris.Client.Delete(ctx, pod)) // graceful: the stand-in completes it
	eventually(t, 15*time.Second, "pod gone and paris's usage back to 0", func() (bool, string) {
		err := paris.Client.Get(ctx, client.ObjectKeyFromObject(pod), &corev1.Pod{})
		cl, cerr := bed.Store.Cluster(ctx, "paris")
		return apierrors.IsNotFound(err) && cerr == nil && cl.Allocated.CPU == 0, fmt.Sprintf("%v %+v", err, cl.Allocated)
	})
	figure(t, "local pod in paris created -> Running (paris's scheduler + kubelet stand-in): %s", running.Round(time.Millisecond))
}

// testRelease (scenario 2, and scenario 1 up to the bridge): a Deployment in
// rome whose pods fit nowhere in rome gets one Reservation per pod, decided
// by the broker (cheaper paris while it fits, then berlin) and granted by the
// provider; scaling to zero releases everything, and the broker's capacity
// is back to the starting numbers exactly.
func testRelease(t *testing.T, bed *testbed.Bed) {
	ctx := context.Background()
	rome, paris, berlin := bed.Cluster("rome"), bed.Cluster("paris"), bed.Cluster("berlin")
	base := baseline(t, bed)
	const ns = "shop"
	newNamespace(t, rome, ns)
	tl := watchTimeline(t, rome, ns)

	// 3 CPU pods: none fits rome's 2-CPU node; paris (8 CPU) takes two, berlin the third.
	dep := webDeployment(ns, 3)
	require.NoError(t, rome.Client.Create(ctx, dep))
	items := waitReservations(t, rome, ns, 3, 60*time.Second, "3 Reservations Active",
		func(r *rbv1.Reservation) bool { return r.Status.Phase == rbv1.ReservationActive })
	assert.Equal(t, map[string]int{"paris": 2, "berlin": 1}, countBy(items), "cheaper paris while it fits, then berlin")
	for _, r := range items {
		assert.NotEmpty(t, r.Spec.PodName, "made by rb-scheduler for a pod")
		if assert.Len(t, r.OwnerReferences, 1) {
			assert.Equal(t, "Pod", r.OwnerReferences[0].Kind)
		}
	}
	assertBrokerMatches(t, bed, items)
	pc, err := bed.Store.Cluster(ctx, "paris")
	require.NoError(t, err)
	bc, err := bed.Store.Cluster(ctx, "berlin")
	require.NoError(t, err)
	assert.Equal(t, int64(6000), pc.Reserved.CPU)
	assert.Equal(t, int64(3000), bc.Reserved.CPU)
	require.NoError(t, bed.Store.CheckInvariant(ctx))
	eventually(t, 15*time.Second, "tenants with quotas at paris and berlin", func() (bool, string) {
		p, b := tenantQuotaCPU(t, paris), tenantQuotaCPU(t, berlin)
		return len(providerInstructions(t, paris)) == 2 && len(providerInstructions(t, berlin)) == 1 && p == "6" && b == "3",
			fmt.Sprintf("paris quota %s, berlin quota %s", p, b)
	})
	// Until rb-agent runs the bridge there is no virtual node: the pods wait, and say so.
	for _, r := range items {
		waitPodServed(t, rome, ns, r.Spec.PodName, r.Name, r.Status.Provider, 30*time.Second)
	}
	figure(t, "pod created -> Reservation created: %s", stats(tl.durations("pod", "seen")))
	figure(t, "Reservation created -> Reserved: %s", stats(tl.durations("seen", "reserved")))
	figure(t, "Reservation created -> Active (provider granted): %s", stats(tl.durations("seen", "active")))
	figure(t, "pod created -> Reservation Active: %s", stats(tl.durations("pod", "active")))

	// Scale to zero: pods deleted, their Reservations garbage-collected and
	// released, the tenants removed.
	scaled := time.Now()
	require.NoError(t, rome.Client.Patch(ctx, &appsv1.Deployment{ObjectMeta: dep.ObjectMeta},
		client.RawPatch("application/merge-patch+json", []byte(`{"spec":{"replicas":0}}`))))
	eventually(t, 60*time.Second, "no pod and no Reservation left in rome", func() (bool, string) {
		var pods corev1.PodList
		require.NoError(t, rome.Client.List(ctx, &pods, client.InNamespace(ns)))
		n := len(reservations(t, rome, ns))
		return len(pods.Items) == 0 && n == 0, fmt.Sprintf("%d pods, %d reservations", len(pods.Items), n)
	})
	waitNoLive(t, bed, 30*time.Second)
	released := time.Since(scaled)
	waitTenantDeleted(t, paris, 30*time.Second)
	waitTenantDeleted(t, berlin, 30*time.Second)
	tenantsDeleted := time.Since(scaled)
	waitTenantGone(t, paris, 30*time.Second)
	waitTenantGone(t, berlin, 30*time.Second)
	tenantsGone := time.Since(scaled)
	backToBaseline(t, bed, base, 30*time.Second)
	figure(t, "scaled to 0 -> released at the broker: %s; -> tenant namespaces deleted by the agents: %s; -> gone: %s "+
		"(kube-controller-manager's namespace controller waits 5s before it empties a namespace)",
		released.Round(time.Millisecond), tenantsDeleted.Round(time.Millisecond), tenantsGone.Round(time.Millisecond))
	require.NoError(t, rome.Client.Delete(ctx, dep))
}

// testGPU (scenario 7): a pod asking for nvidia.com/gpu gets its reservation
// only on berlin, the provider that advertises GPUs, although paris is
// cheaper; one asking for more GPUs than exist is refused for lack of GPUs.
func testGPU(t *testing.T, bed *testbed.Bed) {
	ctx := context.Background()
	rome := bed.Cluster("rome")
	base := baseline(t, bed)
	const ns = "ml"
	newNamespace(t, rome, ns)
	for _, p := range []*corev1.Pod{
		brokerPod(ns, "train", requests("3", "4Gi", "1")),
		brokerPod(ns, "infer", requests("3", "4Gi")),
		brokerPod(ns, "train-huge", requests("3", "4Gi", "8")),
	} {
		require.NoError(t, rome.Client.Create(ctx, p))
	}
	provider := map[string]string{}
	items := waitReservations(t, rome, ns, 3, 60*time.Second, "the three pods' reservations decided", func(r *rbv1.Reservation) bool {
		provider[r.Spec.PodName] = r.Status.Provider
		if r.Spec.PodName == "train-huge" {
			return waiting(r)
		}
		return live(r.Status.Phase)
	})
	assert.Equal(t, "berlin", provider["train"], "only berlin has GPUs")
	assert.Equal(t, "paris", provider["infer"], "without a GPU the cheaper paris wins")
	for _, r := range items {
		if r.Spec.PodName == "train-huge" {
			assert.Equal(t, "NoCapacity", r.Status.Reason)
			assert.Contains(t, r.Status.Message, "insufficient_gpu=2", "both providers lack 8 GPUs")
		}
	}
	waitPodCondition(t, rome, ns, "train-huge", 15*time.Second, "(NoCapacity)", "insufficient_gpu")
	bc, err := bed.Store.Cluster(ctx, "berlin")
	require.NoError(t, err)
	pc, err := bed.Store.Cluster(ctx, "paris")
	require.NoError(t, err)
	assert.Equal(t, int64(1), bc.Reserved.GPU)
	assert.Zero(t, pc.Reserved.GPU)
	require.NoError(t, bed.Store.CheckInvariant(ctx))

	require.NoError(t, rome.Client.DeleteAllOf(ctx, &corev1.Pod{}, client.InNamespace(ns), client.GracePeriodSeconds(0)))
	eventually(t, 30*time.Second, "reservations garbage-collected", func() (bool, string) {
		n := len(reservations(t, rome, ns))
		return n == 0, fmt.Sprintf("%d left", n)
	})
	waitTenantGone(t, bed.Cluster("paris"), 30*time.Second)
	waitTenantGone(t, bed.Cluster("berlin"), 30*time.Second)
	backToBaseline(t, bed, base, 30*time.Second)
}

// testNothingFits (scenario 3): pods that fit no cluster stay Pending with
// the broker's reason; when berlin grows (a Node added), the agent's retries
// place them with no manual action.
func testNothingFits(t *testing.T, bed *testbed.Bed) {
	ctx := context.Background()
	rome, berlin := bed.Cluster("rome"), bed.Cluster("berlin")
	base := baseline(t, bed)
	const ns = "batch"
	newNamespace(t, rome, ns)
	for _, name := range []string{"big-1", "big-2"} {
		require.NoError(t, rome.Client.Create(ctx, brokerPod(ns, name, requests("20", "8Gi"))))
	}
	waitReservations(t, rome, ns, 2, 60*time.Second, "both refused", func(r *rbv1.Reservation) bool {
		return waiting(r)
	})
	for _, name := range []string{"big-1", "big-2"} {
		waitPodCondition(t, rome, ns, name, 15*time.Second, "(NoCapacity)", "insufficient_cpu=2")
	}

	grown := time.Now()
	require.NoError(t, berlin.AddNode(ctx, "berlin-node-2", testbed.Resources("48", "192Gi")))
	t.Cleanup(func() { _ = berlin.DeleteNode(context.Background(), "berlin-node-2") })
	var attempts []int32
	items := waitReservations(t, rome, ns, 2, 60*time.Second, "both placed on berlin", func(r *rbv1.Reservation) bool {
		return live(r.Status.Phase) && r.Status.Provider == "berlin"
	})
	placed := time.Since(grown)
	for _, r := range items {
		attempts = append(attempts, r.Status.Attempts)
		waitPodServed(t, rome, ns, r.Spec.PodName, r.Name, "berlin", 30*time.Second)
	}
	assertBrokerMatches(t, bed, items)
	require.NoError(t, bed.Store.CheckInvariant(ctx))
	figure(t, "node added to berlin -> both waiting reservations placed: %s (broker attempts %v; the agent retries refusals with back-off 1s..30s)",
		placed.Round(time.Millisecond), attempts)

	require.NoError(t, rome.Client.DeleteAllOf(ctx, &corev1.Pod{}, client.InNamespace(ns), client.GracePeriodSeconds(0)))
	waitNoLive(t, bed, 30*time.Second)
	waitTenantGone(t, berlin, 30*time.Second)
	require.NoError(t, berlin.DeleteNode(ctx, "berlin-node-2"))
	backToBaseline(t, bed, base, 30*time.Second)
}

// testPriority (scenario 8): with limited remote capacity, a higher-priority
// reservation is served first. Both providers are full; a priority-0 request
// starts waiting, then a priority-1000 one. When berlin frees room for only
// one of them, the broker notifies the waiting requests (no back-off timer on
// the path) and lets the priority-1000 one take it, even though the
// priority-0 one has waited longer and retries too.
func testPriority(t *testing.T, bed *testbed.Bed) {
	ctx := context.Background()
	rome := bed.Cluster("rome")
	base := baseline(t, bed)
	const ns = "prio"
	newNamespace(t, rome, ns)
	pin := func(r *rbv1.Reservation, region string) *rbv1.Reservation {
		r.Spec.ProviderSelector = map[string]string{"region": region}
		return r
	}
	// Fill both providers.
	require.NoError(t, rome.Client.Create(ctx, pin(reservation(ns, "fill-paris", "8", "1Gi"), "eu-west")))
	require.NoError(t, rome.Client.Create(ctx, pin(reservation(ns, "fill-berlin", "16", "1Gi"), "eu-central")))
	for _, n := range []string{"fill-paris", "fill-berlin"} {
		waitReservation(t, rome, ns, n, 30*time.Second, "live", func(r *rbv1.Reservation) bool { return live(r.Status.Phase) })
	}
	// Two requests wait, each for 12 CPU: the priority-0 one first.
	early := reservation(ns, "low-early", "12", "1Gi")
	require.NoError(t, rome.Client.Create(ctx, early))
	waitReservation(t, rome, ns, "low-early", 30*time.Second, "refused", waiting)
	high := reservation(ns, "high", "12", "1Gi")
	high.Spec.Priority = 1000
	require.NoError(t, rome.Client.Create(ctx, high))
	waitReservation(t, rome, ns, "high", 30*time.Second, "refused", waiting)
	eventually(t, 10*time.Second, "both requests on the broker's waiting list", func() (bool, string) {
		members, err := bed.RDB.ZRange(ctx, bed.Store.Key("waiting"), 0, -1).Result()
		return err == nil && len(members) == 2, fmt.Sprintf("%v %v", members, err)
	})
	e := waitReservation(t, rome, ns, "low-early", time.Second, "read", func(*rbv1.Reservation) bool { return true })
	earlyAttempts := e.Status.Attempts

	// berlin frees 16 CPU: room for one of the two.
	freed := time.Now()
	require.NoError(t, rome.Client.Delete(ctx, reservation(ns, "fill-berlin", "16", "1Gi")))
	h := waitReservation(t, rome, ns, "high", 10*time.Second, "live", func(r *rbv1.Reservation) bool { return live(r.Status.Phase) })
	highTook := time.Since(freed)
	assert.Equal(t, "berlin", h.Status.Provider)
	e = waitReservation(t, rome, ns, "low-early", 10*time.Second, "retried after the release", func(r *rbv1.Reservation) bool {
		return r.Status.Attempts > earlyAttempts
	})
	assert.True(t, waiting(e), "the priority-0 request did not take the capacity: %s %s", e.Status.Phase, e.Status.Reason)
	assert.Equal(t, "NoCapacity", e.Status.Reason)
	assert.Less(t, highTook, 5*time.Second, "the waiting request is notified, not left to its back-off")

	// The audit shows why: the decision for high, and low-early refused or deferred behind it.
	entries, err := bed.Audit(ctx)
	require.NoError(t, err)
	var earlyOutcomes []string
	for _, a := range entries {
		ts, _ := strconv.ParseInt(a.Fields["ts_ms"], 10, 64)
		if a.Fields["reservation"] == string(e.UID) && ts >= freed.UnixMilli()-5 {
			earlyOutcomes = append(earlyOutcomes, a.Fields["outcome"])
		}
	}
	assert.NotEmpty(t, earlyOutcomes, "low-early was notified and retried")
	figure(t, "capacity freed -> priority-1000 request reserved on berlin in %s; priority-0 request (waiting longer) retried %d time(s) after the release: %v",
		highTook.Round(time.Millisecond), e.Status.Attempts-earlyAttempts, earlyOutcomes)

	require.NoError(t, rome.Client.DeleteAllOf(ctx, &rbv1.Reservation{}, client.InNamespace(ns)))
	eventually(t, 30*time.Second, "reservations gone", func() (bool, string) {
		n := len(reservations(t, rome, ns))
		return n == 0, fmt.Sprintf("%d left", n)
	})
	waitTenantGone(t, bed.Cluster("paris"), 30*time.Second)
	waitTenantGone(t, bed.Cluster("berlin"), 30*time.Second)
	backToBaseline(t, bed, base, 30*time.Second)
}

// burst creates n small Reservations in ns from 8 goroutines, calling
// during(k) from a watcher goroutine each time the broker holds k live
// reservations of rome, until it returns true.
func burst(t *testing.T, bed *testbed.Bed, ns string, n int, during func(reservedAtBroker int64) bool) *timeline {
	t.Helper()
	rome := bed.Cluster("rome")
	tl := watchTimeline(t, rome, ns)
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := next.Add(1)
				if i > int64(n) {
					return
				}
				r := reservation(ns, fmt.Sprintf("r-%03d", i), "100m", "128Mi")
				r.Spec.Duration = &metav1.Duration{Duration: 10 * time.Minute}
				at := time.Now()
				if err := rome.Client.Create(context.Background(), r); err != nil {
					errs <- err
					return
				}
				tl.createdAt(r.Name, at)
			}
		}()
	}
	if during != nil {
		key := bed.Store.Key("by-requester:rome")
		eventually(t, 120*time.Second, "the fault injected during the burst", func() (bool, string) {
			k, err := bed.RDB.SCard(context.Background(), key).Result()
			if err != nil {
				return false, err.Error()
			}
			return during(k), fmt.Sprintf("%d reserved", k)
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	return tl
}

// checkBurst waits until every Reservation of the burst is live and checks
// that the broker holds exactly one reservation per object, each decided
// once, the provider side has one instruction per reservation, and the
// invariant holds.
func checkBurst(t *testing.T, bed *testbed.Bed, ns string, n int) []rbv1.Reservation {
	t.Helper()
	ctx := context.Background()
	items := waitReservations(t, bed.Cluster("rome"), ns, n, 180*time.Second, fmt.Sprintf("all %d reserved", n),
		func(r *rbv1.Reservation) bool { return live(r.Status.Phase) })
	assertBrokerMatches(t, bed, items)
	ids := map[string]bool{}
	for _, r := range items {
		ids[string(r.UID)] = true
	}
	for id, k := range reservedAuditCount(t, bed, ids) {
		assert.Equal(t, 1, k, "reservation %s decided %d times", id, k)
	}
	var sumCPU, sumMem int64
	for _, p := range []string{"paris", "berlin"} {
		c, err := bed.Store.Cluster(ctx, p)
		require.NoError(t, err)
		sumCPU += c.Reserved.CPU
		sumMem += c.Reserved.Memory
	}
	assert.Equal(t, int64(n)*100, sumCPU, "reserved millicores = n x 100m")
	assert.Equal(t, int64(n)*128<<20, sumMem, "reserved bytes = n x 128Mi")
	require.NoError(t, bed.Store.CheckInvariant(ctx))
	eventually(t, 60*time.Second, "one ProviderInstruction per reservation", func() (bool, string) {
		var names []string
		for _, p := range []string{"paris", "berlin"} {
			for _, pi := range providerInstructions(t, bed.Cluster(p)) {
				names = append(names, pi.Spec.ReservationID)
			}
		}
		extra := 0
		for _, name := range names {
			if !ids[name] {
				extra++
			}
		}
		return len(names) == n && extra == 0, fmt.Sprintf("%d instructions (%d unknown), want %d", len(names), extra, n)
	})
	return items
}

func cleanupBurst(t *testing.T, bed *testbed.Bed, ns string, base testbed.Capacity) {
	t.Helper()
	rome := bed.Cluster("rome")
	began := time.Now()
	require.NoError(t, rome.Client.DeleteAllOf(context.Background(), &rbv1.Reservation{}, client.InNamespace(ns)))
	eventually(t, 120*time.Second, "every Reservation released and gone", func() (bool, string) {
		n := len(reservations(t, rome, ns))
		return n == 0, fmt.Sprintf("%d left", n)
	})
	waitTenantGone(t, bed.Cluster("paris"), 60*time.Second)
	waitTenantGone(t, bed.Cluster("berlin"), 60*time.Second)
	backToBaseline(t, bed, base, 60*time.Second)
	figure(t, "deleting all -> broker back to baseline, tenants gone: %s", time.Since(began).Round(time.Millisecond))
}

// testBrokerKilled (scenario 5): one of the two broker replicas is killed
// (SIGKILL) during a burst of 200 reservations. The agents' connections to
// it break; their retries reach the other replica through the proxy, with
// the same ids: no reservation is lost or doubled, and the invariant holds.
func testBrokerKilled(t *testing.T, bed *testbed.Bed) {
	require.GreaterOrEqual(t, len(bed.Brokers), 2, "needs two broker replicas")
	ctx := context.Background()
	base := baseline(t, bed)
	const ns, n = "burst", 200
	rome := bed.Cluster("rome")
	newNamespace(t, rome, ns)
	var victim *testbed.Broker
	var killedAt time.Time
	var reservedAtKill int64
	var romeConns int
	began := time.Now()
	tl := burst(t, bed, ns, n, func(k int64) bool {
		if k < 40 {
			return false
		}
		// Kill the replica rome's agent is talking to, or the fault proves nothing.
		serving, err := bed.ReplicasServing(rome.Agent)
		require.NoError(t, err)
		for br, c := range serving {
			if c > romeConns {
				victim, romeConns = br, c
			}
		}
		if victim == nil {
			require.Less(t, k, int64(n*3/4), "rome's agent holds no connection to any broker replica")
			return false
		}
		killedAt, reservedAtKill = time.Now(), k
		require.NoError(t, victim.Kill())
		return true
	})
	items := checkBurst(t, bed, ns, n)
	all := time.Since(began)
	require.NotEmpty(t, items)
	assert.False(t, victim.Running())
	figure(t, "%d reservations; %s (holding %d of rome's agent's connections) killed (SIGKILL) at %d reserved, %s into the burst; all reserved after %s",
		n, victim.Name, romeConns, reservedAtKill, killedAt.Sub(began).Round(time.Millisecond), all.Round(time.Millisecond))
	figure(t, "Reservation created -> Reserved: %s", stats(tl.durations("seen", "reserved")))
	conns := map[string]int{}
	for addr, k := range bed.Proxy.Connections() {
		for _, br := range bed.Brokers {
			if br.Addr == addr {
				conns[br.Name] = k
			}
		}
	}
	figure(t, "connections through the proxy per replica, whole run so far: %v", conns)
	require.NoError(t, victim.Restart(ctx))
	cleanupBurst(t, bed, ns, base)
}

// testRedisRestarted (scenario 6): redis-server is killed (SIGKILL) and
// started again on its append-only file during a burst. The brokers
// reconnect and reload their scripts (/readyz), the agents retry with the
// same ids: the reservations made before the crash are still there and none
// is lost or doubled.
func testRedisRestarted(t *testing.T, bed *testbed.Bed) {
	ctx := context.Background()
	base := baseline(t, bed)
	const ns, n = "redis", 100
	newNamespace(t, bed.Cluster("rome"), ns)
	var before []string
	var down time.Duration
	began := time.Now()
	ready := make(chan time.Duration, len(bed.Brokers))
	tl := burst(t, bed, ns, n, func(k int64) bool {
		if k < 30 {
			return false
		}
		var err error
		before, err = bed.RDB.SMembers(ctx, bed.Store.Key("by-requester:rome")).Result()
		require.NoError(t, err)
		t0 := time.Now()
		require.NoError(t, bed.Redis.Restart(ctx))
		down = time.Since(t0)
		restarted := time.Now()
		// Probe /readyz as a kubelet would (it also reloads the scripts).
		for _, br := range bed.Brokers {
			go func() {
				if br.WaitReady(ctx) == nil {
					ready <- time.Since(restarted)
				} else {
					ready <- -1
				}
			}()
		}
		return true
	})
	checkBurst(t, bed, ns, n)
	all := time.Since(began)
	for _, id := range before {
		requester, rid, _ := strings.Cut(id, "/") // by-requester holds qualified ids
		r, err := bed.Store.Reservation(ctx, requester, rid)
		if assert.NoError(t, err, "reservation %s made before the crash", id) {
			assert.True(t, r.Live(), "reservation %s made before the crash is %s", id, r.Phase)
		}
	}
	var readyIn time.Duration
	for range bed.Brokers {
		d := <-ready
		require.GreaterOrEqual(t, d, time.Duration(0), "a broker replica did not become ready again")
		readyIn = max(readyIn, d)
	}
	require.NoError(t, bed.Store.Ready(ctx), "the scripts are loaded again")
	figure(t, "%d reservations, Redis killed at %d reserved and back in %s (AOF loaded); all reserved after %s; both replicas ready (/readyz) %s after the restart",
		n, len(before), down.Round(time.Millisecond), all.Round(time.Millisecond), readyIn.Round(time.Millisecond))
	figure(t, "Reservation created -> Reserved: %s", stats(tl.durations("seen", "reserved")))
	cleanupBurst(t, bed, ns, base)
}

// testStaleProvider (scenario 4): paris's agent stops; within the stale
// threshold paris is no longer a candidate (new reservations go to berlin),
// and the reservation it held expires at its duration. When the agent comes
// back, it resyncs and removes what the expired reservation left.
func testStaleProvider(t *testing.T, bed *testbed.Bed) {
	ctx := context.Background()
	rome, paris := bed.Cluster("rome"), bed.Cluster("paris")
	base := baseline(t, bed)
	o := bed.Options()
	const ns = "stale"
	newNamespace(t, rome, ns)

	short := reservation(ns, "short", "1", "1Gi")
	short.Spec.Duration = &metav1.Duration{Duration: 8 * time.Second}
	require.NoError(t, rome.Client.Create(ctx, short))
	s := waitReservation(t, rome, ns, "short", 30*time.Second, "Active on paris", func(r *rbv1.Reservation) bool {
		return r.Status.Phase == rbv1.ReservationActive
	})
	require.Equal(t, "paris", s.Status.Provider)
	bc, err := rome.BrokerClient()
	require.NoError(t, err)
	at, err := bc.Reservation(ctx, s.Status.ReservationID)
	require.NoError(t, err)
	expiresAt := at.ExpiresAt // to the millisecond (status.expiresAt has seconds)

	stopped := time.Now()
	require.NoError(t, paris.StopAgent())
	t.Cleanup(func() {
		if !paris.Agent.Running() {
			_ = paris.StartAgent(context.Background())
		}
	})
	var staleAfter time.Duration
	eventually(t, o.StaleThreshold+o.PublishPeriod+5*time.Second, "paris stale at the broker", func() (bool, string) {
		c, err := bc.Cluster(ctx, "paris")
		staleAfter = time.Since(stopped)
		return err == nil && !c.Live, fmt.Sprintf("%v", err)
	})
	assert.LessOrEqual(t, staleAfter, o.StaleThreshold+o.PublishPeriod+time.Second,
		"stale within the threshold of its last advertisement")
	require.NoError(t, rome.Client.Create(ctx, reservation(ns, "after", "1", "1Gi")))
	after := waitReservation(t, rome, ns, "after", 30*time.Second, "live", func(r *rbv1.Reservation) bool { return live(r.Status.Phase) })
	assert.Equal(t, "berlin", after.Status.Provider, "paris is excluded once stale")
	at, err = bc.Reservation(ctx, after.Status.ReservationID)
	require.NoError(t, err)
	for _, c := range at.Candidates {
		assert.NotEqual(t, "paris", c.Cluster, "paris is not even a candidate")
	}

	// The reservation held on paris expires at its duration, agent or not.
	exp := waitReservation(t, rome, ns, "short", 30*time.Second, "Expired", func(r *rbv1.Reservation) bool {
		return r.Status.Phase == rbv1.ReservationExpired
	})
	expiredLate := time.Since(expiresAt)
	assert.Less(t, expiredLate, 3*time.Second, "expired at its duration (broker expiry timer %s)", o.ExpiryInterval)
	pc, err := bed.Store.Cluster(ctx, "paris")
	require.NoError(t, err)
	assert.Zero(t, pc.Reserved.CPU, "paris's capacity released by the expiry")
	require.NoError(t, bed.Store.CheckInvariant(ctx))
	assert.Len(t, providerInstructions(t, paris), 1, "paris's agent is down: its instruction is still there")

	restarted := time.Now()
	require.NoError(t, paris.StartAgent(ctx))
	waitTenantGone(t, paris, 30*time.Second)
	figure(t, "agent stopped -> paris stale at the broker: %s (threshold %s, publish period %s)",
		staleAfter.Round(time.Millisecond), o.StaleThreshold, o.PublishPeriod)
	figure(t, "reservation on paris expired %s after its expiresAt; agent restarted -> expired tenant removed: %s",
		expiredLate.Round(time.Millisecond), time.Since(restarted).Round(time.Millisecond))
	require.NoError(t, rome.Client.Delete(ctx, exp))
	require.NoError(t, rome.Client.Delete(ctx, after))
	eventually(t, 30*time.Second, "reservations gone", func() (bool, string) {
		n := len(reservations(t, rome, ns))
		return n == 0, fmt.Sprintf("%d left", n)
	})
	waitTenantGone(t, bed.Cluster("berlin"), 30*time.Second)
	backToBaseline(t, bed, base, 30*time.Second)
}

// webDeployment is a Deployment "web" of replicas 3-CPU / 2Gi pods scheduled
// by rb-scheduler: none fits rome's 2-CPU node; paris (8 CPU) takes two.
func webDeployment(ns string, replicas int32) *appsv1.Deployment {
	labels := map[string]string{"app": "web"}
	return &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "web"},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To(replicas),
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec:       brokerPod(ns, "", requests("3", "2Gi")).Spec,
			},
		},
	}
}
