package agent_test

import (
	"context"
	"fmt"
	"sort"
	"sync"
	"testing"
	"time"

	promtestutil "github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/fluidos-project/resource-broker/agent"
	"github.com/fluidos-project/resource-broker/agent/metrics"
	rbv1 "github.com/fluidos-project/resource-broker/api/v1alpha1"
	"github.com/fluidos-project/resource-broker/broker/api"
	"github.com/fluidos-project/resource-broker/internal/brokertest"
)

// createPod creates a pod, bound to node when node is set, as the
// scheduler plugin's pods are (envtest runs no scheduler nor kubelet).
func (c *cluster) createPod(name, node string) *corev1.Pod {
	c.t.Helper()
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
		Spec: corev1.PodSpec{NodeName: node, RestartPolicy: corev1.RestartPolicyNever,
			Containers: []corev1.Container{{Name: "main", Image: "registry.k8s.io/pause:3.10"}}},
	}
	require.NoError(c.t, c.client.Create(context.Background(), pod))
	return pod
}

// podReservation is the Reservation the scheduler plugin makes for pod:
// owned by it, naming it in spec.podName, without a duration.
func podReservation(pod *corev1.Pod, cpu, memory string) *rbv1.Reservation {
	rsv := reservationObj(pod.Name+"-rsv", cpu, memory)
	rsv.Labels = map[string]string{rbv1.PodLabel: pod.Name}
	rsv.Spec.PodName = pod.Name
	rsv.OwnerReferences = []metav1.OwnerReference{{APIVersion: "v1", Kind: "Pod", Name: pod.Name, UID: pod.UID,
		Controller: ptr.To(true), BlockOwnerDeletion: ptr.To(true)}}
	return rsv
}

// bind binds pod to node as the scheduler does (the binding subresource).
func (c *cluster) bind(pod *corev1.Pod, node string) {
	c.t.Helper()
	require.NoError(c.t, c.client.SubResource("binding").Create(context.Background(), pod,
		&corev1.Binding{ObjectMeta: metav1.ObjectMeta{Name: pod.Name, Namespace: pod.Namespace}, Target: corev1.ObjectReference{Kind: "Node", Name: node}}))
}

// setPodPhase sets a pod's phase as its kubelet would.
func (c *cluster) setPodPhase(pod *corev1.Pod, phase corev1.PodPhase) {
	c.t.Helper()
	cur := &corev1.Pod{}
	require.NoError(c.t, c.client.Get(context.Background(), client.ObjectKeyFromObject(pod), cur))
	cur.Status.Phase = phase
	require.NoError(c.t, c.client.Status().Update(context.Background(), cur))
}

// TestReleasedWhenPodEnds: a pod that Succeeded, Failed or was deleted has
// its reservation released at the broker within a second, without the
// garbage collector (envtest runs none): the agent deletes the
// Reservation, whose finalizer releases it. Each latency is measured from
// the pod's change to the broker's phase Released.
func TestReleasedWhenPodEnds(t *testing.T) {
	ctx := context.Background()
	b := brokertest.Start(t, brokertest.Options{})
	rome := newCluster(t, b, "rome")
	b.Advertise("paris", "8", "32Gi", "", "0.03", nil)
	rome.startAgent()
	bc := rome.brokerClient() // the requester's view, by its own ids

	var latencies []time.Duration
	for _, end := range []string{"Succeeded", "Failed", "deleted", "Succeeded-2", "Failed-2", "deleted-2"} {
		pod := rome.createPod(fmt.Sprintf("job-%d", len(latencies)), "rb-paris")
		rsv := podReservation(pod, "1", "1Gi")
		require.NoError(t, rome.client.Create(ctx, rsv))
		got := rome.waitPhase(rsv.Name, rbv1.ReservationReserved, 10*time.Second)
		id := got.Status.ReservationID

		began := time.Now()
		switch end[:3] {
		case "Suc":
			rome.setPodPhase(pod, corev1.PodSucceeded)
		case "Fai":
			rome.setPodPhase(pod, corev1.PodFailed)
		default:
			require.NoError(t, rome.client.Delete(ctx, pod, client.GracePeriodSeconds(0)))
		}
		require.Eventually(t, func() bool {
			r, err := bc.Reservation(ctx, id)
			return err == nil && r.Phase == "Released"
		}, 10*time.Second, 5*time.Millisecond, "pod %s: released at the broker", end)
		took := time.Since(began)
		latencies = append(latencies, took)
		t.Logf("pod %s -> broker phase Released: %s", end, took.Round(time.Millisecond))
		require.Eventually(t, func() bool {
			err := rome.client.Get(ctx, client.ObjectKeyFromObject(rsv), &rbv1.Reservation{})
			return apierrors.IsNotFound(err)
		}, 10*time.Second, 20*time.Millisecond, "the Reservation is gone")
	}
	sort.Slice(latencies, func(i, j int) bool { return latencies[i] < latencies[j] })
	t.Logf("pod ended -> Released: median %s, max %s (%d pods)", latencies[len(latencies)/2].Round(time.Millisecond),
		latencies[len(latencies)-1].Round(time.Millisecond), len(latencies))
	assert.Less(t, latencies[len(latencies)-1], 2*time.Second, "released within seconds")

	// A Reservation made by hand for a pod that does not exist (yet) is kept.
	byHand := reservationObj("by-hand", "1", "1Gi")
	byHand.Spec.PodName = "later"
	require.NoError(t, rome.client.Create(ctx, byHand))
	rome.waitPhase("by-hand", rbv1.ReservationReserved, 10*time.Second)
	time.Sleep(300 * time.Millisecond)
	require.NoError(t, rome.client.Get(ctx, client.ObjectKeyFromObject(byHand), byHand))
	assert.True(t, byHand.DeletionTimestamp.IsZero())
	require.NoError(t, b.Store.CheckInvariant(ctx))
}

// countingRenewer counts the ids the agent renews.
type countingRenewer struct {
	inner interface {
		Renew(ctx context.Context, ids []string) (api.RenewResponse, error)
	}
	mu    sync.Mutex
	calls int
	ids   map[string]int
	skip  map[string]bool // never renewed (as if the agent had lost them)
}

func (c *countingRenewer) Renew(ctx context.Context, ids []string) (api.RenewResponse, error) {
	c.mu.Lock()
	c.calls++
	var keep []string
	for _, id := range ids {
		c.ids[id]++
		if !c.skip[id] {
			keep = append(keep, id)
		}
	}
	c.mu.Unlock()
	if len(keep) == 0 {
		return api.RenewResponse{}, nil
	}
	return c.inner.Renew(ctx, keep)
}

func (c *countingRenewer) count(id string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.ids[id]
}

// TestLeaseRenewedWhileBound: a Reservation opened for a pod is a lease
// (status.lease); while its pod is bound and runs the agent renews it, so
// it outlives many lease lengths, renewed soon after binding; a granted
// lease whose pod is never bound ends after its hold time; one the agent
// stops renewing lapses (Expired, Ready False); the pod Succeeded: released.
func TestLeaseRenewedWhileBound(t *testing.T) {
	ctx := context.Background()
	b := brokertest.Start(t, brokertest.Options{})
	rome := newCluster(t, b, "rome")
	b.Advertise("paris", "8", "32Gi", "", "0.03", nil)
	const lease, hold, every = 2 * time.Second, 2 * time.Second, 500 * time.Millisecond
	cr := &countingRenewer{ids: map[string]int{}, skip: map[string]bool{}}
	rome.startAgent(func(o *agent.Options) {
		o.LeaseLength, o.HoldTime, o.RenewInterval = lease, hold, every
		cr.inner = o.Broker
		o.RenewBroker = cr
	})

	bound := rome.createPod("bound", "")
	rsvBound := podReservation(bound, "1", "1Gi")
	require.NoError(t, rome.client.Create(ctx, rsvBound))
	never := rome.createPod("never-bound", "")
	rsvNever := podReservation(never, "1", "1Gi")
	require.NoError(t, rome.client.Create(ctx, rsvNever))
	lost := rome.createPod("lost", "rb-paris")
	rsvLost := podReservation(lost, "1", "1Gi")
	require.NoError(t, rome.client.Create(ctx, rsvLost))

	got := rome.waitPhase(rsvBound.Name, rbv1.ReservationReserved, 10*time.Second)
	bc := rome.brokerClient()
	at, err := bc.Reservation(ctx, got.Status.ReservationID)
	require.NoError(t, err)
	if at.Lease == "" {
		t.Skip("this broker does not keep leases (a broker older than leases)")
	}
	assert.Equal(t, "2s", at.Lease, "asked as a lease")
	require.NotNil(t, got.Status.Lease, "status.lease shows the lease")
	assert.Equal(t, lease, got.Status.Lease.Duration)
	idBound := got.Status.ReservationID
	lostRsv := rome.waitPhase(rsvLost.Name, rbv1.ReservationReserved, 10*time.Second)
	cr.mu.Lock()
	cr.skip[lostRsv.Status.ReservationID] = true
	cr.mu.Unlock()

	bindAt := time.Now()
	rome.bind(bound, "rb-paris")
	require.Eventually(t, func() bool { return cr.count(idBound) > 0 }, 3*time.Second, 10*time.Millisecond, "renewed soon after binding")
	t.Logf("bound -> first renewal: %s", time.Since(bindAt).Round(time.Millisecond))

	// Ten lease lengths: still held, renewed about every interval.
	time.Sleep(10 * lease)
	r, err := bc.Reservation(ctx, idBound)
	require.NoError(t, err)
	assert.Equal(t, "Reserved", r.Phase, "renewed while its pod runs")
	assert.Positive(t, r.RemainingMs)
	n := cr.count(idBound)
	t.Logf("%d renewals of the bound pod's lease in %s (interval %s)", n, (10 * lease).String(), every)
	assert.GreaterOrEqual(t, n, int(10*lease/every)/2)
	assert.Zero(t, cr.count(string(rome.waitPhase(rsvNever.Name, rbv1.ReservationExpired, 5*time.Second).UID)), "an unbound pod's lease is not renewed")
	expired := rome.waitPhase(rsvLost.Name, rbv1.ReservationExpired, 5*time.Second)
	assert.Equal(t, metav1.ConditionFalse, condition(expired, rbv1.ConditionReady).Status)
	assert.Equal(t, metav1.ConditionFalse, condition(expired, rbv1.ConditionReserved).Status)
	assert.Positive(t, promtestutil.ToFloat64(metrics.BrokerCalls.WithLabelValues("renew", "ok")))

	// The pod ends: released at once.
	rome.setPodPhase(bound, corev1.PodSucceeded)
	require.Eventually(t, func() bool {
		r, err := bc.Reservation(ctx, idBound)
		return err == nil && r.Phase == "Released"
	}, 5*time.Second, 10*time.Millisecond)
	require.NoError(t, rome.client.Get(ctx, types.NamespacedName{Namespace: "default", Name: rsvLost.Name}, &rbv1.Reservation{}),
		"an ended lease's Reservation stays until its pod goes")
	require.NoError(t, b.Store.CheckInvariant(ctx))
}
