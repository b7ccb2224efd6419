// Command demo runs the resource broker end to end on one machine (make demo):
// Redis (the local redis-server when installed; otherwise, or with
// --embedded-redis, an embedded in-process miniredis, which the output says),
// two rb-broker replicas behind a proxy, three envtest clusters
// (rome, a small requester; paris, a cheaper provider; berlin, a pricier one
// with GPUs), an rb-agent and rb-scheduler per cluster, through
// internal/testbed. Where the machine allows it (root, cgroups, containerd,
// runc and the CNI plugins: realnode.Check) every node is a real kubelet
// with containerd and every cluster runs kube-controller-manager, so the
// borrowed pods are real containers at the provider, and metrics-server runs
// in every cluster (`kubectl top pod` in rome shows the borrowed pods' real
// usage; the demo prints it); elsewhere the nodes are Node objects served by
// a kubelet stand-in, nothing runs and nothing is measured (the demo says
// which at the top). It creates a Deployment in rome that fits nowhere in rome,
// prints a live timeline of what follows (pod created, reservation opened,
// the broker's decision with the candidates' scores, virtual node Ready, pod
// bound, pod Running at the provider), then the commands to look around, and
// waits for Ctrl-C to tear everything down.
//
//	go run ./hack/demo                  # wait for Ctrl-C (or SIGTERM)
//	go run ./hack/demo --exit-after 30s # tear down 30 s after the pods run
//	go run ./hack/demo --no-wait        # tear down as soon as they run
//	go run ./hack/demo --embedded-redis # in-process miniredis even if redis-server is installed
//	go run ./hack/demo --nodes=stand-in # Node objects and a kubelet stand-in even where real nodes can run
package main

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	rbv1 "github.com/fluidos-project/resource-broker/api/v1alpha1"
	"github.com/fluidos-project/resource-broker/broker/dashboard"
	"github.com/fluidos-project/resource-broker/internal/devcerts"
	"github.com/fluidos-project/resource-broker/internal/realnode"
	"github.com/fluidos-project/resource-broker/internal/redistest"
	"github.com/fluidos-project/resource-broker/internal/testbed"
	"github.com/fluidos-project/resource-broker/internal/testenv"
	"github.com/fluidos-project/resource-broker/internal/testimages"
)

const (
	namespace  = "shop"
	deployment = "web"
	replicas   = 3
)

func main() {
	dir := flag.String("dir", ".demo", "folder for kubeconfigs, certificates, Redis data and logs (emptied first)")
	exitAfter := flag.Duration("exit-after", -1, "tear down this long after every pod is Running, instead of waiting for Ctrl-C")
	noWait := flag.Bool("no-wait", false, "tear down as soon as every pod is Running (same as --exit-after 0)")
	timeout := flag.Duration("timeout", 5*time.Minute, "give up when the pods are not all Running within this time")
	embedded := flag.Bool("embedded-redis", false, "use an embedded in-process Redis (miniredis) even when redis-server is installed "+
		"(the default without redis-server)")
	nodes := flag.String("nodes", "auto", "real (kubelets with containerd), stand-in (Node objects, nothing runs), or auto: real where the machine allows it")
	flag.Parse()
	if *noWait {
		*exitAfter = 0
	}
	if *nodes != "auto" && *nodes != "real" && *nodes != "stand-in" {
		fmt.Fprintf(os.Stderr, "demo: --nodes=%q: want auto, real or stand-in\n", *nodes)
		os.Exit(2)
	}
	os.Exit(run(*dir, *exitAfter, *timeout, *embedded || testbed.EmbeddedRedisFromEnv(), *nodes))
}

// realNodes decides, for --nodes, whether the nodes are real, and says why.
func realNodes(mode string) (bool, error) {
	if mode == "stand-in" {
		return false, nil
	}
	err := realnode.Check()
	if err == nil {
		err = testbed.CheckNodeBinaries()
	}
	if err != nil && mode == "real" {
		return false, err
	}
	return err == nil, err
}

var began = time.Now()

func say(format string, args ...any) {
	fmt.Printf("%s  %s\n", bold(fmt.Sprintf("[%6.1fs]", time.Since(began).Seconds())), fmt.Sprintf(format, args...))
}

var tty = isTerminal(os.Stdout)

func bold(s string) string {
	if !tty {
		return s
	}
	return "\033[1m" + s + "\033[0m"
}

// isTerminal tells whether f is a terminal: a character device other than
// /dev/null (enough for the demo's wording and colours).
func isTerminal(f *os.File) bool {
	st, err := f.Stat()
	if err != nil || st.Mode()&os.ModeCharDevice == 0 {
		return false
	}
	null, err := os.Stat(os.DevNull)
	return err != nil || !os.SameFile(st, null)
}

func run(dirFlag string, exitAfter, timeout time.Duration, embedded bool, nodesMode string) int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	root, err := testenv.ModuleRoot()
	if err != nil {
		fmt.Fprintln(os.Stderr, "demo: run it from the resource-broker checkout:", err)
		return 1
	}
	redisBin, err := redistest.Binary()
	switch {
	case embedded:
		say("%s", bold("redis: using an embedded in-process Redis (miniredis), not redis-server, as asked "+
			"(--embedded-redis or "+testbed.RedisEnv+"="+testbed.RedisEmbedded+")"))
	case err != nil:
		embedded = true
		say("%s", bold("redis: redis-server not found; using an embedded in-process Redis (miniredis) — "+
			"install redis-server for the real thing"))
		say("  (Debian/Ubuntu: sudo apt-get install -y redis-server; macOS: brew install redis; or set REDIS_SERVER to its path)")
	}
	if embedded {
		say("  miniredis keeps everything in memory and is a stand-in for tests: good enough to watch the demo, " +
			"proof of nothing (make test uses redis-server)")
		os.Setenv(testbed.RedisEnv, testbed.RedisEmbedded)
	} else {
		os.Unsetenv(testbed.RedisEnv)
	}
	assets, err := testenv.AssetsDir()
	if err == nil {
		for _, b := range []string{"kube-apiserver", "etcd", "kubectl"} {
			if _, serr := os.Stat(filepath.Join(assets, b)); serr != nil {
				err = serr
				break
			}
		}
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "demo: the test control plane is missing (%v): run `make envtest-bin` (or `make demo`)\n", err)
		return 1
	}

	real, why := realNodes(nodesMode)
	switch {
	case real:
		say("%s", bold("nodes: REAL — every node is a kubelet with its own containerd (built from go.mod's Kubernetes version), "+
			"every cluster runs kube-controller-manager: the borrowed pods are real containers at the provider"))
	case why != nil && nodesMode == "real":
		fmt.Fprintln(os.Stderr, "demo: --nodes=real:", why)
		return 1
	case why != nil:
		say("%s", bold("nodes: STAND-IN — Node objects and a kubelet stand-in that marks pods Running; NO container runs "+
			"(real nodes need: "+why.Error()+")"))
	default:
		say("%s", bold("nodes: STAND-IN, as asked (--nodes=stand-in) — Node objects and a kubelet stand-in; no container runs"))
	}
	metrics := false
	switch err := testbed.CheckMetricsServer(root); {
	case !real:
		say("metrics-server: none — stand-in nodes run nothing, so there is no usage to measure (kubectl top answers \"Metrics API not available\")")
	case err != nil:
		say("%s", bold("metrics-server: NOT BUILT ("+err.Error()+"): kubectl top and HorizontalPodAutoscalers will not work"))
	default:
		metrics = true
		say("metrics-server: in every cluster (built from the Go module proxy, %s), scraping every node, virtual ones too: kubectl top, HPAs",
			rel(testbed.MetricsServerDir(root)))
	}

	dir, err := filepath.Abs(dirFlag)
	if err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		return 1
	}
	if err := emptyDir(dir); err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		return 1
	}

	binDir, err := testbed.DefaultBinDir(root)
	if err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		return 1
	}
	say("building binaries (%s) into %s…", strings.Join(testbed.Binaries, ", "), binDir)
	d, err := testbed.Build(ctx, root, binDir)
	if err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		return 1
	}
	say("  built in %s", d.Round(time.Millisecond))
	// Built: the bed takes them as they are.
	os.Setenv(testbed.BinDirEnv, binDir)

	say("starting rome, paris, berlin (kube-apiserver + etcd each, from %s)…", rel(assets))
	if embedded {
		say("then Redis: the embedded in-process miniredis (in memory only),")
	} else {
		say("then redis-server: the local %s (append-only, data in %s),", redisBin, rel(filepath.Join(dir, "redis")))
	}
	say("  2 rb-broker replicas behind a proxy, an rb-agent and rb-scheduler per cluster…")
	progressDone := make(chan struct{})
	go progress(dir, embedded, progressDone)
	opts := testbed.Options{Dir: dir, BinDir: binDir}
	if real {
		opts.RealNodes = true
		opts.Clusters = []testbed.ClusterSpec{testbed.RealRome, testbed.RealParis, testbed.RealBerlin}
		opts.MetricsServer = metrics
	}
	bed, err := testbed.New(ctx, opts)
	close(progressDone)
	teardown := func() int {
		say("tearing everything down (schedulers, agents, brokers, Redis, control planes)…")
		if bed == nil {
			return 1
		}
		err := bed.Close()
		if bed.Redis != nil {
			bed.Redis.Close() // the embedded server, which Bed.Close leaves running
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "demo: teardown:", err)
			return 1
		}
		say("stopped; logs stay in %s", rel(bed.LogDir))
		return 0
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		if bed != nil {
			bed.DumpLogs(func(f string, a ...any) { fmt.Fprintf(os.Stderr, f+"\n", a...) }, 20)
		}
		teardown()
		return 1
	}
	say("up in %s: %s", bed.Timings["total"].Round(time.Millisecond), phases(bed.Timings))
	redisName := "redis-server"
	if bed.Redis.Embedded {
		redisName = "embedded Redis (miniredis, in-process)"
	}
	say("%s on %s, brokers at %s (replicas %s)", redisName, bed.Redis.Addr, bed.BrokerURL, brokerAddrs(bed))
	dash, err := startDashboard(bed, filepath.Join(dir, "certs", testbed.Operator))
	if err != nil {
		fmt.Fprintln(os.Stderr, "demo: dashboard:", err)
		teardown()
		return 1
	}
	say("dashboard: %s (the brokers' /dashboard/ with the certificate of operator %q)", bold(dash.url), testbed.Operator)

	kubeconfigs, err := copyKubeconfigs(bed, filepath.Join(dir, "kubeconfigs"))
	if err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		teardown()
		return 1
	}

	code := demo(ctx, bed, timeout, real)
	if code == 0 && metrics {
		showTop(ctx, bed, assets, kubeconfigs["rome"])
	}
	if code == 0 {
		printCommands(bed, kubeconfigs, real, metrics, dash)
	}
	if ctx.Err() == nil {
		switch {
		case exitAfter >= 0:
			if exitAfter > 0 {
				say("--exit-after: tearing down in %s (Ctrl-C to do it now)", exitAfter)
			}
			select {
			case <-ctx.Done():
			case <-time.After(exitAfter):
			}
		case isTerminal(os.Stdin):
			say("running; press Ctrl-C to tear everything down")
			<-ctx.Done()
		default:
			say("running; send SIGINT or SIGTERM (pid %d) to tear everything down", os.Getpid())
			<-ctx.Done()
		}
	}
	if ctx.Err() != nil {
		fmt.Println()
		say("signal received")
	}
	stop() // a second Ctrl-C now kills the demo at once
	if teardown() != 0 {
		return 1
	}
	return code
}

// emptyDir removes dir's contents (a previous run's), keeping dir.
func emptyDir(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	for _, e := range entries {
		if err := os.RemoveAll(filepath.Join(dir, e.Name())); err != nil {
			return err
		}
	}
	return nil
}

// progress reports the parts of the bed as they come up (the bed starts
// them in parallel and says nothing until it is done).
func progress(dir string, embedded bool, done <-chan struct{}) {
	type milestone struct{ path, what string }
	redis := "redis-server started"
	if embedded {
		redis = "embedded Redis (miniredis) started"
	}
	ms := []milestone{
		{filepath.Join(dir, "logs", "redis.log"), redis},
		{filepath.Join(dir, "logs", "rb-broker-0.log"), "rb-broker replicas starting"},
	}
	for _, c := range []string{"rome", "paris", "berlin"} {
		ms = append(ms, milestone{filepath.Join(dir, "clusters", c, "kubeconfig"), c + " control plane up"})
	}
	for _, c := range []string{"rome", "paris", "berlin"} {
		ms = append(ms, milestone{filepath.Join(dir, "logs", "agent-"+c+".log"), "rb-agent and rb-scheduler of " + c + " starting"})
	}
	seen := map[string]bool{}
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-done:
			return
		case <-tick.C:
		}
		for _, m := range ms {
			if seen[m.path] {
				continue
			}
			if _, err := os.Stat(m.path); err == nil {
				seen[m.path] = true
				say("  %s", m.what)
			}
		}
	}
}

func phases(t map[string]time.Duration) string {
	var keys []string
	for k := range t {
		if k != "total" {
			keys = append(keys, k)
		}
	}
	sort.Slice(keys, func(i, j int) bool { return t[keys[i]] > t[keys[j]] })
	var parts []string
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%s %s", k, t[k].Round(10*time.Millisecond)))
	}
	if len(parts) > 6 {
		parts = append(parts[:6], "…")
	}
	return strings.Join(parts, ", ")
}

func brokerAddrs(bed *testbed.Bed) string {
	var a []string
	for _, b := range bed.Brokers {
		a = append(a, b.Addr)
	}
	return strings.Join(a, ", ")
}

// copyKubeconfigs writes <cluster>.kubeconfig for each cluster into dir.
func copyKubeconfigs(bed *testbed.Bed, dir string) (map[string]string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	out := map[string]string{}
	for _, c := range bed.Clusters {
		data, err := os.ReadFile(c.Kubeconfig)
		if err != nil {
			return nil, err
		}
		p := filepath.Join(dir, c.Name+".kubeconfig")
		if err := os.WriteFile(p, data, 0o600); err != nil {
			return nil, err
		}
		out[c.Name] = p
	}
	return out, nil
}

// rel shortens p to a path relative to the working directory when under it.
func rel(p string) string {
	wd, err := os.Getwd()
	if err != nil {
		return p
	}
	r, err := filepath.Rel(wd, p)
	if err != nil || strings.HasPrefix(r, "..") {
		return p
	}
	return r
}

// demo creates the workload in rome and prints the timeline until every pod
// runs (0), the timeout (1) or a signal (0: tear down quietly).
func demo(ctx context.Context, bed *testbed.Bed, timeout time.Duration, real bool) int {
	rome := bed.Cluster("rome")
	wc, err := client.NewWithWatch(rome.Config, client.Options{Scheme: testbed.Scheme})
	if err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		return 1
	}
	if err := wc.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace}}); err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		return 1
	}
	tl := newTimeline(bed)
	wctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	watches := []struct {
		list client.ObjectList
		opts []client.ListOption
	}{
		{&corev1.PodList{}, []client.ListOption{client.InNamespace(namespace)}},
		{&rbv1.ReservationList{}, []client.ListOption{client.InNamespace(namespace)}},
		{&corev1.NodeList{}, nil},
	}
	events := make(chan watch.Event, 256)
	var wg sync.WaitGroup
	for _, w := range watches {
		wi, err := wc.Watch(wctx, w.list, w.opts...)
		if err != nil {
			fmt.Fprintln(os.Stderr, "demo: watch:", err)
			return 1
		}
		defer wi.Stop()
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ev := range wi.ResultChan() {
				select {
				case events <- ev:
				case <-wctx.Done():
					return
				}
			}
		}()
	}

	dep, story := workload(real)
	fmt.Println()
	say("%s", bold(story))
	if err := wc.Create(ctx, dep); err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		return 1
	}
	for {
		select {
		case <-wctx.Done():
			if ctx.Err() != nil {
				return 0
			}
			say("not every pod Running within %s; logs are in %s", timeout, rel(bed.LogDir))
			return 1
		case ev := <-events:
			if ev.Type == watch.Error {
				continue
			}
			tl.handle(wctx, ev)
			if tl.allRunning() {
				fmt.Println()
				say("%s", bold(fmt.Sprintf("all %d pods Running: %s", replicas, tl.summary())))
				if real {
					askTheContainer(ctx, bed)
				}
				return 0
			}
		}
	}
}

// workload is the Deployment the demo creates in rome, and how to say it.
// On real nodes its pods run the test application (an HTTP server that says
// where it runs); on stand-in nodes nothing runs, so an image name is all.
func workload(real bool) (*appsv1.Deployment, string) {
	labels := map[string]string{"app": deployment}
	cpu, mem := "3", "2Gi"
	ctr := corev1.Container{Name: "main", Image: testimages.Pause, ImagePullPolicy: corev1.PullIfNotPresent}
	story := fmt.Sprintf("rome: Deployment %s/%s, %d replicas of 3 CPU / 2Gi, schedulerName resource-broker "+
		"(rome has one 2-CPU node: nothing fits there)", namespace, deployment, replicas)
	if real {
		cpu, mem = "1500m", "256Mi"
		ctr = corev1.Container{Name: "app", Image: testimages.TestApp, ImagePullPolicy: corev1.PullIfNotPresent,
			Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: 8080}},
			Env: []corev1.EnvVar{
				{Name: "POD_NAME", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.name"}}},
				{Name: "NODE_NAME", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "spec.nodeName"}}},
				{Name: "HOST_IP", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "status.hostIP"}}},
			}}
		story = fmt.Sprintf("rome: Deployment %s/%s, %d replicas of the test app (HTTP on 8080), 1.5 CPU / 256Mi each, "+
			"schedulerName resource-broker (rome has one 1-CPU node: nothing fits there)", namespace, deployment, replicas)
	}
	res := corev1.ResourceList{corev1.ResourceCPU: resource.MustParse(cpu), corev1.ResourceMemory: resource.MustParse(mem)}
	ctr.Resources = corev1.ResourceRequirements{Requests: res, Limits: res}
	return &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: deployment},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To[int32](replicas),
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec:       corev1.PodSpec{SchedulerName: "resource-broker", Containers: []corev1.Container{ctr}},
			},
		},
	}, story
}

// askTheContainer asks each pod's container, at the pod IP rome shows,
// where it runs, and prints the answers with the provider node they name.
func askTheContainer(ctx context.Context, bed *testbed.Bed) {
	var pods corev1.PodList
	if err := bed.Cluster("rome").Client.List(ctx, &pods, client.InNamespace(namespace)); err != nil {
		say("listing the pods: %v", err)
		return
	}
	nodeOf := map[string]string{} // node IP -> "<cluster>/<node>"
	for _, c := range bed.Clusters {
		for _, n := range c.RealNodes() {
			nodeOf[n.IP] = c.Name + "/" + n.Name
		}
	}
	cl := &http.Client{Timeout: 3 * time.Second}
	for _, p := range pods.Items {
		resp, err := cl.Get("http://" + p.Status.PodIP + ":8080/")
		if err != nil {
			say("  %s at %s: %v", p.Name, p.Status.PodIP, err)
			continue
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		var a map[string]string
		_ = json.Unmarshal(body, &a)
		say("  GET http://%s:8080/ (%s, on %s in rome) -> container on %s: %s", p.Status.PodIP, p.Name, p.Spec.NodeName,
			bold(nodeOf[a["hostIP"]]), strings.TrimSpace(string(body)))
	}
}

// showTop prints what `kubectl top pod` says in rome about the borrowed pods,
// one of which burns a quarter of a CPU at the provider meanwhile. The
// numbers come from the provider's kubelet through its metrics-server, rome's
// virtual node and rome's metrics-server, each at a 15 s resolution: they
// show up within a minute or so.
func showTop(ctx context.Context, bed *testbed.Bed, assets, kubeconfig string) {
	var pods corev1.PodList
	if err := bed.Cluster("rome").Client.List(ctx, &pods, client.InNamespace(namespace)); err != nil || len(pods.Items) == 0 {
		say("kubectl top: no pod to show (%v)", err)
		return
	}
	burner := pods.Items[0]
	resp, err := (&http.Client{Timeout: 3 * time.Second}).Post("http://"+burner.Status.PodIP+":8080/burn?cpu=0.25&seconds=120", "", nil)
	if err == nil {
		resp.Body.Close()
	}
	fmt.Println()
	say("%s", bold(fmt.Sprintf("kubectl top pod -n %s in rome (%s burns 0.25 CPU at the provider for 2 min; metrics take up to a minute to come through %s)…",
		namespace, burner.Name, burner.Spec.NodeName)))
	args := []string{"--kubeconfig", kubeconfig, "top", "pod", "-n", namespace}
	deadline := time.Now().Add(2 * time.Minute)
	for {
		out, err := exec.CommandContext(ctx, filepath.Join(assets, "kubectl"), args...).CombinedOutput()
		if err == nil && topShows(string(out), pods.Items, burner.Name) || time.Now().After(deadline) {
			for _, l := range strings.Split(strings.TrimRight(string(out), "\n"), "\n") {
				say("  %s", l)
			}
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(3 * time.Second):
		}
	}
}

// topShows tells whether kubectl top's output lists every pod, burner
// using 100m or more.
func topShows(out string, pods []corev1.Pod, burner string) bool {
	cpu := map[string]string{}
	for _, l := range strings.Split(out, "\n") {
		if f := strings.Fields(l); len(f) >= 2 {
			cpu[f[0]] = f[1]
		}
	}
	for _, p := range pods {
		if _, ok := cpu[p.Name]; !ok {
			return false
		}
	}
	q, err := resource.ParseQuantity(cpu[burner])
	return err == nil && q.MilliValue() >= 100
}

// timeline prints each pod's steps once, with the time since the pod was created.
type timeline struct {
	bed        *testbed.Bed
	podSeen    map[string]time.Time
	podOf      map[string]string // reservation -> pod
	done       map[string]bool   // "<kind>/<name>/<step>" printed
	running    map[string]string // pod -> provider
	firstPod   time.Time
	nodeNeeded map[string]bool
}

func newTimeline(bed *testbed.Bed) *timeline {
	return &timeline{bed: bed, podSeen: map[string]time.Time{}, podOf: map[string]string{},
		done: map[string]bool{}, running: map[string]string{}, nodeNeeded: map[string]bool{}}
}

func (tl *timeline) once(key string) bool {
	if tl.done[key] {
		return false
	}
	tl.done[key] = true
	return true
}

func (tl *timeline) since(pod string) string {
	t, ok := tl.podSeen[pod]
	if !ok {
		return ""
	}
	return fmt.Sprintf("+%dms", time.Since(t).Milliseconds())
}

func (tl *timeline) line(pod, format string, args ...any) {
	say("%-9s %-24s %s", tl.since(pod), pod, fmt.Sprintf(format, args...))
}

func (tl *timeline) handle(ctx context.Context, ev watch.Event) {
	switch o := ev.Object.(type) {
	case *corev1.Pod:
		if ev.Type == watch.Deleted {
			return
		}
		if _, ok := tl.podSeen[o.Name]; !ok {
			tl.podSeen[o.Name] = time.Now()
			if tl.firstPod.IsZero() {
				tl.firstPod = time.Now()
			}
			tl.line(o.Name, "pod created in rome (scheduler %s)", o.Spec.SchedulerName)
		}
		if o.Spec.NodeName != "" && tl.once("pod/"+o.Name+"/bound") {
			tl.line(o.Name, "pod bound to node %s", o.Spec.NodeName)
		}
		if o.Status.Phase == corev1.PodRunning && tl.once("pod/"+o.Name+"/running") {
			provider := strings.TrimPrefix(o.Spec.NodeName, "rb-")
			tl.running[o.Name] = provider
			tl.line(o.Name, "%s", bold(fmt.Sprintf("pod Running on %s (node %s)", provider, o.Spec.NodeName)))
		}
	case *rbv1.Reservation:
		if ev.Type == watch.Deleted {
			return
		}
		pod := o.Spec.PodName
		tl.podOf[o.Name] = pod
		if tl.once("rsv/" + o.Name + "/opened") {
			tl.line(pod, "Reservation %s opened (cpu %s, memory %s)", o.Name,
				o.Spec.Resources.Cpu().String(), o.Spec.Resources.Memory().String())
		}
		if o.Status.Provider != "" && tl.once("rsv/"+o.Name+"/decided") {
			tl.nodeNeeded["rb-"+o.Status.Provider] = true
			tl.line(pod, "%s%s", bold(fmt.Sprintf("broker decided: %s, score %s", o.Status.Provider, o.Status.Score)),
				tl.candidates(ctx, o))
		}
		if o.Status.Phase == rbv1.ReservationActive && tl.once("rsv/"+o.Name+"/active") {
			vn := ""
			if o.Status.VirtualNode != "" {
				vn = ", virtual node " + o.Status.VirtualNode
			}
			tl.line(pod, "Reservation Active (%s granted it%s)", o.Status.Provider, vn)
		}
		if o.Status.Phase != "" && o.Status.Phase != rbv1.ReservationPending && !live(o.Status.Phase) &&
			tl.once("rsv/"+o.Name+"/phase/"+string(o.Status.Phase)) {
			tl.line(pod, "Reservation %s: %s %s", o.Status.Phase, o.Status.Reason, o.Status.Message)
		}
	case *corev1.Node:
		if !strings.HasPrefix(o.Name, "rb-") || ev.Type == watch.Deleted {
			return
		}
		if nodeReady(o) && tl.once("node/"+o.Name+"/ready") {
			since := ""
			if !tl.firstPod.IsZero() {
				since = fmt.Sprintf("+%dms", time.Since(tl.firstPod).Milliseconds())
			}
			say("%-9s %-24s virtual node %s Ready in rome (%s CPU, %s memory allocatable)", since, "",
				o.Name, o.Status.Allocatable.Cpu().String(), o.Status.Allocatable.Memory().String())
		}
	}
}

// candidates reads the decision's candidates from the broker's Redis (the
// Reservation's status carries the chosen provider's score only).
func (tl *timeline) candidates(ctx context.Context, r *rbv1.Reservation) string {
	id := r.Status.ReservationID
	if id == "" {
		id = string(r.UID)
	}
	rr, err := tl.bed.Store.Reservation(ctx, "rome", id) // rome is the demo's requester
	if err != nil || len(rr.Candidates) == 0 {
		return ""
	}
	var parts []string
	for _, c := range rr.Candidates {
		parts = append(parts, fmt.Sprintf("%s %s (resources %s, cost %s, %s/h)", c.Cluster, num(c.Score),
			num(c.ResourceScore), num(c.CostScore), tl.money(ctx, c.Cluster, c.Price)))
	}
	return "; candidates: " + strings.Join(parts, ", ")
}

func num(f float64) string { return strconv.FormatFloat(f, 'f', -1, 64) }

// money formats micro-units of cluster's currency.
func (tl *timeline) money(ctx context.Context, cluster string, micro int64) string {
	s := strconv.FormatFloat(float64(micro)/1e6, 'f', 3, 64)
	if c, err := tl.bed.Store.Cluster(ctx, cluster); err == nil && c.Prices.Currency != "" {
		s += " " + c.Prices.Currency
	}
	return s
}

func live(p rbv1.ReservationPhase) bool {
	return p == rbv1.ReservationReserved || p == rbv1.ReservationActive
}

func nodeReady(n *corev1.Node) bool {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

func (tl *timeline) allRunning() bool { return len(tl.running) == replicas }

func (tl *timeline) summary() string {
	count := map[string]int{}
	for _, p := range tl.running {
		count[p]++
	}
	var parts []string
	for p, n := range count {
		parts = append(parts, fmt.Sprintf("%d on %s", n, p))
	}
	sort.Strings(parts)
	return strings.Join(parts, ", ") + fmt.Sprintf(" (%s after the first pod was created)",
		time.Since(tl.firstPod).Round(time.Millisecond))
}

func printCommands(bed *testbed.Bed, kubeconfigs map[string]string, real, metrics bool, dash dashboardProxy) {
	w := os.Stdout
	kubectl := rel(filepath.Join(mustRoot(), "bin", "k8s", "kubectl"))
	k := func(c string) string { return kubectl + " --kubeconfig " + rel(kubeconfigs[c]) }
	fmt.Fprintln(w)
	fmt.Fprintln(w, bold("Look around while it runs:"))
	fmt.Fprintf(w, "  dashboard: %s   # live; rb-dashboard does the same: %s --broker-url %s --cert-dir %s\n",
		dash.url, rel(filepath.Join(mustRoot(), "bin", "rb-dashboard")), bed.BrokerURL, rel(dash.certDir))
	fmt.Fprintln(w, "  kubeconfigs:", rel(filepath.Dir(kubeconfigs["rome"]))+"/{rome,paris,berlin}.kubeconfig")
	fmt.Fprintf(w, "  %s get pods -n %s -o wide\n", k("rome"), namespace)
	fmt.Fprintf(w, "  %s get nodes\n", k("rome"))
	fmt.Fprintf(w, "  %s get reservations -A\n", k("rome"))
	fmt.Fprintf(w, "  %s get pods -n rb-rome -o wide      # the copies at the provider\n", k("paris"))
	fmt.Fprintf(w, "  %s get pods -n rb-rome -o wide\n", k("berlin"))
	if real {
		var pods corev1.PodList
		if err := bed.Cluster("rome").Client.List(context.Background(), &pods, client.InNamespace(namespace)); err == nil && len(pods.Items) > 0 {
			p := pods.Items[0]
			fmt.Fprintf(w, "  %s exec -n %s %s -- /testapp get http://127.0.0.1:8080/   # runs in the container at the provider\n", k("rome"), namespace, p.Name)
			fmt.Fprintf(w, "  %s logs -n %s %s\n", k("rome"), namespace, p.Name)
			fmt.Fprintf(w, "  curl http://%s:8080/                # the pod IP rome shows is the container's at the provider\n", p.Status.PodIP)
			if metrics {
				fmt.Fprintf(w, "  %s top pod -n %s                      # the borrowed pods' real usage at the provider\n", k("rome"), namespace)
				fmt.Fprintf(w, "  %s top node                           # %s: what rome's pods use there, not the provider's total\n", k("rome"), p.Spec.NodeName)
				fmt.Fprintf(w, "  %s get --raw /api/v1/nodes/%s/proxy/stats/summary\n", k("rome"), p.Spec.NodeName)
			}
		}
	}
	switch {
	case !real:
		fmt.Fprintln(w, "  # kubectl top: no metrics-server with stand-in nodes (they run nothing to measure)")
	case !metrics:
		fmt.Fprintln(w, "  # kubectl top: metrics-server is not built (make metrics-server-bin)")
	}
	_, port, _ := strings.Cut(bed.Redis.Addr, ":")
	cli := "redis-cli -p " + port
	var cliNotes []string
	if !bed.Redis.Embedded {
		// The default user is off (manifests/redis/users.acl): log in as the
		// bed's administrator, whose password is this bed's own.
		cli = fmt.Sprintf("REDISCLI_AUTH=%s redis-cli --user %s -p %s", bed.Redis.Users.AdminPassword, redistest.AdminUser, port)
		cliNotes = append(cliNotes, "Redis runs the ACL of manifests/redis; the brokers log in as rb-broker, you as the bed's administrator")
	}
	if _, err := exec.LookPath("redis-cli"); err != nil {
		cliNotes = append(cliNotes, "redis-cli is not on PATH (Debian/Ubuntu: apt-get install -y redis-tools)")
	}
	if bed.Redis.Embedded {
		// redis-cli 7 asks for COMMAND DOCS before a prompt or a stdin
		// script, and aborts on miniredis' answer; one command per call works.
		cliNotes = append(cliNotes, "the embedded miniredis answers redis-cli one command per call, as below "+
			"(an interactive redis-cli aborts on it)")
	}
	prefix := bed.Store.Key()
	var rsv string
	if ids, err := bed.RDB.Keys(context.Background(), prefix+"resv:*").Result(); err == nil && len(ids) > 0 {
		sort.Strings(ids)
		rsv = ids[0]
	}
	if rsv == "" {
		rsv = prefix + "resv:<id>"
	}
	for _, n := range cliNotes {
		fmt.Fprintf(w, "  # %s\n", n)
	}
	fmt.Fprintf(w, "  %s --scan --pattern 'rb:*'\n", cli)
	fmt.Fprintf(w, "  %s HGETALL '%scluster:paris'\n", cli, prefix)
	fmt.Fprintf(w, "  %s HGETALL '%s'\n", cli, rsv)
	fmt.Fprintf(w, "  %s XREVRANGE '%saudit' + - COUNT 3\n", cli, prefix)
	rbctl := rel(filepath.Join(mustRoot(), "bin", "rbctl"))
	rc := fmt.Sprintf("%s --broker-url %s --cert-dir %s", rbctl, bed.BrokerURL, rel(bed.Cluster("rome").CertDir))
	fmt.Fprintf(w, "  %s clusters\n", rc)
	fmt.Fprintf(w, "  %s reservations\n", rc)
	// Keys name <requester>/<id>; rome, the requester, addresses its ids bare.
	id := strings.TrimPrefix(rsv, prefix+"resv:")
	if _, bare, ok := strings.Cut(id, "/"); ok {
		id = bare
	}
	fmt.Fprintf(w, "  %s explain %s\n", rc, id)
	fmt.Fprintln(w, "  logs:", rel(bed.LogDir)+"/")
	fmt.Fprintln(w)
}

func mustRoot() string {
	r, err := testenv.ModuleRoot()
	if err != nil {
		return "."
	}
	return r
}

// dashboardProxy is where the demo serves the brokers' dashboard.
type dashboardProxy struct{ url, certDir string }

// startDashboard serves the brokers' web dashboard on loopback, as
// rb-dashboard does: a proxy that presents the operator's certificate
// (written to certDir for rb-dashboard) to the brokers. Port 8080 when it is
// free. It lives as long as the demo.
func startDashboard(bed *testbed.Bed, certDir string) (dashboardProxy, error) {
	pair, err := bed.CA.IssueClient(testbed.Operator)
	if err != nil {
		return dashboardProxy{}, err
	}
	if err := devcerts.WriteTLSDir(certDir, pair, bed.CA.CertPEM); err != nil {
		return dashboardProxy{}, err
	}
	cert, err := pair.TLSCertificate()
	if err != nil {
		return dashboardProxy{}, err
	}
	u, err := url.Parse(bed.BrokerURL)
	if err != nil {
		return dashboardProxy{}, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:8080")
	if err != nil {
		if ln, err = net.Listen("tcp", "127.0.0.1:0"); err != nil {
			return dashboardProxy{}, err
		}
	}
	h := dashboard.NewProxy(u, &tls.Config{MinVersion: tls.VersionTLS12, RootCAs: bed.CA.Pool(), Certificates: []tls.Certificate{cert}})
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	return dashboardProxy{url: "http://" + ln.Addr().String() + dashboard.Path, certDir: certDir}, nil
}
