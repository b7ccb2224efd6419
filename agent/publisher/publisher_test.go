package publisher_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/fluidos-project/resource-broker/agent/collector"
	"github.com/fluidos-project/resource-broker/agent/publisher"
	rbv1 "github.com/fluidos-project/resource-broker/api/v1alpha1"
	"github.com/fluidos-project/resource-broker/broker/api"
	brokerclient "github.com/fluidos-project/resource-broker/broker/client"
	"github.com/fluidos-project/resource-broker/broker/model"
	"github.com/fluidos-project/resource-broker/internal/brokertest"
	"github.com/fluidos-project/resource-broker/internal/testenv"
)

const clusterID = "rome"

// attempt is one call of the broker.
type attempt struct {
	began, at time.Time // the call's start and end
	err       error
	heartbeat bool
}

// recordingBroker records every publish attempt and forwards it to the
// broker client in use, which a test may swap.
type recordingBroker struct {
	mu       sync.Mutex
	inner    publisher.Broker
	attempts []attempt
}

func (r *recordingBroker) Advertise(ctx context.Context, id string, a api.Advertisement) (api.Cluster, error) {
	r.mu.Lock()
	inner := r.inner
	r.mu.Unlock()
	began := time.Now()
	cl, err := inner.Advertise(ctx, id, a)
	r.mu.Lock()
	r.attempts = append(r.attempts, attempt{began, time.Now(), err, false})
	r.mu.Unlock()
	return cl, err
}

func (r *recordingBroker) Heartbeat(ctx context.Context, id, digest string) (api.Heartbeat, error) {
	r.mu.Lock()
	inner := r.inner
	r.mu.Unlock()
	began := time.Now()
	hb, err := inner.Heartbeat(ctx, id, digest)
	r.mu.Lock()
	r.attempts = append(r.attempts, attempt{began, time.Now(), err, true})
	r.mu.Unlock()
	return hb, err
}

func (r *recordingBroker) swap(b publisher.Broker) {
	r.mu.Lock()
	r.inner = b
	r.mu.Unlock()
}

func (r *recordingBroker) since(t time.Time) []attempt {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []attempt
	for _, a := range r.attempts {
		if !a.began.Before(t) {
			out = append(out, a)
		}
	}
	return out
}

type bed struct {
	t      *testing.T
	ctx    context.Context
	kc     client.Client
	b      *brokertest.Broker
	broker *recordingBroker
	reg    *prometheus.Registry
}

// newBed starts a control plane with the CRDs, a real broker, and a manager
// running the collector and a publisher that talks to the broker through
// the client newBroker returns.
func newBed(t *testing.T, tune func(*publisher.Config), newBroker func(b *brokertest.Broker) publisher.Broker) *bed {
	t.Helper()
	cfg := testenv.Start(t, testenv.WithCRDDirectories(testenv.ModulePath(t, "manifests", "crds")))
	b := brokertest.Start(t, brokertest.Options{})
	scheme := runtime.NewScheme()
	require.NoError(t, clientgoscheme.AddToScheme(scheme))
	require.NoError(t, rbv1.AddToScheme(scheme))
	kc, err := client.New(cfg, client.Options{Scheme: scheme})
	require.NoError(t, err)
	ctx := context.Background()
	tb := &bed{t: t, ctx: ctx, kc: kc, b: b, broker: &recordingBroker{inner: newBroker(b)}, reg: prometheus.NewRegistry()}

	// One Ready node: 8 cpu, 16Gi, 100Gi of ephemeral storage.
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}}
	require.NoError(t, kc.Create(ctx, n))
	n.Status = corev1.NodeStatus{
		Capacity:    rl("cpu", "8", "memory", "16Gi", "ephemeral-storage", "100Gi"),
		Allocatable: rl("cpu", "8", "memory", "16Gi", "ephemeral-storage", "100Gi"),
		Conditions:  []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "Test"}},
	}
	require.NoError(t, kc.Status().Update(ctx, n))

	mgr, err := ctrl.NewManager(cfg, ctrl.Options{Scheme: scheme, Metrics: metricsserver.Options{BindAddress: "0"}})
	require.NoError(t, err)
	coll := collector.New(collector.Options{})
	require.NoError(t, coll.SetupWithManager(mgr))
	pc := publisher.Config{
		ClusterID: clusterID, Endpoint: "https://rome.example:6443", Labels: map[string]string{"region": "it"},
		Prices: &rbv1.Prices{Currency: "EUR", CPU: ptrQ("0.031"), Memory: ptrQ("0.004")},
		Source: coll, Broker: tb.broker, Client: mgr.GetClient(), APIReader: mgr.GetAPIReader(),
		Recorder: mgr.GetEventRecorder("rb-agent"), Registerer: tb.reg,
	}
	if tune != nil {
		tune(&pc)
	}
	pub, err := publisher.New(pc)
	require.NoError(t, err)
	require.NoError(t, pub.SetupWithManager(mgr))
	mctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- mgr.Start(mctx) }()
	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-done)
	})
	return tb
}

func realClient(t *testing.T, b *brokertest.Broker, opts ...brokerclient.Option) *brokerclient.Client {
	c, err := brokerclient.New(b.URL, b.ClusterCertDir(clusterID), opts...)
	require.NoError(t, err)
	return c
}

func rl(kv ...string) corev1.ResourceList {
	out := corev1.ResourceList{}
	for i := 0; i < len(kv); i += 2 {
		out[corev1.ResourceName(kv[i])] = resource.MustParse(kv[i+1])
	}
	return out
}

func ptrQ(s string) *resource.Quantity {
	q := resource.MustParse(s)
	return &q
}

// stored reads what the broker holds for rome (integer units).
func (tb *bed) stored() (model.Cluster, bool) {
	c, err := tb.b.Store.Cluster(tb.ctx, clusterID)
	if err != nil {
		return c, false
	}
	return c, true
}

// waitStored waits until the broker holds cond, and returns how long that took.
func (tb *bed) waitStored(within time.Duration, what string, cond func(model.Cluster) bool) time.Duration {
	tb.t.Helper()
	began := time.Now()
	for {
		if c, ok := tb.stored(); ok && cond(c) {
			return time.Since(began)
		}
		if time.Since(began) > within {
			c, _ := tb.stored()
			tb.t.Fatalf("%s: not at the broker within %s; stored %+v", what, within, c)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

func (tb *bed) advertisement() *rbv1.Advertisement {
	var adv rbv1.Advertisement
	if err := tb.kc.Get(tb.ctx, client.ObjectKey{Name: clusterID}, &adv); err != nil {
		return nil
	}
	return &adv
}

// waitAdvertisement waits until the Advertisement satisfies cond.
func (tb *bed) waitAdvertisement(within time.Duration, what string, cond func(*rbv1.Advertisement) bool) *rbv1.Advertisement {
	tb.t.Helper()
	deadline := time.Now().Add(within)
	for {
		adv := tb.advertisement()
		if adv != nil && cond(adv) {
			return adv
		}
		if time.Now().After(deadline) {
			tb.t.Fatalf("%s: Advertisement not so within %s: %+v", what, within, adv)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// published: the Published condition is status (for reason), about the current spec.
func published(status metav1.ConditionStatus, reason string) func(*rbv1.Advertisement) bool {
	return func(adv *rbv1.Advertisement) bool {
		c := meta.FindStatusCondition(adv.Status.Conditions, rbv1.ConditionPublished)
		return c != nil && c.Status == status && (reason == "" || c.Reason == reason) && c.ObservedGeneration == adv.Generation
	}
}

// events counts the events of a reason about the Advertisement.
func (tb *bed) events(reason string) int {
	var list eventsv1.EventList
	require.NoError(tb.t, tb.kc.List(tb.ctx, &list, client.InNamespace(metav1.NamespaceDefault)))
	n := 0
	for _, e := range list.Items {
		if e.Regarding.Kind == "Advertisement" && e.Regarding.Name == clusterID && e.Reason == reason {
			n++
		}
	}
	return n
}

func (tb *bed) waitEvent(reason string, atLeast int) {
	tb.t.Helper()
	require.Eventually(tb.t, func() bool { return tb.events(reason) >= atLeast }, 15*time.Second, 50*time.Millisecond,
		"want %d events %s", atLeast, reason)
}

// metric reads a counter, gauge or histogram count from the test registry.
func (tb *bed) metric(name, label, value string) float64 {
	tb.t.Helper()
	families, err := tb.reg.Gather()
	require.NoError(tb.t, err)
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			match := label == ""
			for _, l := range m.GetLabel() {
				if l.GetName() == label && l.GetValue() == value {
					match = true
				}
			}
			if !match {
				continue
			}
			switch {
			case m.Counter != nil:
				return m.GetCounter().GetValue()
			case m.Gauge != nil:
				return m.GetGauge().GetValue()
			case m.Histogram != nil:
				return float64(m.GetHistogram().GetSampleCount())
			}
		}
	}
	tb.t.Fatalf("metric %s{%s=%q} not found", name, label, value)
	return 0
}

func (tb *bed) pod(name, cpu string) {
	tb.t.Helper()
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name},
		Spec: corev1.PodSpec{NodeName: "n1", Containers: []corev1.Container{{
			Name: "c", Image: "busybox", Resources: corev1.ResourceRequirements{Requests: rl("cpu", cpu, "memory", "64Mi")},
		}}},
	}
	require.NoError(tb.t, tb.kc.Create(tb.ctx, p))
}

// TestChangeReachesBrokerWithinDebounce: the agent's advertisement reaches a
// real broker, the Advertisement shows it, and a new pod's requests reach
// the broker's used_cpu within the debounce window (1 s); a burst of pods is
// coalesced into few publishes.
func TestChangeReachesBrokerWithinDebounce(t *testing.T) {
	tb := newBed(t, func(c *publisher.Config) {
		c.Band = -1 // every change is sent: the exact figures reach the broker
	}, func(b *brokertest.Broker) publisher.Broker { return realClient(t, b) })

	tb.waitStored(30*time.Second, "first advertisement", func(c model.Cluster) bool { return c.Allocatable.CPU == 8000 })
	c, _ := tb.stored()
	require.Equal(t, model.Resources{CPU: 8000, Memory: 16 << 30, Storage: 100 << 30}, c.Capacity)
	require.Equal(t, model.Resources{}, c.Allocated)
	require.Equal(t, "https://rome.example:6443", c.Endpoint)
	require.Equal(t, map[string]string{"region": "it"}, c.Labels)
	require.Equal(t, int64(31000), c.Prices.CPU) // micro-EUR per core-hour

	adv := tb.waitAdvertisement(10*time.Second, "acknowledged", published(metav1.ConditionTrue, publisher.ReasonAcknowledged))
	require.Equal(t, clusterID, adv.Spec.ClusterID)
	require.Zero(t, adv.Spec.Allocatable.Cpu().Cmp(resource.MustParse("8")))
	require.NotNil(t, adv.Status.LastPublished)
	require.Zero(t, adv.Status.ConsecutiveFailures)
	require.Zero(t, adv.Status.Available.Cpu().Cmp(resource.MustParse("8")), "available: %v", adv.Status.Available)
	require.Equal(t, adv.Generation, meta.FindStatusCondition(adv.Status.Conditions, rbv1.ConditionPublished).ObservedGeneration)
	tb.waitEvent(publisher.EventPublished, 1)

	// One pod after a quiet spell: published at once.
	time.Sleep(1500 * time.Millisecond)
	began := time.Now()
	tb.pod("one", "1500m")
	tb.waitStored(5*time.Second, "one pod", func(c model.Cluster) bool { return c.Allocated.CPU == 1500 })
	took := time.Since(began)
	t.Logf("pod created -> used_cpu at the broker: %s", took.Round(time.Millisecond))

	require.Less(t, took, 5*time.Second)

	// A burst of 20 pods right after: the rest waits for the debounce
	// interval and goes out in one publish.
	began = time.Now()
	for i := 0; i < 20; i++ {
		tb.pod("burst-"+string(rune('a'+i)), "100m")
	}
	tb.waitStored(5*time.Second, "burst", func(c model.Cluster) bool { return c.Allocated.CPU == 3500 })
	burst := time.Since(began)
	require.Less(t, burst, 5*time.Second)

	adv = tb.waitAdvertisement(5*time.Second, "spec follows", func(a *rbv1.Advertisement) bool {
		return a.Spec.Allocated.Cpu().Cmp(resource.MustParse("3500m")) == 0 && published(metav1.ConditionTrue, "")(a)
	})
	require.Zero(t, adv.Status.Available.Cpu().Cmp(resource.MustParse("4500m")), "available: %v", adv.Status.Available)
	n := len(tb.broker.since(began))
	t.Logf("20 pods created in a burst -> used_cpu at the broker: %s, %d publish(es)", burst.Round(time.Millisecond), n)
	require.LessOrEqual(t, n, 3) // one or two by the debounce, perhaps a 30 s tick
	require.GreaterOrEqual(t, tb.metric("rb_agent_publish_duration_seconds", "result", "success"), 3.0)
	require.Zero(t, tb.metric("rb_agent_publish_duration_seconds", "result", "failure"))
	require.InDelta(t, float64(time.Now().Unix()), tb.metric("rb_agent_published_timestamp_seconds", "", ""), 10)
}

// waits returns the back-off: the time from the end of each attempt to the
// start of the next.
func waits(as []attempt) []time.Duration {
	var out []time.Duration
	for i := 1; i < len(as); i++ {
		out = append(out, as[i].began.Sub(as[i-1].at))
	}
	return out
}

// TestRetriesThroughRedisOutage: with the broker's Redis down, the publisher
// keeps retrying with growing back-off, shows Published=False with the
// reason and the failure count, counts failures in its metrics, and catches
// up by itself once Redis is back (empty: the advertisement is stored anew).
func TestRetriesThroughRedisOutage(t *testing.T) {
	tb := newBed(t, func(c *publisher.Config) {
		c.Debounce = 200 * time.Millisecond
		c.MinBackoff, c.MaxBackoff = 100*time.Millisecond, 800*time.Millisecond
	}, func(b *brokertest.Broker) publisher.Broker {
		return realClient(t, b, brokerclient.WithRetries(0, 0)) // the publisher's own back-off only
	})
	tb.waitStored(30*time.Second, "first advertisement", func(c model.Cluster) bool { return c.Allocatable.CPU == 8000 })
	tb.waitAdvertisement(10*time.Second, "acknowledged", published(metav1.ConditionTrue, ""))

	tb.b.Redis.Stop()
	down := time.Now()
	tb.pod("during-outage", "1")
	adv := tb.waitAdvertisement(20*time.Second, "failing", func(a *rbv1.Advertisement) bool {
		return published(metav1.ConditionFalse, publisher.ReasonBrokerUnavailable)(a) && a.Status.ConsecutiveFailures >= 4
	})
	cond := meta.FindStatusCondition(adv.Status.Conditions, rbv1.ConditionPublished)
	t.Logf("while Redis is down: Published=%s reason=%s consecutiveFailures=%d message=%q",
		cond.Status, cond.Reason, adv.Status.ConsecutiveFailures, cond.Message)
	require.Zero(t, adv.Spec.Allocated.Cpu().Cmp(resource.MustParse("1")), "the spec shows what is being published")
	require.Equal(t, adv.Generation, cond.ObservedGeneration)
	require.GreaterOrEqual(t, tb.metric("rb_agent_publish_failures_total", "reason", publisher.ReasonBrokerUnavailable), 4.0)
	require.GreaterOrEqual(t, tb.metric("rb_agent_publish_consecutive_failures", "", ""), 4.0)
	tb.waitEvent(publisher.EventPublishFailed, 1)

	time.Sleep(3 * time.Second) // long enough for the back-off to reach its bound
	failed := tb.broker.since(down)
	for _, a := range failed {
		require.Error(t, a.err)
	}
	g := waits(failed)
	t.Logf("%d attempts in %s while Redis was down (the broker answers 503 after trying Redis); back-off between them %v",
		len(failed), time.Since(down).Round(time.Millisecond), g)
	// MinBackoff 100ms doubling to MaxBackoff 800ms, each up to half longer
	// (jitter): 100-150ms, 200-300ms, 400-600ms, then 800ms-1.2s.
	require.GreaterOrEqual(t, len(g), 3)
	require.Less(t, g[0], 400*time.Millisecond, "first retry after about MinBackoff")
	for _, d := range g {
		require.Less(t, d, 1500*time.Millisecond, "no wait beyond MaxBackoff (with jitter)")
	}
	require.Greater(t, g[len(g)-1], 550*time.Millisecond, "back-off grew to MaxBackoff")

	restarted := time.Now()
	tb.b.Redis.Restart()
	tb.waitStored(10*time.Second, "caught up", func(c model.Cluster) bool { return c.Allocated.CPU == 1000 })
	t.Logf("Redis back -> advertisement stored again in %s", time.Since(restarted).Round(time.Millisecond))
	adv = tb.waitAdvertisement(10*time.Second, "acknowledged again", func(a *rbv1.Advertisement) bool {
		return published(metav1.ConditionTrue, publisher.ReasonAcknowledged)(a) && a.Status.ConsecutiveFailures == 0
	})
	require.True(t, adv.Status.LastPublished.After(down))
	require.Zero(t, tb.metric("rb_agent_publish_consecutive_failures", "", ""))
	tb.waitEvent(publisher.EventPublished, 2) // once at first, once after the outage
}

// TestDeadURLThenBroker: a publisher pointed at an address nothing listens
// on reports BrokerUnreachable, and publishes once it reaches the broker.
func TestDeadURLThenBroker(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	dead := "https://" + ln.Addr().String()
	require.NoError(t, ln.Close())
	var real *brokerclient.Client
	tb := newBed(t, func(c *publisher.Config) {
		c.MinBackoff, c.MaxBackoff = 100*time.Millisecond, time.Second
	}, func(b *brokertest.Broker) publisher.Broker {
		real = realClient(t, b)
		c, err := brokerclient.New(dead, b.ClusterCertDir(clusterID), brokerclient.WithRetries(0, 0))
		require.NoError(t, err)
		return c
	})
	adv := tb.waitAdvertisement(30*time.Second, "unreachable", func(a *rbv1.Advertisement) bool {
		return published(metav1.ConditionFalse, publisher.ReasonBrokerUnreachable)(a) && a.Status.ConsecutiveFailures >= 2
	})
	require.Nil(t, adv.Status.LastPublished)
	require.GreaterOrEqual(t, tb.metric("rb_agent_publish_failures_total", "reason", publisher.ReasonBrokerUnreachable), 2.0)
	_, stored := tb.stored()
	require.False(t, stored)
	tb.waitEvent(publisher.EventPublishFailed, 1)

	tb.broker.swap(real)
	tb.waitStored(10*time.Second, "reached", func(c model.Cluster) bool { return c.Allocatable.CPU == 8000 })
	tb.waitAdvertisement(10*time.Second, "acknowledged", func(a *rbv1.Advertisement) bool {
		return published(metav1.ConditionTrue, publisher.ReasonAcknowledged)(a) && a.Status.ConsecutiveFailures == 0 && a.Status.LastPublished != nil
	})
	tb.waitEvent(publisher.EventPublished, 1)
}

// TestNewChecksConfig: required fields, and the metrics land on
// controller-runtime's registry by default (twice is fine).
func TestNewChecksConfig(t *testing.T) {
	_, err := publisher.New(publisher.Config{})
	require.Error(t, err)
	cfg := publisher.Config{ClusterID: "x", Source: collector.New(collector.Options{}), Broker: &recordingBroker{}, Client: fakeClient{}}
	_, err = publisher.New(cfg)
	require.NoError(t, err)
	_, err = publisher.New(cfg)
	require.NoError(t, err, "a second publisher reuses the registered metrics")
	reg := prometheus.NewRegistry()
	require.NoError(t, reg.Register(prometheus.NewGauge(prometheus.GaugeOpts{Name: "rb_agent_published_timestamp_seconds", Help: "x", ConstLabels: prometheus.Labels{"a": "b"}})))
	cfg.Registerer = reg
	_, err = publisher.New(cfg)
	require.Error(t, err, "a different metric under the same name")
	require.False(t, errors.Is(err, context.Canceled))
}

// fakeClient satisfies client.Client for tests that never write.
type fakeClient struct{ client.Client }

// staticSource never changes.
type staticSource struct{ changed chan struct{} }

func (s staticSource) Measure() collector.Measurement {
	l := rl("cpu", "1", "memory", "1Gi")
	return collector.Measurement{Capacity: l, Allocatable: l, Allocated: rl("cpu", "0", "memory", "0"), Nodes: 1}
}
func (s staticSource) Changed() <-chan struct{}         { return s.changed }
func (s staticSource) WaitForSync(context.Context) bool { return true }

type okBroker struct{}

func (okBroker) Advertise(context.Context, string, api.Advertisement) (api.Cluster, error) {
	return api.Cluster{SeenAt: time.Now(), Digest: "0123456789abcdef"}, nil
}

func (okBroker) Heartbeat(context.Context, string, string) (api.Heartbeat, error) {
	return api.Heartbeat{SeenAt: time.Now()}, nil
}

// TestPeriodicPublishesOnWallClock: with nothing changing, the publisher
// publishes at every multiple of the period on the wall clock: the
// advertisement at start, then heartbeats naming it.
func TestPeriodicPublishesOnWallClock(t *testing.T) {
	scheme := runtime.NewScheme()
	require.NoError(t, rbv1.AddToScheme(scheme))
	kc := fake.NewClientBuilder().WithScheme(scheme).WithStatusSubresource(&rbv1.Advertisement{}).Build()
	rec := &recordingBroker{inner: okBroker{}}
	const period = 500 * time.Millisecond
	pub, err := publisher.New(publisher.Config{ClusterID: clusterID, Source: staticSource{make(chan struct{})}, Broker: rec,
		Client: kc, Period: period, Registerer: prometheus.NewRegistry()})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	// Start half-way between two multiples: a publisher that ticked from its
	// start would publish 250 ms off them, an aligned one within a timer's
	// lateness, which a loaded machine stretches to tens of milliseconds.
	now := time.Now()
	time.Sleep(now.Truncate(period).Add(period + period/2).Sub(now))
	began := time.Now()
	go func() { done <- pub.Start(ctx) }()
	time.Sleep(2200 * time.Millisecond)
	cancel()
	require.NoError(t, <-done)

	as := rec.since(began)
	require.GreaterOrEqual(t, len(as), 4, "one at start, then one per period")
	require.False(t, as[0].heartbeat, "the advertisement first")
	for _, a := range as[1:] {
		require.True(t, a.heartbeat, "nothing changed: a heartbeat")
		off := a.began.Sub(a.began.Truncate(period))
		require.Less(t, off, 150*time.Millisecond, "attempt at %s is not on a multiple of %s", a.began.Format("15:04:05.000"), period)
	}
	var adv rbv1.Advertisement
	require.NoError(t, kc.Get(context.Background(), client.ObjectKey{Name: clusterID}, &adv))
	require.NotNil(t, adv.Status.LastPublished)
}

// TestNodesReachTheBroker: the node summary and the reservations on nodes
// reach a real broker and the Advertisement's spec. A reservation the
// broker placed on n1 is debited there until the tenant pod that carries its
// id runs on n1; then the provider's figures count the pod and list the id,
// and the broker drops its own debit: counted once.
func TestNodesReachTheBroker(t *testing.T) {
	tb := newBed(t, nil, func(b *brokertest.Broker) publisher.Broker { return realClient(t, b) })
	tb.waitStored(30*time.Second, "first advertisement", func(c model.Cluster) bool { return len(c.Nodes) == 1 })
	c, _ := tb.stored()
	require.Equal(t, model.NodeCapacity{Name: "n1", Allocatable: model.Resources{CPU: 8000, Memory: 16 << 30, Storage: 100 << 30}}, c.Nodes[0])

	d, err := tb.b.Store.Reserve(tb.ctx, model.ReserveRequest{ID: "resv-1", Requester: "milan", Duration: time.Hour,
		Resources: model.Resources{CPU: 1000, Memory: 1 << 30}})
	require.NoError(t, err)
	require.Equal(t, clusterID, d.Reservation.Target)
	require.Equal(t, "n1", d.Reservation.Node)
	c, _ = tb.stored()
	require.Equal(t, model.Resources{CPU: 1000, Memory: 1 << 30}, c.NodesReserved["n1"], "debited until the provider reports the pod")

	require.NoError(t, tb.kc.Create(tb.ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "rb-milan", Labels: map[string]string{rbv1.TenantLabel: "milan"}}}))
	require.NoError(t, tb.kc.Create(tb.ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "rb-milan", Name: "guest", Annotations: map[string]string{rbv1.ReservationIDAnnotation: "resv-1"}},
		Spec: corev1.PodSpec{NodeName: "n1", Containers: []corev1.Container{{
			Name: "c", Image: "busybox", Resources: corev1.ResourceRequirements{Requests: rl("cpu", "1", "memory", "1Gi")},
		}}},
	}))
	tb.waitStored(10*time.Second, "the pod in n1's figures, its reservation listed", func(c model.Cluster) bool {
		return len(c.Nodes) == 1 && c.Nodes[0].Allocated.CPU == 1000 && len(c.NodesReserved) == 0 &&
			slices.Equal(c.ReservationsOnNodes, []string{"milan/resv-1"})
	})
	c, _ = tb.stored()
	require.Zero(t, c.Allocated.CPU, "the totals leave tenant pods out, as before")
	require.Equal(t, int64(7000), c.StoredNodes()[0].Free().CPU, "counted once")
	require.NoError(t, tb.b.Store.CheckInvariant(tb.ctx))

	adv := tb.waitAdvertisement(10*time.Second, "spec shows the nodes", func(a *rbv1.Advertisement) bool {
		return len(a.Spec.ReservationsOnNodes) == 1 && published(metav1.ConditionTrue, "")(a)
	})
	require.Len(t, adv.Spec.Nodes, 1)
	require.Equal(t, "n1", adv.Spec.Nodes[0].Name)
	require.Zero(t, adv.Spec.Nodes[0].Allocated.CPU.Cmp(resource.MustParse("1")))
	require.Nil(t, adv.Spec.Nodes[0].Allocated.GPU, "no GPUs: left out")
}

// TestAdvertisementNodesValidation: the CRD refuses nodes the broker would
// refuse (too many, a bad or repeated name, negative amounts, allocated
// beyond allocatable).
func TestAdvertisementNodesValidation(t *testing.T) {
	cfg := testenv.Start(t, testenv.WithCRDDirectories(testenv.ModulePath(t, "manifests", "crds")))
	scheme := runtime.NewScheme()
	require.NoError(t, rbv1.AddToScheme(scheme))
	kc, err := client.New(cfg, client.Options{Scheme: scheme})
	require.NoError(t, err)
	ctx := context.Background()
	amounts := func(cpu, memory string) rbv1.NodeAmounts {
		return rbv1.NodeAmounts{CPU: ptrQ(cpu), Memory: ptrQ(memory)}
	}
	node := func(name, allocCPU, usedCPU string) rbv1.NodeResources {
		return rbv1.NodeResources{Name: name, Allocatable: amounts(allocCPU, "8Gi"), Allocated: amounts(usedCPU, "1Gi")}
	}
	adv := func(name string, nodes ...rbv1.NodeResources) *rbv1.Advertisement {
		return &rbv1.Advertisement{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: rbv1.AdvertisementSpec{
			ClusterID: name, Capacity: rl("cpu", "8"), Allocatable: rl("cpu", "8"), Allocated: corev1.ResourceList{},
			Nodes: nodes, ReservationsOnNodes: []string{"resv-1"},
		}}
	}
	gpu := node("n2", "4", "1")
	gpu.Allocatable.GPU, gpu.Allocated.GPU = ptrQ("2"), ptrQ("1")
	require.NoError(t, kc.Create(ctx, adv("ok", node("n1", "4", "4"), gpu)))

	many := make([]rbv1.NodeResources, 101)
	for i := range many {
		many[i] = node(fmt.Sprintf("n%d", i), "4", "1")
	}
	overGPU := node("n1", "4", "1")
	overGPU.Allocated.GPU = ptrQ("1")
	for name, a := range map[string]*rbv1.Advertisement{
		"too-many":   adv("too-many", many...),
		"bad-name":   adv("bad-name", node("Node_1", "4", "1")),
		"twice":      adv("twice", node("n1", "4", "1"), node("n1", "4", "1")),
		"negative":   adv("negative", node("n1", "4", "-1")),
		"over":       adv("over", node("n1", "4", "5")),
		"over-gpu":   adv("over-gpu", overGPU),
		"no-name":    adv("no-name", node("", "4", "1")),
		"long-value": adv("long-value", node("n1", "4", strings.Repeat("1", 70))),
	} {
		require.Error(t, kc.Create(ctx, a), name)
	}
}

// TestHeartbeatsWithinBand (real broker): once the broker holds the
// advertisement, a pod that moves n1's used cpu within the band (5 % of 8
// cores) publishes nothing and the ticks send heartbeats that keep the
// cluster live; a pod past the band is advertised within the debounce
// interval; after the broker lost its state, the next heartbeat is refused
// and the full advertisement follows at once.
func TestHeartbeatsWithinBand(t *testing.T) {
	const period = time.Second
	tb := newBed(t, func(c *publisher.Config) { c.Period = period }, func(b *brokertest.Broker) publisher.Broker { return realClient(t, b) })
	tb.waitStored(30*time.Second, "first advertisement", func(c model.Cluster) bool { return c.Allocatable.CPU == 8000 })
	tb.waitAdvertisement(10*time.Second, "acknowledged", published(metav1.ConditionTrue, publisher.ReasonAcknowledged))

	began := time.Now()
	tb.pod("small", "300m") // 3.75 % of n1
	time.Sleep(3 * period)
	c, _ := tb.stored()
	require.Zero(t, c.Allocated.CPU, "within the band: the broker keeps the figures it has")
	require.Less(t, time.Since(c.SeenAt), 2*period, "kept live by heartbeats")
	as := tb.broker.since(began)
	require.GreaterOrEqual(t, len(as), 2)
	for _, a := range as {
		require.True(t, a.heartbeat, "heartbeats only")
		require.NoError(t, a.err)
	}
	require.GreaterOrEqual(t, tb.metric("rb_agent_heartbeats_total", "outcome", publisher.HeartbeatAccepted), 2.0)
	adv := tb.waitAdvertisement(5*time.Second, "status follows heartbeats", func(a *rbv1.Advertisement) bool {
		return a.Status.LastPublished != nil && a.Status.LastPublished.After(began.Add(-time.Second))
	})
	require.Zero(t, adv.Spec.Allocated.Cpu().Value(), "the spec is what the broker holds")

	tb.pod("big", "1") // 300m + 1 = 16 % of n1: past the band
	moved := time.Now()
	tb.waitStored(period/2+2*time.Second, "past the band", func(c model.Cluster) bool { return c.Allocated.CPU == 1300 })
	t.Logf("a pod past the band -> stored in %s", time.Since(moved).Round(time.Millisecond))

	// The broker lost its state: the next heartbeat is refused, and the
	// advertisement is sent again at once.
	require.NoError(t, tb.b.RDB.FlushAll(tb.ctx).Err())
	tb.waitStored(period+5*time.Second, "advertised again", func(c model.Cluster) bool { return c.Allocated.CPU == 1300 })
	require.GreaterOrEqual(t, tb.metric("rb_agent_heartbeats_total", "outcome", publisher.HeartbeatAdvertisementNeeded), 1.0)
	require.Zero(t, tb.metric("rb_agent_publish_failures_total", "reason", publisher.ReasonBrokerRejected), "a refused heartbeat is no failure")
	tb.waitAdvertisement(5*time.Second, "acknowledged", published(metav1.ConditionTrue, publisher.ReasonAcknowledged))
}

// shedBroker answers every advertisement 503 Busy while shedding, as a
// broker whose advertisement queue is full does, and passes heartbeats on.
type shedBroker struct {
	publisher.Broker
	shedding atomic.Bool
}

func (s *shedBroker) Advertise(ctx context.Context, id string, a api.Advertisement) (api.Cluster, error) {
	if s.shedding.Load() {
		return api.Cluster{}, &brokerclient.APIError{StatusCode: http.StatusServiceUnavailable, Reason: api.ReasonBusy,
			Message: "advertisement shed", RetryAfter: time.Second}
	}
	return s.Broker.Advertise(ctx, id, a)
}

// TestShedAdvertisementKeepsClusterLiveWhenItFrees (real broker behind a
// shedding front): while the broker sheds the advertisements, a cluster
// whose pods ended (it uses less than the broker's copy says) stays live by
// heartbeats on that copy; one whose use rose past the band sends none and
// would go stale; once the broker takes advertisements again, the new
// figures are stored.
func TestShedAdvertisementKeepsClusterLiveWhenItFrees(t *testing.T) {
	const period = time.Second
	var shed *shedBroker
	tb := newBed(t, func(c *publisher.Config) { c.Period = period }, func(b *brokertest.Broker) publisher.Broker {
		shed = &shedBroker{Broker: realClient(t, b)}
		return shed
	})
	tb.pod("big", "1") // 12.5 % of n1: past the band
	tb.waitStored(30*time.Second, "the pod advertised", func(c model.Cluster) bool { return c.Allocated.CPU == 1000 })
	tb.waitAdvertisement(10*time.Second, "acknowledged", published(metav1.ConditionTrue, publisher.ReasonAcknowledged))

	shed.shedding.Store(true)
	freed := time.Now()
	require.NoError(t, tb.kc.Delete(tb.ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "big"}}, client.GracePeriodSeconds(0)))
	time.Sleep(4 * period)
	c, _ := tb.stored()
	require.Equal(t, int64(1000), c.Allocated.CPU, "the broker took no new figures")
	require.Less(t, time.Since(c.SeenAt), 2*period, "kept live by heartbeats on its copy")
	var shedAds, heartbeats int
	for _, a := range tb.broker.since(freed) {
		switch {
		case a.heartbeat:
			require.NoError(t, a.err)
			heartbeats++
		case brokerclient.IsBusy(a.err):
			shedAds++
		}
	}
	require.Positive(t, shedAds, "the new figures were sent, and shed")
	require.Positive(t, heartbeats)

	tb.pod("bigger", "2") // now 25 % of n1 against the copy's 12.5 %: past the band upwards
	rose := time.Now()
	time.Sleep(4 * period)
	for _, a := range tb.broker.since(rose.Add(period / 2)) {
		require.False(t, a.heartbeat, "no heartbeat stands for figures that rose past the band")
	}
	c, _ = tb.stored()
	require.Greater(t, time.Since(c.SeenAt), 3*period, "not kept live: the broker's copy offers more than there is")

	shed.shedding.Store(false)
	tb.waitStored(10*time.Second, "the new figures once the broker takes them", func(c model.Cluster) bool { return c.Allocated.CPU == 2000 })
}
