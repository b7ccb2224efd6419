package integration

import (
	"bytes"
	"context"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/utils/ptr"
	crcache "sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	rbv1 "github.com/fluidos-project/resource-broker/api/v1alpha1"
	"github.com/fluidos-project/resource-broker/internal/testbed"
)

// benchPods is how many pods one iteration of BenchmarkEndToEnd creates.
const benchPods = 100

// PacedRateEnv sets the creation rate, in pods per second, of
// BenchmarkEndToEnd/remote-paced (default defaultPacedRate).
const PacedRateEnv = "RB_BENCH_PACED_RATE"

// defaultPacedRate: 100 pods in about 20 s, one every 200 ms.
const defaultPacedRate = 5.0

func pacedRate(b *testing.B) float64 {
	v := os.Getenv(PacedRateEnv)
	if v == "" {
		return defaultPacedRate
	}
	r, err := strconv.ParseFloat(v, 64)
	if err != nil || r <= 0 {
		b.Fatalf("%s=%q: want a positive number of pods per second", PacedRateEnv, v)
	}
	return r
}

// BenchmarkEndToEnd measures, on the whole bed, how long a pod created in
// rome takes to be Running (rome's pod phase), over benchPods pods, and
// how many pods per second they are served at:
//
//   - remote-paced: the figure the target (p50 < 1 s, p99 < 2 s) is read
//     on. The same remote pods, created one by one at a steady rate
//     (RB_BENCH_PACED_RATE pods/s, default 5: 100 pods over about 20 s),
//     as Kubernetes' pod startup latency SLO is measured (clusterloader2:
//     the latency at a stated creation throughput, not of a burst). Bare
//     pods, in two namespaces in turn; it reports the creation rate
//     achieved (created-pods/s, from the informer's first sightings).
//   - remote: the stress figure, all benchPods at once (two Deployments
//     created back to back). Pods of 100m CPU / 5Gi that fit nowhere in
//     rome (one 2-CPU/4Gi node) and are served by the providers, which the
//     benchmark sizes so that all of them fit (paris 16 CPU/320Gi, berlin
//     32 CPU/320Gi: 64 fit in each): reservation, virtual node, copy at
//     the provider, Running.
//   - local-baseline: the same Deployment of 100m CPU / 64Mi pods once a
//     64-CPU/256Gi node is added to rome: rb-scheduler's resource-broker
//     profile binds them locally, no reservation.
//
// Between iterations the Deployment is scaled to zero and the broker waits
// to be back at its starting numbers. Setup is not timed.
//
// Each iteration also prints, on stdout, where the time went: for every
// pair of consecutive steps of a pod (pod created, Reservation created,
// broker decision, Reserved, ProviderInstruction created and granted at the
// provider, Active, virtual node resized, Reservation names its node, pod
// bound, copy created at the provider, copy Running, pod Running) the distribution over the pods, the timelines of the first,
// median and last pod, and the API writes each cluster served meanwhile.
// RB_TESTBED_KEEP=<dir> keeps the bed's logs (see testbed.KeepDirEnv).
//
//	go test -run '^$' -bench EndToEnd -benchtime 1x -timeout 30m ./test/integration/
func BenchmarkEndToEnd(b *testing.B) {
	b.StopTimer()
	paris, berlin := testbed.Paris, testbed.Berlin
	paris.Nodes = []corev1.ResourceList{testbed.Resources("16", "320Gi")}
	berlin.Nodes = []corev1.ResourceList{testbed.Resources("32", "320Gi", "4")}
	bed := testbed.Start(b, testbed.Options{Clusters: []testbed.ClusterSpec{testbed.Rome, paris, berlin}})
	rome := bed.Cluster("rome")
	ctx := context.Background()
	base := benchBaseline(b, bed)

	b.Run("remote-paced", func(b *testing.B) {
		benchDeployment(b, bed, base, "bench-paced", requests("100m", "5Gi"), pacedRate(b))
	})
	b.Run("remote", func(b *testing.B) {
		benchDeployment(b, bed, base, "bench-remote", requests("100m", "5Gi"), 0)
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
		benchDeployment(b, bed, local, "bench-local", requests("100m", "64Mi"), 0)
	})
}

// BenchmarkRealNodesEndToEnd is BenchmarkEndToEnd's remote-paced and remote
// runs on the real-node bed (testbed.Options.RealNodes): every copy is a
// real container (the bed's pause image) started by a real kubelet with
// containerd on a paris or berlin node, and kube-controller-manager runs the
// workload controllers. The providers have two nodes each, sized so that all
// pods fit (paris 2 x 16 CPU/320Gi, berlin 2 x 16 CPU/320Gi). The same
// figures from BenchmarkEndToEnd (kubelet stand-in, nothing runs) are the
// baseline; docs/benchmarks.md puts them side by side.
//
//	go test -run '^$' -bench RealNodesEndToEnd -benchtime 1x -timeout 30m ./test/integration/
func BenchmarkRealNodesEndToEnd(b *testing.B) {
	b.StopTimer()
	rome, paris, berlin := testbed.RealRome, testbed.RealParis, testbed.RealBerlin
	rome.Nodes = []corev1.ResourceList{testbed.Resources("2", "4Gi")}
	paris.Nodes = []corev1.ResourceList{testbed.Resources("16", "320Gi"), testbed.Resources("16", "320Gi")}
	berlin.Nodes = []corev1.ResourceList{testbed.Resources("16", "320Gi", "2"), testbed.Resources("16", "320Gi")}
	bed := testbed.Start(b, testbed.Options{RealNodes: true, Clusters: []testbed.ClusterSpec{rome, paris, berlin}})
	base := benchBaseline(b, bed)
	b.Run("remote-paced", func(b *testing.B) {
		benchDeployment(b, bed, base, "bench-paced", requests("100m", "5Gi"), pacedRate(b))
	})
	b.Run("remote", func(b *testing.B) {
		benchDeployment(b, bed, base, "bench-remote", requests("100m", "5Gi"), 0)
	})
}

// benchDeployment runs b.N iterations of: create benchPods pods with req in
// rome (namespaces ns-a and ns-b), wait until all are Running, remove them,
// wait for the broker to be back at base. With rate 0 the pods come as a
// burst, two Deployments of half created back to back (scaled to zero
// afterwards); with rate > 0 they are bare pods created at rate pods per
// second, alternating between the namespaces (deleted afterwards). It
// reports the latency distribution of pod created -> Running, the pods/s
// from the first pod created to the last Running and, paced, the creation
// rate achieved.
func benchDeployment(b *testing.B, bed *testbed.Bed, base testbed.Capacity, ns string, req corev1.ResourceList, rate float64) {
	b.StopTimer()
	ctx := context.Background()
	rome := bed.Cluster("rome")
	// rb-scheduler lets at most 50 pods per namespace wait for a reservation
	// at once (maxOutstandingReservationsPerNamespace; a larger Deployment is
	// served that many at a time): the 100 pods are two Deployments of 50, in
	// two namespaces, created back to back, so that the limit does not pace
	// the burst.
	nss := []string{ns + "-a", ns + "-b"}
	for _, n := range nss {
		benchNoErr(b, rome.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: n}}))
	}
	what := "burst"
	if rate > 0 {
		what = fmt.Sprintf("paced run (%.3g pods/s asked)", rate)
	}
	var all []time.Duration
	var rates, created []float64
	for i := 0; i < b.N; i++ {
		name := fmt.Sprintf("%s-%d", ns, i)
		w := watchPods(b, rome, name)
		st := watchStages(b, bed, name)
		writesBefore, cpuBefore := apiWrites(bed), cpuTimes(bed)
		var deps []*appsv1.Deployment
		if rate == 0 {
			for _, n := range nss {
				deps = append(deps, benchDeploymentObject(n, name, req))
			}
		}
		b.StartTimer()
		for _, dep := range deps {
			benchNoErr(b, rome.Client.Create(ctx, dep))
		}
		if rate > 0 {
			benchPaced(b, rome, nss, name, req, rate)
		}
		eventually(b, 5*time.Minute, fmt.Sprintf("%d pods Running", benchPods), func() (bool, string) {
			n, r := w.counts()
			return r >= benchPods, fmt.Sprintf("%d pods seen, %d Running", n, r)
		})
		b.StopTimer()
		cpuAfter := cpuTimes(bed)
		lat, first, last := w.latencies()
		firstSeen, lastSeen := w.seenSpan()
		w.stop()
		st.stop()
		st.finish(ctx, bed, rome)
		// Printed rather than logged: a benchmark's log is cut after a few lines.
		fmt.Printf("%s, iteration %d: time between consecutive steps of each pod:\n%s\n", b.Name(), i, st.report())
		fmt.Printf("%s, iteration %d: API writes during the %s (%.1f per pod):\n%s\n", b.Name(), i, what,
			writesTotal(writesBefore, apiWrites(bed))/float64(len(lat)), writesReport(writesBefore, apiWrites(bed)))
		fmt.Printf("%s, iteration %d: CPU time during the %s (%s on %d cores): %s\n", b.Name(), i, what,
			last.Sub(first).Round(time.Millisecond), runtime.NumCPU(), cpuReport(cpuBefore, cpuAfter))
		all = append(all, lat...)
		rates = append(rates, float64(len(lat))/last.Sub(first).Seconds())
		if span := lastSeen.Sub(firstSeen); rate > 0 && span > 0 {
			created = append(created, float64(len(lat)-1)/span.Seconds())
			fmt.Printf("%s, iteration %d: pods created at %.2f pods/s (%.3g asked): first -> last created %s\n", b.Name(), i,
				created[len(created)-1], rate, span.Round(time.Millisecond))
		}
		b.Logf("iteration %d: %s; first create -> last Running %s", i, durStats(lat), last.Sub(first).Round(time.Millisecond))

		if rate == 0 {
			for _, dep := range deps {
				benchNoErr(b, rome.Client.Patch(ctx, &appsv1.Deployment{ObjectMeta: dep.ObjectMeta},
					client.RawPatch("application/merge-patch+json", []byte(`{"spec":{"replicas":0}}`))))
			}
		} else {
			for _, n := range nss {
				benchNoErr(b, rome.Client.DeleteAllOf(ctx, &corev1.Pod{}, client.InNamespace(n), client.MatchingLabels{"bench": name}))
			}
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
	if len(created) > 0 {
		sum = 0
		for _, r := range created {
			sum += r
		}
		b.ReportMetric(sum/float64(len(created)), "created-pods/s")
	}
}

// benchPaced creates benchPods bare pods with req in rome, the i-th at
// start + i/rate (each create in its own goroutine, so that a slow answer
// does not hold the next one back), alternating between the namespaces,
// and returns once every create has answered.
func benchPaced(b *testing.B, rome *testbed.Cluster, nss []string, name string, req corev1.ResourceList, rate float64) {
	ctx := context.Background()
	interval := time.Duration(float64(time.Second) / rate)
	start := time.Now()
	var wg sync.WaitGroup
	errs := make(chan error, benchPods)
	for i := 0; i < benchPods; i++ {
		time.Sleep(time.Until(start.Add(time.Duration(i) * interval)))
		pod := brokerPod(nss[i%len(nss)], fmt.Sprintf("%s-%03d", name, i), req)
		pod.Labels = map[string]string{"app": name, "bench": name}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := rome.Client.Create(ctx, pod); err != nil {
				errs <- err
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		benchNoErr(b, err)
	}
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

// podWatch records, from an informer, when each pod was first seen and
// first Running (pods labelled bench=<name>, any namespace).
type podWatch struct {
	mu      sync.Mutex
	seen    map[string]time.Time
	running map[string]time.Time
	stop    func()
}

func watchPods(b *testing.B, c *testbed.Cluster, bench string) *podWatch {
	return watchPodsIn(b, c, bench, "")
}

// watchPodsIn is watchPods of namespace ns only ("": all).
func watchPodsIn(b *testing.B, c *testbed.Cluster, bench, ns string) *podWatch {
	w := &podWatch{seen: map[string]time.Time{}, running: map[string]time.Time{}}
	w.stop = inform(b, c, &corev1.Pod{}, labels.SelectorFromSet(labels.Set{"bench": bench}), ns, func(obj any) {
		now := time.Now()
		p, ok := obj.(*corev1.Pod)
		if !ok {
			return
		}
		key := p.Namespace + "/" + p.Name
		w.mu.Lock()
		defer w.mu.Unlock()
		if _, ok := w.seen[key]; !ok {
			w.seen[key] = now
		}
		if _, ok := w.running[key]; !ok && p.Status.Phase == corev1.PodRunning {
			w.running[key] = now
		}
	})
	return w
}

// inform calls handle with every object of obj's type in c (in namespace ns
// and matching sel, when given) as it is added or changed, until the
// returned function is called. An informer rather than a bare watch: the
// API server may end a watch at any time (a slow consumer on a loaded
// machine), and an informer resumes it by itself.
func inform(b testing.TB, c *testbed.Cluster, obj client.Object, sel labels.Selector, ns string, handle func(any)) func() {
	opts := crcache.Options{Scheme: testbed.Scheme, DefaultLabelSelector: sel}
	if ns != "" {
		opts.DefaultNamespaces = map[string]crcache.Config{ns: {}}
	}
	ca, err := crcache.New(c.Config, opts)
	benchNoErr(b, err)
	ctx, cancel := context.WithCancel(context.Background())
	inf, err := ca.GetInformer(ctx, obj, crcache.BlockUntilSynced(false))
	benchNoErr(b, err)
	_, err = inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc:    handle,
		UpdateFunc: func(_, o any) { handle(o) },
	})
	benchNoErr(b, err)
	go func() { _ = ca.Start(ctx) }()
	if !ca.WaitForCacheSync(ctx) {
		cancel()
		b.Fatalf("%s: informer on %T did not sync", c.Name, obj)
	}
	return cancel
}

func (w *podWatch) counts() (seen, running int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.seen), len(w.running)
}

// seenSpan returns when the first and the last pod were first seen.
func (w *podWatch) seenSpan() (first, last time.Time) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, s := range w.seen {
		if first.IsZero() || s.Before(first) {
			first = s
		}
		if s.After(last) {
			last = s
		}
	}
	return first, last
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

func benchNoErr(b testing.TB, err error) {
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
// numbers equal base; then checks the store's invariant; then waits for the
// bed to be as quiet as at the start: no virtual node left in rome and no
// tenant namespace left at a provider (a next iteration or sub-benchmark
// would otherwise wait for a tenant namespace still terminating, and
// measure that).
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
	eventually(b, timeout, "no virtual node, no tenant namespace", func() (bool, string) {
		var left []string
		for _, c := range bed.Clusters {
			var nodes corev1.NodeList
			var nss corev1.NamespaceList
			if err := c.Client.List(ctx, &nodes, client.HasLabels{rbv1.ProviderLabel}); err != nil {
				return false, err.Error()
			}
			if err := c.Client.List(ctx, &nss, client.HasLabels{rbv1.TenantLabel}); err != nil {
				return false, err.Error()
			}
			for _, n := range nodes.Items {
				left = append(left, c.Name+": node "+n.Name)
			}
			for _, n := range nss.Items {
				left = append(left, c.Name+": namespace "+n.Name)
			}
		}
		return len(left) == 0, strings.Join(left, ", ")
	})
}

// stage names, in the order a remote pod goes through them.
const (
	stPodCreated   = "pod created"
	stRsvCreated   = "Reservation created"
	stDecided      = "broker decision"
	stReserved     = "Reservation Reserved"
	stInstruction  = "ProviderInstruction created"
	stGranted      = "ProviderInstruction granted"
	stActive       = "Reservation Active (granted)"
	stVNodeUpdated = "virtual node resized"
	stNamed        = "Reservation names its node"
	stBound        = "pod bound"
	stMirror       = "mirror created"
	stMirrorRun    = "mirror Running"
	stRunning      = "pod Running"
)

var stageOrder = []string{stPodCreated, stRsvCreated, stDecided, stReserved, stInstruction, stGranted, stActive, stVNodeUpdated, stNamed, stBound, stMirror, stMirrorRun, stRunning}

// stages records, from informers on every cluster of the bed, when each pod
// of a benchmark iteration passes each step of the remote path (see
// stageOrder); the broker's decision time (the reservation's creation time
// at the broker, Redis clock) is read afterwards.
type stages struct {
	mu    sync.Mutex
	at    map[string]map[string]time.Time // pod key (ns/name) -> stage -> first time
	rsvID map[string]string               // pod key -> broker reservation id
	vnode map[string][]time.Time          // virtual node -> times its allocatable changed
	alloc map[string]string
	pi    map[string]map[string]time.Time // broker reservation id -> provider-side stage -> first time
	stops []func()
}

func watchStages(b testing.TB, bed *testbed.Bed, bench string) *stages {
	s := &stages{at: map[string]map[string]time.Time{}, rsvID: map[string]string{}, vnode: map[string][]time.Time{}, alloc: map[string]string{},
		pi: map[string]map[string]time.Time{}}
	for _, c := range bed.Clusters {
		if c.Name == "rome" {
			s.stops = append(s.stops,
				inform(b, c, &corev1.Pod{}, labels.SelectorFromSet(labels.Set{"bench": bench}), "", s.handler("")),
				inform(b, c, &rbv1.Reservation{}, nil, "", s.handler("")),
				inform(b, c, &corev1.Node{}, nil, "", s.handler("")))
			continue
		}
		s.stops = append(s.stops, inform(b, c, &corev1.Pod{}, nil, "rb-rome", s.handler(c.Name)),
			inform(b, c, &rbv1.ProviderInstruction{}, nil, testbed.AgentNamespace, s.handler(c.Name)))
	}
	return s
}

func (s *stages) stop() {
	for _, f := range s.stops {
		f()
	}
}

func (s *stages) mark(key, stage string, at time.Time) {
	m := s.at[key]
	if m == nil {
		m = map[string]time.Time{}
		s.at[key] = m
	}
	if _, ok := m[stage]; !ok {
		m[stage] = at
	}
}

// handler records what an informer sees; provider is "" for rome's.
func (s *stages) handler(provider string) func(any) {
	return func(obj any) {
		now := time.Now()
		s.mu.Lock()
		defer s.mu.Unlock()
		switch o := obj.(type) {
		case *corev1.Pod:
			if provider != "" { // a mirror: <namespace>.<name> in rb-rome
				ns, name, ok := strings.Cut(o.Name, ".")
				if !ok {
					return
				}
				key := ns + "/" + name
				s.mark(key, stMirror, now)
				if o.Status.Phase == corev1.PodRunning {
					s.mark(key, stMirrorRun, now)
				}
				break
			}
			key := o.Namespace + "/" + o.Name
			s.mark(key, stPodCreated, now)
			if o.Spec.NodeName != "" {
				s.mark(key, stBound, now)
			}
			if o.Status.Phase == corev1.PodRunning {
				s.mark(key, stRunning, now)
			}
		case *rbv1.Reservation:
			if o.Spec.PodName == "" {
				return
			}
			key := o.Namespace + "/" + o.Spec.PodName
			s.mark(key, stRsvCreated, now)
			if o.Status.ReservationID != "" {
				s.rsvID[key] = o.Status.ReservationID
			}
			if live(o.Status.Phase) {
				s.mark(key, stReserved, now)
			}
			if o.Status.Phase == rbv1.ReservationActive {
				s.mark(key, stActive, now)
			}
			if o.Status.VirtualNode != "" {
				s.mark(key, stNamed, now)
			}
		case *rbv1.ProviderInstruction:
			m := s.pi[o.Spec.ReservationID]
			if m == nil {
				m = map[string]time.Time{}
				s.pi[o.Spec.ReservationID] = m
			}
			if _, ok := m[stInstruction]; !ok {
				m[stInstruction] = now
			}
			if _, ok := m[stGranted]; !ok && o.Status.Enforced {
				m[stGranted] = now
			}
		case *corev1.Node:
			if _, ok := o.Labels[rbv1.ProviderLabel]; !ok {
				return
			}
			a := fmt.Sprint(o.Status.Allocatable.Cpu(), o.Status.Allocatable.Pods())
			if s.alloc[o.Name] != a {
				s.alloc[o.Name] = a
				s.vnode[o.Name] = append(s.vnode[o.Name], now)
			}
		}
	}
}

// finish reads the broker's decision times and fills in, per pod, the first
// resize of the virtual node it was bound to after its reservation became
// Active (approximate: the resize that took the reservation in).
func (s *stages) finish(ctx context.Context, bed *testbed.Bed, rome *testbed.Cluster) {
	var pods corev1.PodList
	_ = rome.Client.List(ctx, &pods)
	node := map[string]string{}
	for _, p := range pods.Items {
		node[p.Namespace+"/"+p.Name] = p.Spec.NodeName
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for key, id := range s.rsvID {
		if r, err := bed.Store.Reservation(ctx, "rome", id); err == nil && !r.CreatedAt.IsZero() {
			s.mark(key, stDecided, r.CreatedAt)
		}
		for st, t := range s.pi[id] {
			s.mark(key, st, t)
		}
	}
	for key, m := range s.at {
		active, ok := m[stActive]
		if !ok {
			continue
		}
		for _, t := range s.vnode[node[key]] {
			if !t.Before(active) {
				s.mark(key, stVNodeUpdated, t)
				break
			}
		}
	}
}

// report gives, for every pair of consecutive steps that pods went through,
// the distribution of the time between them, and the full timeline of the
// first, the median and the last pod to be Running.
func (s *stages) report() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var lines []string
	for i := 1; i < len(stageOrder); i++ {
		var ds []time.Duration
		from := stageOrder[i-1]
		to := stageOrder[i]
		for _, m := range s.at {
			// from the latest earlier stage the pod went through
			var a time.Time
			for j := i - 1; j >= 0; j-- {
				if t, ok := m[stageOrder[j]]; ok {
					a, from = t, stageOrder[j]
					break
				}
			}
			if t, ok := m[to]; ok && !a.IsZero() {
				ds = append(ds, t.Sub(a))
			}
		}
		if len(ds) > 0 {
			lines = append(lines, fmt.Sprintf("  %-28s -> %-28s %s", from, to, stats(ds)))
		}
	}
	var total []time.Duration
	type run struct {
		key string
		at  time.Time
	}
	var runs []run
	for k, m := range s.at {
		if r, ok := m[stRunning]; ok {
			total = append(total, r.Sub(m[stPodCreated]))
			runs = append(runs, run{k, r})
		}
	}
	lines = append(lines, fmt.Sprintf("  %-28s -> %-28s %s", stPodCreated, stRunning, stats(total)))
	sort.Slice(runs, func(i, j int) bool { return runs[i].at.Before(runs[j].at) })
	if len(runs) > 0 {
		for _, r := range []run{runs[0], runs[len(runs)/2], runs[len(runs)-1]} {
			m := s.at[r.key]
			t0 := m[stPodCreated]
			var parts []string
			for _, st := range stageOrder {
				if t, ok := m[st]; ok {
					parts = append(parts, fmt.Sprintf("%s +%s", st, t.Sub(t0).Round(time.Millisecond)))
				}
			}
			lines = append(lines, fmt.Sprintf("  %s: %s", r.key, strings.Join(parts, ", ")))
		}
	}
	var nodes []string
	for n, ts := range s.vnode {
		nodes = append(nodes, fmt.Sprintf("%s resized %d times", n, len(ts)))
	}
	slices.Sort(nodes)
	if len(nodes) > 0 {
		lines = append(lines, "  "+strings.Join(nodes, ", "))
	}
	return strings.Join(lines, "\n")
}

// apiWrites reads apiserver_request_total of every cluster of the bed:
// cluster -> "VERB resource[/subresource]" -> requests, writes only.
func apiWrites(bed *testbed.Bed) map[string]map[string]float64 {
	out := map[string]map[string]float64{}
	for _, c := range bed.Clusters {
		out[c.Name] = map[string]float64{}
		raw, err := c.Clientset.CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(context.Background())
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(raw), "\n") {
			if !strings.HasPrefix(line, "apiserver_request_total{") {
				continue
			}
			labels := map[string]string{}
			for _, kv := range strings.Split(line[len("apiserver_request_total{"):strings.LastIndex(line, "}")], ",") {
				k, v, _ := strings.Cut(kv, "=")
				labels[k] = strings.Trim(v, `"`)
			}
			switch labels["verb"] {
			case "POST", "PUT", "PATCH", "DELETE":
			default:
				continue
			}
			key := labels["verb"] + " " + labels["resource"]
			if labels["subresource"] != "" {
				key += "/" + labels["subresource"]
			}
			var n float64
			_, _ = fmt.Sscan(line[strings.LastIndex(line, " ")+1:], &n)
			out[c.Name][key] += n
		}
	}
	return out
}

// writesTotal: the writes made between before and after, every cluster.
func writesTotal(before, after map[string]map[string]float64) float64 {
	var total float64
	for cluster, m := range after {
		for k, v := range m {
			if d := v - before[cluster][k]; d > 0 {
				total += d
			}
		}
	}
	return total
}

// writesReport: per cluster, the writes made between before and after, most first.
func writesReport(before, after map[string]map[string]float64) string {
	var lines []string
	for _, cluster := range slices.Sorted(maps.Keys(after)) {
		var total float64
		var keys []string
		for k, v := range after[cluster] {
			if d := v - before[cluster][k]; d > 0 {
				total += d
				keys = append(keys, k)
			}
		}
		d := func(k string) float64 { return after[cluster][k] - before[cluster][k] }
		sort.Slice(keys, func(i, j int) bool { return d(keys[i]) > d(keys[j]) })
		var parts []string
		for _, k := range keys {
			if d(k) >= 10 {
				parts = append(parts, fmt.Sprintf("%s %.0f", k, d(k)))
			}
		}
		lines = append(lines, fmt.Sprintf("  %s: %.0f: %s", cluster, total, strings.Join(parts, ", ")))
	}
	return strings.Join(lines, "\n")
}

// cpuTimes reads the CPU time (user + system) spent so far by each part of
// the bed, from /proc (Linux; nothing elsewhere): each cluster's
// kube-apiserver and etcd (found by their ports), the subprocesses, and
// this test process (in-process controllers, kubelet stand-ins, the
// benchmark's informers).
func cpuTimes(bed *testbed.Bed) map[string]time.Duration {
	out := map[string]time.Duration{}
	if runtime.GOOS != "linux" {
		return out
	}
	const ticks = 100 // USER_HZ
	cpu := func(pid int) time.Duration {
		raw, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
		if err != nil {
			return 0
		}
		f := strings.Fields(string(raw[bytes.LastIndexByte(raw, ')')+1:]))
		if len(f) < 13 {
			return 0
		}
		u, _ := strconv.ParseInt(f[11], 10, 64)
		k, _ := strconv.ParseInt(f[12], 10, 64)
		return time.Duration(u+k) * time.Second / ticks
	}
	out["test process"] = cpu(os.Getpid())
	for _, p := range bed.Processes() {
		if pid := p.Pid(); pid > 0 {
			out[p.Name] += cpu(pid)
		}
	}
	// API servers by --secure-port, etcds by the client URL their API server uses.
	apiPort := map[string]string{} // port -> cluster
	for _, c := range bed.Clusters {
		if i := strings.LastIndexByte(c.Config.Host, ':'); i >= 0 {
			apiPort[strings.TrimSuffix(c.Config.Host[i+1:], "/")] = c.Name
		}
	}
	etcdURL := map[string]string{} // client URL -> cluster
	type proc struct {
		pid  int
		args []string
	}
	var etcds []proc
	dirs, _ := os.ReadDir("/proc")
	for _, d := range dirs {
		pid, err := strconv.Atoi(d.Name())
		if err != nil {
			continue
		}
		raw, err := os.ReadFile(filepath.Join("/proc", d.Name(), "cmdline"))
		if err != nil || len(raw) == 0 {
			continue
		}
		args := strings.Split(strings.TrimRight(string(raw), "\x00"), "\x00")
		switch filepath.Base(args[0]) {
		case "kube-apiserver":
			var cluster, etcd string
			for _, a := range args {
				if v, ok := strings.CutPrefix(a, "--secure-port="); ok {
					cluster = apiPort[v]
				}
				if v, ok := strings.CutPrefix(a, "--etcd-servers="); ok {
					etcd = v
				}
			}
			if cluster != "" {
				out["kube-apiserver "+cluster] += cpu(pid)
				etcdURL[etcd] = cluster
			}
		case "etcd":
			etcds = append(etcds, proc{pid, args})
		}
	}
	for _, e := range etcds {
		for _, a := range e.args {
			if v, ok := strings.CutPrefix(a, "--listen-client-urls="); ok && etcdURL[v] != "" {
				out["etcd "+etcdURL[v]] += cpu(e.pid)
			}
		}
	}
	// Real nodes: kubelet, containerd, shims and pods of each.
	for _, c := range bed.Clusters {
		for _, n := range c.RealNodes() {
			out["node "+n.Name] = n.CPUTime()
		}
	}
	return out
}

// cpuReport: the CPU time each part spent between before and after, most first.
func cpuReport(before, after map[string]time.Duration) string {
	type part struct {
		name string
		d    time.Duration
	}
	var parts []part
	var total time.Duration
	for k, v := range after {
		if d := v - before[k]; d > 0 {
			parts = append(parts, part{k, d})
			total += d
		}
	}
	sort.Slice(parts, func(i, j int) bool { return parts[i].d > parts[j].d })
	out := []string{fmt.Sprintf("total %s", total.Round(10*time.Millisecond))}
	for _, p := range parts {
		out = append(out, fmt.Sprintf("%s %s", p.name, p.d.Round(10*time.Millisecond)))
	}
	return strings.Join(out, ", ")
}
