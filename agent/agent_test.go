package agent_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	promtestutil "github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/fluidos-project/resource-broker/agent"
	"github.com/fluidos-project/resource-broker/agent/metrics"
	"github.com/fluidos-project/resource-broker/agent/provider"
	rbv1 "github.com/fluidos-project/resource-broker/api/v1alpha1"
	"github.com/fluidos-project/resource-broker/broker/api"
	brokerclient "github.com/fluidos-project/resource-broker/broker/client"
	"github.com/fluidos-project/resource-broker/broker/policy"
	"github.com/fluidos-project/resource-broker/broker/store"
	"github.com/fluidos-project/resource-broker/internal/brokertest"
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

// cluster is one member cluster: a real API server, and its agent when running.
type cluster struct {
	t      *testing.T
	id     string
	cfg    *rest.Config
	client client.Client
	broker *brokertest.Broker
	stop   context.CancelFunc
	done   chan error
}

func newCluster(t *testing.T, b *brokertest.Broker, id string) *cluster {
	t.Helper()
	cfg := testenv.Start(t, testenv.WithCRDDirectories(testenv.ModulePath(t, "manifests", "crds")))
	c, err := client.New(cfg, client.Options{Scheme: scheme})
	require.NoError(t, err)
	require.NoError(t, c.Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: agentNamespace}}))
	require.NoError(t, c.Create(context.Background(), provider.NewTenantClusterRole()), "installed by manifests/agent")
	return &cluster{t: t, id: id, cfg: cfg, client: c, broker: b}
}

// brokerClient is a broker client with this cluster's certificate.
func (c *cluster) brokerClient(opts ...brokerclient.Option) *brokerclient.Client {
	bc, err := brokerclient.New(c.broker.URL, c.broker.ClusterCertDir(c.id), opts...)
	require.NoError(c.t, err)
	return bc
}

// startAgent runs the agent in-process until the test ends or stopAgent.
func (c *cluster) startAgent(mutate ...func(*agent.Options)) {
	c.t.Helper()
	mgr, err := ctrl.NewManager(c.cfg, ctrl.Options{
		Scheme:                 scheme,
		Cache:                  agent.CacheOptions(agentNamespace),
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
		Controller:             config.Controller{SkipNameValidation: ptr.To(true)},
	})
	require.NoError(c.t, err)
	o := agent.Options{ClusterID: c.id, Broker: c.brokerClient(brokerclient.WithRetries(1, 50*time.Millisecond)), Namespace: agentNamespace,
		TokenTTL: 10 * time.Minute, MinBackoff: 100 * time.Millisecond, MaxBackoff: time.Second,
		// Nothing schedules here: placeholders stay unbound, grants go without placement.
		HoldTimeout: 200 * time.Millisecond, EvictionGrace: 200 * time.Millisecond}
	o.EndpointFrom(c.cfg)
	for _, m := range mutate {
		m(&o)
	}
	require.NoError(c.t, agent.Setup(mgr, o))
	ctx, cancel := context.WithCancel(context.Background())
	c.stop, c.done = cancel, make(chan error, 1)
	go func() { c.done <- mgr.Start(ctx) }()
	c.t.Cleanup(c.stopAgent)
}

func (c *cluster) stopAgent() {
	if c.stop == nil {
		return
	}
	c.stop()
	select {
	case err := <-c.done:
		assert.NoError(c.t, err)
	case <-time.After(30 * time.Second):
		c.t.Error("agent did not stop")
	}
	c.stop = nil
}

func reservationObj(name, cpu, memory string) *rbv1.Reservation {
	return &rbv1.Reservation{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
		Spec: rbv1.ReservationSpec{Resources: corev1.ResourceList{
			corev1.ResourceCPU: resource.MustParse(cpu), corev1.ResourceMemory: resource.MustParse(memory)}},
	}
}

// waitPhase waits until the Reservation reaches phase and returns it.
func (c *cluster) waitPhase(name string, phase rbv1.ReservationPhase, within time.Duration) *rbv1.Reservation {
	c.t.Helper()
	var rsv rbv1.Reservation
	require.EventuallyWithT(c.t, func(t *assert.CollectT) {
		require.NoError(t, c.client.Get(context.Background(), types.NamespacedName{Namespace: "default", Name: name}, &rsv))
		assert.Equal(t, phase, rsv.Status.Phase, "status: %+v", rsv.Status)
	}, within, 20*time.Millisecond)
	return &rsv
}

func condition(rsv *rbv1.Reservation, typ string) metav1.Condition {
	for _, c := range rsv.Status.Conditions {
		if c.Type == typ {
			return c
		}
	}
	return metav1.Condition{}
}

// TestReservationAcrossClusters: a Reservation in rome is decided by the real
// broker, paris sets the capacity aside and grants rome a token that works in
// the tenant namespace only, and deleting the Reservation undoes all of it.
func TestReservationAcrossClusters(t *testing.T) {
	ctx := context.Background()
	b := brokertest.Start(t, brokertest.Options{})
	rome, paris := newCluster(t, b, "rome"), newCluster(t, b, "paris")
	cs, err := kubernetes.NewForConfig(paris.cfg)
	require.NoError(t, err)
	_, err = kubelet.ReadyNode(ctx, cs, "paris-1", corev1.ResourceList{
		corev1.ResourceCPU: resource.MustParse("8"), corev1.ResourceMemory: resource.MustParse("32Gi")}, nil)
	require.NoError(t, err)
	rome.startAgent()
	paris.startAgent() // advertises paris from its node
	require.Eventually(t, func() bool {
		c, err := b.Store.Cluster(ctx, "paris")
		return err == nil && c.Allocatable.CPU == 8000
	}, 10*time.Second, 20*time.Millisecond, "paris's agent advertises its node")

	// Created as a user would write it: the API server stores "30m" as written,
	// while Go re-encodes it as "30m0s"; the agent must never send the spec back.
	web0 := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "broker.fluidos.eu/v1alpha1", "kind": "Reservation",
		"metadata": map[string]any{"name": "web-0", "namespace": "default"},
		"spec":     map[string]any{"resources": map[string]any{"cpu": "2", "memory": "4Gi"}, "duration": "30m"},
	}}
	require.NoError(t, rome.client.Create(ctx, web0))
	rsv := rome.waitPhase("web-0", rbv1.ReservationActive, 10*time.Second)
	assert.Equal(t, "paris", rsv.Status.Provider)
	assert.Equal(t, string(rsv.UID), rsv.Status.ReservationID, "idempotency id = UID")
	assert.Contains(t, rsv.Finalizers, rbv1.ReleaseFinalizer)
	assert.Equal(t, metav1.ConditionTrue, condition(rsv, rbv1.ConditionReserved).Status)
	assert.Equal(t, metav1.ConditionTrue, condition(rsv, rbv1.ConditionReady).Status, "Ready exactly while Active")
	assert.Nil(t, rsv.Status.Lease, "a manual reservation is no lease")

	// paris: instruction, tenant namespace, quota = the reservation.
	var pi rbv1.ProviderInstruction
	require.NoError(t, paris.client.Get(ctx, types.NamespacedName{Namespace: agentNamespace, Name: provider.InstructionName("rome", string(rsv.UID))}, &pi))
	assert.True(t, pi.Status.Enforced)
	assert.Equal(t, "rb-rome", pi.Status.TenantNamespace)
	var quota corev1.ResourceQuota
	require.NoError(t, paris.client.Get(ctx, types.NamespacedName{Namespace: "rb-rome", Name: "rb-reservations"}, &quota))
	assert.Equal(t, "2", ptr.To(quota.Spec.Hard["requests.cpu"]).String())
	assert.Equal(t, "4Gi", ptr.To(quota.Spec.Hard["requests.memory"]).String())

	// rome reads its grant and uses it against paris's API server.
	at, err := rome.brokerClient().Reservation(ctx, string(rsv.UID))
	require.NoError(t, err)
	require.NotNil(t, at.Grant)
	assert.Equal(t, "rb-rome", at.Grant.Namespace)
	tenant, err := client.New(&rest.Config{Host: at.Grant.Endpoint, BearerToken: at.Grant.Token,
		TLSClientConfig: rest.TLSClientConfig{CAData: at.Grant.CABundle}}, client.Options{Scheme: scheme})
	require.NoError(t, err)
	var pods corev1.PodList
	require.NoError(t, tenant.List(ctx, &pods, client.InNamespace("rb-rome")), "the token works in the tenant namespace")
	err = tenant.List(ctx, &pods, client.InNamespace("default"))
	assert.True(t, apierrors.IsForbidden(err), "and nowhere else: %v", err)
	err = tenant.List(ctx, &corev1.SecretList{}, client.InNamespace("kube-system"))
	assert.True(t, apierrors.IsForbidden(err), "%v", err)

	// A second reservation of rome to paris grows the quota, and is granted
	// the same token (one TokenRequest per requester while it is young).
	require.NoError(t, rome.client.Create(ctx, reservationObj("web-1", "1", "1Gi")))
	rsv1 := rome.waitPhase("web-1", rbv1.ReservationActive, 10*time.Second)
	at1, err := rome.brokerClient().Reservation(ctx, string(rsv1.UID))
	require.NoError(t, err)
	require.NotNil(t, at1.Grant)
	assert.Equal(t, at.Grant.Token, at1.Grant.Token, "one token for the requester's reservations")
	assert.Equal(t, at.Grant.ExpiresAt.Unix(), at1.Grant.ExpiresAt.Unix())
	require.Eventually(t, func() bool {
		_ = paris.client.Get(ctx, types.NamespacedName{Namespace: "rb-rome", Name: "rb-reservations"}, &quota)
		q := quota.Spec.Hard["requests.cpu"]
		return q.Cmp(resource.MustParse("3")) == 0
	}, 5*time.Second, 20*time.Millisecond)

	// Deleting the Reservations releases at the broker and removes the tenant.
	require.NoError(t, rome.client.Delete(ctx, rsv))
	require.NoError(t, rome.client.Delete(ctx, reservationObj("web-1", "1", "1Gi")))
	require.Eventually(t, func() bool {
		var list rbv1.ReservationList
		require.NoError(t, rome.client.List(ctx, &list))
		return len(list.Items) == 0
	}, 10*time.Second, 20*time.Millisecond, "the finalizer lets go once released")
	released, err := b.Store.Reservation(ctx, "rome", string(rsv.UID))
	require.NoError(t, err)
	assert.Equal(t, "Released", released.Phase)
	require.Eventually(t, func() bool {
		var ns corev1.Namespace
		err := paris.client.Get(ctx, types.NamespacedName{Name: "rb-rome"}, &ns)
		// envtest runs no namespace controller: a deleted namespace stays Terminating.
		return apierrors.IsNotFound(err) || !ns.DeletionTimestamp.IsZero()
	}, 10*time.Second, 20*time.Millisecond, "tenant namespace removed")
	var pis rbv1.ProviderInstructionList
	require.NoError(t, paris.client.List(ctx, &pis))
	assert.Empty(t, pis.Items)
	c, err := b.Store.Cluster(ctx, "paris")
	require.NoError(t, err)
	assert.Zero(t, c.Reserved.CPU)
	require.NoError(t, b.Store.CheckInvariant(ctx))
}

// TestQueuedUntilCapacity: a reservation refused for lack of capacity stays
// Pending (Failed is final) with Reserved=False and the broker's reason,
// and is retried until a provider can take it.
func TestQueuedUntilCapacity(t *testing.T) {
	ctx := context.Background()
	b := brokertest.Start(t, brokertest.Options{})
	rome := newCluster(t, b, "rome")
	b.Advertise("paris", "2", "8Gi", "", "0.03", nil)
	rome.startAgent()

	require.NoError(t, rome.client.Create(ctx, reservationObj("big", "4", "4Gi")))
	rsv := &rbv1.Reservation{}
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		require.NoError(c, rome.client.Get(ctx, types.NamespacedName{Namespace: "default", Name: "big"}, rsv))
		assert.Equal(c, rbv1.ReservationPending, rsv.Status.Phase)
		assert.Equal(c, "NoCapacity", rsv.Status.Reason)
	}, 10*time.Second, 20*time.Millisecond)
	assert.Contains(t, rsv.Status.Message, "insufficient_cpu=1")
	cond := condition(rsv, rbv1.ConditionReserved)
	assert.Equal(t, metav1.ConditionFalse, cond.Status)
	assert.Equal(t, "NoCapacity", cond.Reason)
	assert.Contains(t, cond.Message, "insufficient_cpu=1", "the broker's reason")
	assert.Equal(t, metav1.ConditionFalse, condition(rsv, rbv1.ConditionReady).Status)

	b.Advertise("berlin", "16", "64Gi", "", "0.05", nil) // capacity appears
	rsv = rome.waitPhase("big", rbv1.ReservationReserved, 10*time.Second)
	assert.Equal(t, "berlin", rsv.Status.Provider)
	assert.Greater(t, rsv.Status.Attempts, int32(1))
}

// TestOverLimitAtTheBroker: a reservation refused because its cluster is at
// a limit the broker's operator set (429 LimitExceeded) was shown as
// BrokerUnavailable; it stays Pending with the broker's reason and message,
// Synced=True (the broker answered) and a Warning Event, and is placed once
// the cluster is back under its limit.
func TestOverLimitAtTheBroker(t *testing.T) {
	ctx := context.Background()
	p, err := policy.Parse([]byte("apiVersion: broker.fluidos.eu/v1alpha1\nkind: BrokerPolicy\nrequesters: {default: {maxReservations: 1}}\n"))
	require.NoError(t, err)
	b := brokertest.Start(t, brokertest.Options{Store: store.Config{Policy: p}})
	rome := newCluster(t, b, "rome")
	b.Advertise("paris", "8", "32Gi", "", "0.03", nil)
	rome.startAgent()

	require.NoError(t, rome.client.Create(ctx, reservationObj("first", "1", "1Gi")))
	first := rome.waitPhase("first", rbv1.ReservationReserved, 10*time.Second)
	require.NoError(t, rome.client.Create(ctx, reservationObj("second", "1", "1Gi")))
	rsv := &rbv1.Reservation{}
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		require.NoError(c, rome.client.Get(ctx, types.NamespacedName{Namespace: "default", Name: "second"}, rsv))
		assert.Equal(c, rbv1.ReservationPending, rsv.Status.Phase)
		assert.Equal(c, api.ReasonLimitExceeded, rsv.Status.Reason)
	}, 10*time.Second, 20*time.Millisecond)
	assert.Equal(t, "requester rome is at its limit of live reservations: holds 1, asks 1 more, limit 1", rsv.Status.Message)
	assert.Equal(t, metav1.ConditionTrue, condition(rsv, rbv1.ConditionSynced).Status, "the broker answered")
	assert.Equal(t, api.ReasonLimitExceeded, condition(rsv, rbv1.ConditionReserved).Reason)
	assert.Equal(t, api.ReasonLimitExceeded, condition(rsv, rbv1.ConditionReady).Reason)
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		var events corev1.EventList
		require.NoError(c, rome.client.List(ctx, &events, client.InNamespace("default")))
		found := false
		for _, e := range events.Items {
			if e.InvolvedObject.Name == "second" && e.Reason == api.ReasonLimitExceeded && e.Type == corev1.EventTypeWarning {
				found = true
			}
		}
		assert.True(c, found, "a Warning Event names the limit")
	}, 10*time.Second, 50*time.Millisecond)

	require.NoError(t, rome.client.Delete(ctx, first)) // back under the limit (Retry-After: 5s)
	got := rome.waitPhase("second", rbv1.ReservationReserved, 20*time.Second)
	assert.Equal(t, "paris", got.Status.Provider)
	require.NoError(t, b.Store.CheckInvariant(ctx))
}

// flakyBroker loses the broker's first answer after the broker acted on it,
// as a dropped connection or an agent crash right after the call would.
type flakyBroker struct {
	*brokerclient.Client
	lost bool
}

func (f *flakyBroker) Reserve(ctx context.Context, r api.ReservationRequest) (api.Reservation, error) {
	at, err := f.Client.Reserve(ctx, r)
	if err == nil && !f.lost {
		f.lost = true
		return api.Reservation{}, &brokerclient.StreamError{Err: errors.New("connection reset after the broker answered")}
	}
	return at, err
}

// TestRestartDuplicatesNothing: an answer lost after the broker reserved, and
// an agent restart, neither duplicate nor leak a reservation.
func TestRestartDuplicatesNothing(t *testing.T) {
	ctx := context.Background()
	b := brokertest.Start(t, brokertest.Options{})
	rome := newCluster(t, b, "rome")
	b.Advertise("paris", "8", "32Gi", "", "0.03", nil)
	rome.startAgent(func(o *agent.Options) { o.ReserveBroker = &flakyBroker{Client: o.Broker} })
	require.NoError(t, rome.client.Create(ctx, reservationObj("once", "1", "1Gi")))
	rsv := rome.waitPhase("once", rbv1.ReservationReserved, 10*time.Second)
	assert.Equal(t, int32(2), rsv.Status.Attempts, "the first answer was lost and the request sent again")

	// Stop the agent, create another while it is down, restart.
	rome.stopAgent()
	require.NoError(t, rome.client.Create(ctx, reservationObj("while-down", "1", "1Gi")))
	rome.startAgent()
	rome.waitPhase("while-down", rbv1.ReservationReserved, 10*time.Second)
	time.Sleep(300 * time.Millisecond) // let the restarted agent resync everything
	live, err := b.Store.LiveReservations(ctx, "by-requester", "rome")
	require.NoError(t, err)
	assert.Len(t, live, 2, "one broker reservation per object, whatever the retries and restarts")
	c, err := b.Store.Cluster(ctx, "paris")
	require.NoError(t, err)
	assert.Equal(t, int64(2000), c.Reserved.CPU)

	// Deleted while the agent is down: released when it comes back.
	rome.stopAgent()
	require.NoError(t, rome.client.Delete(ctx, rsv))
	rome.startAgent()
	require.Eventually(t, func() bool {
		r, err := b.Store.Reservation(ctx, "rome", rsv.Status.ReservationID)
		return err == nil && r.Phase == "Released"
	}, 10*time.Second, 20*time.Millisecond)
	require.NoError(t, b.Store.CheckInvariant(ctx))
}

// TestBrokerUnreachable: while the broker cannot serve, the reservation waits
// with Synced=False, and it is decided once the broker is back.
func TestBrokerUnreachable(t *testing.T) {
	ctx := context.Background()
	b := brokertest.Start(t, brokertest.Options{})
	rome := newCluster(t, b, "rome")
	b.Advertise("paris", "8", "32Gi", "", "0.03", nil)
	rome.startAgent()

	b.Redis.Stop()
	require.NoError(t, rome.client.Create(ctx, reservationObj("patient", "1", "1Gi")))
	var rsv rbv1.Reservation
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		require.NoError(c, rome.client.Get(ctx, types.NamespacedName{Namespace: "default", Name: "patient"}, &rsv))
		assert.Equal(c, rbv1.ReservationPending, rsv.Status.Phase)
		assert.Equal(c, metav1.ConditionFalse, condition(&rsv, rbv1.ConditionSynced).Status)
		assert.Equal(c, "BrokerUnavailable", condition(&rsv, rbv1.ConditionSynced).Reason)
	}, 15*time.Second, 50*time.Millisecond)
	assert.Positive(t, promtestutil.ToFloat64(metrics.BrokerCalls.WithLabelValues("reserve", "unavailable")),
		"failed calls are counted in rb_agent_broker_calls_total")
	assert.Zero(t, promtestutil.ToFloat64(metrics.StreamConnected), "the event stream is down with the broker")

	b.Redis.Restart() // empty: the broker reloads its scripts; paris advertises again
	b.Advertise("paris", "8", "32Gi", "", "0.03", nil)
	got := rome.waitPhase("patient", rbv1.ReservationReserved, 15*time.Second)
	assert.Equal(t, metav1.ConditionTrue, condition(got, rbv1.ConditionSynced).Status)
	require.Eventually(t, func() bool { return promtestutil.ToFloat64(metrics.StreamConnected) == 1 }, 15*time.Second, 50*time.Millisecond,
		"the follower reconnects by itself")
}

// slowBroker stands for a broker a few tens of milliseconds away: every
// Reserve waits delay first. It records how many Reserve calls were in
// flight at once and how often each reservation id was asked for.
type slowBroker struct {
	*brokerclient.Client
	delay       time.Duration
	inFlight    atomic.Int32
	maxInFlight atomic.Int32
	mu          sync.Mutex
	calls       map[string]int
}

func (s *slowBroker) Reserve(ctx context.Context, r api.ReservationRequest) (api.Reservation, error) {
	n := s.inFlight.Add(1)
	defer s.inFlight.Add(-1)
	for m := s.maxInFlight.Load(); n > m && !s.maxInFlight.CompareAndSwap(m, n); m = s.maxInFlight.Load() {
	}
	s.mu.Lock()
	s.calls[r.ID]++
	s.mu.Unlock()
	time.Sleep(s.delay)
	return s.Client.Reserve(ctx, r)
}

// TestReservationBurstConcurrent: a burst of Reservations is reconciled by
// several workers at once (ReservationWorkers), and concurrency neither
// duplicates nor loses a reservation at the broker; one worker, as before,
// takes the same burst one at a time.
func TestReservationBurstConcurrent(t *testing.T) {
	ctx := context.Background()
	b := brokertest.Start(t, brokertest.Options{})
	rome := newCluster(t, b, "rome")
	b.Advertise("paris", "1000", "4000Gi", "", "0.03", nil)

	burst := func(prefix string, workers, n int) (*slowBroker, time.Duration) {
		t.Helper()
		sb := &slowBroker{delay: 40 * time.Millisecond, calls: map[string]int{}}
		rome.startAgent(func(o *agent.Options) {
			sb.Client = o.Broker
			o.ReserveBroker, o.ReservationWorkers = sb, workers
		})
		defer rome.stopAgent()
		began := time.Now()
		var wg sync.WaitGroup
		for i := range n {
			wg.Go(func() {
				assert.NoError(t, rome.client.Create(ctx, reservationObj(fmt.Sprintf("%s-%02d", prefix, i), "1", "1Gi")))
			})
		}
		wg.Wait()
		for i := range n {
			rsv := rome.waitPhase(fmt.Sprintf("%s-%02d", prefix, i), rbv1.ReservationReserved, 30*time.Second)
			assert.Equal(t, string(rsv.UID), rsv.Status.ReservationID)
		}
		took := time.Since(began)
		t.Logf("%d workers: %d reservations in %s (%.0f/s), at most %d broker calls at once",
			workers, n, took.Round(time.Millisecond), float64(n)/took.Seconds(), sb.maxInFlight.Load())
		sb.mu.Lock()
		defer sb.mu.Unlock()
		assert.Len(t, sb.calls, n, "one broker id per Reservation")
		return sb, took
	}

	one, _ := burst("serial", 1, 12)
	assert.Equal(t, int32(1), one.maxInFlight.Load(), "ReservationWorkers=1: one at a time")

	eight, _ := burst("burst", 8, 48)
	assert.Greater(t, eight.maxInFlight.Load(), int32(1), "ReservationWorkers=8: several at once")
	assert.LessOrEqual(t, eight.maxInFlight.Load(), int32(8))

	live, err := b.Store.LiveReservations(ctx, "by-requester", "rome")
	require.NoError(t, err)
	assert.Len(t, live, 12+48, "one broker reservation per object")
	c, err := b.Store.Cluster(ctx, "paris")
	require.NoError(t, err)
	assert.Equal(t, int64(60_000), c.Reserved.CPU)

	// Deleting them all at once: released concurrently, each exactly once.
	rome.startAgent(func(o *agent.Options) { o.ReservationWorkers = 8 })
	require.NoError(t, rome.client.DeleteAllOf(ctx, &rbv1.Reservation{}, client.InNamespace("default")))
	require.Eventually(t, func() bool {
		var list rbv1.ReservationList
		require.NoError(t, rome.client.List(ctx, &list))
		return len(list.Items) == 0
	}, 30*time.Second, 50*time.Millisecond, "every finalizer lets go once released")
	for _, r := range live {
		got, err := b.Store.Reservation(ctx, r.Requester, r.ID)
		require.NoError(t, err)
		assert.Equal(t, "Released", got.Phase, r.ID)
	}
	c, err = b.Store.Cluster(ctx, "paris")
	require.NoError(t, err)
	assert.Zero(t, c.Reserved.CPU)
	require.NoError(t, b.Store.CheckInvariant(ctx))
}
