package virtualkubelet

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"runtime"
	"slices"
	"testing"
	"time"

	"github.com/go-logr/logr"
	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/rest"
	clienttesting "k8s.io/client-go/testing"
	metricsv1beta1 "k8s.io/metrics/pkg/apis/metrics/v1beta1"
	metricsclient "k8s.io/metrics/pkg/client/clientset/versioned"

	rbv1 "github.com/fluidos-project/resource-broker/api/v1alpha1"
)

// BenchmarkKubeletMetrics: a virtual node with 1,000 borrowed pods (one
// container each).
//
//   - poll: one List of the provider's 1,000 PodMetrics (JSON over HTTP
//     from a server that answers with a ready-made list) joined with the
//     copies and the local pods into the node's cache: ns/op, B/op, allocs;
//     cache-KiB is the live heap the cache holds; cpu-%-at-10s the share of
//     a core polling every 10 s (the default --provider-metrics-period)
//     takes.
//   - route=stats-summary|metrics-resource/source=cache: one scrape through
//     the node's kubelet endpoint (HTTPS, a bearer token: a TokenReview and
//     a SubjectAccessReview against a fake API server), answered from the
//     cache: p50-ms, p99-ms, resp-KiB.
//   - the same with source=list-at-scrape, the baseline: the scrape lists
//     the provider's PodMetrics itself, as an endpoint without a cache would.
func BenchmarkKubeletMetrics(b *testing.B) {
	const pods = 1000
	n, rc := benchNode(b, pods)
	ctx := context.Background()
	b.Run(fmt.Sprintf("pods=%d/poll", pods), func(b *testing.B) {
		n.usage = nodeUsage{}
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		n.pollUsage(ctx, rc)
		runtime.GC()
		runtime.ReadMemStats(&after)
		if got := len(n.usageSnapshot().pods); got != pods {
			b.Fatalf("%d pods in the cache, want %d", got, pods)
		}
		b.ReportAllocs()
		b.ResetTimer()
		for b.Loop() {
			n.pollUsage(ctx, rc)
		}
		b.StopTimer()
		perOp := float64(b.Elapsed().Nanoseconds()) / float64(b.N)
		b.ReportMetric(float64(after.HeapAlloc-before.HeapAlloc)/1024, "cache-KiB")
		b.ReportMetric(perOp/float64(10*time.Second)*100, "cpu-%-at-10s")
	})

	n.pollUsage(ctx, rc)
	cached := benchServer(b, n, nil)
	listing := benchServer(b, n, func() { n.pollUsage(ctx, rc) })
	for _, route := range []struct{ name, path string }{{"stats-summary", "/stats/summary"}, {"metrics-resource", "/metrics/resource"}} {
		for _, source := range []struct {
			name string
			srv  *httptest.Server
		}{{"cache", cached}, {"list-at-scrape", listing}} {
			b.Run(fmt.Sprintf("pods=%d/route=%s/source=%s", pods, route.name, source.name), func(b *testing.B) {
				client := source.srv.Client()
				var took []time.Duration
				var size int
				for b.Loop() {
					start := time.Now()
					size = benchGet(b, client, source.srv.URL+route.path)
					took = append(took, time.Since(start))
				}
				b.StopTimer()
				slices.Sort(took)
				b.ReportMetric(ms(took[len(took)/2]), "p50-ms")
				b.ReportMetric(ms(took[min(len(took)-1, len(took)*99/100)]), "p99-ms")
				b.ReportMetric(float64(size)/1024, "resp-KiB")
			})
		}
	}
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// benchNode is node rb-paris with pods local pods bound to it, their copies
// at paris, and paris's metrics.k8s.io: a server answering every List with
// the same PodMetricsList of them all (250m, 100Mi each, and 5 placeholder
// pods the node leaves out).
func benchNode(b *testing.B, pods int) (*providerNode, *remoteCluster) {
	b.Helper()
	started := metav1.NewTime(time.Now().Add(-time.Hour))
	var local, copies []*corev1.Pod
	list := metricsv1beta1.PodMetricsList{TypeMeta: metav1.TypeMeta{Kind: "PodMetricsList", APIVersion: "metrics.k8s.io/v1beta1"}}
	usage := metricsv1beta1.ContainerMetrics{Name: "main", Usage: corev1.ResourceList{
		corev1.ResourceCPU: resource.MustParse("250m"), corev1.ResourceMemory: resource.MustParse("100Mi")}}
	for i := range pods {
		name := fmt.Sprintf("web-%04d", i)
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: name, UID: types.UID(fmt.Sprintf("uid-%04d", i))},
			Spec: corev1.PodSpec{NodeName: "rb-paris"}, Status: corev1.PodStatus{StartTime: &started}}
		local = append(local, p)
		copies = append(copies, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "rb-rome", Name: RemoteName("shop", name),
			Labels:      map[string]string{rbv1.RequesterLabel: "rome", "app": "web"},
			Annotations: map[string]string{OriginNamespaceAnnotation: "shop", OriginNameAnnotation: name, OriginUIDAnnotation: string(p.UID)}},
			Status: corev1.PodStatus{ContainerStatuses: []corev1.ContainerStatus{{Name: "main",
				State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: started}}}}}})
		list.Items = append(list.Items, metricsv1beta1.PodMetrics{
			ObjectMeta: metav1.ObjectMeta{Namespace: "rb-rome", Name: RemoteName("shop", name), Labels: copies[i].Labels},
			Timestamp:  metav1.Now(), Window: metav1.Duration{Duration: 15 * time.Second}, Containers: []metricsv1beta1.ContainerMetrics{usage}})
	}
	for i := range 5 {
		list.Items = append(list.Items, metricsv1beta1.PodMetrics{
			ObjectMeta: metav1.ObjectMeta{Namespace: "rb-rome", Name: fmt.Sprintf("rb-placeholder-%d", i), Labels: map[string]string{rbv1.RequesterLabel: "rome"}},
			Timestamp:  metav1.Now(), Window: metav1.Duration{Duration: 15 * time.Second}, Containers: []metricsv1beta1.ContainerMetrics{usage}})
	}
	body, err := json.Marshal(list)
	if err != nil {
		b.Fatal(err)
	}
	provider := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(body)
	}))
	b.Cleanup(provider.Close)
	mc, err := metricsclient.NewForConfig(&rest.Config{Host: provider.URL, QPS: -1})
	if err != nil {
		b.Fatal(err)
	}
	bridge := &Bridge{cfg: Config{ClusterID: "rome", MetricsPeriod: 10 * time.Second}, log: logr.Discard()}
	n := &providerNode{b: bridge, name: "rb-paris", provider: "paris", log: logr.Discard(), started: started.Time,
		localPods: podLister(b, local...), capacity: corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("512Gi")}}
	n.remote = &remoteCluster{namespace: "rb-rome", metrics: mc, synced: func() bool { return true }, pods: podLister(b, copies...).Pods("rb-rome")}
	return n, n.remote
}

// benchServer serves node n's kubelet endpoint over TLS, calling before
// first on every request; its local API server (a fake) accepts any token
// and allows everything.
func benchServer(b *testing.B, n *providerNode, before func()) *httptest.Server {
	local := fake.NewClientset()
	local.PrependReactor("create", "tokenreviews", func(a clienttesting.Action) (bool, kruntime.Object, error) {
		tr := a.(clienttesting.CreateAction).GetObject().(*authenticationv1.TokenReview)
		tr.Status = authenticationv1.TokenReviewStatus{Authenticated: true, User: authenticationv1.UserInfo{Username: tr.Spec.Token}}
		return true, tr, nil
	})
	local.PrependReactor("create", "subjectaccessreviews", func(a clienttesting.Action) (bool, kruntime.Object, error) {
		sar := a.(clienttesting.CreateAction).GetObject().(*authorizationv1.SubjectAccessReview)
		sar.Status.Allowed = true
		return true, sar, nil
	})
	n.b.local = local
	k := &kubeletServer{b: n.b, log: logr.Discard(), timeout: 5 * time.Second, idleTimeout: streamIdleTimeout, creationTimeout: streamCreationTimeout}
	h := k.handler(n)
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if before != nil {
			before()
		}
		h.ServeHTTP(w, r)
	}))
	b.Cleanup(srv.Close)
	return srv
}

func benchGet(b *testing.B, c *http.Client, url string) int {
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		b.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer system:serviceaccount:kube-system:metrics-server")
	resp, err := c.Do(req)
	if err != nil {
		b.Fatal(err)
	}
	defer resp.Body.Close()
	n, err := io.Copy(io.Discard, resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		b.Fatalf("GET %s: %d %v", url, resp.StatusCode, err)
	}
	return int(n)
}
