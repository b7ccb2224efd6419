package main

import (
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
)

// Machine describes where the benchmarks ran.
type Machine struct {
	CPU       string // model, cores, clock
	Memory    string
	Kernel    string
	Go        string // go version of the toolchain that ran go test
	Redis     string // redis-server --version
	Commit    string // HEAD, and whether the tree had changes
	LoadStart string
	LoadEnd   string
}

func describeMachine(root string) Machine {
	m := Machine{
		CPU:       cpuText(),
		Memory:    memText(),
		Kernel:    firstLine(readFile("/proc/sys/kernel/osrelease")),
		Go:        command(root, "go", "version"),
		Redis:     command(root, "redis-server", "--version"),
		LoadStart: loadAverage(),
	}
	if m.Redis == "" {
		m.Redis = "redis-server not found"
	}
	if head := command(root, "git", "rev-parse", "--short", "HEAD"); head != "" {
		m.Commit = "commit " + head
		if changed := changedFiles(root); len(changed) > 0 {
			const show = 12
			m.Commit += fmt.Sprintf(", with uncommitted changes to %d tracked files: %s",
				len(changed), strings.Join(changed[:min(show, len(changed))], ", "))
			if len(changed) > show {
				m.Commit += ", …"
			}
		}
	}
	return m
}

func cpuText() string {
	info := readFile("/proc/cpuinfo")
	model, mhz := "", ""
	for _, line := range strings.Split(info, "\n") {
		k, v, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		switch strings.TrimSpace(k) {
		case "model name":
			if model == "" {
				model = strings.TrimSpace(v)
			}
		case "cpu MHz":
			if mhz == "" {
				mhz = strings.TrimSpace(v)
			}
		}
	}
	if model == "" {
		model = runtime.GOARCH
	}
	s := fmt.Sprintf("%s, %d cores (runtime.NumCPU)", model, runtime.NumCPU())
	if f, err := strconv.ParseFloat(mhz, 64); err == nil {
		s += fmt.Sprintf(", %.0f MHz", f)
	}
	return s
}

func memText() string {
	for _, line := range strings.Split(readFile("/proc/meminfo"), "\n") {
		if v, ok := strings.CutPrefix(line, "MemTotal:"); ok {
			f := strings.Fields(v)
			if len(f) == 0 {
				return ""
			}
			if kb, err := strconv.ParseFloat(f[0], 64); err == nil {
				return fmt.Sprintf("%.1f GiB (MemTotal)", kb/(1<<20))
			}
		}
	}
	return ""
}

// loadAverage is the 1, 5 and 15 minute load averages.
func loadAverage() string {
	f := strings.Fields(readFile("/proc/loadavg"))
	if len(f) < 3 {
		return ""
	}
	return strings.Join(f[:3], ", ")
}

func readFile(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	return string(b)
}

func firstLine(s string) string {
	l, _, _ := strings.Cut(s, "\n")
	return strings.TrimSpace(l)
}

// command runs a short command and returns its first line of output, or "".
func command(dir, name string, args ...string) string {
	cmd := exec.Command(name, args...)
	cmd.Dir = dir
	out, err := cmd.Output()
	if err != nil {
		return ""
	}
	return firstLine(string(out))
}

// changedFiles lists the tracked files that differ from HEAD.
func changedFiles(root string) []string {
	cmd := exec.Command("git", "diff", "--name-only", "HEAD")
	cmd.Dir = root
	out, err := cmd.Output()
	if err != nil {
		return nil
	}
	return strings.Fields(string(out))
}
