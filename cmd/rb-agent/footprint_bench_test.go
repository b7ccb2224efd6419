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
	"context"
	"os"
	"slices"
	"strconv"
	"sync/atomic"
	"testing"
	"time"
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
