package integration

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	rbv1 "github.com/fluidos-project/resource-broker/api/v1alpha1"
	"github.com/fluidos-project/resource-broker/broker/api"
	"github.com/fluidos-project/resource-broker/internal/testbed"
	"github.com/fluidos-project/resource-broker/internal/testimages"
)

// The lifetime bed's timings: leases short enough that ten of them pass in
// a test, a hold time long enough for the placeholder scenario to look at a
// granted reservation before its pod exists.
const (
	lifeLease = 5 * time.Second
	lifeRenew = 1500 * time.Millisecond
	lifeHold  = 30 * time.Second
	lifeGrace = 4 * time.Second
	// lifeClockOffset: the broker's clock (redis-server's TIME) is an hour
	// behind the agents' for the whole bed, so every scenario also shows
	// that no agent compares the broker's absolute times with its own.
	lifeClockOffset = -time.Hour
)

// leaseAgentArgs are the agents' flags for a bed's lease timings.
func leaseAgentArgs(lease, renew, hold, grace time.Duration) func(string) []string {
	return func(string) []string {
		return []string{
			"--lease-length=" + lease.String(),
			"--lease-renew-interval=" + renew.String(),
			"--hold-time=" + hold.String(),
			"--eviction-grace=" + grace.String(),
		}
	}
}

// TestLifetime starts one real-node bed whose broker clock is an hour off the
// agents' and runs the lifetime scenarios on it in turn; each leaves the bed
// as it found it.
func TestLifetime(t *testing.T) {
	bed := testbed.Start(t, testbed.Options{
		RealNodes:         true,
		Clusters:          []testbed.ClusterSpec{testbed.RealRome, testbed.RealParis, testbed.RealBerlin},
		AgentArgs:         leaseAgentArgs(lifeLease, lifeRenew, lifeHold, lifeGrace),
		BrokerClockOffset: lifeClockOffset,
	})
	t.Logf("lifetime bed up in %s", bed.Timings["total"].Round(time.Millisecond))
	runScenarios(t, bed, []scenario{
		{"clock-skew", testLifetimeClockSkew},
		{"placeholder", testLifetimePlaceholder},
		{"renewed", testLifetimeRenewed},
		{"requester-lost", testLifetimeRequesterLost},
		{"v1-refusal", testLifetimeV1Refusal},
	})
}

// testLifetimeClockSkew: the broker's clock really is an hour behind (Redis
// TIME), and a Reservation's status.expiresAt, which the agent derives from
// the broker's remaining time, is in the agent's clock: within the hold time
// of now, not an hour off.
func testLifetimeClockSkew(t *testing.T, bed *testbed.Bed) {
	ctx := context.Background()
	rome := bed.Cluster("rome")
	base := baseline(t, bed)
	brokerNow, err := bed.RDB.Time(ctx).Result()
	require.NoError(t, err)
	skew := time.Since(brokerNow)
	require.InDelta(t, time.Hour.Seconds(), skew.Seconds(), 60, "the broker's clock is an hour behind the agents'")

	const ns = "skew"
	newNamespace(t, rome, ns)
	rsv := reservation(ns, "fixed", "500m", "128Mi")
	rsv.Spec.Duration = &metav1.Duration{Duration: 10 * time.Minute}
	require.NoError(t, rome.Client.Create(ctx, rsv))
	got := waitReservation(t, rome, ns, "fixed", 30*time.Second, "Active", func(r *rbv1.Reservation) bool {
		return r.Status.Phase == rbv1.ReservationActive
	})
	require.NotNil(t, got.Status.ExpiresAt)
	left := time.Until(got.Status.ExpiresAt.Time)
	assert.InDelta(t, (10 * time.Minute).Seconds(), left.Seconds(), 30,
		"expiresAt is now + the broker's remaining time in the agent's clock (got %s from now)", left)
	ready := meta.FindStatusCondition(got.Status.Conditions, rbv1.ConditionReady)
	if assert.NotNil(t, ready, "a Ready condition") {
		assert.Equal(t, metav1.ConditionTrue, ready.Status, "Ready while Active: %+v", ready)
	}
	// The provider keeps it: it does not compare the broker's expiry (an
	// hour in its past) with its own clock.
	paris := bed.Cluster(got.Status.Provider)
	require.NotNil(t, paris)
	time.Sleep(2 * lifeRenew)
	require.Len(t, providerInstructions(t, paris), 1, "the provider keeps its instruction")
	require.NoError(t, rome.Client.Delete(ctx, rsv))
	waitTenantGone(t, paris, 60*time.Second)
	backToBaseline(t, bed, base, 30*time.Second)
	figure(t, "broker clock %s behind the agents'; expiresAt of a 10m reservation read as %s from now", skew.Round(time.Second), left.Round(time.Second))
}

// heldPlaceholder waits for the placeholder pod of reservation id in rome's
// tenant namespace at a provider to be Running, and returns it.
func heldPlaceholder(t *testing.T, c *testbed.Cluster, id string) *corev1.Pod {
	t.Helper()
	var ph corev1.Pod
	eventually(t, 60*time.Second, "the placeholder of "+id+" Running at "+c.Name, func() (bool, string) {
		var pods corev1.PodList
		require.NoError(t, c.Client.List(context.Background(), &pods, client.InNamespace("rb-rome"),
			client.MatchingLabels{rbv1.ReservationLabel: id, rbv1.RoleLabel: rbv1.RolePlaceholder}))
		if len(pods.Items) != 1 {
			return false, fmt.Sprintf("%d placeholders", len(pods.Items))
		}
		ph = pods.Items[0]
		return ph.Status.Phase == corev1.PodRunning, fmt.Sprintf("%s on %q", ph.Status.Phase, ph.Spec.NodeName)
	})
	return &ph
}

// nodeFree is what a node's allocatable cpu leaves after the requests of its
// non-terminal pods, except skip's.
func nodeFree(t *testing.T, c *testbed.Cluster, node string, skip *corev1.Pod) resource.Quantity {
	t.Helper()
	var n corev1.Node
	require.NoError(t, c.Client.Get(context.Background(), client.ObjectKey{Name: node}, &n))
	free := n.Status.Allocatable.Cpu().DeepCopy()
	var pods corev1.PodList
	require.NoError(t, c.Client.List(context.Background(), &pods))
	for _, p := range pods.Items {
		if p.Spec.NodeName != node || p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed ||
			(skip != nil && p.UID == skip.UID) {
			continue
		}
		for _, ctr := range p.Spec.Containers {
			free.Sub(*ctr.Resources.Requests.Cpu())
		}
	}
	return free
}

// testLifetimePlaceholder (item 3): a reservation granted before its pod
// exists is held at the provider by a placeholder pod on a node. A pod of the
// provider's own asking for everything that node has free apart from the
// placeholder cannot take the reserved share (it stays Pending: it may not
// preempt the placeholder), and the tenant pod, when it comes, still lands
// on that node (it preempts its own placeholder and nothing else).
func testLifetimePlaceholder(t *testing.T, bed *testbed.Bed) {
	ctx := context.Background()
	rome := bed.Cluster("rome")
	base := baseline(t, bed)
	const ns = "held"
	newNamespace(t, rome, ns)

	rsv := reservation(ns, "for-late", "1500m", "256Mi")
	rsv.Spec.PodName = "late" // made by hand for a pod that does not exist yet
	require.NoError(t, rome.Client.Create(ctx, rsv))
	got := waitReservation(t, rome, ns, rsv.Name, 30*time.Second, "Active with a placement", func(r *rbv1.Reservation) bool {
		return r.Status.Phase == rbv1.ReservationActive && r.Status.Placement != nil
	})
	paris := bed.Cluster(got.Status.Provider)
	require.NotNil(t, paris)
	id := string(got.UID)
	ph := heldPlaceholder(t, paris, id)
	node := ph.Spec.NodeName
	assert.Equal(t, node, got.Status.Placement.Node, "the requester is told the placeholder's node")
	assert.Equal(t, rbv1.TenantPriorityClass, got.Status.Placement.PriorityClassName)

	// The provider's own pod asks for all the node has apart from the placeholder.
	greedyCPU := nodeFree(t, paris, node, ph)
	require.True(t, greedyCPU.Cmp(resource.MustParse("1500m")) >= 0, "node %s has the reserved share free without the hold (%s)", node, greedyCPU.String())
	greedy := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "greedy"},
		Spec: corev1.PodSpec{
			NodeSelector: map[string]string{corev1.LabelHostname: node},
			Containers: []corev1.Container{{Name: "main", Image: testimages.Pause, ImagePullPolicy: corev1.PullIfNotPresent,
				Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceCPU: greedyCPU, corev1.ResourceMemory: resource.MustParse("64Mi")}}}},
			TerminationGracePeriodSeconds: ptr.To[int64](0),
		},
	}
	require.NoError(t, paris.Client.Create(ctx, greedy))
	t.Cleanup(func() { _ = paris.Client.Delete(context.Background(), greedy) })
	eventually(t, 30*time.Second, "the greedy pod refused by paris's scheduler", func() (bool, string) {
		var events corev1.EventList
		require.NoError(t, paris.Client.List(ctx, &events, client.InNamespace("default")))
		for _, e := range events.Items {
			if e.InvolvedObject.Name == "greedy" && e.Reason == "FailedScheduling" {
				return true, e.Message
			}
		}
		return false, "no FailedScheduling event yet"
	})
	time.Sleep(3 * time.Second) // and it stays so: the placeholder is not preempted
	require.NoError(t, paris.Client.Get(ctx, client.ObjectKeyFromObject(greedy), greedy))
	assert.Empty(t, greedy.Spec.NodeName, "the provider's own pod cannot take the reserved share")
	var still corev1.Pod
	require.NoError(t, paris.Client.Get(ctx, client.ObjectKeyFromObject(ph), &still))
	assert.Nil(t, still.DeletionTimestamp, "the placeholder still holds the share")

	// The tenant pod comes and lands on the held node.
	late := brokerPod(ns, "late", requests("1500m", "256Mi"))
	late.Spec.TerminationGracePeriodSeconds = ptr.To[int64](0)
	landed := time.Now()
	require.NoError(t, rome.Client.Create(ctx, late))
	late = waitRunning(t, rome, late)
	cp := copyOf(t, paris, late)
	assert.Equal(t, node, cp.Spec.NodeName, "the tenant pod lands on the placeholder's node")
	assert.Equal(t, rbv1.TenantPriorityClass, cp.Spec.PriorityClassName)
	figure(t, "tenant pod created in rome -> Running on the held node %s: %s", node, time.Since(landed).Round(time.Millisecond))
	eventually(t, 30*time.Second, "the placeholder gone and not recreated", func() (bool, string) {
		var pods corev1.PodList
		require.NoError(t, paris.Client.List(ctx, &pods, client.InNamespace("rb-rome"),
			client.MatchingLabels{rbv1.ReservationLabel: id, rbv1.RoleLabel: rbv1.RolePlaceholder}))
		return len(pods.Items) == 0, fmt.Sprintf("%d placeholders", len(pods.Items))
	})
	require.NoError(t, paris.Client.Get(ctx, client.ObjectKeyFromObject(greedy), greedy))
	assert.Empty(t, greedy.Spec.NodeName, "the greedy pod is still Pending: the share is the tenant's")
	require.NoError(t, bed.Store.CheckInvariant(ctx))

	require.NoError(t, paris.Client.Delete(ctx, greedy))
	require.NoError(t, rome.Client.Delete(ctx, late))
	require.NoError(t, rome.Client.Delete(ctx, rsv)) // made by hand: its owner deletes it
	eventually(t, 60*time.Second, "no Reservation left in "+ns, func() (bool, string) {
		n := len(reservations(t, rome, ns))
		return n == 0, fmt.Sprintf("%d reservations", n)
	})
	waitTenantGone(t, paris, 60*time.Second)
	backToBaseline(t, bed, base, 30*time.Second)
}

// testLifetimeRenewed: a Deployment's remote pods keep running for more than
// ten lease lengths, well past the hold time: their leases are renewed, the
// copies and containers are the same, and the broker's numbers do not move.
// Scaled to zero, everything is released within seconds, exactly.
func testLifetimeRenewed(t *testing.T, bed *testbed.Bed) {
	ctx := context.Background()
	rome, paris := bed.Cluster("rome"), bed.Cluster("paris")
	base := baseline(t, bed)
	const ns = "keep"
	newNamespace(t, rome, ns)
	dep := appDeployment(ns, "keep", 2, "1500m", "256Mi")
	require.NoError(t, rome.Client.Create(ctx, dep))
	items := waitReservations(t, rome, ns, 2, 120*time.Second, "2 Reservations Active",
		func(r *rbv1.Reservation) bool { return r.Status.Phase == rbv1.ReservationActive })
	pods := waitDeploymentReady(t, rome, ns, 2)
	for _, r := range items {
		require.NotNil(t, r.Status.Lease, "a pod's reservation is a lease")
		assert.Equal(t, lifeLease, r.Status.Lease.Duration)
	}
	copies := map[string]string{} // copy UID -> first container id
	var list corev1.PodList
	require.NoError(t, paris.Client.List(ctx, &list, client.InNamespace("rb-rome"), client.MatchingLabels{"app": "keep"}))
	require.Len(t, list.Items, 2)
	for _, cp := range list.Items {
		require.NotEmpty(t, cp.Status.ContainerStatuses)
		copies[string(cp.UID)] = cp.Status.ContainerStatuses[0].ContainerID
	}
	steady, err := bed.Capacity(ctx)
	require.NoError(t, err)
	bc, err := rome.BrokerClient()
	require.NoError(t, err)

	started := time.Now()
	wait := max(10*lifeLease, lifeHold) + 2*lifeLease
	for time.Since(started) < wait {
		time.Sleep(lifeLease)
		for _, r := range items {
			at, err := bc.Reservation(ctx, string(r.UID))
			require.NoError(t, err)
			require.Equal(t, string(rbv1.ReservationActive), at.Phase, "%s still Active after %s", r.Name, time.Since(started).Round(time.Second))
			require.Positive(t, at.RemainingMs, "%s: time left", r.Name)
		}
	}
	for _, r := range items {
		at, err := bc.Reservation(ctx, string(r.UID))
		require.NoError(t, err)
		lived := at.ExpiresAt.Sub(at.CreatedAt) // both on the broker's clock
		assert.Greater(t, lived, lifeHold+5*lifeLease, "%s renewed well past its hold time", r.Name)
		assert.LessOrEqual(t, at.RemainingMs, (lifeLease + time.Second).Milliseconds(), "a renewal extends by one lease")
	}
	require.NoError(t, paris.Client.List(ctx, &list, client.InNamespace("rb-rome"), client.MatchingLabels{"app": "keep"}))
	require.Len(t, list.Items, 2, "the same two copies")
	for _, cp := range list.Items {
		id, ok := copies[string(cp.UID)]
		require.True(t, ok, "copy %s is one of the first two", cp.Name)
		require.NotEmpty(t, cp.Status.ContainerStatuses)
		assert.Equal(t, id, cp.Status.ContainerStatuses[0].ContainerID, "the same container")
		assert.Zero(t, cp.Status.ContainerStatuses[0].RestartCount)
	}
	for _, p := range pods {
		var now corev1.Pod
		require.NoError(t, rome.Client.Get(ctx, client.ObjectKeyFromObject(&p), &now))
		assert.Equal(t, p.UID, now.UID)
		assert.True(t, podReady(&now), "%s Ready after %s", p.Name, time.Since(started).Round(time.Second))
	}
	after, err := bed.Capacity(ctx)
	require.NoError(t, err)
	assert.Empty(t, after.Diff(steady), "broker accounting unchanged while the leases are renewed")
	require.NoError(t, bed.Store.CheckInvariant(ctx))
	figure(t, "2 remote pods kept for %s (%d lease lengths of %s, hold time %s) with their leases renewed",
		time.Since(started).Round(time.Second), int(time.Since(started)/lifeLease), lifeLease, lifeHold)

	scaled := time.Now()
	require.NoError(t, rome.Client.Patch(ctx, &appsv1.Deployment{ObjectMeta: dep.ObjectMeta},
		client.RawPatch("application/merge-patch+json", []byte(`{"spec":{"replicas":0}}`))))
	waitNoLive(t, bed, 30*time.Second)
	released := time.Since(scaled)
	waitTenantGone(t, paris, 60*time.Second)
	backToBaseline(t, bed, base, 30*time.Second)
	figure(t, "scaled to 0 -> every lease released at the broker %s; numbers back exactly", released.Round(time.Millisecond))
	require.NoError(t, rome.Client.Delete(ctx, dep))
}

// waitDeploymentReady waits until a namespace has n Running and Ready pods.
func waitDeploymentReady(t *testing.T, c *testbed.Cluster, ns string, n int) []corev1.Pod {
	t.Helper()
	var pods corev1.PodList
	eventually(t, 120*time.Second, fmt.Sprintf("%d pods Running and Ready in %s", n, ns), func() (bool, string) {
		require.NoError(t, c.Client.List(context.Background(), &pods, client.InNamespace(ns)))
		ready := 0
		var state []string
		for _, p := range pods.Items {
			if p.Status.Phase == corev1.PodRunning && podReady(&p) {
				ready++
			}
			state = append(state, fmt.Sprintf("%s %s on %q: %s", p.Name, p.Status.Phase, p.Spec.NodeName, podCondition(&p)))
		}
		return len(pods.Items) == n && ready == n, strings.Join(state, "; ")
	})
	return pods.Items
}

// testLifetimeRequesterLost: rome's agent is killed. Its leases lapse after
// at most a lease length; the broker ends them; paris marks its instruction
// ended (Warning Event) and evicts the copy only after the grace; paris's
// capacity is back. The agent comes back: the Reservation is Expired, with
// its condition and Event.
func testLifetimeRequesterLost(t *testing.T, bed *testbed.Bed) {
	ctx := context.Background()
	rome, paris := bed.Cluster("rome"), bed.Cluster("paris")
	base := baseline(t, bed)
	const ns = "orphan"
	newNamespace(t, rome, ns)
	dep := appDeployment(ns, "orphan", 1, "1500m", "256Mi")
	require.NoError(t, rome.Client.Create(ctx, dep))
	items := waitReservations(t, rome, ns, 1, 120*time.Second, "the Reservation Active",
		func(r *rbv1.Reservation) bool { return r.Status.Phase == rbv1.ReservationActive })
	waitDeploymentReady(t, rome, ns, 1)
	rsv := items[0]
	var copies corev1.PodList
	require.NoError(t, paris.Client.List(ctx, &copies, client.InNamespace("rb-rome"), client.MatchingLabels{"app": "orphan"}))
	require.Len(t, copies.Items, 1)
	cp := copies.Items[0]

	// A renewal never shortens a lease's end, so the hold time covers the
	// first seconds of a pod: wait until only renewals keep it.
	bc, err := rome.BrokerClient()
	require.NoError(t, err)
	eventually(t, lifeHold+10*time.Second, "the lease past its hold time", func() (bool, string) {
		at, err := bc.Reservation(ctx, string(rsv.UID))
		require.NoError(t, err)
		return at.RemainingMs <= lifeLease.Milliseconds(), fmt.Sprintf("%dms left", at.RemainingMs)
	})
	killed := time.Now()
	require.NoError(t, rome.Agent.Kill())
	// Until the lease lapses the copy runs untouched.
	time.Sleep(lifeLease - lifeRenew - time.Second)
	var now corev1.Pod
	require.NoError(t, paris.Client.Get(ctx, client.ObjectKeyFromObject(&cp), &now))
	assert.Nil(t, now.DeletionTimestamp, "the copy runs while the lease is live")

	var ended time.Time
	eventually(t, 2*lifeLease+10*time.Second, "paris's instruction ended (lease lapsed)", func() (bool, string) {
		for _, pi := range providerInstructions(t, paris) {
			if pi.Spec.ReservationID != string(rsv.UID) {
				continue
			}
			c := meta.FindStatusCondition(pi.Status.Conditions, rbv1.ConditionEnded)
			if c != nil && c.Status == metav1.ConditionTrue {
				ended = time.Now()
				return true, c.Reason
			}
			return false, fmt.Sprintf("conditions %+v", pi.Status.Conditions)
		}
		return false, "no instruction"
	})
	lapsed := ended.Sub(killed)
	require.NoError(t, paris.Client.Get(ctx, client.ObjectKeyFromObject(&cp), &now))
	assert.Nil(t, now.DeletionTimestamp, "the copy is not evicted before the grace")
	eventually(t, lifeGrace+30*time.Second, "the copy evicted", func() (bool, string) {
		err := paris.Client.Get(ctx, client.ObjectKeyFromObject(&cp), &now)
		return apierrors.IsNotFound(err) || (err == nil && now.DeletionTimestamp != nil), fmt.Sprintf("%v", err)
	})
	evicted := time.Since(killed)
	assert.GreaterOrEqual(t, evicted, lifeLease-lifeRenew+lifeGrace-500*time.Millisecond,
		"evicted only after the lease lapsed and the grace passed (%s after the kill)", evicted)
	assert.GreaterOrEqual(t, evicted-lapsed, lifeGrace-time.Second, "the grace is honoured")
	eventually(t, 30*time.Second, "paris's Events tell", func() (bool, string) {
		var events corev1.EventList
		require.NoError(t, paris.Client.List(ctx, &events, client.InNamespace(testbed.AgentNamespace)))
		var reasons []string
		for _, e := range events.Items {
			if e.InvolvedObject.Kind == "ProviderInstruction" {
				reasons = append(reasons, e.Reason)
			}
		}
		joined := strings.Join(reasons, ",")
		return strings.Contains(joined, "LeaseLapsed") && strings.Contains(joined, "Evicted"), joined
	})
	waitNoLive(t, bed, 30*time.Second)
	figure(t, "requester agent killed -> lease lapsed and paris's instruction ended %s, copy evicted %s (lease %s, renewal %s, grace %s)",
		lapsed.Round(100*time.Millisecond), evicted.Round(100*time.Millisecond), lifeLease, lifeRenew, lifeGrace)

	require.NoError(t, rome.StartAgent(ctx))
	var gone rbv1.Reservation
	eventually(t, 60*time.Second, "rome's Reservation Expired with its condition", func() (bool, string) {
		err := rome.Client.Get(ctx, client.ObjectKeyFromObject(&rsv), &gone)
		if apierrors.IsNotFound(err) {
			return true, "" // its pod went (the bridge reported the copy gone) and took it along
		}
		require.NoError(t, err)
		c := meta.FindStatusCondition(gone.Status.Conditions, rbv1.ConditionReserved)
		return gone.Status.Phase == rbv1.ReservationExpired && c != nil && c.Status == metav1.ConditionFalse,
			fmt.Sprintf("%s %+v", gone.Status.Phase, c)
	})
	require.NoError(t, rome.Client.Delete(ctx, dep))
	waitNoPodOrReservation(t, rome, ns, 60*time.Second)
	waitTenantGone(t, paris, 60*time.Second)
	backToBaseline(t, bed, base, 30*time.Second)
}

// testLifetimeV1Refusal (item 5): a seed agent's request that nothing can
// hold is refused, and does not hold back the fitting request another
// cluster makes right after it.
func testLifetimeV1Refusal(t *testing.T, bed *testbed.Bed) {
	base := baseline(t, bed)
	berlin := seedClient(t, bed.Cluster("berlin"))
	code, body := berlin.post(t, bed.BrokerURL+"/api/v1/reservations", `{"requestedResources":{"cpu":"64","memory":"256Gi"},"priority":100}`)
	require.Equal(t, http.StatusConflict, code, "nothing holds 64 CPUs: %s", body)
	rome := seedClient(t, bed.Cluster("rome"))
	code, body = rome.post(t, bed.BrokerURL+"/api/v1/reservations", `{"requestedResources":{"cpu":"500m","memory":"128Mi"},"duration":"1m"}`)
	require.Equal(t, http.StatusCreated, code, "the fitting request of another cluster is granted at once: %s", body)
	// A seed reservation is not a lease: it keeps its fixed duration. Give
	// it back so the bed is as it was.
	var v1 api.V1Reservation
	require.NoError(t, json.Unmarshal(body, &v1))
	rid := v1.ID
	require.NotEmpty(t, rid, "the seed answer names its reservation: %s", body)
	bc, err := bed.Cluster("rome").BrokerClient()
	require.NoError(t, err)
	at, err := bc.Reservation(context.Background(), rid)
	require.NoError(t, err)
	assert.Empty(t, at.Lease, "a v1 reservation is not a lease")
	_, err = bc.Release(context.Background(), rid)
	require.NoError(t, err)
	backToBaseline(t, bed, base, 30*time.Second)
}

// seedClient speaks HTTP to the broker with a cluster's certificate, as a
// seed agent does.
type seedHTTP struct{ c *http.Client }

func seedClient(t *testing.T, c *testbed.Cluster) seedHTTP {
	t.Helper()
	cert, err := tls.LoadX509KeyPair(filepath.Join(c.CertDir, "tls.crt"), filepath.Join(c.CertDir, "tls.key"))
	require.NoError(t, err)
	caPEM, err := os.ReadFile(filepath.Join(c.CertDir, "ca.crt"))
	require.NoError(t, err)
	pool := x509.NewCertPool()
	require.True(t, pool.AppendCertsFromPEM(caPEM))
	return seedHTTP{c: &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{Certificates: []tls.Certificate{cert}, RootCAs: pool, MinVersion: tls.VersionTLS12}}}}
}

func (s seedHTTP) post(t *testing.T, url, body string) (int, []byte) {
	t.Helper()
	resp, err := s.c.Post(url, "application/json", strings.NewReader(body))
	require.NoError(t, err)
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, data
}
