package integration

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	rbv1 "github.com/fluidos-project/resource-broker/api/v1alpha1"
	"github.com/fluidos-project/resource-broker/internal/testbed"
)

// The faults bed's timings: leases short enough that three of them pass in
// a scenario, an eviction grace shorter than a lease, so that a lease lost to
// a fault would show as evicted pods well within each scenario.
const (
	faultLease = 6 * time.Second
	faultRenew = 2 * time.Second
	faultHold  = 30 * time.Second
	faultGrace = 3 * time.Second
)

// TestFaultsControlPlane starts one real-node bed and, on the same borrowed
// pods, takes the control plane away in the ways users meet: every broker
// replica stopped and Redis frozen, the requester cut off from the broker
// alone, Redis killed and restarted from its append-only file. After each,
// the pods are the same pods (UIDs), in the same containers at the provider,
// never restarted and never unready, and their reservations are live at the
// broker with its books exact.
func TestFaultsControlPlane(t *testing.T) {
	bed := testbed.Start(t, testbed.Options{
		RealNodes: true,
		Clusters:  []testbed.ClusterSpec{testbed.RealRome, testbed.RealParis, testbed.RealBerlin},
		AgentArgs: leaseAgentArgs(faultLease, faultRenew, faultHold, faultGrace),
	})
	t.Logf("faults bed up in %s", bed.Timings["total"].Round(time.Millisecond))
	runScenarios(t, bed, []scenario{
		{"borrow", testFaultsBorrow},
		{"broker-outage", testFaultsBrokerOutage},
		{"requester-cut-off", testFaultsRequesterCutOff},
		{"redis-restart", testFaultsRedisRestart},
		{"release", testFaultsRelease},
	})
}

const faultsNamespace = "faults"

// faultsWeb is what borrow leaves for the fault scenarios: the Deployment,
// the broker's numbers before it, and the borrowed pods as they were.
var faultsWeb struct {
	dep  *appsv1.Deployment
	base testbed.Capacity
	pods map[string]borrowedPod
}

// borrowedPod is what must not change across a fault: the pod, where it
// runs, its copy and the copy's container.
type borrowedPod struct {
	UID, Node, CopyUID, ContainerID string
	Restarts                        int32
}

func (p borrowedPod) String() string {
	return fmt.Sprintf("uid %s on %s, copy %s container %s, %d restarts", p.UID, p.Node, p.CopyUID, p.ContainerID, p.Restarts)
}

// testFaultsBorrow: two 1.5-CPU pods that fit no rome node run on providers.
func testFaultsBorrow(t *testing.T, bed *testbed.Bed) {
	ctx := context.Background()
	rome := bed.Cluster("rome")
	base := baseline(t, bed)
	// Not newNamespace: the namespace outlives this subtest (release deletes it).
	require.NoError(t, rome.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: faultsNamespace}}))
	dep := appDeployment(faultsNamespace, "web", 2, "1500m", "256Mi")
	require.NoError(t, rome.Client.Create(ctx, dep))
	pods := waitBorrowedReady(t, bed, 2, 120*time.Second)
	waitReservations(t, rome, faultsNamespace, 2, 30*time.Second, "2 Reservations Active",
		func(r *rbv1.Reservation) bool { return r.Status.Phase == rbv1.ReservationActive })
	require.NoError(t, bed.Store.CheckInvariant(ctx))
	for name, p := range pods {
		figureLine(t, "faults", "%s: %s", name, p)
	}
	faultsWeb.dep, faultsWeb.base, faultsWeb.pods = dep, base, pods
}

// waitBorrowedReady waits until the faults namespace holds n Running, Ready
// pods on virtual nodes, each with a running copy, and returns them.
func waitBorrowedReady(t *testing.T, bed *testbed.Bed, n int, timeout time.Duration) map[string]borrowedPod {
	t.Helper()
	var out map[string]borrowedPod
	eventually(t, timeout, fmt.Sprintf("%d borrowed pods Running and Ready", n), func() (bool, string) {
		got, state := borrowedPods(t, bed)
		out = got
		ready := 0
		for _, p := range got {
			if p.ContainerID != "" {
				ready++
			}
		}
		return len(got) == n && ready == n, state
	})
	return out
}

// borrowedPods reads the faults namespace's pods in rome and their copies at
// the providers; a pod not Running and Ready, or whose copy has no running
// container, has an empty ContainerID.
func borrowedPods(t *testing.T, bed *testbed.Bed) (map[string]borrowedPod, string) {
	t.Helper()
	ctx := context.Background()
	var pods corev1.PodList
	require.NoError(t, bed.Cluster("rome").Client.List(ctx, &pods, client.InNamespace(faultsNamespace)))
	out := map[string]borrowedPod{}
	var state []string
	for i := range pods.Items {
		p := &pods.Items[i]
		bp := borrowedPod{UID: string(p.UID), Node: p.Spec.NodeName}
		for _, cs := range p.Status.ContainerStatuses {
			bp.Restarts += cs.RestartCount
		}
		provider := strings.TrimPrefix(p.Spec.NodeName, "rb-")
		if c := bed.Cluster(provider); c != nil && p.Status.Phase == corev1.PodRunning && podReady(p) {
			var cp corev1.Pod
			err := c.Client.Get(ctx, client.ObjectKey{Namespace: "rb-rome", Name: faultsNamespace + "." + p.Name}, &cp)
			if err == nil && len(cp.Status.ContainerStatuses) > 0 && cp.Status.ContainerStatuses[0].State.Running != nil {
				bp.CopyUID, bp.ContainerID = string(cp.UID), cp.Status.ContainerStatuses[0].ContainerID
			}
		}
		out[p.Name] = bp
		state = append(state, fmt.Sprintf("%s %s ready=%t on %q: %s", p.Name, p.Status.Phase, podReady(p), p.Spec.NodeName, podCondition(p)))
	}
	sort.Strings(state)
	return out, strings.Join(state, "; ")
}

// readyWatch polls the borrowed pods every half second until stopped and
// records every moment one of them was not the pod it was, or not ready.
type readyWatch struct {
	stop   chan struct{}
	done   chan struct{}
	mu     sync.Mutex
	faults []string
}

func watchBorrowed(t *testing.T, bed *testbed.Bed, want map[string]borrowedPod) *readyWatch {
	w := &readyWatch{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(w.done)
		for {
			select {
			case <-w.stop:
				return
			case <-time.After(500 * time.Millisecond):
			}
			got, state := borrowedPods(t, bed)
			for name, p := range want {
				g, ok := got[name]
				if !ok || g.UID != p.UID || g.ContainerID != p.ContainerID || g.Restarts != 0 {
					w.mu.Lock()
					w.faults = append(w.faults, fmt.Sprintf("%s: %s", time.Now().Format("15:04:05.000"), state))
					w.mu.Unlock()
					break
				}
			}
		}
	}()
	return w
}

// end stops the watch and returns what it saw go wrong.
func (w *readyWatch) end() []string {
	close(w.stop)
	<-w.done
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.faults
}

// assertPodsKept checks, over a window long enough for a lost lease to have
// lapsed and its pods to have been evicted (two leases and the grace), that
// the borrowed pods stay as they were, then that their reservations are
// live at the broker and its books exact.
func assertPodsKept(t *testing.T, bed *testbed.Bed, w *readyWatch, what string) {
	t.Helper()
	time.Sleep(2*faultLease + faultGrace + 2*time.Second)
	faults := w.end()
	assert.Empty(t, faults, "%s: the borrowed pods were replaced, restarted or unready", what)
	got, state := borrowedPods(t, bed)
	assert.Equal(t, faultsWeb.pods, got, "%s: the same pods in the same containers, never restarted (%s)", what, state)
	rome := bed.Cluster("rome")
	items := waitReservations(t, rome, faultsNamespace, 2, 30*time.Second, "2 Reservations Active after "+what,
		func(r *rbv1.Reservation) bool { return r.Status.Phase == rbv1.ReservationActive })
	assertBrokerMatches(t, bed, items)
	require.NoError(t, bed.Store.CheckInvariant(context.Background()))
}

func requireFaultsWeb(t *testing.T) {
	if faultsWeb.dep == nil {
		t.Fatal("needs the borrow scenario's pods (run the whole TestFaultsControlPlane)")
	}
}

// testFaultsBrokerOutage: every broker replica stopped and Redis frozen
// (SIGSTOP) for three lease lengths, then both back. No lease may end for
// it: the broker finds the outage on its first expiry run and gives every
// lease live when it began a whole lease from its return.
func testFaultsBrokerOutage(t *testing.T, bed *testbed.Bed) {
	requireFaultsWeb(t)
	ctx := context.Background()
	w := watchBorrowed(t, bed, faultsWeb.pods)
	for _, br := range bed.Brokers {
		require.NoError(t, br.Stop(10*time.Second))
	}
	require.NoError(t, bed.Redis.Freeze())
	began := time.Now()
	time.Sleep(3 * faultLease)
	require.NoError(t, bed.Redis.Thaw())
	for _, br := range bed.Brokers {
		require.NoError(t, br.Restart(ctx))
	}
	outage := time.Since(began)
	assertPodsKept(t, bed, w, "a broker outage")
	credited := brokerMetric(t, bed, "rb_broker_leases_credited_total")
	outages := brokerMetric(t, bed, "rb_broker_outages_total")
	assert.GreaterOrEqual(t, outages, 1.0, "a replica found the outage")
	figure(t, "broker outage of %s (every replica stopped, Redis frozen): same pods, 0 restarts; %g outage(s) found, %g due lease(s) credited",
		outage.Round(time.Second), outages, credited)
}

// brokerMetric sums a counter over the broker replicas' /metrics.
func brokerMetric(t *testing.T, bed *testbed.Bed, name string) float64 {
	t.Helper()
	var sum float64
	for _, br := range bed.Brokers {
		resp, err := http.Get("http://" + br.HealthAddr + "/metrics")
		require.NoError(t, err)
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		for _, line := range strings.Split(string(body), "\n") {
			var v float64
			if strings.HasPrefix(line, name+" ") {
				_, err := fmt.Sscanf(strings.TrimPrefix(line, name+" "), "%g", &v)
				require.NoError(t, err, line)
				sum += v
			}
		}
	}
	return sum
}

// testFaultsRequesterCutOff: rome's agent cannot reach the broker for three
// lease lengths, while it still reaches its providers. The providers hear
// rome (its heartbeat Lease in their tenant namespace) and renew its leases
// for it: nothing lapses, nothing is evicted.
func testFaultsRequesterCutOff(t *testing.T, bed *testbed.Bed) {
	requireFaultsWeb(t)
	rome := bed.Cluster("rome")
	w := watchBorrowed(t, bed, faultsWeb.pods)
	mend := bed.CutFromBroker(rome.Agent)
	time.Sleep(3 * faultLease)
	live, err := bed.LiveIndexes(context.Background())
	require.NoError(t, err)
	mend()
	assert.NotEmpty(t, live, "rome's reservations stayed live at the broker while rome could not reach it")
	assertPodsKept(t, bed, w, "the requester cut off from the broker")
	figure(t, "requester cut off from the broker for %s: its providers renewed its leases, same pods, 0 restarts", 3*faultLease)
}

// testFaultsRedisRestart: redis-server killed (SIGKILL) mid-lease, down for
// two lease lengths, and started again from its append-only file.
func testFaultsRedisRestart(t *testing.T, bed *testbed.Bed) {
	requireFaultsWeb(t)
	w := watchBorrowed(t, bed, faultsWeb.pods)
	began := time.Now()
	require.NoError(t, bed.Redis.RestartAfter(context.Background(), 2*faultLease))
	down := time.Since(began)
	assertPodsKept(t, bed, w, "a Redis restart")
	figure(t, "Redis killed and restarted from its AOF after %s down: same pods, 0 restarts", down.Round(time.Second))
}

// testFaultsRelease: scaled to zero, everything is released and the broker's
// numbers are back exactly.
func testFaultsRelease(t *testing.T, bed *testbed.Bed) {
	requireFaultsWeb(t)
	ctx := context.Background()
	rome := bed.Cluster("rome")
	require.NoError(t, rome.Client.Delete(ctx, faultsWeb.dep))
	waitNoPodOrReservation(t, rome, faultsNamespace, 60*time.Second)
	backToBaseline(t, bed, faultsWeb.base, 60*time.Second)
	require.NoError(t, rome.Client.Delete(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: faultsNamespace}}))
}
