package main

// BenchmarkAgentFootprint measures what rb-agent costs a large cluster: the
// resident memory and CPU of the real rb-agent binary, run as a subprocess
// against a real API server (envtest) holding 1,000 Ready Nodes and 30,000
// Running Pods bound to them, and a real broker (mutual TLS, redis-server).
// In the same run, for ratios, two baselines:
//
//   - informer: the same kind of process (this test binary, which links the
//     same Kubernetes libraries as rb-agent) running nothing but a plain
//     client-go shared informer factory on Pods and Nodes (protobuf, no
//     transform, no selector): what any controller that watches every pod
//     of the cluster costs;
//   - empty: rb-agent against the same API server before it is populated
//     (its fixed cost).
//
// Each process is started, waited for until it has synced (rb-agent: its
// Advertisement carries every node's allocatable and every pod's requests
// and the broker acknowledged it; the informer: its caches are synced), left
// to settle, then measured from /proc/<pid>: VmRSS after a quiet window,
// VmHWM (peak), CPU (utime+stime) over the quiet window, then CPU under
// churn (pod annotation patches at a fixed rate) over a second window.
//
// Sizes and windows: RB_FOOTPRINT_NODES (1000), RB_FOOTPRINT_PODS (30000),
// RB_FOOTPRINT_WINDOW (30s), RB_FOOTPRINT_CHURN_WINDOW (20s),
// RB_FOOTPRINT_CHURN_RATE (50 updates/s), RB_FOOTPRINT_SETTLE (10s).
// RB_FOOTPRINT_AGENT_ENV adds environment variables to rb-agent (e.g.
// "GOMEMLIMIT=64MiB"). RB_FOOTPRINT_PROFILE_DIR, when set, receives
// rb-agent's heap profile (after the quiet window), a CPU profile under
// churn (rb-agent runs with --pprof-bind-address for that) and the
// processes' logs. Figures and their reading: docs/benchmarks.md, "Agent
// footprint".
//
//	go test -run '^$' -bench AgentFootprint -benchtime 1x -timeout 30m ./cmd/rb-agent/

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/fluidos-project/resource-broker/agent/provider"
	rbv1 "github.com/fluidos-project/resource-broker/api/v1alpha1"
	"github.com/fluidos-project/resource-broker/internal/brokertest"
	"github.com/fluidos-project/resource-broker/internal/testenv"
)

// footprintConfig sizes one run of the benchmark.
type footprintConfig struct {
	nodes, pods, namespaces int
	settle, window, churn   time.Duration
	churnRate               int
	profileDir              string
}

func footprintConfigFromEnv(tb testing.TB) footprintConfig {
	tb.Helper()
	c := footprintConfig{nodes: 1000, pods: 30000, settle: 10 * time.Second, window: 30 * time.Second,
		churn: 20 * time.Second, churnRate: 50, profileDir: os.Getenv("RB_FOOTPRINT_PROFILE_DIR")}
	for name, dst := range map[string]*int{"RB_FOOTPRINT_NODES": &c.nodes, "RB_FOOTPRINT_PODS": &c.pods, "RB_FOOTPRINT_CHURN_RATE": &c.churnRate} {
		if v := os.Getenv(name); v != "" {
			n, err := strconv.Atoi(v)
			if err != nil || n <= 0 {
				tb.Fatalf("%s=%q: want a positive integer", name, v)
			}
			*dst = n
		}
	}
	for name, dst := range map[string]*time.Duration{"RB_FOOTPRINT_WINDOW": &c.window, "RB_FOOTPRINT_CHURN_WINDOW": &c.churn, "RB_FOOTPRINT_SETTLE": &c.settle} {
		if v := os.Getenv(name); v != "" {
			d, err := time.ParseDuration(v)
			if err != nil || d < 0 {
				tb.Fatalf("%s=%q: want a duration", name, v)
			}
			*dst = d
		}
	}
	return c.withDefaults()
}

func (c footprintConfig) withDefaults() footprintConfig {
	if c.namespaces == 0 {
		c.namespaces = max(1, min(100, c.pods/300))
	}
	return c
}

const (
	footprintClusterID = "bench"
	footprintNamespace = "resource-broker"
	// Each node offers nodeCPU / nodeMemory; each pod asks podCPU / podMemory
	// (its two containers together).
	nodeCPU, nodeMemory = "32", "128Gi"
	podCPUMilli         = 100 + 10
	podMemory           = (128 + 16) << 20
)

// BenchmarkAgentFootprint: see the comment at the top of the file.
func BenchmarkAgentFootprint(b *testing.B) {
	runFootprint(b, footprintConfigFromEnv(b))
}

// TestAgentFootprintSmoke runs the benchmark on a small cluster with short
// windows, so that go test keeps it working: rb-agent must sync and every
// figure must be there. The figures themselves are only logged.
func TestAgentFootprintSmoke(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a control plane, a broker and builds rb-agent")
	}
	cfg := footprintConfig{nodes: 20, pods: 300, namespaces: 3, settle: time.Second, window: 2 * time.Second,
		churn: 2 * time.Second, churnRate: 20}.withDefaults()
	var failed atomic.Bool
	r := testing.Benchmark(func(b *testing.B) {
		defer func() { failed.Store(b.Failed()) }()
		runFootprint(b, cfg)
	})
	if failed.Load() || r.N == 0 {
		t.Fatal("the benchmark failed (run it with go test -bench AgentFootprint -v to see why)")
	}
	for _, m := range []string{"agent-MiB", "agent-peak-MiB", "agent-idle-%cpu", "agent-churn-%cpu", "informer-MiB", "empty-MiB", "sync-s"} {
		if _, ok := r.Extra[m]; !ok {
			t.Errorf("metric %s missing: %v", m, r.Extra)
		}
	}
	t.Logf("%s", r.String())
}

// footprint is what one process costs.
type footprint struct {
	sync          time.Duration // start -> synced
	rssMiB        float64       // VmRSS after the quiet window
	peakMiB       float64       // VmHWM at the end
	idleCPU       float64       // % of one core over the quiet window
	churnCPU      float64       // % of one core under churn
	churnRSSMiB   float64       // VmRSS after the churn window
	churnRate     float64       // updates/s actually made
	startupCPUSec float64       // CPU seconds from start to synced
	anonMiB       float64       // of rssMiB: anonymous memory (Go heap, stacks, runtime)
	fileMiB       float64       // of rssMiB: file-backed (the executable's pages)
}

func runFootprint(b *testing.B, cfg footprintConfig) {
	ctx := context.Background()
	fx := newFootprintFixture(b, cfg)

	// Baseline 1: rb-agent on the empty cluster.
	empty := fx.measure(b, "empty", fx.startAgent, func(p *process, began time.Time) error { return fx.waitAdvertised(ctx, p, began, 0, 0) }, false)

	began := time.Now()
	fx.populate(ctx, b)
	b.Logf("populated %d nodes, %d pods in %d namespaces in %s", cfg.nodes, cfg.pods, cfg.namespaces, time.Since(began).Round(time.Millisecond))

	var agents, infs []footprint
	for b.Loop() {
		agents = append(agents, fx.measure(b, "agent", fx.startAgent,
			func(p *process, began time.Time) error { return fx.waitAdvertised(ctx, p, began, cfg.nodes, cfg.pods) }, true))
		infs = append(infs, fx.measure(b, "informer", fx.startInformer,
			func(p *process, _ time.Time) error {
				return p.waitLine(ctx, "synced pods="+strconv.Itoa(cfg.pods)+" ", 5*time.Minute)
			}, false))
	}
	if b.Failed() {
		return
	}
	a, in := median(agents), median(infs)
	b.ReportMetric(a.rssMiB, "agent-MiB")
	b.ReportMetric(a.peakMiB, "agent-peak-MiB")
	b.ReportMetric(a.idleCPU, "agent-idle-%cpu")
	b.ReportMetric(a.churnCPU, "agent-churn-%cpu")
	b.ReportMetric(a.sync.Seconds(), "sync-s")
	b.ReportMetric(in.rssMiB, "informer-MiB")
	b.ReportMetric(in.peakMiB, "informer-peak-MiB")
	b.ReportMetric(in.idleCPU, "informer-idle-%cpu")
	b.ReportMetric(in.churnCPU, "informer-churn-%cpu")
	b.ReportMetric(empty.rssMiB, "empty-MiB")
	b.ReportMetric(empty.idleCPU, "empty-idle-%cpu")
	b.ReportMetric(a.rssMiB/in.rssMiB, "agent/informer-MiB")
	if in.churnCPU > 0 {
		b.ReportMetric(a.churnCPU/in.churnCPU, "agent/informer-churn-cpu")
	}
	b.ReportMetric(0, "ns/op") // one op is minutes of set-up and windows: meaningless
	b.Logf("%-9s %8s %6s %6s %8s %9s %10s %9s %8s %10s %11s", "process", "RSS MiB", "anon", "file", "peak", "idle %cpu", "churn %cpu", "churn RSS", "sync", "sync cpu-s", "churn upd/s")
	for _, r := range []struct {
		name string
		f    footprint
	}{{"empty", empty}, {"agent", a}, {"informer", in}} {
		b.Logf("%-9s %8.1f %6.1f %6.1f %8.1f %9.2f %10.2f %9.1f %8s %10.2f %11.1f", r.name, r.f.rssMiB, r.f.anonMiB, r.f.fileMiB, r.f.peakMiB, r.f.idleCPU, r.f.churnCPU,
			r.f.churnRSSMiB, r.f.sync.Round(time.Millisecond), r.f.startupCPUSec, r.f.churnRate)
	}
}

// median takes each figure's median over the iterations.
func median(fs []footprint) footprint {
	pick := func(get func(footprint) float64) float64 {
		v := make([]float64, len(fs))
		for i, f := range fs {
			v[i] = get(f)
		}
		slices.Sort(v)
		return v[len(v)/2]
	}
	return footprint{
		sync:          time.Duration(pick(func(f footprint) float64 { return float64(f.sync) })),
		rssMiB:        pick(func(f footprint) float64 { return f.rssMiB }),
		peakMiB:       pick(func(f footprint) float64 { return f.peakMiB }),
		idleCPU:       pick(func(f footprint) float64 { return f.idleCPU }),
		churnCPU:      pick(func(f footprint) float64 { return f.churnCPU }),
		churnRSSMiB:   pick(func(f footprint) float64 { return f.churnRSSMiB }),
		churnRate:     pick(func(f footprint) float64 { return f.churnRate }),
		startupCPUSec: pick(func(f footprint) float64 { return f.startupCPUSec }),
		anonMiB:       pick(func(f footprint) float64 { return f.anonMiB }),
		fileMiB:       pick(func(f footprint) float64 { return f.fileMiB }),
	}
}

// footprintFixture is the API server, the broker and the binaries.
type footprintFixture struct {
	cfg        footprintConfig
	dir        string
	restConfig *rest.Config
	cs         *kubernetes.Clientset
	client     client.Client
	kubeconfig string
	brokerURL  string
	certDir    string
	agentBin   string
	pods       []types.NamespacedName // created pods (churn picks from them)
}

func newFootprintFixture(b *testing.B, cfg footprintConfig) *footprintFixture {
	b.Helper()
	fx := &footprintFixture{cfg: cfg, dir: b.TempDir()}

	// rb-agent, built from this directory (go test runs in the package directory).
	fx.agentBin = filepath.Join(fx.dir, "rb-agent")
	began := time.Now()
	if out, err := exec.Command("go", "build", "-o", fx.agentBin, ".").CombinedOutput(); err != nil {
		b.Fatalf("go build rb-agent: %v\n%s", err, out)
	}
	b.Logf("built rb-agent in %s", time.Since(began).Round(time.Millisecond))

	env, err := testenv.New(testenv.WithCRDDirectories(testenv.ModulePath(b, "manifests", "crds")))
	if err != nil {
		b.Fatal(err)
	}
	if _, err := env.Start(); err != nil {
		_ = env.Stop()
		b.Fatalf("starting the control plane: %v", err)
	}
	b.Cleanup(func() {
		if err := env.Stop(); err != nil {
			b.Errorf("stopping the control plane: %v", err)
		}
	})
	user, err := env.AddUser(envtest.User{Name: "footprint-admin", Groups: []string{"system:masters"}}, nil)
	if err != nil {
		b.Fatal(err)
	}
	kc, err := user.KubeConfig()
	if err != nil {
		b.Fatal(err)
	}
	fx.kubeconfig = filepath.Join(fx.dir, "kubeconfig")
	if err := os.WriteFile(fx.kubeconfig, kc, 0o600); err != nil {
		b.Fatal(err)
	}
	fx.restConfig = user.Config()
	fx.restConfig.QPS, fx.restConfig.Burst = -1, 0 // no client-side rate limit: the API server is the limit
	if fx.cs, err = kubernetes.NewForConfig(fx.restConfig); err != nil {
		b.Fatal(err)
	}
	scheme := runtime.NewScheme()
	_ = clientgoscheme.AddToScheme(scheme)
	_ = rbv1.AddToScheme(scheme)
	if fx.client, err = client.New(fx.restConfig, client.Options{Scheme: scheme}); err != nil {
		b.Fatal(err)
	}
	for _, obj := range []client.Object{
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: footprintNamespace}},
		provider.NewTenantClusterRole(),
	} {
		if err := fx.client.Create(context.Background(), obj); err != nil {
			b.Fatal(err)
		}
	}

	brk := brokertest.Start(b, brokertest.Options{})
	fx.brokerURL, fx.certDir = brk.URL, brk.ClusterCertDir(footprintClusterID)
	return fx
}

// populate creates the nodes, then the pods bound to them, Running.
func (fx *footprintFixture) populate(ctx context.Context, b *testing.B) {
	b.Helper()
	cfg := fx.cfg
	for i := range cfg.namespaces {
		ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("shop-%02d", i),
			Labels: map[string]string{"team": fmt.Sprintf("team-%d", i%7)}}}
		if _, err := fx.cs.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil {
			b.Fatal(err)
		}
	}
	if err := parallel(ctx, cfg.nodes, 16, func(i int) error {
		return createNode(ctx, fx.cs, nodeName(i))
	}); err != nil {
		b.Fatalf("creating nodes: %v", err)
	}
	fx.pods = make([]types.NamespacedName, cfg.pods)
	if err := parallel(ctx, cfg.pods, 32, func(i int) error {
		ns := fmt.Sprintf("shop-%02d", i%cfg.namespaces)
		p := footprintPod(ns, fmt.Sprintf("web-%05d", i), nodeName(i%cfg.nodes), i)
		created, err := fx.cs.CoreV1().Pods(ns).Create(ctx, p, metav1.CreateOptions{})
		if err != nil {
			return err
		}
		markRunning(created, i)
		if _, err := fx.cs.CoreV1().Pods(ns).UpdateStatus(ctx, created, metav1.UpdateOptions{}); err != nil {
			return err
		}
		fx.pods[i] = types.NamespacedName{Namespace: ns, Name: p.Name}
		return nil
	}); err != nil {
		b.Fatalf("creating pods: %v", err)
	}
}

func nodeName(i int) string { return fmt.Sprintf("worker-%04d", i) }

// parallel runs fn(0..n-1) on workers goroutines and returns the first error.
func parallel(ctx context.Context, n, workers int, fn func(i int) error) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	var next atomic.Int64
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for ctx.Err() == nil {
				i := int(next.Add(1) - 1)
				if i >= n {
					return
				}
				var err error
				for attempt := range 5 { // a loaded API server answers 429 or times out now and then
					if err = fn(i); err == nil || ctx.Err() != nil {
						break
					}
					time.Sleep(time.Duration(attempt+1) * 200 * time.Millisecond)
				}
				if err != nil {
					cancel(err)
					return
				}
			}
		})
	}
	wg.Wait()
	return context.Cause(ctx)
}

// createNode creates a node the way a kubelet registers one, then reports
// it Ready with a realistic status (addresses, node info, images).
func createNode(ctx context.Context, cs kubernetes.Interface, name string) error {
	zone := fmt.Sprintf("eu-west-1%c", 'a'+name[len(name)-1]%3)
	node := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{
			corev1.LabelHostname: name, corev1.LabelOSStable: "linux", corev1.LabelArchStable: "amd64",
			corev1.LabelInstanceTypeStable: "m6i.8xlarge", corev1.LabelTopologyZone: zone, corev1.LabelTopologyRegion: "eu-west-1",
			"node.kubernetes.io/pool": "general",
		}, Annotations: map[string]string{
			"node.alpha.kubernetes.io/ttl": "0", "volumes.kubernetes.io/controller-managed-attach-detach": "true",
		}},
		Spec: corev1.NodeSpec{PodCIDR: "10.244.0.0/24", PodCIDRs: []string{"10.244.0.0/24"}, ProviderID: "aws:///" + zone + "/i-0" + name},
	}
	created, err := cs.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{})
	if err != nil {
		return err
	}
	capacity := corev1.ResourceList{
		corev1.ResourceCPU: resource.MustParse(nodeCPU), corev1.ResourceMemory: resource.MustParse(nodeMemory),
		corev1.ResourcePods: resource.MustParse("110"), corev1.ResourceEphemeralStorage: resource.MustParse("200Gi"),
	}
	now := metav1.Now()
	st := &created.Status
	st.Capacity, st.Allocatable = capacity, capacity
	st.Conditions = []corev1.NodeCondition{
		{Type: corev1.NodeMemoryPressure, Status: corev1.ConditionFalse, Reason: "KubeletHasSufficientMemory", Message: "kubelet has sufficient memory available", LastHeartbeatTime: now, LastTransitionTime: now},
		{Type: corev1.NodeDiskPressure, Status: corev1.ConditionFalse, Reason: "KubeletHasNoDiskPressure", Message: "kubelet has no disk pressure", LastHeartbeatTime: now, LastTransitionTime: now},
		{Type: corev1.NodePIDPressure, Status: corev1.ConditionFalse, Reason: "KubeletHasSufficientPID", Message: "kubelet has sufficient PID available", LastHeartbeatTime: now, LastTransitionTime: now},
		{Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "KubeletReady", Message: "kubelet is posting ready status", LastHeartbeatTime: now, LastTransitionTime: now},
	}
	st.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "10.0.1.17"}, {Type: corev1.NodeHostName, Address: name},
		{Type: corev1.NodeInternalDNS, Address: name + ".eu-west-1.compute.internal"}}
	st.DaemonEndpoints.KubeletEndpoint.Port = 10250
	st.NodeInfo = corev1.NodeSystemInfo{MachineID: "ec2" + name, SystemUUID: "ec2" + name, BootID: "b00t-" + name, KernelVersion: "6.1.0-aws",
		OSImage: "Amazon Linux 2023", ContainerRuntimeVersion: "containerd://1.7.27", KubeletVersion: "v1.35.0",
		OperatingSystem: "linux", Architecture: "amd64"}
	for i := range 25 {
		st.Images = append(st.Images, corev1.ContainerImage{
			Names:     []string{fmt.Sprintf("registry.example/shop/app-%03d@sha256:%064d", i, i), fmt.Sprintf("registry.example/shop/app-%03d:1.4.2", i)},
			SizeBytes: int64(50+i) << 20,
		})
	}
	_, err = cs.CoreV1().Nodes().UpdateStatus(ctx, created, metav1.UpdateOptions{})
	return err
}

// footprintPod is a Deployment's pod as it is commonly written: an app
// container and a sidecar, probes, env, a ConfigMap and the projected
// service account token volume, the default tolerations; bound to node.
func footprintPod(ns, name, node string, i int) *corev1.Pod {
	app := fmt.Sprintf("app-%03d", i%25)
	rq := func(cpu, mem string) corev1.ResourceList {
		return corev1.ResourceList{corev1.ResourceCPU: resource.MustParse(cpu), corev1.ResourceMemory: resource.MustParse(mem)}
	}
	probe := func(path string) *corev1.Probe {
		return &corev1.Probe{ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: path, Port: intstr.FromString("http")}},
			PeriodSeconds: 10, TimeoutSeconds: 1, SuccessThreshold: 1, FailureThreshold: 3}
	}
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns,
			Labels: map[string]string{"app.kubernetes.io/name": app, "app.kubernetes.io/part-of": "shop", "pod-template-hash": "5fffb58574", "tier": "backend"},
			Annotations: map[string]string{"kubectl.kubernetes.io/restartedAt": "2026-01-01T00:00:00Z", "prometheus.io/scrape": "true",
				"prometheus.io/port": "9090"},
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "ReplicaSet", Name: app + "-5fffb58574",
				UID: types.UID(fmt.Sprintf("0b9e1c2a-7c1d-4f5e-9a6b-%012d", i%25)), Controller: ptr.To(true), BlockOwnerDeletion: ptr.To(true)}},
		},
		Spec: corev1.PodSpec{
			NodeName:                     node,
			ServiceAccountName:           "default",
			AutomountServiceAccountToken: ptr.To(false), // the token volume is spelled out below
			Containers: []corev1.Container{{
				Name: "app", Image: "registry.example/shop/" + app + ":1.4.2", ImagePullPolicy: corev1.PullIfNotPresent,
				Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: 8080, Protocol: corev1.ProtocolTCP}, {Name: "metrics", ContainerPort: 9090, Protocol: corev1.ProtocolTCP}},
				Env: []corev1.EnvVar{{Name: "LOG_LEVEL", Value: "info"}, {Name: "HTTP_PORT", Value: "8080"}, {Name: "DB_HOST", Value: "postgres.shop.svc.cluster.local"},
					{Name: "POD_NAME", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{APIVersion: "v1", FieldPath: "metadata.name"}}},
					{Name: "POD_IP", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{APIVersion: "v1", FieldPath: "status.podIP"}}}},
				Resources:      corev1.ResourceRequirements{Requests: rq("100m", "128Mi"), Limits: rq("500m", "256Mi")},
				VolumeMounts:   []corev1.VolumeMount{{Name: "config", MountPath: "/etc/app", ReadOnly: true}, {Name: "kube-api-access", MountPath: "/var/run/secrets/kubernetes.io/serviceaccount", ReadOnly: true}},
				ReadinessProbe: probe("/ready"), LivenessProbe: probe("/healthz"),
				TerminationMessagePath: "/dev/termination-log", TerminationMessagePolicy: corev1.TerminationMessageReadFile,
			}, {
				Name: "proxy", Image: "registry.example/mesh/proxy:2.1.0", ImagePullPolicy: corev1.PullIfNotPresent,
				Args:                   []string{"proxy", "--upstream=127.0.0.1:8080", "--listen=:15001"},
				Resources:              corev1.ResourceRequirements{Requests: rq("10m", "16Mi"), Limits: rq("100m", "64Mi")},
				TerminationMessagePath: "/dev/termination-log", TerminationMessagePolicy: corev1.TerminationMessageReadFile,
			}},
			Volumes: []corev1.Volume{
				{Name: "config", VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{LocalObjectReference: corev1.LocalObjectReference{Name: app + "-config"}}}},
				{Name: "kube-api-access", VolumeSource: corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{Sources: []corev1.VolumeProjection{
					{ServiceAccountToken: &corev1.ServiceAccountTokenProjection{Path: "token", ExpirationSeconds: ptr.To[int64](3607)}},
					{ConfigMap: &corev1.ConfigMapProjection{LocalObjectReference: corev1.LocalObjectReference{Name: "kube-root-ca.crt"}, Items: []corev1.KeyToPath{{Key: "ca.crt", Path: "ca.crt"}}}},
					{DownwardAPI: &corev1.DownwardAPIProjection{Items: []corev1.DownwardAPIVolumeFile{{Path: "namespace", FieldRef: &corev1.ObjectFieldSelector{APIVersion: "v1", FieldPath: "metadata.namespace"}}}}},
				}}}},
			},
			Tolerations: []corev1.Toleration{
				{Key: corev1.TaintNodeNotReady, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoExecute, TolerationSeconds: ptr.To[int64](300)},
				{Key: corev1.TaintNodeUnreachable, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoExecute, TolerationSeconds: ptr.To[int64](300)},
			},
		},
	}
}

// markRunning sets the status a kubelet reports for a started pod.
func markRunning(p *corev1.Pod, i int) {
	now := metav1.Now()
	p.Status.Phase = corev1.PodRunning
	p.Status.QOSClass = corev1.PodQOSBurstable
	p.Status.StartTime = &now
	p.Status.HostIP = "10.0.1.17"
	p.Status.HostIPs = []corev1.HostIP{{IP: p.Status.HostIP}}
	p.Status.PodIP = fmt.Sprintf("10.%d.%d.%d", 100+i>>16, (i>>8)&255, i&255)
	p.Status.PodIPs = []corev1.PodIP{{IP: p.Status.PodIP}}
	p.Status.Conditions = []corev1.PodCondition{
		{Type: corev1.PodReadyToStartContainers, Status: corev1.ConditionTrue, LastTransitionTime: now},
		{Type: corev1.PodInitialized, Status: corev1.ConditionTrue, LastTransitionTime: now},
		{Type: corev1.PodReady, Status: corev1.ConditionTrue, LastTransitionTime: now},
		{Type: corev1.ContainersReady, Status: corev1.ConditionTrue, LastTransitionTime: now},
		{Type: corev1.PodScheduled, Status: corev1.ConditionTrue, LastTransitionTime: now},
	}
	p.Status.ContainerStatuses = nil
	for _, c := range p.Spec.Containers {
		p.Status.ContainerStatuses = append(p.Status.ContainerStatuses, corev1.ContainerStatus{
			Name: c.Name, Image: c.Image, ImageID: c.Image + "@sha256:" + strings.Repeat("ab", 32),
			ContainerID: fmt.Sprintf("containerd://%064x", i), Ready: true, Started: ptr.To(true),
			State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: now}},
		})
	}
}

// process is one measured subprocess.
type process struct {
	name  string
	cmd   *exec.Cmd
	log   string
	done  chan struct{}
	lines chan string // stdout lines, when captured
}

func (fx *footprintFixture) start(b *testing.B, name, path string, args, env []string, captureStdout bool) *process {
	b.Helper()
	logDir := fx.dir
	if fx.cfg.profileDir != "" { // keep the logs with the profiles
		logDir = fx.cfg.profileDir
		if err := os.MkdirAll(logDir, 0o755); err != nil {
			b.Fatal(err)
		}
	}
	p := &process{name: name, log: filepath.Join(logDir, name+".log"), done: make(chan struct{})}
	logf, err := os.OpenFile(p.log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		b.Fatal(err)
	}
	p.cmd = exec.Command(path, args...)
	p.cmd.Env = append(os.Environ(), env...)
	p.cmd.Stderr = logf
	var stdout io.ReadCloser
	if captureStdout {
		if stdout, err = p.cmd.StdoutPipe(); err != nil {
			b.Fatal(err)
		}
	} else {
		p.cmd.Stdout = logf
	}
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := p.cmd.Start(); err != nil {
		b.Fatal(err)
	}
	if captureStdout {
		p.lines = make(chan string, 64)
		go func() {
			sc := bufio.NewScanner(stdout)
			for sc.Scan() {
				fmt.Fprintln(logf, sc.Text())
				select {
				case p.lines <- sc.Text():
				default:
				}
			}
		}()
	}
	go func() {
		_ = p.cmd.Wait()
		logf.Close()
		close(p.done)
	}()
	b.Cleanup(p.stop)
	return p
}

// stop ends the process: SIGTERM, then SIGKILL after 15 s.
func (p *process) stop() {
	select {
	case <-p.done:
		return
	default:
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(15 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.done
	}
}

func (p *process) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

func (p *process) tail() string {
	data, _ := os.ReadFile(p.log)
	lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-30):], "\n")
}

// waitLine waits for a line of the process's stdout that starts with prefix.
func (p *process) waitLine(ctx context.Context, prefix string, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	for {
		select {
		case l := <-p.lines:
			if strings.HasPrefix(l, prefix) {
				return nil
			}
		case <-p.done:
			return fmt.Errorf("%s exited", p.name)
		case <-ctx.Done():
			return fmt.Errorf("no line %q within %s", prefix, timeout)
		}
	}
}

func (fx *footprintFixture) startAgent(b *testing.B) *process {
	args := []string{
		"--kubeconfig=" + fx.kubeconfig,
		"--cluster-id=" + footprintClusterID,
		"--broker-url=" + fx.brokerURL,
		"--broker-cert-dir=" + fx.certDir,
		"--namespace=" + footprintNamespace,
		"--leader-elect=false",
		"--metrics-bind-address=0",
		"--health-probe-bind-address=0",
		"--kubelet-address=127.0.0.1:" + strconv.Itoa(freePort(b)),
		"--node-ip=127.0.0.1",
		"--price-cpu=0.03", "--price-memory=0.004",
	}
	if fx.cfg.profileDir != "" {
		args = append(args, "--pprof-bind-address=127.0.0.1:"+strconv.Itoa(freePort(b)))
	}
	// RB_FOOTPRINT_AGENT_ENV adds environment variables to rb-agent, e.g.
	// GOMEMLIMIT=64MiB or GOGC=50, to see what the runtime's tuning changes.
	return fx.start(b, "rb-agent", fx.agentBin, args, strings.Fields(os.Getenv("RB_FOOTPRINT_AGENT_ENV")), false)
}

func (fx *footprintFixture) startInformer(b *testing.B) *process {
	self, err := os.Executable()
	if err != nil {
		b.Fatal(err)
	}
	return fx.start(b, "informer", self, []string{"-test.run=^TestFootprintInformerProcess$", "-test.timeout=0", "-test.count=1"},
		[]string{informerKubeconfigEnv + "=" + fx.kubeconfig}, true)
}

func freePort(tb testing.TB) int {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// waitAdvertised waits until the agent's Advertisement, published after
// the agent started and acknowledged by the broker, carries the allocatable
// of nodes nodes and the requests of pods pods.
func (fx *footprintFixture) waitAdvertised(ctx context.Context, p *process, since time.Time, nodes, pods int) error {
	wantAllocatable := resource.MustParse(nodeCPU)
	wantAllocatable.SetMilli(wantAllocatable.MilliValue() * int64(nodes))
	deadline := time.Now().Add(5 * time.Minute)
	for time.Now().Before(deadline) {
		if p.exited() {
			return fmt.Errorf("rb-agent exited:\n%s", p.tail())
		}
		var adv rbv1.Advertisement
		if err := fx.client.Get(ctx, types.NamespacedName{Name: footprintClusterID}, &adv); err == nil {
			published := meta.FindStatusCondition(adv.Status.Conditions, rbv1.ConditionPublished)
			cpuAllocated, cpuAllocatable := adv.Spec.Allocated[corev1.ResourceCPU], adv.Spec.Allocatable[corev1.ResourceCPU]
			memAllocated := adv.Spec.Allocated[corev1.ResourceMemory]
			if adv.Status.LastPublished != nil && !adv.Status.LastPublished.Time.Before(since.Truncate(time.Second)) /* seconds in the API */ &&
				published != nil && published.Status == metav1.ConditionTrue && published.ObservedGeneration == adv.Generation &&
				cpuAllocatable.MilliValue() == wantAllocatable.MilliValue() &&
				cpuAllocated.MilliValue() == int64(pods)*podCPUMilli && memAllocated.Value() == int64(pods)*podMemory {
				return nil
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	return fmt.Errorf("rb-agent did not advertise %d nodes and %d pods within 5m:\n%s", nodes, pods, p.tail())
}

// measure starts a process, waits for it to sync, and measures it.
func (fx *footprintFixture) measure(b *testing.B, name string, start func(*testing.B) *process, synced func(*process, time.Time) error, profile bool) footprint {
	b.Helper()
	cfg := fx.cfg
	var f footprint
	began := time.Now()
	p := start(b)
	defer p.stop()
	if err := synced(p, began); err != nil {
		b.Fatalf("%s: %v", name, err)
	}
	f.sync = time.Since(began)
	pid := p.cmd.Process.Pid
	s0 := readProcStat(b, pid)
	f.startupCPUSec = s0.cpuSeconds()

	time.Sleep(cfg.settle)
	s1 := readProcStat(b, pid)
	time.Sleep(cfg.window)
	s2 := readProcStat(b, pid)
	f.idleCPU = 100 * (s2.cpuSeconds() - s1.cpuSeconds()) / s2.at.Sub(s1.at).Seconds()
	f.rssMiB = s2.rssMiB()
	f.anonMiB, f.fileMiB = float64(s2.anon)/1024, float64(s2.file)/1024
	if profile && cfg.profileDir != "" {
		fx.saveProfile(b, p, "heap", "/debug/pprof/heap?gc=1")
	}

	f.peakMiB = s2.hwmMiB()
	if len(fx.pods) == 0 { // the empty cluster: nothing to churn
		b.Logf("%s: synced in %s (%.2f CPU-s), RSS %.1f MiB (anon %.1f, file %.1f; peak %.1f), idle %.2f %% of a core",
			name, f.sync.Round(time.Millisecond), f.startupCPUSec, f.rssMiB, f.anonMiB, f.fileMiB, f.peakMiB, f.idleCPU)
		return f
	}

	stopChurn := fx.churn(b, cfg.churnRate)
	time.Sleep(time.Second) // the rate is reached
	c1 := readProcStat(b, pid)
	var cpuProfile sync.WaitGroup
	if profile && cfg.profileDir != "" {
		cpuProfile.Go(func() {
			fx.saveProfile(b, p, "cpu-churn", fmt.Sprintf("/debug/pprof/profile?seconds=%d", max(1, int(cfg.churn.Seconds()))))
		})
	}
	time.Sleep(cfg.churn)
	c2 := readProcStat(b, pid)
	made := stopChurn()
	cpuProfile.Wait()
	f.churnCPU = 100 * (c2.cpuSeconds() - c1.cpuSeconds()) / c2.at.Sub(c1.at).Seconds()
	f.churnRSSMiB = c2.rssMiB()
	f.peakMiB = c2.hwmMiB()
	f.churnRate = float64(made) / (c2.at.Sub(c1.at).Seconds() + time.Second.Seconds())
	if p.exited() {
		b.Fatalf("%s exited during the measurement:\n%s", name, p.tail())
	}
	b.Logf("%s: synced in %s (%.2f CPU-s), RSS %.1f MiB (anon %.1f, file %.1f; peak %.1f), idle %.2f %% of a core, churn %.2f %% at %.0f updates/s, RSS after churn %.1f MiB",
		name, f.sync.Round(time.Millisecond), f.startupCPUSec, f.rssMiB, f.anonMiB, f.fileMiB, f.peakMiB, f.idleCPU, f.churnCPU, f.churnRate, f.churnRSSMiB)
	return f
}

// churn patches an annotation of random pods at rate per second until the
// returned function is called, which returns how many patches were made.
func (fx *footprintFixture) churn(b *testing.B, rate int) func() int {
	ctx := context.Background()
	stop := make(chan struct{})
	work := make(chan types.NamespacedName, rate)
	var made atomic.Int64
	var wg sync.WaitGroup
	for range 16 { // patches in flight: enough for the rate even when the API server is slow
		wg.Go(func() {
			for key := range work {
				patch := fmt.Appendf(nil, `{"metadata":{"annotations":{"bench.fluidos.eu/churn":"%d"}}}`, time.Now().UnixNano())
				if _, err := fx.cs.CoreV1().Pods(key.Namespace).Patch(ctx, key.Name, types.MergePatchType, patch, metav1.PatchOptions{}); err == nil {
					made.Add(1)
				} else {
					b.Logf("churn: %v", err)
				}
			}
		})
	}
	wg.Go(func() {
		defer close(work)
		t := time.NewTicker(time.Second / time.Duration(rate))
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-t.C:
				select {
				case work <- fx.pods[rand.IntN(len(fx.pods))]:
				default: // the API server is behind: skip rather than burst
				}
			}
		}
	})
	return func() int {
		close(stop)
		wg.Wait()
		return int(made.Load())
	}
}

func (fx *footprintFixture) saveProfile(b *testing.B, p *process, name, path string) {
	var addr string
	for _, a := range p.cmd.Args {
		if v, ok := strings.CutPrefix(a, "--pprof-bind-address="); ok {
			addr = v
		}
	}
	if addr == "" {
		return
	}
	resp, err := http.Get("http://" + addr + path)
	if err != nil {
		b.Logf("profile %s: %v", name, err)
		return
	}
	defer resp.Body.Close()
	if err := os.MkdirAll(fx.cfg.profileDir, 0o755); err != nil {
		b.Logf("profile %s: %v", name, err)
		return
	}
	out := filepath.Join(fx.cfg.profileDir, name+".pprof")
	f, err := os.Create(out)
	if err != nil {
		b.Logf("profile %s: %v", name, err)
		return
	}
	defer f.Close()
	if _, err := io.Copy(f, resp.Body); err != nil {
		b.Logf("profile %s: %v", name, err)
		return
	}
	b.Logf("profile %s: %s", name, out)
}

// procStat is one reading of /proc/<pid>.
type procStat struct {
	at           time.Time
	rss, hwm     int64 // KiB
	anon, file   int64 // KiB: RssAnon (heap, stacks) and RssFile (the binary's mapped pages)
	utime, stime int64 // clock ticks
}

// clockTicks is USER_HZ, fixed at 100 by the Linux ABI for /proc/<pid>/stat.
const clockTicks = 100

func (s procStat) cpuSeconds() float64 { return float64(s.utime+s.stime) / clockTicks }
func (s procStat) rssMiB() float64     { return float64(s.rss) / 1024 }
func (s procStat) hwmMiB() float64     { return float64(s.hwm) / 1024 }

func readProcStat(b *testing.B, pid int) procStat {
	b.Helper()
	s := procStat{at: time.Now()}
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		b.Fatalf("reading /proc/%d/status: %v", pid, err)
	}
	for l := range strings.Lines(string(status)) {
		for key, dst := range map[string]*int64{"VmRSS:": &s.rss, "VmHWM:": &s.hwm, "RssAnon:": &s.anon, "RssFile:": &s.file} {
			if v, ok := strings.CutPrefix(l, key); ok {
				*dst, _ = strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			}
		}
	}
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		b.Fatalf("reading /proc/%d/stat: %v", pid, err)
	}
	// pid (comm) state ppid ...: utime and stime are fields 14 and 15,
	// i.e. 12 and 13 after the comm's closing parenthesis.
	rest := strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+1:]))
	if len(rest) < 14 {
		b.Fatalf("/proc/%d/stat: unexpected %q", pid, stat)
	}
	s.utime, _ = strconv.ParseInt(rest[11], 10, 64)
	s.stime, _ = strconv.ParseInt(rest[12], 10, 64)
	return s
}

const informerKubeconfigEnv = "RB_FOOTPRINT_INFORMER_KUBECONFIG"

// TestFootprintInformerProcess is the informer baseline of
// BenchmarkAgentFootprint, run as a subprocess of it (this test binary with
// -test.run selecting this test): a plain client-go shared informer factory
// on Pods and Nodes, full objects, protobuf, a handler that counts pods.
// It prints "synced pods=N nodes=M" once its caches are synced, then runs
// until SIGTERM. Without the environment variable it is skipped.
func TestFootprintInformerProcess(t *testing.T) {
	kc := os.Getenv(informerKubeconfigEnv)
	if kc == "" {
		t.Skip("the informer baseline of BenchmarkAgentFootprint, run by it as a subprocess")
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", kc)
	if err != nil {
		t.Fatal(err)
	}
	cfg.ContentType = runtime.ContentTypeProtobuf
	cfg.AcceptContentTypes = runtime.ContentTypeProtobuf + "," + runtime.ContentTypeJSON
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	var pods atomic.Int64
	factory := informers.NewSharedInformerFactory(cs, 0)
	podInf, nodeInf := factory.Core().V1().Pods().Informer(), factory.Core().V1().Nodes().Informer()
	reg, err := podInf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { pods.Add(1) },
		UpdateFunc: func(any, any) {},
		DeleteFunc: func(any) { pods.Add(-1) },
	})
	if err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	factory.Start(stop)
	if !toolscache.WaitForCacheSync(stop, reg.HasSynced, nodeInf.HasSynced) {
		t.Fatal("caches did not sync")
	}
	fmt.Printf("synced pods=%d nodes=%d \n", pods.Load(), len(nodeInf.GetStore().ListKeys()))
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	<-sig
	close(stop)
	os.Exit(0)
}
