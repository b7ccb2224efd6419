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
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/fluidos-project/resource-broker/internal/realnode"
	"github.com/fluidos-project/resource-broker/internal/redistest"
	"github.com/fluidos-project/resource-broker/internal/testbed"
	"github.com/fluidos-project/resource-broker/internal/testenv"
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
	if err == nil {
		var root string
		if root, err = testenv.ModuleRoot(); err == nil {
			err = testbed.CheckCoreDNS(root) // the clusters' DNS
		}
	}
	if err != nil && mode == "real" {
		return false, err
	}
	return err == nil, err
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
		// rome's borrowed pods keep rome's DNS and Services (the bed's host
		// routes every cluster's service CIDR).
		opts.AgentArgs = func(cluster string) []string {
			if cluster == "rome" {
				return []string{"--borrowed-pod-network=home"}
			}
			return nil
		}
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

func mustRoot() string {
	r, err := testenv.ModuleRoot()
	if err != nil {
		return "."
	}
	return r
}
