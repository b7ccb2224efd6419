// Command benchreport runs the repository's benchmarks (go test -bench, one
// subprocess per run, its output streamed to stderr), prints every figure
// with its baseline and ratio, then a summary against the targets of the
// performance work, and writes a report: a plot of decision latency against
// the number of clusters (full scan vs index) and a markdown page with the
// machine, the commands, the summary and the raw benchmark lines.
//
//	go run ./hack/benchreport                          # every suite (the e2e and agent ones take many minutes)
//	go run ./hack/benchreport --only broker            # one suite (names: see the suites table below)
//	go run ./hack/benchreport --only broker --benchtime 200x
//	go run ./hack/benchreport --benchtime broker=2s,http=5s
//	go run ./hack/benchreport --from run.txt           # report on saved go test -bench output, run nothing
//	go run ./hack/benchreport --list                   # the suites and their go test commands
//	go run ./hack/benchreport --out ''                 # print only, write no files
//
// Suites whose benchmark does not exist (yet) in their package, or that skip,
// are reported as "not run" and do not fail the report. A failing benchmark
// (go test exiting non-zero, or a --- FAIL line) makes the exit code 1, after
// the report.
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// suites is what the report runs, in this order. Each run is one
// `go test -run '^$' -bench <Bench> -benchtime <Benchtime> -timeout <Timeout> <Pkg>`.
// The top level of Bench (before the first '/') is also matched against the
// Benchmark functions declared in Pkg's _test.go files: when none matches, the
// suite is "not run". Baselines say, for a figure (benchmark name and unit),
// which other figure it is compared with; the ratio is always value / baseline.
var suites = []Suite{
	{
		Name: "broker", Pkg: "./broker/store/",
		About: "one reservation decision (reserve.lua) by federation size, candidate index vs full scan, the replica's view's candidates vs the index walk; trivial EVALSHA as the floor; per-node fit (10 nodes per cluster) vs no nodes; WAIT for a replica on vs off",
		Runs: []Run{
			// Per-op cost differs by three orders of magnitude between the
			// trivial script and the full scan at 10,000 clusters: one
			// benchtime per group, each a few seconds.
			{Bench: `^BenchmarkReserve$/^baseline-trivial-evalsha$`, Benchtime: "20000x"},
			{Bench: `^BenchmarkReserve$/^clusters=(10|100)$/^method=index$`, Benchtime: "2000x"},
			{Bench: `^BenchmarkReserve$/^clusters=(10|100)$/^method=scan$`, Benchtime: "1000x"},
			{Bench: `^BenchmarkReserve$/^clusters=(1000|10000)$/^method=index$`, Benchtime: "1000x"},
			// The same decisions among the candidates of the replica's view.
			{Bench: `^BenchmarkReserve$/^clusters=(1000|10000)$/^method=hint$`, Benchtime: "1000x"},
			{Bench: `^BenchmarkReserve$/^clusters=1000$/^method=scan$`, Benchtime: "200x"},
			{Bench: `^BenchmarkReserve$/^clusters=10000$/^method=scan$`, Benchtime: "50x"},
			// Per-node fit: the same decision with clusters advertising no
			// nodes (the baseline) and 10 nodes each, in the same run.
			{Bench: `^BenchmarkReserveNodes$/^clusters=100$`, Benchtime: "2000x"},
			{Bench: `^BenchmarkReserveNodes$/^clusters=10000$`, Benchtime: "1000x"},
			// Waiting for a replica (--redis-wait-replicas): the same
			// decision with WAIT on and off, primary and replica, same run.
			{Bench: `^BenchmarkReserveReplicated$`, Benchtime: "2000x"},
		},
		Baselines: []Baseline{
			{Label: "full scan", Match: `/method=index/`, Replace: `/method=scan/`},
			{Label: "index walk", Match: `/method=hint/`, Replace: `/method=index/`},
			{Label: "no nodes", Match: `/nodes=10(-slowpath)?/`, Replace: `/nodes=0/`},
			{Label: "no WAIT", Match: `/wait=on/`, Replace: `/wait=off/`},
			{Label: "trivial EVALSHA", Match: `/clusters=\d+/method=\w+/`, Replace: `/baseline-trivial-evalsha/`,
				Units: map[string]string{"decisions/s": "calls/s", "p50-ms": "p50-ms", "p99-ms": "p99-ms", "redis-us/op": "redis-us/op"}},
		},
	},
	{
		Name: "http", Pkg: "./broker/server/",
		About: "reservations through the real v2 API (HTTPS, mutual TLS) vs the same Store.Reserve in-process; " +
			"8 members listing 60,000 reservations at once (the broker's peak RSS)",
		Runs: []Run{{Bench: `^BenchmarkHTTPReserve$`, Benchtime: "2s"}, {Bench: `^BenchmarkListReservations$`, Benchtime: "1x"},
			{Bench: `^BenchmarkAbuseCombined$`, Benchtime: "3000x", Timeout: "20m"}},
		Baselines: []Baseline{
			{Label: "honest members alone", Match: `^BenchmarkAbuseCombined/abuse$`, Replace: `BenchmarkAbuseCombined/quiet`,
				Units: map[string]string{"p50-ms": "p50-ms", "p99-ms": "p99-ms"}},
			{Label: "in-process Store.Reserve", Match: `^(BenchmarkHTTPReserve/(?:replay-)?)https-mtls(?:-http2)?$`, Replace: `${1}baseline-store-direct`},
			{Label: "HTTP floor (GET /healthz)", Match: `^(BenchmarkHTTPReserve/)(?:replay-)?https-mtls(?:-http2)?$`, Replace: `${1}floor-healthz-mtls`,
				Units: map[string]string{"reservations/s": "requests/s", "p50-ms": "p50-ms", "p99-ms": "p99-ms", "go-cpu-us/op": "go-cpu-us/op"}},
		},
	},
	{
		Name: "events", Pkg: "./broker/server/",
		About: "notification latency: decision returned -> event out of the agents' event stream (SSE, mTLS) vs bare Redis XADD -> XREAD; " +
			"other members' reserve latency while one member holds 1,000 streams vs none open",
		Runs: []Run{{Bench: `^BenchmarkEventLatency$`, Benchtime: "1000x"}, {Bench: `^BenchmarkStreamsReserve$`, Benchtime: "2000x"}},
		Baselines: []Baseline{
			{Label: "Redis XADD -> XREAD", Match: `/sse-mtls(-loaded)?$`, Replace: `/baseline-redis-xadd-xread${1}`,
				Units: map[string]string{"p50-ms": "p50-ms", "p99-ms": "p99-ms", "max-ms": "max-ms"}},
			{Label: "no stream open", Match: `^BenchmarkStreamsReserve$`, Units: map[string]string{
				"p50-ms": "base-p50-ms", "p99-ms": "base-p99-ms", "events-p50-ms": "base-p50-ms", "events-p99-ms": "base-p99-ms"}},
		},
	},
	{
		Name: "scheduler", Pkg: "./plugins/resourcebroker/",
		About: "pods bound per second, resource-broker profile vs the default profile (envtest API server)",
		Runs:  []Run{{Bench: `^BenchmarkSchedulingThroughput`, Benchtime: "8x", Timeout: "20m"}},
		Baselines: []Baseline{
			{Label: "default profile", Match: `^BenchmarkSchedulingThroughput`, Units: map[string]string{"rb-pods/s": "default-pods/s"}},
		},
	},
	{
		Name: "agent", Pkg: "./cmd/rb-agent/",
		About: "rb-agent's memory and CPU on a large cluster vs a plain client-go informer",
		Runs:  []Run{{Bench: `^BenchmarkAgentFootprint$`, Benchtime: "1x", Timeout: "30m"}},
		Baselines: []Baseline{
			{Label: "plain informer", Match: `^BenchmarkAgentFootprint`, Units: map[string]string{
				"agent-MiB": "informer-MiB", "agent-peak-MiB": "informer-peak-MiB",
				"agent-idle-%cpu": "informer-idle-%cpu", "agent-churn-%cpu": "informer-churn-%cpu"}},
			{Label: "rb-agent, empty cluster", Match: `^BenchmarkAgentFootprint`, Units: map[string]string{
				"agent-MiB": "empty-MiB", "agent-idle-%cpu": "empty-idle-%cpu"}},
		},
	},
	{
		Name: "kubelet", Pkg: "./agent/bridge/virtualkubelet/",
		About: "a virtual node's kubelet endpoint with 1,000 borrowed pods: /stats/summary and /metrics/resource answered from the node's cache " +
			"vs listing the provider's PodMetrics at scrape time; one poll of the provider's metrics.k8s.io (CPU, allocations, cache size)",
		Runs: []Run{
			{Bench: `^BenchmarkKubeletMetrics$/^pods=1000$/^poll$`, Benchtime: "100x"},
			{Bench: `^BenchmarkKubeletMetrics$/^pods=1000$/^route=`, Benchtime: "300x"},
		},
		Baselines: []Baseline{
			{Label: "list at scrape", Match: `/source=cache$`, Replace: `/source=list-at-scrape`,
				Units: map[string]string{"p50-ms": "p50-ms", "p99-ms": "p99-ms"}},
		},
	},
	{
		Name: "e2e", Pkg: "./test/integration/",
		About: "pod created -> Running for 100 pods on the whole test bed: remote-paced (created at a steady rate, " +
			"created-pods/s; the target's figure), remote (all 100 at once: the stress figure), local scheduling (all at once)",
		Runs: []Run{{Bench: `^BenchmarkEndToEnd$`, Benchtime: "1x", Timeout: "30m"}},
		Baselines: []Baseline{
			{Label: "local scheduling", Match: `/remote(-paced)?$`, Replace: `/local-baseline`},
		},
	},
}

// targets are the goals of the performance work. Name is a regular
// expression on the benchmark name (without the -GOMAXPROCS suffix); every
// result it matches is one row. Baseline names one of the suite's baselines;
// with OnRatio the limit applies to value / baseline.
var targets = []Target{
	{Suite: "broker", Figure: "decisions/s, 100 clusters, index, 16 in flight",
		Name: `^BenchmarkReserve/clusters=100/method=index/parallel$`, Unit: "decisions/s", Baseline: "full scan", Op: ">=", Limit: 20000},
	{Suite: "broker", Figure: "decisions/s vs trivial EVALSHA, 100 clusters, index, 16 in flight",
		Name: `^BenchmarkReserve/clusters=100/method=index/parallel$`, Unit: "decisions/s", Baseline: "trivial EVALSHA", OnRatio: true, Op: ">=", Limit: 0.3},
	{Suite: "broker", Figure: "decisions/s vs trivial EVALSHA, 100 clusters, index, serial",
		Name: `^BenchmarkReserve/clusters=100/method=index/serial$`, Unit: "decisions/s", Baseline: "trivial EVALSHA", OnRatio: true, Op: ">=", Limit: 0.3},
	{Suite: "broker", Figure: "p99 ms, 10,000 clusters, index, serial",
		Name: `^BenchmarkReserve/clusters=10000/method=index/serial$`, Unit: "p99-ms", Baseline: "full scan", Op: "<", Limit: 5},
	{Suite: "broker", Figure: "p99 ms, 10,000 clusters, index, 16 in flight",
		Name: `^BenchmarkReserve/clusters=10000/method=index/parallel$`, Unit: "p99-ms", Baseline: "full scan", Op: "<", Limit: 5},
	// Per-node fit: at most 1.5x the cost of the cluster-level fit.
	{Suite: "broker", Figure: "per-node fit: p99 ms, 10,000 clusters x 10 nodes vs no nodes, serial",
		Name: `^BenchmarkReserveNodes/clusters=10000/nodes=10/serial$`, Unit: "p99-ms", Baseline: "no nodes", OnRatio: true, Op: "<", Limit: 1.5},
	{Suite: "broker", Figure: "per-node fit: decisions/s, 100 clusters x 10 nodes vs no nodes, 16 in flight",
		Name: `^BenchmarkReserveNodes/clusters=100/nodes=10/parallel$`, Unit: "decisions/s", Baseline: "no nodes", OnRatio: true, Op: ">=", Limit: 1 / 1.5},
	{Suite: "broker", Figure: "per-node fit, worst case (every node record read): p99 ms, 10,000 clusters, serial",
		Name: `^BenchmarkReserveNodes/clusters=10000/nodes=10-slowpath/serial$`, Unit: "p99-ms", Baseline: "no nodes", Info: "worst case, shown beside"},
	{Suite: "broker", Figure: "per-node fit, worst case (every node record read): decisions/s, 100 clusters, 16 in flight",
		Name: `^BenchmarkReserveNodes/clusters=100/nodes=10-slowpath/parallel$`, Unit: "decisions/s", Baseline: "no nodes", Info: "worst case, shown beside"},
	{Suite: "broker", Figure: "replica WAIT on the decision path: decisions/s, 100 clusters, 16 in flight",
		Name: `^BenchmarkReserveReplicated/clusters=100/wait=on/parallel$`, Unit: "decisions/s", Baseline: "no WAIT", Info: "the price of a failover losing no decision"},
	{Suite: "broker", Figure: "replica WAIT on the decision path: p50 ms, 100 clusters, serial",
		Name: `^BenchmarkReserveReplicated/clusters=100/wait=on/serial$`, Unit: "p50-ms", Baseline: "no WAIT", Info: "the price of a failover losing no decision"},
	{Suite: "http", Figure: "HTTP reservations/s (HTTPS, mTLS)",
		Name: `^BenchmarkHTTPReserve/https-mtls$`, Unit: "reservations/s", Baseline: "in-process Store.Reserve", Op: ">=", Limit: 5000},
	{Suite: "http", Figure: "HTTP p99 ms (HTTPS, mTLS)",
		Name: `^BenchmarkHTTPReserve/https-mtls$`, Unit: "p99-ms", Baseline: "in-process Store.Reserve", Op: "<", Limit: 20},
	{Suite: "http", Figure: "rb-broker peak RSS MiB, 8 members listing 60,000 reservations at once (manifest limit 256 MiB)",
		Name: `^BenchmarkListReservations$`, Unit: "broker-peak-rss-MiB", Op: "<", Limit: 256},
	// The bounded abuse run: every abuse at once against one
	// rb-broker process; the honest members are never refused and the
	// broker stays under its manifest's memory limit.
	{Suite: "http", Figure: "rb-broker peak RSS MiB, every abuse at once (60,000 live, 8 listers, 1,000 streams, a member at its limits)",
		Name: `^BenchmarkAbuseCombined/abuse$`, Unit: "broker-peak-rss-MiB", Op: "<", Limit: 256},
	{Suite: "http", Figure: "honest members' reservations refused during the abuse",
		Name: `^BenchmarkAbuseCombined/abuse$`, Unit: "honest-refused", Op: "<", Limit: 1},
	{Suite: "http", Figure: "honest members' reserve p99 ms during the abuse",
		Name: `^BenchmarkAbuseCombined/abuse$`, Unit: "p99-ms", Baseline: "honest members alone", Info: "shown against the same members alone, same run"},
	{Suite: "events", Figure: "notification p99 ms",
		Name: `^BenchmarkEventLatency/sse-mtls(-loaded)?$`, Unit: "p99-ms", Baseline: "Redis XADD -> XREAD", Op: "<", Limit: 50},
	// The broker under abuse: one member's streams must not slow
	// the others down by more than 2x.
	{Suite: "events", Figure: "honest members' reserve p99 ms while another member holds 1,000 event streams",
		Name: `^BenchmarkStreamsReserve$`, Unit: "p99-ms", Baseline: "no stream open", OnRatio: true, Op: "<", Limit: 2},
	{Suite: "events", Figure: "... and while each of its events goes to the 1,000 streams (5 events/s)",
		Name: `^BenchmarkStreamsReserve$`, Unit: "events-p99-ms", Baseline: "no stream open", Info: "the same with fan-out, shown beside"},
	// The end-to-end target is read, as Kubernetes' pod startup SLO is, at a
	// stated creation rate (remote-paced: RB_BENCH_PACED_RATE pods/s, default
	// 5); the burst of 100 at once is shown beside it, not checked.
	{Suite: "e2e", Figure: "pod created -> Running p50 ms, 100 remote pods created at a steady rate (remote-paced)",
		Name: `^BenchmarkEndToEnd/remote-paced$`, Unit: "p50-ms", Baseline: "local scheduling", Op: "<", Limit: 1000},
	{Suite: "e2e", Figure: "pod created -> Running p99 ms, 100 remote pods created at a steady rate (remote-paced)",
		Name: `^BenchmarkEndToEnd/remote-paced$`, Unit: "p99-ms", Baseline: "local scheduling", Op: "<", Limit: 2000},
	{Suite: "e2e", Figure: "creation rate achieved, pods/s (remote-paced)",
		Name: `^BenchmarkEndToEnd/remote-paced$`, Unit: "created-pods/s", Info: "the rate the paced figures hold at"},
	{Suite: "e2e", Figure: "pod created -> Running p50 ms, 100 remote pods at once (remote, burst)",
		Name: `^BenchmarkEndToEnd/remote$`, Unit: "p50-ms", Baseline: "local scheduling", Info: "stress figure, no target (target: paced run)"},
	{Suite: "e2e", Figure: "pod created -> Running p99 ms, 100 remote pods at once (remote, burst)",
		Name: `^BenchmarkEndToEnd/remote$`, Unit: "p99-ms", Baseline: "local scheduling", Info: "stress figure, no target (target: paced run)"},
	{Suite: "scheduler", Figure: "scheduling throughput, resource-broker / default profile",
		Name: `^BenchmarkSchedulingThroughput`, Unit: "rb-pods/s", Baseline: "default profile", OnRatio: true, Op: ">=", Limit: 0.95},
	// The virtual node's kubelet endpoint: metrics-server's scrape
	// (10 s timeout) must never time out.
	{Suite: "kubelet", Figure: "/stats/summary p99 ms, 1,000 borrowed pods on one virtual node",
		Name: `^BenchmarkKubeletMetrics/pods=1000/route=stats-summary/source=cache$`, Unit: "p99-ms", Baseline: "list at scrape", Op: "<", Limit: 1000},
	{Suite: "kubelet", Figure: "/metrics/resource p99 ms, 1,000 borrowed pods on one virtual node",
		Name: `^BenchmarkKubeletMetrics/pods=1000/route=metrics-resource/source=cache$`, Unit: "p99-ms", Baseline: "list at scrape", Op: "<", Limit: 1000},
	{Suite: "kubelet", Figure: "one poll of 1,000 PodMetrics: % of a core at the default 10 s period",
		Name: `^BenchmarkKubeletMetrics/pods=1000/poll$`, Unit: "cpu-%-at-10s", Info: "the agent's added CPU, besides the scrapes"},
	{Suite: "kubelet", Figure: "the node's usage cache for 1,000 pods, KiB of live heap",
		Name: `^BenchmarkKubeletMetrics/pods=1000/poll$`, Unit: "cache-KiB", Info: "the agent's added memory"},
	{Suite: "agent", Figure: "rb-agent RSS MiB",
		Name: `^BenchmarkAgentFootprint$`, Unit: "agent-MiB", Baseline: "plain informer", Op: "<", Limit: 150},
	{Suite: "agent", Figure: "rb-agent CPU % of a core, quiet",
		Name: `^BenchmarkAgentFootprint$`, Unit: "agent-idle-%cpu", Baseline: "plain informer", Op: "<", Limit: 5},
	{Suite: "agent", Figure: "rb-agent CPU % of a core, under pod churn",
		Name: `^BenchmarkAgentFootprint$`, Unit: "agent-churn-%cpu", Baseline: "plain informer", Op: "<", Limit: 5},
}

// The broker suite's names, for its overview table and the plot. The plot
// shows the serial runs (one caller: the decision's own latency, without
// queueing behind other requests), with the trivial EVALSHA as the floor.
const (
	brokerSuite   = "broker"
	brokerPattern = `^BenchmarkReserve/clusters=(\d+)/method=(\w+)/(serial|parallel)$` // clusters, method, mode
	brokerTrivial = "BenchmarkReserve/baseline-trivial-evalsha/"                       // + mode
	brokerIndex   = "index"                                                            // the method compared with
	brokerScan    = "scan"                                                             // its baseline
	plotMode      = "serial"
	plotFile      = "decision-latency.png"
	plotWidthPx   = 800
	plotHeightPx  = 500
	reportFile    = "latest.md"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("benchreport", flag.ContinueOnError)
	fs.SetOutput(stderr)
	out := fs.String("out", "docs/benchmarks", "folder for "+plotFile+" and "+reportFile+" (relative to the module root); empty: write nothing")
	only := fs.String("only", "", "comma-separated suites to run (default all): "+strings.Join(suiteNames(), ","))
	benchtime := fs.String("benchtime", "", "override the runs' -benchtime: a value for every selected suite (200x, 2s), or suite=value,... per suite")
	count := fs.Int("count", 1, "go test -count: results of the same benchmark are reduced to their median")
	from := fs.String("from", "", "comma-separated files of saved go test -bench output: report on them instead of running anything")
	list := fs.Bool("list", false, "print the selected suites and their go test commands (with --only and --benchtime applied), then exit")
	fs.Usage = func() {
		fmt.Fprintf(stderr, "usage: go run ./hack/benchreport [flags]\n\nSuites:\n")
		printSuites(stderr, nil)
		fmt.Fprintf(stderr, "\nFlags:\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "benchreport: unexpected arguments %q\n", fs.Args())
		return 2
	}
	selected, err := selectSuites(*only)
	if err == nil {
		err = applyBenchtime(selected, *benchtime)
	}
	if err == nil {
		err = validateTables()
	}
	if err != nil {
		fmt.Fprintf(stderr, "benchreport: %v\n", err)
		return 2
	}
	if *list {
		printSuites(stdout, selected)
		return 0
	}

	root, err := moduleRoot()
	if err != nil {
		fmt.Fprintf(stderr, "benchreport: %v\n", err)
		return 2
	}
	rep := &Report{Started: time.Now(), Args: args}
	rep.Machine = describeMachine(root)
	if *from != "" {
		if err := rep.loadFiles(strings.Split(*from, ","), selected); err != nil {
			fmt.Fprintf(stderr, "benchreport: %v\n", err)
			return 2
		}
	} else {
		rep.runSuites(root, selected, *count, stderr)
	}
	rep.Finished = time.Now()
	rep.Machine.LoadEnd = loadAverage()

	rep.printFigures(stdout)
	rep.printSummary(stdout)

	if *out != "" {
		dir := *out
		if !filepath.IsAbs(dir) {
			dir = filepath.Join(root, dir)
		}
		if err := rep.write(dir, stdout); err != nil {
			fmt.Fprintf(stderr, "benchreport: %v\n", err)
			return 1
		}
	}
	if rep.failed() {
		fmt.Fprintln(stderr, "benchreport: some benchmarks failed (see above)")
		return 1
	}
	return 0
}
