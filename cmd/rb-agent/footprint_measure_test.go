package main

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// How BenchmarkAgentFootprint (footprint_bench_test.go) measures a process:
// /proc/<pid> readings over its windows, and pprof profiles.

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
