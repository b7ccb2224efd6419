package virtualkubelet

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	clienttesting "k8s.io/client-go/testing"
	statsv1alpha1 "k8s.io/kubelet/pkg/apis/stats/v1alpha1"
	metricsv1beta1 "k8s.io/metrics/pkg/apis/metrics/v1beta1"
	metricsfake "k8s.io/metrics/pkg/client/clientset/versioned/fake"

	rbv1 "github.com/fluidos-project/resource-broker/api/v1alpha1"
)

var t0 = time.Date(2026, 11, 25, 12, 0, 0, 0, time.UTC)

func sample(ns, name string, uid types.UID, at time.Time, window time.Duration, containers ...containerSample) podSample {
	return podSample{namespace: ns, name: name, uid: uid, start: t0, time: at, window: window, containers: containers}
}

func cores(c float64) uint64 { return uint64(c * 1e9) }

// core-seconds as counters hold them (nanoseconds, from the floor of 1).
func coreNS(seconds float64) uint64 { return counterFloor + uint64(seconds*1e9) }

func all(types.UID) bool { return true }

// TestUsageCounters: the cumulative CPU counters rebuilt from the
// provider's rates, for a container, its pod and the node, through new
// samples, repeated and older ones, a restart, a second pod, a pod that
// misses a poll and one that is gone.
func TestUsageCounters(t *testing.T) {
	var tr usageTracker
	main := func(rate float64, start time.Time) containerSample {
		return containerSample{name: "main", start: start, nanoCores: cores(rate), workingSet: 64 << 20}
	}
	sidecar := containerSample{name: "sidecar", start: t0, nanoCores: 0, workingSet: 8 << 20}
	pod := func(s *usageSnapshot, name string) podUsage {
		for _, p := range s.pods {
			if p.name == name {
				return p
			}
		}
		t.Fatalf("no pod %s in the snapshot", name)
		return podUsage{}
	}

	// First sample, 30 s after the container started, 0.5 cores over 15 s:
	// the container's counter is its usage since it started at that rate;
	// the node adds the window's usage.
	s := tr.observe([]podSample{sample("shop", "web-0", "u0", t0.Add(30*time.Second), 15*time.Second, main(0.5, t0), sidecar)}, t0.Add(31*time.Second), all)
	web := pod(s, "web-0")
	require.Len(t, web.containers, 2)
	assert.Equal(t, "main", web.containers[0].name, "containers by name")
	assert.Equal(t, coreNS(15), web.containers[0].coreNanoSeconds)
	assert.Equal(t, uint64(counterFloor), web.containers[1].coreNanoSeconds, "an idle container's counter is the floor, never 0")
	assert.Equal(t, coreNS(15), web.coreNanoSeconds, "the pod's counter starts as its containers' sum")
	assert.Equal(t, coreNS(7.5), s.coreNanoSeconds, "the node adds the window's usage")
	assert.Equal(t, cores(0.5), s.nanoCores)
	assert.Equal(t, uint64(72<<20), web.workingSet)
	assert.Equal(t, uint64(72<<20), s.workingSet)
	assert.Equal(t, t0.Add(30*time.Second), s.time, "the node's figures are as of its newest sample")
	assert.Equal(t, t0, web.containers[0].start)

	// The same sample again (the provider's metrics-server has not scraped
	// since), then an older one: nothing moves.
	again := tr.observe([]podSample{sample("shop", "web-0", "u0", t0.Add(30*time.Second), 15*time.Second, main(0.5, t0), sidecar)}, t0.Add(41*time.Second), all)
	assert.Equal(t, s.coreNanoSeconds, again.coreNanoSeconds)
	assert.Equal(t, web.coreNanoSeconds, pod(again, "web-0").coreNanoSeconds)
	older := tr.observe([]podSample{sample("shop", "web-0", "u0", t0.Add(20*time.Second), 15*time.Second, main(3, t0), sidecar)}, t0.Add(42*time.Second), all)
	assert.Equal(t, coreNS(15), pod(older, "web-0").containers[0].coreNanoSeconds)
	assert.Equal(t, t0.Add(30*time.Second), older.time, "never back in time")

	// 15 s later at 1 core: +15 core-seconds everywhere.
	s = tr.observe([]podSample{sample("shop", "web-0", "u0", t0.Add(45*time.Second), 15*time.Second, main(1, t0), sidecar)}, t0.Add(46*time.Second), all)
	web = pod(s, "web-0")
	assert.Equal(t, coreNS(30), web.containers[0].coreNanoSeconds)
	assert.Equal(t, coreNS(30), web.coreNanoSeconds)
	assert.Equal(t, coreNS(22.5), s.coreNanoSeconds)

	// main restarts at the provider (a later start time): its counter starts
	// over, as a kubelet's does for a new container; the pod's and the
	// node's go on.
	restart := t0.Add(50 * time.Second)
	s = tr.observe([]podSample{sample("shop", "web-0", "u0", t0.Add(60*time.Second), 10*time.Second, main(0.2, restart), sidecar)}, t0.Add(61*time.Second), all)
	web = pod(s, "web-0")
	assert.Equal(t, coreNS(2), web.containers[0].coreNanoSeconds)
	assert.Equal(t, restart, web.containers[0].start)
	assert.Equal(t, coreNS(32), web.coreNanoSeconds)
	assert.Equal(t, coreNS(24.5), s.coreNanoSeconds)

	// A second pod: the node adds its window; web-0 misses this poll but is
	// still bound, so it keeps its counters.
	s = tr.observe([]podSample{sample("shop", "api-0", "u1", t0.Add(75*time.Second), 15*time.Second, main(2, t0.Add(70*time.Second)))}, t0.Add(76*time.Second), all)
	require.Len(t, s.pods, 1, "only the pods of the last poll are reported")
	api := pod(s, "api-0")
	assert.Equal(t, coreNS(10), api.coreNanoSeconds, "2 cores since it started 5 s before the sample")
	assert.Equal(t, coreNS(34.5), s.coreNanoSeconds, "the node adds what the window measured, capped at the container's life (5 s)")
	s = tr.observe([]podSample{
		sample("shop", "web-0", "u0", t0.Add(90*time.Second), 15*time.Second, main(0.2, restart), sidecar),
		sample("shop", "api-0", "u1", t0.Add(90*time.Second), 15*time.Second, main(2, t0.Add(70*time.Second))),
	}, t0.Add(91*time.Second), all)
	assert.Equal(t, coreNS(32+0.2*30), pod(s, "web-0").coreNanoSeconds, "web-0 went on from where it was")
	assert.Equal(t, coreNS(10+2*15), pod(s, "api-0").coreNanoSeconds)
	assert.Equal(t, coreNS(34.5+6+30), s.coreNanoSeconds)
	// A poll that misses both (still bound): the node's counter and its
	// time stay, so that a rate over two scrapes is the pods'.
	missed := tr.observe(nil, t0.Add(92*time.Second), all)
	assert.Equal(t, s.coreNanoSeconds, missed.coreNanoSeconds)
	assert.Equal(t, t0.Add(90*time.Second), missed.time)
	assert.Equal(t, []string{"api-0", "web-0"}, []string{s.pods[0].name, s.pods[1].name}, "pods by namespace and name")

	// web-0 is gone: forgotten; a new pod of the same name (another uid)
	// starts afresh; the node's counter never goes back.
	gone := func(uid types.UID) bool { return uid != "u0" }
	s = tr.observe([]podSample{sample("shop", "api-0", "u1", t0.Add(105*time.Second), 15*time.Second, main(2, t0.Add(70*time.Second)))}, t0.Add(106*time.Second), gone)
	assert.NotContains(t, tr.pods, types.UID("u0"))
	node := s.coreNanoSeconds
	s = tr.observe([]podSample{sample("shop", "web-0", "u2", t0.Add(120*time.Second), 15*time.Second, main(1, t0.Add(110*time.Second)))}, t0.Add(121*time.Second), all)
	assert.Equal(t, coreNS(10), pod(s, "web-0").coreNanoSeconds)
	assert.Greater(t, s.coreNanoSeconds, node)

	// No pod at all: the node's figures are as of the poll.
	var empty usageTracker
	s = empty.observe(nil, t0, all)
	assert.Equal(t, t0, s.time)
	assert.Equal(t, uint64(counterFloor), s.coreNanoSeconds)
	assert.Zero(t, s.workingSet)
}

// usageFixture is node rb-paris with two borrowed pods, web-0 and api-0,
// and their copies at paris, a pod on another node, and the provider's
// metrics.k8s.io (a fake clientset answering list with items).
type usageFixture struct {
	n       *providerNode
	metrics *metricsfake.Clientset
	items   []metricsv1beta1.PodMetrics
	listErr error
}

func newUsageFixture(t *testing.T) *usageFixture {
	f := &usageFixture{}
	local := func(name, uid, node string) *corev1.Pod {
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: name, UID: types.UID(uid)}, Spec: corev1.PodSpec{NodeName: node},
			Status: corev1.PodStatus{StartTime: &metav1.Time{Time: t0}}}
	}
	copyOf := func(p *corev1.Pod) *corev1.Pod {
		c := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "rb-rome", Name: RemoteName(p.Namespace, p.Name), Annotations: map[string]string{
			OriginNamespaceAnnotation: p.Namespace, OriginNameAnnotation: p.Name, OriginUIDAnnotation: string(p.UID)}}}
		c.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "main", State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: metav1.Time{Time: t0.Add(time.Second)}}}}}
		return c
	}
	web, api, other := local("web-0", "u-web", "rb-paris"), local("api-0", "u-api", "rb-paris"), local("db-0", "u-db", "rb-berlin")
	stale := copyOf(local("old-0", "u-old", "rb-paris")) // its local pod is gone
	f.metrics = metricsfake.NewSimpleClientset()
	f.metrics.PrependReactor("list", "pods", func(a clienttesting.Action) (bool, runtime.Object, error) {
		if f.listErr != nil {
			return true, nil, f.listErr
		}
		assert.Equal(t, rbv1.RequesterLabel+"=rome", a.(clienttesting.ListAction).GetListRestrictions().Labels.String(), "this requester's copies only")
		return true, &metricsv1beta1.PodMetricsList{Items: f.items}, nil
	})
	b := &Bridge{cfg: Config{ClusterID: "rome", MetricsPeriod: time.Second}, log: logr.Discard()}
	f.n = &providerNode{b: b, name: "rb-paris", provider: "paris", log: logr.Discard(), started: t0.Add(-time.Hour),
		localPods: podLister(t, web, api, other),
		capacity:  corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("4Gi")}}
	f.n.remote = &remoteCluster{namespace: "rb-rome", metrics: f.metrics, synced: func() bool { return true },
		pods: podLister(t, copyOf(web), copyOf(api), copyOf(other), stale).Pods("rb-rome")}
	usage := func(name string, cpu, mem string) metricsv1beta1.PodMetrics {
		// metrics-server labels a PodMetrics as its pod.
		return metricsv1beta1.PodMetrics{ObjectMeta: metav1.ObjectMeta{Namespace: "rb-rome", Name: name, Labels: map[string]string{rbv1.RequesterLabel: "rome"}},
			Timestamp: metav1.Time{Time: t0.Add(31 * time.Second)}, Window: metav1.Duration{Duration: 15 * time.Second},
			Containers: []metricsv1beta1.ContainerMetrics{{Name: "main", Usage: corev1.ResourceList{
				corev1.ResourceCPU: resource.MustParse(cpu), corev1.ResourceMemory: resource.MustParse(mem)}}}}
	}
	f.items = []metricsv1beta1.PodMetrics{
		usage("shop.web-0", "250m", "100Mi"), usage("shop.api-0", "1", "1Gi"),
		usage("shop.db-0", "2", "2Gi"),   // bound to rb-berlin
		usage("shop.old-0", "3", "3Gi"),  // its local pod is gone
		usage("shop.gone-0", "4", "4Gi"), // no copy known
	}
	return f
}

// TestPollUsage: one List per poll, joined with the copies and the local
// pods of this node only; the figures in both of the kubelet's formats.
func TestPollUsage(t *testing.T) {
	f := newUsageFixture(t)
	f.n.pollUsage(context.Background(), f.n.remote)
	require.Len(t, f.metrics.Actions(), 1)
	assert.Equal(t, "rb-rome", f.metrics.Actions()[0].GetNamespace())
	s := f.n.usageSnapshot()
	require.Len(t, s.pods, 2, "web-0 and api-0: not the pod of rb-berlin, nor those without a copy or a local pod")
	api, web := s.pods[0], s.pods[1]
	assert.Equal(t, "api-0", api.name)
	assert.Equal(t, types.UID("u-web"), web.uid)
	assert.Equal(t, cores(0.25), web.nanoCores)
	assert.Equal(t, t0.Add(time.Second), web.containers[0].start, "from the copy's container status")
	assert.Equal(t, coreNS(0.25*30), web.containers[0].coreNanoSeconds, "0.25 cores for the 30 s since the container started")
	assert.Equal(t, uint64(100<<20), web.workingSet)
	assert.Equal(t, cores(1.25), s.nanoCores)
	assert.Equal(t, uint64(1<<30+100<<20), s.workingSet)

	t.Run("summary", func(t *testing.T) {
		sum := f.n.statsSummary()
		assert.Equal(t, "rb-paris", sum.Node.NodeName)
		assert.Equal(t, t0.Add(-time.Hour), sum.Node.StartTime.Time)
		assert.Equal(t, cores(1.25), *sum.Node.CPU.UsageNanoCores)
		assert.Equal(t, s.coreNanoSeconds, *sum.Node.CPU.UsageCoreNanoSeconds)
		assert.Equal(t, t0.Add(31*time.Second), sum.Node.CPU.Time.Time)
		assert.Equal(t, uint64(1<<30+100<<20), *sum.Node.Memory.WorkingSetBytes)
		assert.Equal(t, uint64(4<<30-(1<<30+100<<20)), *sum.Node.Memory.AvailableBytes, "allocatable minus the working set")
		require.Len(t, sum.Pods, 2)
		p := sum.Pods[1]
		assert.Equal(t, statsv1alpha1.PodReference{Name: "web-0", Namespace: "shop", UID: "u-web"}, p.PodRef, "the local pod")
		assert.Equal(t, t0, p.StartTime.Time)
		require.Len(t, p.Containers, 1)
		assert.Equal(t, "main", p.Containers[0].Name)
		assert.Equal(t, t0.Add(time.Second), p.Containers[0].StartTime.Time)
		assert.Equal(t, cores(0.25), *p.Containers[0].CPU.UsageNanoCores)
		assert.Equal(t, uint64(100<<20), *p.Containers[0].Memory.WorkingSetBytes)
		assert.Nil(t, p.Network, "metrics.k8s.io measures CPU and memory only")
		assert.Nil(t, sum.Node.Fs)
	})

	t.Run("a failed poll serves the last figures with resource_scrape_error 1", func(t *testing.T) {
		f.listErr = apierrors.NewInternalError(assertError("etcd is slow"))
		defer func() { f.listErr = nil }()
		f.n.pollUsage(context.Background(), f.n.remote)
		failed := f.n.usageSnapshot()
		assert.True(t, failed.failed)
		assert.Equal(t, s.pods, failed.pods)
		assert.Empty(t, f.n.usageProblem(), "worth retrying: no 503")
		fams := map[string]*dto.MetricFamily{}
		for _, mf := range failed.resourceMetrics() {
			fams[mf.GetName()] = mf
		}
		assert.Equal(t, 1.0, fams["resource_scrape_error"].Metric[0].GetGauge().GetValue())
	})
}

type assertError string

func (e assertError) Error() string { return string(e) }

// TestUsageUnavailable: a provider without metrics.k8s.io (404), with a
// metrics-server that does not answer (503), or that does not let the tenant
// list its metrics (403): the metrics routes answer 503 saying so, and
// recover once it answers.
func TestUsageUnavailable(t *testing.T) {
	f := newUsageFixture(t)
	allowAll := func(string, *authorizationv1.ResourceAttributes) bool { return true }
	srv := newEndpointFixtureFor(t, f.n, allowAll)
	gr := schema.GroupResource{Group: "metrics.k8s.io", Resource: "pods"}
	for _, tc := range []struct {
		err  error
		want string
	}{
		{apierrors.NewNotFound(gr, ""), "provider paris serves no metrics.k8s.io API (no metrics-server there)"},
		{apierrors.NewServiceUnavailable("the server is currently unable to handle the request"), "provider paris's metrics.k8s.io API is unavailable (its metrics-server does not answer)"},
		{apierrors.NewForbidden(gr, "", assertError("no rule")), "provider paris does not let this cluster list metrics.k8s.io pods in rb-rome"},
	} {
		f.listErr = tc.err
		f.n.pollUsage(context.Background(), f.n.remote)
		for _, path := range []string{"/stats/summary", "/metrics/resource", "/metrics/resource/"} {
			code, body := srv.get(t, path)
			assert.Equal(t, http.StatusServiceUnavailable, code, "%s: %s", path, body)
			assert.Contains(t, body, tc.want, path)
		}
	}
	f.listErr = nil
	f.n.pollUsage(context.Background(), f.n.remote)
	code, body := srv.get(t, "/stats/summary")
	require.Equal(t, http.StatusOK, code, body)
	var sum statsv1alpha1.Summary
	require.NoError(t, json.Unmarshal([]byte(body), &sum))
	assert.Len(t, sum.Pods, 2)

	f.n.remote = nil
	code, body = srv.get(t, "/metrics/resource")
	assert.Equal(t, http.StatusServiceUnavailable, code)
	assert.Contains(t, body, "no access to provider paris yet")
}

// TestResourceMetrics: /metrics/resource through the node's handler, as
// metrics-server v0.8.0 decodes it (pkg/scraper/client/resource/decode.go):
// the kubelet's family names, types and labels; cumulative CPU in seconds
// and working sets in bytes, both non-zero (else it drops the point), with
// their sample time in milliseconds; start times without one.
func TestResourceMetrics(t *testing.T) {
	f := newUsageFixture(t)
	f.n.pollUsage(context.Background(), f.n.remote)
	srv := newEndpointFixtureFor(t, f.n, func(_ string, a *authorizationv1.ResourceAttributes) bool {
		return a.Subresource == "metrics" && a.Name == "rb-paris"
	})
	code, body := srv.get(t, "/metrics/resource")
	require.Equal(t, http.StatusOK, code, body)
	assert.Contains(t, body, "# HELP container_cpu_usage_seconds_total [STABLE] Cumulative cpu time consumed by the container in core-seconds\n"+
		"# TYPE container_cpu_usage_seconds_total counter\n")
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(strings.NewReader(body))
	require.NoError(t, err, body)
	var names []string
	for name := range fams {
		names = append(names, name)
	}
	assert.ElementsMatch(t, []string{"container_cpu_usage_seconds_total", "container_memory_working_set_bytes", "container_start_time_seconds",
		"node_cpu_usage_seconds_total", "node_memory_working_set_bytes", "pod_cpu_usage_seconds_total", "pod_memory_working_set_bytes",
		"resource_scrape_error"}, names)

	s := f.n.usageSnapshot()
	at := t0.Add(31 * time.Second).UnixMilli()
	labels := func(m *dto.Metric) map[string]string {
		out := map[string]string{}
		for _, l := range m.Label {
			out[l.GetName()] = l.GetValue()
		}
		return out
	}
	one := func(name string, want map[string]string) *dto.Metric {
		t.Helper()
		var found *dto.Metric
		for _, m := range fams[name].Metric {
			if assert.ObjectsAreEqual(want, labels(m)) {
				require.Nil(t, found, "%s%v twice", name, want)
				found = m
			}
		}
		require.NotNil(t, found, "%s%v in\n%s", name, want, body)
		return found
	}
	web := map[string]string{"container": "main", "namespace": "shop", "pod": "web-0"}
	m := one("container_cpu_usage_seconds_total", web)
	assert.Equal(t, dto.MetricType_COUNTER, fams["container_cpu_usage_seconds_total"].GetType())
	assert.InDelta(t, 0.25*30, m.GetCounter().GetValue(), 1e-6, "core-seconds")
	assert.Equal(t, at, m.GetTimestampMs())
	m = one("container_memory_working_set_bytes", web)
	assert.Equal(t, float64(100<<20), m.GetGauge().GetValue())
	assert.Equal(t, at, m.GetTimestampMs())
	m = one("container_start_time_seconds", web)
	assert.Equal(t, float64(t0.Add(time.Second).Unix()), m.GetGauge().GetValue())
	assert.Zero(t, m.GetTimestampMs(), "as the kubelet's: no timestamp")
	m = one("pod_cpu_usage_seconds_total", map[string]string{"namespace": "shop", "pod": "api-0"})
	assert.InDelta(t, 30, m.GetCounter().GetValue(), 1e-6, "1 core for 30 s")
	one("pod_memory_working_set_bytes", map[string]string{"namespace": "shop", "pod": "api-0"})
	m = one("node_cpu_usage_seconds_total", map[string]string{})
	assert.InDelta(t, float64(s.coreNanoSeconds)/1e9, m.GetCounter().GetValue(), 1e-9)
	assert.Positive(t, m.GetCounter().GetValue())
	assert.Equal(t, at, m.GetTimestampMs())
	m = one("node_memory_working_set_bytes", map[string]string{})
	assert.Equal(t, float64(1<<30+100<<20), m.GetGauge().GetValue())
	assert.Zero(t, one("resource_scrape_error", map[string]string{}).GetGauge().GetValue())
	assert.Len(t, fams["container_cpu_usage_seconds_total"].Metric, 2, "the two pods of rb-paris only")
}

// newEndpointFixtureFor serves node n's kubelet endpoint over a fake local
// API server: any token is the user of that name, SubjectAccessReviews are
// answered by allow.
func newEndpointFixtureFor(t *testing.T, n *providerNode, allow func(string, *authorizationv1.ResourceAttributes) bool) *testServer {
	local := fake.NewClientset()
	local.PrependReactor("create", "tokenreviews", func(a clienttesting.Action) (bool, runtime.Object, error) {
		tr := a.(clienttesting.CreateAction).GetObject().(*authenticationv1.TokenReview)
		tr.Status = authenticationv1.TokenReviewStatus{Authenticated: true, User: authenticationv1.UserInfo{Username: tr.Spec.Token}}
		return true, tr, nil
	})
	local.PrependReactor("create", "subjectaccessreviews", func(a clienttesting.Action) (bool, runtime.Object, error) {
		sar := a.(clienttesting.CreateAction).GetObject().(*authorizationv1.SubjectAccessReview)
		sar.Status.Allowed = allow(sar.Spec.User, sar.Spec.ResourceAttributes)
		return true, sar, nil
	})
	n.b.local = local
	k := &kubeletServer{b: n.b, log: logr.Discard(), timeout: 5 * time.Second, idleTimeout: streamIdleTimeout, creationTimeout: streamCreationTimeout}
	srv := httptest.NewServer(k.handler(n))
	t.Cleanup(srv.Close)
	return &testServer{srv}
}

type testServer struct{ *httptest.Server }

// get sends GET path as user metrics-server.
func (s *testServer) get(t testing.TB, path string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, s.URL+path, nil)
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer system:serviceaccount:kube-system:metrics-server")
	resp, err := s.Client().Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(body)
}
