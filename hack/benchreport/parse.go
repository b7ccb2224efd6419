package main

import (
	"regexp"
	"strconv"
	"strings"
)

// The output of go test -bench, read line by line. golang.org/x/perf/benchfmt
// would do this, but it is not in the module graph and its current version
// raises unrelated golang.org/x/* requirements of go.mod; the format is small:
//
//	goos: linux                                       (configuration: key: value)
//	pkg: github.com/fluidos-project/resource-broker/broker/store
//	BenchmarkReserve/clusters=10/method=index/serial-2   50   258408 ns/op   3870 decisions/s   0.2306 p50-ms
//	--- FAIL: BenchmarkX/sub                          (a failed benchmark; --- SKIP: for a skipped one)
//
// A result line is the name (with a -GOMAXPROCS suffix when GOMAXPROCS > 1),
// the iteration count, then value/unit pairs (ns/op, B/op, and the custom
// units of b.ReportMetric). The testing package prints the name before it runs
// the benchmark and the figures after, so anything the benchmark writes to
// stdout or stderr meanwhile splits the line in two: the name followed by that
// output, then, on a later line, the count and the figures. Both halves are
// joined here.

// Metric is one value/unit pair of a result line.
type Metric struct {
	Value float64
	Unit  string
}

// Result is one benchmark result line.
type Result struct {
	Pkg        string // from the last "pkg:" line before it
	Name       string // without the -GOMAXPROCS suffix
	Procs      int    // the suffix; 0 when absent
	Iterations int64
	Metrics    []Metric
	Line       string // the line as printed (joined when it was split), for benchstat
}

// Skip is a benchmark that called b.Skip.
type Skip struct {
	Name   string
	Reason string // the first log line after "--- SKIP:"
}

// Parser accumulates what it reads from go test -bench output.
type Parser struct {
	Pkg      string
	Config   []string // goos, goarch, pkg, cpu lines, in order (for the raw output)
	Results  []Result
	Failed   []string // names from "--- FAIL:" lines
	Skipped  []Skip
	FailLine bool // a "FAIL" summary line was seen

	pending  string // a name printed without its figures yet (its line was split)
	lastSkip int    // index in Skipped waiting for its reason, or -1
}

// NewParser returns an empty parser.
func NewParser() *Parser { return &Parser{lastSkip: -1} }

// Line reads one line of output (without its newline).
func (p *Parser) Line(s string) {
	s = strings.TrimRight(s, "\r")
	trimmed := strings.TrimSpace(s)
	if p.lastSkip >= 0 {
		if trimmed != "" && s != trimmed && p.Skipped[p.lastSkip].Reason == "" {
			p.Skipped[p.lastSkip].Reason = trimmed
		}
		p.lastSkip = -1
	}
	switch {
	case strings.HasPrefix(s, "Benchmark"):
		f := strings.Fields(s)
		if r, ok := parseFigures(f[1:]); ok {
			r.Line = strings.TrimSpace(s)
			p.add(f[0], r)
			return
		}
		// The name alone, then whatever the benchmark printed: its figures
		// come on a later line.
		p.pending = f[0]
	case strings.HasPrefix(trimmed, "--- FAIL: "):
		p.Failed = append(p.Failed, reportName(trimmed[len("--- FAIL: "):]))
	case strings.HasPrefix(trimmed, "--- SKIP: "):
		p.Skipped = append(p.Skipped, Skip{Name: reportName(trimmed[len("--- SKIP: "):])})
		p.lastSkip = len(p.Skipped) - 1
	case s == "FAIL" || strings.HasPrefix(s, "FAIL\t") || strings.HasPrefix(s, "FAIL "):
		p.FailLine = true
	case isConfig(s):
		k, v, _ := strings.Cut(s, ":")
		if k == "pkg" {
			p.Pkg = strings.TrimSpace(v)
		}
		p.Config = append(p.Config, s)
	case p.pending != "" && trimmed != "" && (s[0] == ' ' || s[0] == '\t' || (s[0] >= '0' && s[0] <= '9')):
		if r, ok := parseFigures(strings.Fields(s)); ok {
			r.Line = p.pending + "\t" + trimmed
			p.add(p.pending, r)
		}
	}
}

func (p *Parser) add(rawName string, r Result) {
	p.pending = ""
	r.Pkg = p.Pkg
	r.Name, r.Procs = splitProcs(rawName)
	p.Results = append(p.Results, r)
}

// parseFigures reads "iterations value unit value unit ...".
func parseFigures(f []string) (Result, bool) {
	if len(f) < 3 || (len(f)-1)%2 != 0 {
		return Result{}, false
	}
	n, err := strconv.ParseInt(f[0], 10, 64)
	if err != nil || n < 0 {
		return Result{}, false
	}
	r := Result{Iterations: n}
	for i := 1; i < len(f); i += 2 {
		v, err := strconv.ParseFloat(f[i], 64)
		if err != nil {
			return Result{}, false
		}
		if _, err := strconv.ParseFloat(f[i+1], 64); err == nil {
			return Result{}, false // a number where a unit belongs: not a result line
		}
		r.Metrics = append(r.Metrics, Metric{Value: v, Unit: f[i+1]})
	}
	return r, true
}

// splitProcs removes the -GOMAXPROCS suffix testing appends to the name.
func splitProcs(name string) (string, int) {
	i := strings.LastIndexByte(name, '-')
	if i <= 0 || i == len(name)-1 {
		return name, 0
	}
	n, err := strconv.Atoi(name[i+1:])
	if err != nil || n <= 0 || name[i+1] == '+' {
		return name, 0
	}
	return name[:i], n
}

// reportName is the benchmark name of a "--- FAIL:" or "--- SKIP:" line,
// without the duration and the -GOMAXPROCS suffix.
func reportName(s string) string {
	name, _, _ := strings.Cut(strings.TrimSpace(s), " ")
	name, _ = splitProcs(name)
	return name
}

// isConfig is true for the configuration lines go test -bench prints.
func isConfig(s string) bool {
	k, v, ok := strings.Cut(s, ":")
	if !ok || !strings.HasPrefix(v, " ") {
		return false
	}
	switch k {
	case "goos", "goarch", "pkg", "cpu":
		return true
	}
	return false
}

// matchBench reports whether name is selected by a -bench pattern: the
// pattern and the name are split on '/' (outside brackets and parentheses)
// and each level of the pattern must match the name's element at that level,
// as the testing package does.
func matchBench(pattern, name string) bool {
	levels := splitPattern(pattern)
	elems := strings.Split(name, "/")
	for i, lv := range levels {
		if i >= len(elems) {
			return true // the name is a parent of what the pattern selects
		}
		re, err := regexp.Compile(lv)
		if err != nil || !re.MatchString(elems[i]) {
			return false
		}
	}
	return true
}

// splitPattern splits a -bench pattern into its levels.
func splitPattern(p string) []string {
	var out []string
	depth, start := 0, 0
	for i := 0; i < len(p); i++ {
		switch p[i] {
		case '\\':
			i++
		case '(', '[':
			depth++
		case ')', ']':
			if depth > 0 {
				depth--
			}
		case '/':
			if depth == 0 {
				out = append(out, p[start:i])
				start = i + 1
			}
		}
	}
	return append(out, p[start:])
}
