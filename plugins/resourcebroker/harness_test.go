package resourcebroker_test

// One test control plane (kube-apiserver + etcd from bin/k8s, the
// Reservation CRD from manifests/crds) and one real scheduler per package:
// kube-scheduler's own app.Setup/app.Run, in-process, with the ResourceBroker
// plugin registered and a KubeSchedulerConfiguration holding two profiles,
// "resource-broker" (the plugin) and "default-scheduler" (the defaults), as
// rb-scheduler runs them. Node objects stand in for kubelets; the tests play
// the agent by writing Reservation statuses and creating virtual nodes.

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/rand"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"k8s.io/component-base/metrics/legacyregistry"
	"k8s.io/klog/v2"
	fwk "k8s.io/kube-scheduler/framework"
	"k8s.io/kubernetes/cmd/kube-scheduler/app"
	"k8s.io/kubernetes/cmd/kube-scheduler/app/options"
	"sigs.k8s.io/controller-runtime/pkg/client"

	brokerv1alpha1 "github.com/fluidos-project/resource-broker/api/v1alpha1"
	"github.com/fluidos-project/resource-broker/internal/testenv"
	"github.com/fluidos-project/resource-broker/plugins/resourcebroker"
)

const (
	rbProfile      = "resource-broker"
	defaultProfile = "default-scheduler"
	// restrictedProfile is rbProfile offloading the pods of allowedNamespace only.
	restrictedProfile = "resource-broker-restricted"
	allowedNamespace  = "rb-allowed"
	// maxOutstanding is maxOutstandingReservationsPerNamespace in the test configuration.
	maxOutstanding = 2
	optOutLabel    = "broker.fluidos.eu/offload"
)

var (
	restCfg *rest.Config
	cs      kubernetes.Interface
	cl      client.Client
	scheme  = runtime.NewScheme()
)

// schedulerConfig is the configuration of the in-process scheduler: the
// profile of manifests/scheduler, the same restricted to one namespace
// (args namespaces), the default profile, and BenchGate (a test-only
// PreEnqueue plugin that holds benchmark pods until a run starts) in the
// first and the last.
const schedulerConfig = `apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
leaderElection:
  leaderElect: false
clientConnection:
  kubeconfig: %q
  qps: 5000
  burst: 5000
profiles:
- schedulerName: resource-broker
  plugins:
    multiPoint:
      enabled:
      - name: ResourceBroker
      - name: BenchGate
    filter:
      disabled:
      - name: TaintToleration
  pluginConfig:
  - name: ResourceBroker
    args:
      selector:
        matchExpressions:
        - key: broker.fluidos.eu/offload
          operator: NotIn
          values: ["false"]
      reservationDuration: 30m
      maxOutstandingReservationsPerNamespace: %d
      excludedNamespaces: [kube-system, rb-excluded]
- schedulerName: resource-broker-restricted
  plugins:
    multiPoint:
      enabled:
      - name: ResourceBroker
    filter:
      disabled:
      - name: TaintToleration
  pluginConfig:
  - name: ResourceBroker
    args:
      namespaces: [rb-allowed]
- schedulerName: default-scheduler
  plugins:
    multiPoint:
      enabled:
      - name: BenchGate
`

func TestMain(m *testing.M) {
	flag.Parse()
	os.Exit(run(m))
}

func run(m *testing.M) int {
	// kube-scheduler logs every start-up detail at level 0; keep the test
	// output readable unless RB_SCHEDULER_LOG=<verbosity> asks for the log.
	if v := os.Getenv("RB_SCHEDULER_LOG"); v == "" {
		klog.LogToStderr(false)
		klog.SetOutput(io.Discard)
	} else {
		var fs flag.FlagSet
		klog.InitFlags(&fs)
		_ = fs.Set("v", v)
	}
	utilruntimeScheme()
	root, err := testenv.ModuleRoot()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	env, err := testenv.New(testenv.WithCRDDirectories(filepath.Join(root, "manifests", "crds")))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	began := time.Now()
	restCfg, err = env.Start()
	if err != nil {
		_ = env.Stop()
		fmt.Fprintln(os.Stderr, "starting the control plane:", err)
		return 1
	}
	defer func() { _ = env.Stop() }()
	fmt.Printf("testenv: control plane up in %s\n", time.Since(began).Round(time.Millisecond))
	restCfg.QPS, restCfg.Burst = -1, 0 // no client-side throttling in tests

	if cs, err = kubernetes.NewForConfig(restCfg); err == nil {
		cl, err = client.New(restCfg, client.Options{Scheme: scheme})
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}

	dir, err := os.MkdirTemp("", "rb-scheduler-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	configFile, err := writeConfig(dir, restCfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}

	ctx, cancel := context.WithCancel(context.Background())
	errCh, err := startScheduler(ctx, configFile)
	if err != nil {
		cancel()
		fmt.Fprintln(os.Stderr, "starting the scheduler:", err)
		return 1
	}
	code := m.Run()
	cancel()
	select {
	case err := <-errCh:
		// app.Run ends with "finished without leader elect" when its context ends.
		if err != nil && !strings.Contains(err.Error(), "finished without leader elect") {
			fmt.Fprintln(os.Stderr, "scheduler:", err)
		}
	case <-time.After(30 * time.Second):
		fmt.Fprintln(os.Stderr, "the scheduler did not stop within 30s")
	}
	return code
}

func utilruntimeScheme() {
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		panic(err)
	}
	if err := brokerv1alpha1.AddToScheme(scheme); err != nil {
		panic(err)
	}
}

// writeConfig writes a kubeconfig for cfg and the scheduler configuration
// naming it; it returns the configuration's path.
func writeConfig(dir string, cfg *rest.Config) (string, error) {
	kc := clientcmdapi.NewConfig()
	kc.Clusters["envtest"] = &clientcmdapi.Cluster{Server: cfg.Host, CertificateAuthorityData: cfg.CAData}
	kc.AuthInfos["admin"] = &clientcmdapi.AuthInfo{ClientCertificateData: cfg.CertData, ClientKeyData: cfg.KeyData, Token: cfg.BearerToken}
	kc.Contexts["envtest"] = &clientcmdapi.Context{Cluster: "envtest", AuthInfo: "admin"}
	kc.CurrentContext = "envtest"
	kubeconfig := filepath.Join(dir, "kubeconfig")
	if err := clientcmd.WriteToFile(*kc, kubeconfig); err != nil {
		return "", err
	}
	path := filepath.Join(dir, "scheduler-config.yaml")
	return path, os.WriteFile(path, []byte(fmt.Sprintf(schedulerConfig, kubeconfig, maxOutstanding)), 0o600)
}

// startScheduler runs kube-scheduler in-process until ctx ends.
func startScheduler(ctx context.Context, configFile string) (<-chan error, error) {
	opts := options.NewOptions()
	opts.ConfigFile = configFile
	opts.SecureServing.BindPort = 0 // no health/metrics server in tests
	if err := opts.ComponentGlobalsRegistry.Set(); err != nil {
		return nil, err
	}
	cc, sched, err := app.Setup(ctx, opts,
		app.WithPlugin(resourcebroker.Name, newPlugin),
		app.WithPlugin(gateName, newGate))
	if err != nil {
		return nil, err
	}
	errCh := make(chan error, 1)
	go func() { errCh <- app.Run(ctx, cc, sched) }()
	return errCh, nil
}

// plugins are the ResourceBroker plugins the scheduler built (one per
// profile that enables it).
var plugins struct {
	sync.Mutex
	all []fwk.Plugin
}

// newPlugin is resourcebroker.New, remembering the plugin.
func newPlugin(ctx context.Context, obj runtime.Object, h fwk.Handle) (fwk.Plugin, error) {
	p, err := resourcebroker.New(ctx, obj, h)
	if err == nil {
		plugins.Lock()
		plugins.all = append(plugins.all, p)
		plugins.Unlock()
	}
	return p, err
}

// hintsOnly turns the retries by the plugins' own informers off until the
// test ends: only the scheduler's queueing hints requeue pods.
func hintsOnly(t testing.TB) {
	plugins.Lock()
	defer plugins.Unlock()
	for _, p := range plugins.all {
		prev := resourcebroker.SetHintsOnly(p, true)
		t.Cleanup(func() { resourcebroker.SetHintsOnly(p, prev) })
	}
}

// --- BenchGate: holds pods labelled gateLabel until their run is opened ---

const (
	gateName  = "BenchGate"
	gateLabel = "rb-bench/run"
)

var openRun atomic.Value // string: the run whose pods may be scheduled

type gate struct{}

func newGate(context.Context, runtime.Object, fwk.Handle) (fwk.Plugin, error) { return gate{}, nil }

func (gate) Name() string { return gateName }

func (gate) PreEnqueue(_ context.Context, p *v1.Pod) *fwk.Status {
	if run, ok := p.Labels[gateLabel]; ok && run != openRun.Load() {
		return fwk.NewStatus(fwk.UnschedulableAndUnresolvable, "benchmark run not started")
	}
	return nil
}

func (gate) EventsToRegister(context.Context) ([]fwk.ClusterEventWithHint, error) {
	return []fwk.ClusterEventWithHint{{
		Event: fwk.ClusterEvent{Resource: fwk.Node, ActionType: fwk.UpdateNodeLabel},
		QueueingHintFn: func(_ klog.Logger, p *v1.Pod, _, _ any) (fwk.QueueingHint, error) {
			if p.Labels[gateLabel] == openRun.Load() {
				return fwk.Queue, nil
			}
			return fwk.QueueSkip, nil
		},
	}}, nil
}

// --- cluster helpers ---

type nodeSpec struct {
	name        string
	cpu, memory string
	gpu         string
	pods        string
	labels      map[string]string
	taints      []v1.Taint
}

// setNodes replaces every Node by nodes, each Ready with its allocatable
// and only its own taints (the API server adds not-ready on create).
func setNodes(t testing.TB, nodes ...nodeSpec) {
	t.Helper()
	ctx := context.Background()
	if err := cs.CoreV1().Nodes().DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 30*time.Second, "old nodes deleted", func() (bool, error) {
		l, err := cs.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
		return err == nil && len(l.Items) == 0, err
	})
	for _, n := range nodes {
		createNode(t, n)
	}
}

func createNode(t testing.TB, n nodeSpec) *v1.Node {
	t.Helper()
	ctx := context.Background()
	node, err := cs.CoreV1().Nodes().Create(ctx, &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: n.name, Labels: withHostname(n.labels, n.name)}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	node.Spec.Taints = n.taints
	if node, err = cs.CoreV1().Nodes().Update(ctx, node, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	pods := n.pods
	if pods == "" {
		pods = "110"
	}
	alloc := v1.ResourceList{
		v1.ResourceCPU:    resource.MustParse(n.cpu),
		v1.ResourceMemory: resource.MustParse(n.memory),
		v1.ResourcePods:   resource.MustParse(pods),
	}
	if n.gpu != "" {
		alloc[brokerv1alpha1.ResourceGPU] = resource.MustParse(n.gpu)
	}
	node.Status.Capacity, node.Status.Allocatable = alloc, alloc
	node.Status.Conditions = []v1.NodeCondition{{Type: v1.NodeReady, Status: v1.ConditionTrue, Reason: "KubeletReady",
		LastHeartbeatTime: metav1.Now(), LastTransitionTime: metav1.Now()}}
	if node, err = cs.CoreV1().Nodes().UpdateStatus(ctx, node, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	return node
}

func withHostname(l map[string]string, name string) map[string]string {
	out := map[string]string{"kubernetes.io/hostname": name}
	for k, v := range l {
		out[k] = v
	}
	return out
}

// newNamespace makes a namespace for one test; its pods are removed at the end.
func newNamespace(t testing.TB) string {
	t.Helper()
	name := strings.ToLower(strings.NewReplacer("/", "-", "_", "-").Replace(t.Name()))
	if len(name) > 40 {
		name = name[:40]
	}
	name = strings.Trim(name, "-") + "-" + rand.String(5)
	return createNamespace(t, name)
}

func createNamespace(t testing.TB, name string) string {
	t.Helper()
	ctx := context.Background()
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &v1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	t.Cleanup(func() { deleteAllPods(t, name) })
	return name
}

// deleteAllPods removes the pods of ns at once (no kubelet to wait for);
// their reservations go with them only where a garbage collector runs, so
// those are deleted too.
func deleteAllPods(t testing.TB, ns string) {
	ctx := context.Background()
	zero := int64(0)
	if err := cs.CoreV1().Pods(ns).DeleteCollection(ctx, metav1.DeleteOptions{GracePeriodSeconds: &zero}, metav1.ListOptions{}); err != nil {
		t.Errorf("deleting the pods of %s: %v", ns, err)
	}
	if err := cl.DeleteAllOf(ctx, &brokerv1alpha1.Reservation{}, client.InNamespace(ns)); err != nil {
		t.Errorf("deleting the reservations of %s: %v", ns, err)
	}
	waitFor(t, 60*time.Second, "pods of "+ns+" deleted", func() (bool, error) {
		l, err := cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
		return err == nil && len(l.Items) == 0, err
	})
}

type podOpt func(*v1.Pod)

func newPod(ns, name, cpu, memory string, opts ...podOpt) *v1.Pod {
	p := &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: map[string]string{"app": name}},
		Spec: v1.PodSpec{
			SchedulerName: rbProfile,
			Containers: []v1.Container{{
				Name:  "main",
				Image: "registry.k8s.io/pause:3.10",
				Resources: v1.ResourceRequirements{Requests: v1.ResourceList{
					v1.ResourceCPU:    resource.MustParse(cpu),
					v1.ResourceMemory: resource.MustParse(memory),
				}},
			}},
		},
	}
	for _, o := range opts {
		o(p)
	}
	return p
}

func createPod(t testing.TB, p *v1.Pod) *v1.Pod {
	t.Helper()
	out, err := cs.CoreV1().Pods(p.Namespace).Create(context.Background(), p, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func getPod(t testing.TB, ns, name string) *v1.Pod {
	t.Helper()
	p, err := cs.CoreV1().Pods(ns).Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// waitBound waits until the pod is bound and returns its node.
func waitBound(t testing.TB, ns, name string, timeout time.Duration) string {
	t.Helper()
	var node string
	waitFor(t, timeout, "pod "+ns+"/"+name+" bound", func() (bool, error) {
		p, err := cs.CoreV1().Pods(ns).Get(context.Background(), name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		node = p.Spec.NodeName
		return node != "", nil
	})
	return node
}

// scheduledCondition is the pod's PodScheduled condition (zero when none).
func scheduledCondition(p *v1.Pod) v1.PodCondition {
	for _, c := range p.Status.Conditions {
		if c.Type == v1.PodScheduled {
			return c
		}
	}
	return v1.PodCondition{}
}

func waitCondition(t testing.TB, ns, name, contains string, timeout time.Duration) v1.PodCondition {
	t.Helper()
	var c v1.PodCondition
	waitFor(t, timeout, fmt.Sprintf("pod %s/%s condition mentioning %q", ns, name, contains), func() (bool, error) {
		p, err := cs.CoreV1().Pods(ns).Get(context.Background(), name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		c = scheduledCondition(p)
		return c.Status == v1.ConditionFalse && strings.Contains(c.Message, contains), nil
	})
	return c
}

func reservations(t testing.TB, ns string) []brokerv1alpha1.Reservation {
	t.Helper()
	var l brokerv1alpha1.ReservationList
	if err := cl.List(context.Background(), &l, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	return l.Items
}

// waitReservation waits until ns holds exactly one reservation for pod and returns it.
func waitReservation(t testing.TB, pod *v1.Pod, timeout time.Duration) *brokerv1alpha1.Reservation {
	t.Helper()
	var out *brokerv1alpha1.Reservation
	waitFor(t, timeout, "reservation of "+pod.Name, func() (bool, error) {
		for _, r := range reservations(t, pod.Namespace) {
			if r.Spec.PodName == pod.Name {
				out = r.DeepCopy()
				return true, nil
			}
		}
		return false, nil
	})
	return out
}

// setStatus plays the agent: it writes the reservation's status.
func setStatus(t testing.TB, r *brokerv1alpha1.Reservation, st brokerv1alpha1.ReservationStatus) *brokerv1alpha1.Reservation {
	t.Helper()
	cur := &brokerv1alpha1.Reservation{}
	if err := cl.Get(context.Background(), client.ObjectKeyFromObject(r), cur); err != nil {
		t.Fatal(err)
	}
	cur.Status = st
	if err := cl.Status().Update(context.Background(), cur); err != nil {
		t.Fatal(err)
	}
	return cur
}

func waitFor(t testing.TB, timeout time.Duration, what string, cond func() (bool, error)) {
	t.Helper()
	var last error
	err := wait.PollUntilContextTimeout(context.Background(), 20*time.Millisecond, timeout, true, func(context.Context) (bool, error) {
		ok, err := cond()
		if err != nil {
			last = err
		}
		return ok, nil
	})
	if err != nil {
		t.Fatalf("timed out after %s waiting for %s (last error: %v)", timeout, what, last)
	}
}

// schedulerCounter is the in-process scheduler's counter name{labels...}.
func schedulerCounter(t testing.TB, name string, labels map[string]string) float64 {
	t.Helper()
	return schedulerMetric(t, name, labels, func(m *dto.Metric) float64 { return m.GetCounter().GetValue() })
}

// schedulerGauge is the in-process scheduler's gauge name{labels...}.
func schedulerGauge(t testing.TB, name string, labels map[string]string) float64 {
	t.Helper()
	return schedulerMetric(t, name, labels, func(m *dto.Metric) float64 { return m.GetGauge().GetValue() })
}

// schedulerMetric sums value(m) over the in-process scheduler's series name{labels...}.
func schedulerMetric(t testing.TB, name string, labels map[string]string, value func(*dto.Metric) float64) float64 {
	t.Helper()
	families, err := legacyGather()
	if err != nil {
		t.Fatal(err)
	}
	var sum float64
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			if matchLabels(m, labels) {
				sum += value(m)
			}
		}
	}
	return sum
}

func matchLabels(m *dto.Metric, want map[string]string) bool {
	n := 0
	for _, lp := range m.GetLabel() {
		if v, ok := want[lp.GetName()]; ok {
			if v != lp.GetValue() {
				return false
			}
			n++
		}
	}
	return n == len(want)
}

func legacyGather() ([]*dto.MetricFamily, error) { return legacyregistry.DefaultGatherer.Gather() }
