package integration

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/fluidos-project/resource-broker/internal/testbed"
)

// BenchmarkRealNodesRemoteVsLocal: what borrowing costs a pod's start, as
// users feel it. On one real-node bed whose provider paris has a single
// node, pods of the same size are created side by side at a steady rate:
// local pods in paris (paris's scheduler, paris's kubelet) and pods in rome
// that fit nowhere there and are borrowed (rb-scheduler's reservation, the
// broker, paris's hold, the copy, the same kubelet). Each pod's time from
// created to Running is read in its own cluster (rome's pod phase for a
// borrowed pod: what kubectl shows its owner). Sub-benchmarks pace at 1, 5
// and 20 pods/s of each kind; it reports both distributions and the ratios
// remote/local at p50 and p99, and prints the borrowed pods' time between
// consecutive steps (where the difference goes).
//
//	go test -run '^$' -bench RealNodesRemoteVsLocal -benchtime 1x -timeout 30m ./test/integration/
func BenchmarkRealNodesRemoteVsLocal(b *testing.B) {
	b.StopTimer()
	rome, paris := testbed.RealRome, testbed.RealParis
	// One node: both kinds of pods start on the same kubelet. Its memory
	// is what it reports (realnode fakes it), and the pods' pause
	// containers use none of it.
	paris.Nodes = []corev1.ResourceList{testbed.Resources("16", "400Gi")}
	bed := testbed.Start(b, testbed.Options{RealNodes: true, Clusters: []testbed.ClusterSpec{rome, paris}})
	base := benchBaseline(b, bed)
	for _, rate := range []float64{1, 5, 20} {
		b.Run(fmt.Sprintf("%gpods-per-s", rate), func(b *testing.B) { benchRemoteVsLocal(b, bed, base, rate) })
	}
}

// remoteVsLocalPods is how many pods of each kind one iteration creates at
// rate pods/s: at least 20, 3 s worth at the higher rates, and at most 30:
// paris's one node holds 110 pods (the kubelet's maxPods), and a borrowed
// pod's placeholder is there too until the copy preempts it.
func remoteVsLocalPods(rate float64) int { return min(30, max(20, int(3*rate))) }

func benchRemoteVsLocal(b *testing.B, bed *testbed.Bed, base testbed.Capacity, rate float64) {
	b.StopTimer()
	ctx := context.Background()
	rome, paris := bed.Cluster("rome"), bed.Cluster("paris")
	// 100m / 3Gi: rome's node (2Gi) holds none, paris's holds all of both kinds.
	req := requests("100m", "3Gi")
	n := remoteVsLocalPods(rate)
	const ns = "bench-rvl"
	for _, c := range []*testbed.Cluster{rome, paris} {
		if err := c.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); client.IgnoreAlreadyExists(err) != nil {
			b.Fatal(err)
		}
		if err := c.WaitServiceAccount(ctx, ns); err != nil {
			b.Fatal(err)
		}
	}
	var remoteAll, localAll []time.Duration
	for i := 0; i < b.N; i++ {
		name := fmt.Sprintf("rvl-%g-%d", rate, i)
		// paris's copies of the borrowed pods carry the label too: its own pods are ns's.
		remote, local := watchPods(b, rome, name), watchPodsIn(b, paris, name, ns)
		st := watchStages(b, bed, name)
		interval := time.Duration(float64(time.Second) / rate)
		start := time.Now()
		var wg sync.WaitGroup
		errs := make(chan error, 2*n)
		b.StartTimer()
		for j := range n {
			// A local pod, and half an interval later a remote one.
			for k, c := range []*testbed.Cluster{paris, rome} {
				time.Sleep(time.Until(start.Add(time.Duration(j)*interval + time.Duration(k)*interval/2)))
				pod := brokerPod(ns, fmt.Sprintf("%s-%03d", name, j), req)
				pod.Labels = map[string]string{"bench": name}
				if c == paris {
					pod.Spec.SchedulerName = "" // paris's own scheduler, as any local pod
				}
				wg.Add(1)
				go func() {
					defer wg.Done()
					if err := c.Client.Create(ctx, pod); err != nil {
						errs <- fmt.Errorf("%s: %w", c.Name, err)
					}
				}()
			}
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			benchNoErr(b, err)
		}
		eventually(b, 5*time.Minute, fmt.Sprintf("%d pods Running in rome and %d in paris", n, n), func() (bool, string) {
			rs, rr := remote.counts()
			ls, lr := local.counts()
			return rr >= n && lr >= n, fmt.Sprintf("rome: %d seen, %d Running; paris: %d seen, %d Running", rs, rr, ls, lr)
		})
		b.StopTimer()
		rlat, _, _ := remote.latencies()
		llat, _, _ := local.latencies()
		remote.stop()
		local.stop()
		st.stop()
		st.finish(ctx, bed, rome)
		fmt.Printf("%s, iteration %d: borrowed pods, time between consecutive steps:\n%s\n", b.Name(), i, st.report())
		b.Logf("iteration %d: local %s; remote %s", i, durStats(llat), durStats(rlat))
		remoteAll, localAll = append(remoteAll, rlat...), append(localAll, llat...)

		for _, c := range []*testbed.Cluster{rome, paris} {
			benchNoErr(b, c.Client.DeleteAllOf(ctx, &corev1.Pod{}, client.InNamespace(ns), client.MatchingLabels{"bench": name}))
		}
		eventually(b, 2*time.Minute, "no pod left", func() (bool, string) {
			left := 0
			for _, c := range []*testbed.Cluster{rome, paris} {
				var pods corev1.PodList
				if err := c.Client.List(ctx, &pods, client.MatchingLabels{"bench": name}); err != nil {
					return false, err.Error()
				}
				left += len(pods.Items)
			}
			return left == 0, fmt.Sprintf("%d pods", left)
		})
		benchBackToBaseline(b, bed, base, 2*time.Minute)
	}
	lp50, lp99 := quantileMs(localAll, 0.5), quantileMs(localAll, 0.99)
	rp50, rp99 := quantileMs(remoteAll, 0.5), quantileMs(remoteAll, 0.99)
	b.ReportMetric(lp50, "local-p50-ms")
	b.ReportMetric(lp99, "local-p99-ms")
	b.ReportMetric(rp50, "remote-p50-ms")
	b.ReportMetric(rp99, "remote-p99-ms")
	b.ReportMetric(rp50/lp50, "ratio-p50")
	b.ReportMetric(rp99/lp99, "ratio-p99")
}

// quantileMs is the q-quantile of ds in milliseconds (nearest rank).
func quantileMs(ds []time.Duration, q float64) float64 {
	s := slices.Clone(ds)
	slices.Sort(s)
	if len(s) == 0 {
		return 0
	}
	return float64(s[min(len(s)-1, int(q*float64(len(s))))]) / float64(time.Millisecond)
}
