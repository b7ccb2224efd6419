package main

import (
	"os"
	"strings"
	"testing"
)

func TestParser(t *testing.T) {
	out := `goos: linux
goarch: amd64
pkg: github.com/fluidos-project/resource-broker/broker/store
cpu: AMD EPYC
BenchmarkReserve/baseline-trivial-evalsha/serial-2  	   20000	     32966 ns/op	     30334 calls/s	         0.02388 p50-ms	         0.09882 p99-ms	        10.31 redis-busy-%	         3.400 redis-us/op
BenchmarkReserve/clusters=10000/method=scan/parallel-2      	      20	 355520189 ns/op	         2.813 decisions/s	      3444 p50-ms	     1.1632e+04 p99-ms
BenchmarkAgentFootprint-2   	I0101 12:00:00.000 klog line written while the benchmark ran
    footprint_bench_test.go:42: populated 1000 nodes
       1	         0 ns/op	        61.50 agent-MiB	         0.4100 agent-idle-%cpu	         1.230 agent/informer-MiB
--- SKIP: BenchmarkEventLatency
    bench_test.go:12: needs redis-server
--- FAIL: BenchmarkHTTPReserve/https-mtls-2
    bench_test.go:99: boom
FAIL
exit status 1
pkg: github.com/fluidos-project/resource-broker/test/integration
BenchmarkEndToEnd/remote 	1	1 ns/op	8900 p50-ms
Benchmark 12 pods seen
ok  	github.com/fluidos-project/resource-broker/test/integration	12.3s
`
	p := NewParser()
	for _, l := range strings.Split(out, "\n") {
		p.Line(l)
	}

	type want struct {
		pkg, name string
		procs     int
		iters     int64
		metrics   []Metric
	}
	store := "github.com/fluidos-project/resource-broker/broker/store"
	wants := []want{
		{store, "BenchmarkReserve/baseline-trivial-evalsha/serial", 2, 20000, []Metric{
			{32966, "ns/op"}, {30334, "calls/s"}, {0.02388, "p50-ms"}, {0.09882, "p99-ms"}, {10.31, "redis-busy-%"}, {3.4, "redis-us/op"}}},
		{store, "BenchmarkReserve/clusters=10000/method=scan/parallel", 2, 20, []Metric{
			{355520189, "ns/op"}, {2.813, "decisions/s"}, {3444, "p50-ms"}, {11632, "p99-ms"}}},
		// The line split by the benchmark's own output is joined.
		{store, "BenchmarkAgentFootprint", 2, 1, []Metric{
			{0, "ns/op"}, {61.5, "agent-MiB"}, {0.41, "agent-idle-%cpu"}, {1.23, "agent/informer-MiB"}}},
		// No -GOMAXPROCS suffix (GOMAXPROCS=1).
		{"github.com/fluidos-project/resource-broker/test/integration", "BenchmarkEndToEnd/remote", 0, 1, []Metric{
			{1, "ns/op"}, {8900, "p50-ms"}}},
	}
	if len(p.Results) != len(wants) {
		t.Fatalf("%d results, want %d: %+v", len(p.Results), len(wants), p.Results)
	}
	for i, w := range wants {
		r := p.Results[i]
		if r.Pkg != w.pkg || r.Name != w.name || r.Procs != w.procs || r.Iterations != w.iters {
			t.Errorf("result %d: %s %q procs %d n %d, want %s %q procs %d n %d", i, r.Pkg, r.Name, r.Procs, r.Iterations, w.pkg, w.name, w.procs, w.iters)
		}
		if len(r.Metrics) != len(w.metrics) {
			t.Errorf("result %d: metrics %v, want %v", i, r.Metrics, w.metrics)
			continue
		}
		for j, m := range w.metrics {
			if r.Metrics[j] != m {
				t.Errorf("result %d metric %d: %v, want %v", i, j, r.Metrics[j], m)
			}
		}
	}
	if got := p.Results[1].Line; !strings.HasPrefix(got, "BenchmarkReserve/clusters=10000/method=scan/parallel-2      \t      20\t 355520189 ns/op") {
		t.Errorf("line %q", got)
	}
	if got := p.Results[2].Line; !strings.HasPrefix(got, "BenchmarkAgentFootprint-2\t1\t         0 ns/op\t        61.50 agent-MiB") {
		t.Errorf("joined line %q", got)
	}
	if len(p.Skipped) != 1 || p.Skipped[0] != (Skip{"BenchmarkEventLatency", "bench_test.go:12: needs redis-server"}) {
		t.Errorf("skipped %+v", p.Skipped)
	}
	if len(p.Failed) != 1 || p.Failed[0] != "BenchmarkHTTPReserve/https-mtls" || !p.FailLine {
		t.Errorf("failed %v, FAIL line %v", p.Failed, p.FailLine)
	}
	if len(p.Config) != 5 {
		t.Errorf("config %q", p.Config)
	}
}

func TestSplitProcs(t *testing.T) {
	for in, want := range map[string]struct {
		name  string
		procs int
	}{
		"BenchmarkX-16":          {"BenchmarkX", 16},
		"BenchmarkX":             {"BenchmarkX", 0},
		"BenchmarkX/a-b":         {"BenchmarkX/a-b", 0},
		"BenchmarkX/replay-x-2":  {"BenchmarkX/replay-x", 2},
		"BenchmarkX/clusters=10": {"BenchmarkX/clusters=10", 0},
		"BenchmarkX-":            {"BenchmarkX-", 0},
	} {
		n, p := splitProcs(in)
		if n != want.name || p != want.procs {
			t.Errorf("splitProcs(%q) = %q, %d; want %q, %d", in, n, p, want.name, want.procs)
		}
	}
}

func TestMatchBench(t *testing.T) {
	pat := `^BenchmarkReserve$/^clusters=(10|100)$/^method=index$`
	for name, want := range map[string]bool{
		"BenchmarkReserve/clusters=10/method=index/serial":    true,
		"BenchmarkReserve/clusters=100/method=index/parallel": true,
		"BenchmarkReserve/clusters=1000/method=index/serial":  false,
		"BenchmarkReserve/clusters=10/method=scan/serial":     false,
		"BenchmarkReserveX/clusters=10/method=index/serial":   false,
	} {
		if got := matchBench(pat, name); got != want {
			t.Errorf("matchBench(%q) = %v, want %v", name, got, want)
		}
	}
	if got := splitPattern(`^A$/^(b/c|d)$/[/]x`); len(got) != 3 || got[1] != `^(b/c|d)$` || got[2] != `[/]x` {
		t.Errorf("splitPattern: %q", got)
	}
}

func TestBaselinesAndTargets(t *testing.T) {
	if err := validateTables(); err != nil {
		t.Fatal(err)
	}
	b := suiteByName("broker")
	cases := []struct {
		label, name, unit string
		bname, bunit      string
		ok                bool
	}{
		{"full scan", "BenchmarkReserve/clusters=100/method=index/parallel", "p99-ms", "BenchmarkReserve/clusters=100/method=scan/parallel", "p99-ms", true},
		{"full scan", "BenchmarkReserve/clusters=100/method=scan/parallel", "p99-ms", "", "", false},
		{"trivial EVALSHA", "BenchmarkReserve/clusters=100/method=index/serial", "decisions/s", "BenchmarkReserve/baseline-trivial-evalsha/serial", "calls/s", true},
		{"trivial EVALSHA", "BenchmarkReserve/clusters=100/method=index/serial", "redis-busy-%", "", "", false},
	}
	for _, c := range cases {
		bn, bu, ok := b.baseline(c.label).of(c.name, c.unit)
		if bn != c.bname || bu != c.bunit || ok != c.ok {
			t.Errorf("%s of %s %s = %q %q %v, want %q %q %v", c.label, c.name, c.unit, bn, bu, ok, c.bname, c.bunit, c.ok)
		}
	}
	sched := suiteByName("scheduler")
	if bn, bu, ok := sched.baseline("default profile").of("BenchmarkSchedulingThroughput1000Pods", "rb-pods/s"); !ok ||
		bn != "BenchmarkSchedulingThroughput1000Pods" || bu != "default-pods/s" {
		t.Errorf("scheduler baseline: %q %q %v", bn, bu, ok)
	}
}

func TestFmtNum(t *testing.T) {
	for v, want := range map[float64]string{
		0: "0", 20000: "20,000", 1192.4: "1,192", 123.4: "123", 12.34: "12.3", 1.234: "1.23",
		0.1165: "0.117", 0.02388: "0.0239", -1500: "-1,500", 1234567: "1,234,567",
	} {
		if got := fmtNum(v); got != want {
			t.Errorf("fmtNum(%v) = %q, want %q", v, got, want)
		}
	}
}

// The end-to-end target is checked on the paced run; the burst is shown
// beside it, labelled, and not checked.
func TestEndToEndSummary(t *testing.T) {
	if err := validateTables(); err != nil {
		t.Fatal(err)
	}
	e2e := suiteByName("e2e")
	if bn, bu, ok := e2e.baseline("local scheduling").of("BenchmarkEndToEnd/remote-paced", "p99-ms"); !ok ||
		bn != "BenchmarkEndToEnd/local-baseline" || bu != "p99-ms" {
		t.Errorf("e2e baseline of remote-paced: %q %q %v", bn, bu, ok)
	}
	out := `pkg: github.com/fluidos-project/resource-broker/test/integration
BenchmarkEndToEnd/remote-paced-2 	1	1 ns/op	700 p50-ms	900 p90-ms	1500 p99-ms	1600 max-ms	4.9 pods/s	5.0 created-pods/s
BenchmarkEndToEnd/remote-2 	1	1 ns/op	4000 p50-ms	5000 p90-ms	6000 p99-ms	6100 max-ms	15 pods/s
BenchmarkEndToEnd/local-baseline-2 	1	1 ns/op	500 p50-ms	600 p90-ms	700 p99-ms	800 max-ms	80 pods/s
`
	path := t.TempDir() + "/run.txt"
	if err := os.WriteFile(path, []byte(out), 0o644); err != nil {
		t.Fatal(err)
	}
	rep := &Report{}
	if err := rep.loadFiles([]string{path}, map[string]bool{"e2e": true}); err != nil {
		t.Fatal(err)
	}
	rows := map[string][]string{}
	for _, r := range rep.summary().rows {
		rows[r[0]] = r
	}
	for fig, want := range map[string][2]string{ // figure -> target, met?
		"pod created -> Running p50 ms, 100 remote pods created at a steady rate (remote-paced)": {"< 1,000 ms", "yes"},
		"pod created -> Running p99 ms, 100 remote pods created at a steady rate (remote-paced)": {"< 2,000 ms", "yes"},
		"creation rate achieved, pods/s (remote-paced)":                                          {"the rate the paced figures hold at", "n/a"},
		"pod created -> Running p50 ms, 100 remote pods at once (remote, burst)":                 {"stress figure, no target (target: paced run)", "n/a"},
		"pod created -> Running p99 ms, 100 remote pods at once (remote, burst)":                 {"stress figure, no target (target: paced run)", "n/a"},
	} {
		r, ok := rows[fig]
		if !ok {
			t.Errorf("no row %q", fig)
			continue
		}
		if r[4] != want[0] || r[5] != want[1] {
			t.Errorf("%s: target %q met %q, want %q %q (row %q)", fig, r[4], r[5], want[0], want[1], r)
		}
	}
}
