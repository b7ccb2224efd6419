package integration

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/fluidos-project/resource-broker/internal/testbed"
)

// benchPods is how many pods one iteration of BenchmarkEndToEnd creates.
const benchPods = 100

// BenchmarkEndToEnd measures, on the whole bed, how long a pod created in
// rome takes to be Running (rome's pod phase), over a Deployment of
// benchPods pods, and how many pods per second the burst is served at:
//
//   - remote: pods of 100m CPU / 5Gi that fit nowhere in rome (one 2-CPU/4Gi
//     node) and are served by the providers, which the benchmark sizes so
//     that all of them fit (paris 16 CPU/320Gi, berlin 32 CPU/320Gi: 64
//     fit in each): reservation, virtual node, copy at the provider, Running.
//   - local-baseline: the same Deployment of 100m CPU / 64Mi pods once a
//     64-CPU/256Gi node is added to rome: rb-scheduler's resource-broker
//     profile binds them locally, no reservation.
//
// Between iterations the Deployment is scaled to zero and the broker waits
// to be back at its starting numbers. Setup is not timed.
//
//	go test -run '^$' -bench EndToEnd -benchtime 1x -timeout 20m ./test/integration/
func BenchmarkEndToEnd(b *testing.B) {
	b.StopTimer()
	paris, berlin := testbed.Paris, testbed.Berlin
	paris.Nodes = []corev1.ResourceList{testbed.Resources("16", "320Gi")}
	berlin.Nodes = []corev1.ResourceList{testbed.Resources("32", "320Gi", "4")}
	bed := testbed.Start(b, testbed.Options{Clusters: []testbed.ClusterSpec{testbed.Rome, paris, berlin}})
	rome := bed.Cluster("rome")
	ctx := context.Background()
	base := benchBaseline(b, bed)

	b.Run("remote", func(b *testing.B) {
		benchDeployment(b, bed, base, "bench-remote", requests("100m", "5Gi"))
	})
	b.Run("local-baseline", func(b *testing.B) {
		b.StopTimer()
		const node = "rome-node-bench"
		benchNoErr(b, rome.AddNode(ctx, node, testbed.Resources("64", "256Gi")))
		defer func() { _ = rome.DeleteNode(ctx, node) }()
		// The agent advertises the bigger rome; wait for it, then take that as the numbers to come back to.
		eventually(b, 30*time.Second, "rome advertised with its new node", func() (bool, string) {
			c, err := bed.Capacity(ctx)
			return err == nil && c.Diff(base) != "", fmt.Sprint(err)
		})
		time.Sleep(1500 * time.Millisecond)
		local := benchBaseline(b, bed)
		benchDeployment(b, bed, local, "bench-local", requests("100m", "64Mi"))
	})
}

// benchDeployment runs b.N iterations of: create benchPods pods with req in
// rome (two Deployments of half, namespaces ns-a and ns-b), wait until all are Running, scale to
// zero, wait for the broker to be back at base. It reports the latency
// distribution of pod created -> Running and the burst's pods/s.
func benchDeployment(b *testing.B, bed *testbed.Bed, base testbed.Capacity, ns string, req corev1.ResourceList) {
	b.StopTimer()
	ctx := context.Background()
	rome := bed.Cluster("rome")
	// rb-scheduler keeps at most 50 outstanding reservations per namespace
	// (maxOutstandingReservationsPerNamespace): the 100 pods are two
	// Deployments of 50, in two namespaces, created back to back.
	nss := []string{ns + "-a", ns + "-b"}
	for _, n := range nss {
		benchNoErr(b, rome.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: n}}))
	}
	var all []time.Duration
	var rates []float64
	for i := 0; i < b.N; i++ {
		name := fmt.Sprintf("%s-%d", ns, i)
		w := watchPods(b, rome, name)
		var deps []*appsv1.Deployment
		for _, n := range nss {
			deps = append(deps, benchDeploymentObject(n, name, req))
		}
		b.StartTimer()
		for _, dep := range deps {
			benchNoErr(b, rome.Client.Create(ctx, dep))
		}
		eventually(b, 5*time.Minute, fmt.Sprintf("%d pods Running", benchPods), func() (bool, string) {
			n, r := w.counts()
			return r >= benchPods, fmt.Sprintf("%d pods seen, %d Running", n, r)
		})
		b.StopTimer()
		lat, first, last := w.latencies()
		w.stop()
		all = append(all, lat...)
		rates = append(rates, float64(len(lat))/last.Sub(first).Seconds())
		b.Logf("iteration %d: %s; first create -> last Running %s", i, durStats(lat), last.Sub(first).Round(time.Millisecond))

		for _, dep := range deps {
			benchNoErr(b, rome.Client.Patch(ctx, &appsv1.Deployment{ObjectMeta: dep.ObjectMeta},
				client.RawPatch("application/merge-patch+json", []byte(`{"spec":{"replicas":0}}`))))
		}
		eventually(b, 2*time.Minute, "no pod left", func() (bool, string) {
			var left corev1.PodList
			if err := rome.Client.List(ctx, &left, client.MatchingLabels{"bench": name}); err != nil {
				return false, err.Error()
			}
			return len(left.Items) == 0, fmt.Sprintf("%d pods", len(left.Items))
		})
		for _, dep := range deps {
			benchNoErr(b, rome.Client.Delete(ctx, dep))
		}
		benchBackToBaseline(b, bed, base, 2*time.Minute)
	}
	slices.Sort(all)
	q := func(p float64) float64 {
		return float64(all[min(len(all)-1, int(p*float64(len(all))))]) / float64(time.Millisecond)
	}
	b.ReportMetric(q(0.5), "p50-ms")
	b.ReportMetric(q(0.9), "p90-ms")
	b.ReportMetric(q(0.99), "p99-ms")
	b.ReportMetric(float64(all[len(all)-1])/float64(time.Millisecond), "max-ms")
	var sum float64
	for _, r := range rates {
		sum += r
	}
	b.ReportMetric(sum/float64(len(rates)), "pods/s")
}

func benchDeploymentObject(ns, name string, req corev1.ResourceList) *appsv1.Deployment {
	labels := map[string]string{"app": name, "bench": name}
	return &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To(int32(benchPods / 2)),
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec:       brokerPod(ns, "", req).Spec,
			},
		},
	}
}

// podWatch records, from a watch of a namespace, when each pod was first
// seen and first Running (pods labelled bench=<name>, any namespace).
type podWatch struct {
	mu      sync.Mutex
	seen    map[string]time.Time
	running map[string]time.Time
	stop    func()
}

func watchPods(b *testing.B, c *testbed.Cluster, bench string) *podWatch {
	wc, err := client.NewWithWatch(c.Config, client.Options{Scheme: testbed.Scheme})
	benchNoErr(b, err)
	pw, err := wc.Watch(context.Background(), &corev1.PodList{}, client.MatchingLabels{"bench": bench})
	benchNoErr(b, err)
	w := &podWatch{seen: map[string]time.Time{}, running: map[string]time.Time{}, stop: pw.Stop}
	go func() {
		for ev := range pw.ResultChan() {
			now := time.Now()
			p, ok := ev.Object.(*corev1.Pod)
			if !ok {
				continue
			}
			w.mu.Lock()
			if _, ok := w.seen[p.Name]; !ok {
				w.seen[p.Name] = now
			}
			if _, ok := w.running[p.Name]; !ok && p.Status.Phase == corev1.PodRunning {
				w.running[p.Name] = now
			}
			w.mu.Unlock()
		}
	}()
	return w
}

func (w *podWatch) counts() (seen, running int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.seen), len(w.running)
}

// latencies returns running - seen per pod, the first seen and the last Running.
func (w *podWatch) latencies() (out []time.Duration, first, last time.Time) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for name, r := range w.running {
		s := w.seen[name]
		out = append(out, r.Sub(s))
		if first.IsZero() || s.Before(first) {
			first = s
		}
		if r.After(last) {
			last = r
		}
	}
	return out, first, last
}

func durStats(ds []time.Duration) string {
	s := slices.Clone(ds)
	slices.Sort(s)
	q := func(p float64) time.Duration { return s[min(len(s)-1, int(p*float64(len(s))))].Round(time.Millisecond) }
	return fmt.Sprintf("n=%d p50=%s p90=%s p99=%s max=%s", len(s), q(0.5), q(0.9), q(0.99), s[len(s)-1].Round(time.Millisecond))
}

func benchNoErr(b *testing.B, err error) {
	b.Helper()
	if err != nil {
		b.Fatal(err)
	}
}

// benchBaseline reads the broker's numbers once no reservation is live.
func benchBaseline(b *testing.B, bed *testbed.Bed) testbed.Capacity {
	b.Helper()
	ctx := context.Background()
	eventually(b, 30*time.Second, "no live reservation", func() (bool, string) {
		idx, err := bed.LiveIndexes(ctx)
		return err == nil && len(idx) == 0, fmt.Sprintf("%v %v", idx, err)
	})
	c, err := bed.Capacity(ctx)
	benchNoErr(b, err)
	return c
}

// benchBackToBaseline waits until no reservation is live and the broker's
// numbers equal base; then checks the store's invariant.
func benchBackToBaseline(b *testing.B, bed *testbed.Bed, base testbed.Capacity, timeout time.Duration) {
	b.Helper()
	ctx := context.Background()
	eventually(b, timeout, "broker back at its starting numbers", func() (bool, string) {
		idx, err := bed.LiveIndexes(ctx)
		if err != nil || len(idx) > 0 {
			return false, fmt.Sprintf("live %v %v", idx, err)
		}
		c, err := bed.Capacity(ctx)
		if err != nil {
			return false, err.Error()
		}
		d := c.Diff(base)
		return d == "", d
	})
	benchNoErr(b, bed.Store.CheckInvariant(ctx))
}
