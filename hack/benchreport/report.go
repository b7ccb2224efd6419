package main

import (
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
)

// SuiteResult is what one suite gave.
type SuiteResult struct {
	Suite    *Suite
	Selected bool
	Status   string // statusOK, statusNotRun or statusFailed
	Note     string
	Runs     []RunOutcome
	Config   []string
	Results  []Result
	Skipped  []Skip
	Failed   []string

	names []string                        // benchmark names, in order of first appearance
	units map[string][]string             // name -> units, in order
	vals  map[string]map[string][]float64 // name -> unit -> values (several with -count)
}

const (
	statusOK     = "ok"
	statusNotRun = "not run"
	statusFailed = "FAILED"
)

func (sr *SuiteResult) absorb(p *Parser) {
	for _, c := range p.Config {
		if !slices.Contains(sr.Config, c) {
			sr.Config = append(sr.Config, c)
		}
	}
	for _, r := range p.Results {
		sr.addResult(r)
	}
	sr.Skipped = append(sr.Skipped, p.Skipped...)
	sr.Failed = append(sr.Failed, p.Failed...)
}

func (sr *SuiteResult) addResult(r Result) {
	if sr.vals == nil {
		sr.vals, sr.units = map[string]map[string][]float64{}, map[string][]string{}
	}
	sr.Results = append(sr.Results, r)
	if _, ok := sr.vals[r.Name]; !ok {
		sr.names = append(sr.names, r.Name)
		sr.vals[r.Name] = map[string][]float64{}
	}
	for _, m := range r.Metrics {
		if _, ok := sr.vals[r.Name][m.Unit]; !ok {
			sr.units[r.Name] = append(sr.units[r.Name], m.Unit)
		}
		sr.vals[r.Name][m.Unit] = append(sr.vals[r.Name][m.Unit], m.Value)
	}
}

// value is the median of a figure's values.
func (sr *SuiteResult) value(name, unit string) (float64, bool) {
	vs := sr.vals[name][unit]
	if len(vs) == 0 {
		return 0, false
	}
	s := slices.Clone(vs)
	sort.Float64s(s)
	if len(s)%2 == 1 {
		return s[len(s)/2], true
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2, true
}

// Report is everything the program prints and writes.
type Report struct {
	Started, Finished time.Time
	Args              []string
	Machine           Machine
	Suites            []*SuiteResult
	Plot              string   // file name of the plot, when one was written
	From              []string // the saved outputs read with --from, if any
}

func (rep *Report) failed() bool {
	for _, sr := range rep.Suites {
		if sr.Status == statusFailed {
			return true
		}
	}
	return false
}

func (rep *Report) suite(name string) *SuiteResult {
	for _, sr := range rep.Suites {
		if sr.Suite.Name == name {
			return sr
		}
	}
	return nil
}

// runSuites runs the selected suites, one go test per run.
func (rep *Report) runSuites(root string, sel map[string]bool, count int, progress io.Writer) {
	for i := range suites {
		s := &suites[i]
		sr := &SuiteResult{Suite: s, Selected: sel[s.Name]}
		rep.Suites = append(rep.Suites, sr)
		if !sr.Selected {
			sr.Status, sr.Note = statusNotRun, "not selected (--only)"
			continue
		}
		funcs, err := benchmarksIn(filepath.Join(root, s.Pkg))
		if err != nil {
			sr.Status, sr.Note = statusFailed, err.Error()
			continue
		}
		var runs, missing []Run
		for _, r := range s.Runs {
			if r.declared(funcs) {
				runs = append(runs, r)
			} else {
				missing = append(missing, r)
			}
		}
		if len(runs) == 0 {
			sr.Status = statusNotRun
			sr.Note = fmt.Sprintf("no Benchmark function in %s matches %s", s.Pkg, topLevels(missing))
			continue
		}
		fmt.Fprintf(progress, "\n== suite %s (%s): %s\n", s.Name, s.Pkg, s.About)
		runFailed := false
		for _, r := range runs {
			p, o := execute(root, s.Pkg, r, count, progress)
			sr.Runs = append(sr.Runs, o)
			sr.absorb(p)
			if o.ExitErr != "" || len(p.Failed) > 0 || p.FailLine {
				runFailed = true
			}
		}
		sr.settle(runFailed)
		if len(missing) > 0 {
			sr.Note = joinNotes(sr.Note, fmt.Sprintf("not run (no such Benchmark function): %s", topLevels(missing)))
		}
	}
}

// loadFiles reads saved go test -bench output and gives each result to the
// selected suite whose package and -bench patterns select it.
func (rep *Report) loadFiles(files []string, sel map[string]bool) error {
	var all []*Parser
	rep.From = files
	for _, f := range files {
		b, err := os.ReadFile(strings.TrimSpace(f))
		if err != nil {
			return err
		}
		p := NewParser()
		for _, line := range strings.Split(string(b), "\n") {
			p.Line(line)
		}
		all = append(all, p)
	}
	for i := range suites {
		s := &suites[i]
		sr := &SuiteResult{Suite: s, Selected: sel[s.Name]}
		rep.Suites = append(rep.Suites, sr)
		if !sr.Selected {
			sr.Status, sr.Note = statusNotRun, "not selected (--only)"
			continue
		}
		runFailed := false
		for fi, p := range all {
			n := 0
			for _, r := range p.Results {
				if s.selects(r.Pkg, r.Name) {
					sr.addResult(r)
					n++
				}
			}
			for _, c := range p.Config {
				if n > 0 && !slices.Contains(sr.Config, c) {
					sr.Config = append(sr.Config, c)
				}
			}
			for _, f := range p.Failed {
				if s.selects("", f) {
					sr.Failed = append(sr.Failed, f)
					runFailed = true
				}
			}
			for _, sk := range p.Skipped {
				if s.selects("", sk.Name) {
					sr.Skipped = append(sr.Skipped, sk)
				}
			}
			if n > 0 {
				sr.Runs = append(sr.Runs, RunOutcome{Command: "from " + files[fi], NResults: n})
			}
		}
		sr.settle(runFailed)
	}
	return nil
}

// selects reports whether a result of package pkg (empty: any) belongs to
// the suite.
func (s *Suite) selects(pkg, name string) bool {
	if pkg != "" && !strings.HasSuffix(pkg, "/"+strings.Trim(s.Pkg, "./")) {
		return false
	}
	for _, r := range s.Runs {
		if matchBench(r.Bench, name) {
			return true
		}
	}
	return false
}

func (sr *SuiteResult) settle(runFailed bool) {
	switch {
	case runFailed:
		sr.Status = statusFailed
		if len(sr.Failed) > 0 {
			sr.Note = "failed: " + strings.Join(dedup(sr.Failed), ", ")
		} else {
			sr.Note = "go test failed"
		}
	case len(sr.Results) == 0 && len(sr.Skipped) > 0:
		sr.Status, sr.Note = statusNotRun, "skipped: "+skipNotes(sr.Skipped)
	case len(sr.Results) == 0:
		sr.Status, sr.Note = statusNotRun, "no benchmark results"
	default:
		sr.Status = statusOK
		var took time.Duration
		for _, o := range sr.Runs {
			took += o.Took
		}
		sr.Note = fmt.Sprintf("%d %s from %d %s", len(sr.Results), plural(len(sr.Results), "result", "results"), len(sr.Runs), plural(len(sr.Runs), "run", "runs"))
		if took > 0 {
			sr.Note += fmt.Sprintf(" in %s", took.Round(time.Second))
		}
		if len(sr.Skipped) > 0 {
			sr.Note += "; skipped: " + skipNotes(sr.Skipped)
		}
	}
}

func skipNotes(sk []Skip) string {
	var out []string
	for _, s := range sk {
		n := s.Name
		if s.Reason != "" {
			n += " (" + s.Reason + ")"
		}
		out = append(out, n)
	}
	return strings.Join(dedup(out), ", ")
}

func dedup(s []string) []string {
	var out []string
	for _, v := range s {
		if !slices.Contains(out, v) {
			out = append(out, v)
		}
	}
	return out
}

func joinNotes(a, b string) string {
	if a == "" {
		return b
	}
	return a + "; " + b
}

func topLevels(runs []Run) string {
	var out []string
	for _, r := range runs {
		out = append(out, "`"+splitPattern(r.Bench)[0]+"`")
	}
	return strings.Join(dedup(out), ", ")
}

// table is a header and rows of cells, printed as text or markdown.
type table struct {
	header []string
	right  []bool // right-aligned columns (markdown)
	rows   [][]string
}

func (t *table) text(w io.Writer) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, strings.Join(t.header, "\t"))
	for _, r := range t.rows {
		fmt.Fprintln(tw, strings.Join(r, "\t"))
	}
	_ = tw.Flush()
}

func (t *table) markdown(w io.Writer) {
	esc := func(s string) string { return strings.ReplaceAll(s, "|", `\|`) }
	cells := func(r []string) string {
		var b strings.Builder
		b.WriteString("|")
		for _, c := range r {
			b.WriteString(" " + esc(c) + " |")
		}
		return b.String()
	}
	fmt.Fprintln(w, cells(t.header))
	var sep []string
	for i := range t.header {
		if i < len(t.right) && t.right[i] {
			sep = append(sep, "---:")
		} else {
			sep = append(sep, "---")
		}
	}
	fmt.Fprintln(w, "|"+strings.Join(sep, "|")+"|")
	for _, r := range t.rows {
		fmt.Fprintln(w, cells(r))
	}
}

// figures is every figure of a suite with its baselines and ratios.
func (sr *SuiteResult) figures() *table {
	used := make([]bool, len(sr.Suite.Baselines))
	for _, name := range sr.names {
		for _, unit := range sr.units[name] {
			for i := range sr.Suite.Baselines {
				if _, _, ok := sr.Suite.Baselines[i].of(name, unit); ok {
					used[i] = true
				}
			}
		}
	}
	t := &table{header: []string{"benchmark", "metric", "value"}, right: []bool{false, false, true}}
	for i, b := range sr.Suite.Baselines {
		if used[i] {
			t.header = append(t.header, "vs "+b.Label, "ratio")
			t.right = append(t.right, true, true)
		}
	}
	for _, name := range sr.names {
		for j, unit := range sr.units[name] {
			v, _ := sr.value(name, unit)
			row := []string{"", unit, fmtNum(v)}
			if j == 0 {
				row[0] = name
			}
			for i := range sr.Suite.Baselines {
				if !used[i] {
					continue
				}
				bname, bunit, ok := sr.Suite.Baselines[i].of(name, unit)
				if !ok {
					row = append(row, "", "")
					continue
				}
				bv, ok := sr.value(bname, bunit)
				if !ok {
					// The baseline did not run: say so; it ran without
					// this unit: nothing to compare.
					missing := ""
					if _, ran := sr.vals[bname]; !ran {
						missing = "n/a"
					}
					row = append(row, missing, "")
					continue
				}
				cell := fmtNum(bv)
				if bunit != unit {
					cell += " " + bunit
				}
				row = append(row, cell, ratio(v, bv))
			}
			t.rows = append(t.rows, row)
		}
	}
	return t
}

// brokerOverview is the broker suite by federation size: index vs full scan,
// and the index against the trivial EVALSHA.
func (sr *SuiteResult) brokerOverview() *table {
	re := regexp.MustCompile(brokerPattern)
	type key struct {
		n    int
		mode string
	}
	seen := map[key]bool{}
	var keys []key
	for _, name := range sr.names {
		m := re.FindStringSubmatch(name)
		if m == nil {
			continue
		}
		n, _ := strconv.Atoi(m[1])
		k := key{n, m[3]}
		if !seen[k] {
			seen[k] = true
			keys = append(keys, k)
		}
	}
	if len(keys) == 0 {
		return nil
	}
	sort.SliceStable(keys, func(i, j int) bool {
		if keys[i].n != keys[j].n {
			return keys[i].n < keys[j].n
		}
		return keys[i].mode > keys[j].mode // serial before parallel
	})
	name := func(k key, method string) string {
		return fmt.Sprintf("BenchmarkReserve/clusters=%d/method=%s/%s", k.n, method, k.mode)
	}
	get := func(n, unit string) string {
		if v, ok := sr.value(n, unit); ok {
			return fmtNum(v)
		}
		return "n/a"
	}
	div := func(a, aunit, b, bunit string) string {
		av, ok1 := sr.value(a, aunit)
		bv, ok2 := sr.value(b, bunit)
		if !ok1 || !ok2 {
			return "n/a"
		}
		return ratio(av, bv)
	}
	t := &table{
		header: []string{"clusters", "mode", "index decisions/s", "scan decisions/s", "index / scan",
			"index p50 ms", "index p99 ms", "scan p50 ms", "scan p99 ms", "index redis-us/op", "scan redis-us/op", "index ops/call", "index / trivial EVALSHA"},
		right: []bool{true, false, true, true, true, true, true, true, true, true, true, true, true},
	}
	for _, mode := range []string{"serial", "parallel"} {
		tn := brokerTrivial + mode
		if _, ok := sr.vals[tn]; ok {
			t.rows = append(t.rows, []string{"trivial EVALSHA", mode, get(tn, "calls/s") + " calls/s", "", "",
				get(tn, "p50-ms"), get(tn, "p99-ms"), "", "", get(tn, "redis-us/op"), "", "1", "1"})
		}
	}
	for _, k := range keys {
		in, sc := name(k, brokerIndex), name(k, brokerScan)
		t.rows = append(t.rows, []string{fmtInt(float64(k.n)), k.mode,
			get(in, "decisions/s"), get(sc, "decisions/s"), div(in, "decisions/s", sc, "decisions/s"),
			get(in, "p50-ms"), get(in, "p99-ms"), get(sc, "p50-ms"), get(sc, "p99-ms"),
			get(in, "redis-us/op"), get(sc, "redis-us/op"), get(in, "ops/call"),
			div(in, "decisions/s", brokerTrivial+k.mode, "calls/s")})
	}
	return t
}

// summary checks the figures against the targets.
func (rep *Report) summary() *table {
	t := &table{header: []string{"figure", "value", "baseline", "ratio", "target", "met?"},
		right: []bool{false, true, true, true, false, false}}
	for i := range targets {
		tg := &targets[i]
		sr := rep.suite(tg.Suite)
		target := fmt.Sprintf("%s %s %s", opText(tg.Op), fmtLimit(tg.Limit), unitText(tg.Unit))
		if tg.OnRatio {
			target = fmt.Sprintf("ratio %s %s", opText(tg.Op), fmtLimit(tg.Limit))
		}
		if tg.Info != "" {
			target = tg.Info
		}
		if sr == nil || sr.Status == statusNotRun || (sr.Status == statusFailed && len(sr.Results) == 0) {
			status := statusNotRun
			if sr != nil && sr.Status == statusFailed {
				status = "failed"
			}
			t.rows = append(t.rows, []string{tg.Figure, "", "", "", target, status + " (" + tg.Suite + ")"})
			continue
		}
		var matched []string
		for _, name := range sr.names {
			if _, ok := sr.value(name, tg.Unit); ok && tg.re.MatchString(name) {
				matched = append(matched, name)
			}
		}
		if len(matched) == 0 {
			t.rows = append(t.rows, []string{tg.Figure, "", "", "", target, "missing"})
			continue
		}
		for _, name := range matched {
			fig := tg.Figure
			if len(matched) > 1 {
				fig += " (" + name + ")"
			}
			v, _ := sr.value(name, tg.Unit)
			row := []string{fig, fmtNum(v) + " " + unitText(tg.Unit), "", "", target, ""}
			var r float64
			haveRatio := false
			if tg.Baseline != "" {
				b := sr.Suite.baseline(tg.Baseline)
				if bname, bunit, ok := b.of(name, tg.Unit); ok {
					if bv, ok := sr.value(bname, bunit); ok {
						row[2] = fmtNum(bv) + " " + unitText(bunit) + " (" + b.Label + ")"
						row[3] = ratio(v, bv)
						r, haveRatio = v/bv, bv != 0
					} else {
						row[2] = "n/a (" + b.Label + ")"
					}
				}
			}
			x := v
			if tg.OnRatio {
				x = r
			}
			switch {
			case tg.Info != "":
				row[5] = "n/a"
			case tg.OnRatio && !haveRatio:
				row[5] = "no baseline"
			case (tg.Op == ">=" && x >= tg.Limit) || (tg.Op == "<" && x < tg.Limit):
				row[5] = "yes"
			default:
				row[5] = "NO"
			}
			t.rows = append(t.rows, row)
		}
	}
	return t
}

func (rep *Report) suitesTable() *table {
	t := &table{header: []string{"suite", "package", "status", "notes"}}
	for _, sr := range rep.Suites {
		t.rows = append(t.rows, []string{sr.Suite.Name, sr.Suite.Pkg, sr.Status, sr.Note})
	}
	return t
}

func (rep *Report) printFigures(w io.Writer) {
	fmt.Fprintf(w, "\nEvery figure with its baseline and ratio (ratio = value / baseline; medians when a benchmark ran more than once).\n")
	for _, sr := range rep.Suites {
		if len(sr.Results) == 0 {
			continue
		}
		fmt.Fprintf(w, "\n== %s (%s): %s\n\n", sr.Suite.Name, sr.Suite.Pkg, sr.Suite.About)
		if sr.Suite.Name == brokerSuite {
			if t := sr.brokerOverview(); t != nil {
				t.text(w)
				fmt.Fprintln(w)
			}
		}
		sr.figures().text(w)
	}
}

func (rep *Report) printSummary(w io.Writer) {
	fmt.Fprintf(w, "\n== summary\n\n")
	rep.suitesTable().text(w)
	fmt.Fprintln(w)
	rep.summary().text(w)
}

// write writes the plot and the markdown report into dir.
func (rep *Report) write(dir string, log io.Writer) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	if sr := rep.suite(brokerSuite); sr != nil && len(sr.Results) > 0 {
		path := filepath.Join(dir, plotFile)
		ok, err := writePlot(sr, path)
		if err != nil {
			return fmt.Errorf("plot: %w", err)
		}
		if ok {
			rep.Plot = plotFile
			fmt.Fprintf(log, "\nwrote %s\n", path)
		}
	}
	path := filepath.Join(dir, reportFile)
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	rep.markdown(f)
	if err := f.Close(); err != nil {
		return err
	}
	fmt.Fprintf(log, "wrote %s\n", path)
	return nil
}

func (rep *Report) markdown(w io.Writer) {
	m := rep.Machine
	fmt.Fprintf(w, "# Benchmark report: latest run\n\n")
	fmt.Fprintf(w, "Written by `%s` (hack/benchreport); edit the program, not this file.\n\n", shellQuote("go run ./hack/benchreport", rep.Args))
	if len(rep.From) > 0 {
		fmt.Fprintf(w, "* Made on %s from saved go test output (%s): the machine and tree below are where the report was made, "+
			"which need not be where the benchmarks ran.\n", rep.Started.UTC().Format("2006-01-02 15:04:05 MST"), strings.Join(rep.From, ", "))
	} else {
		fmt.Fprintf(w, "* Run: %s to %s (%s).\n", rep.Started.UTC().Format("2006-01-02 15:04:05 MST"),
			rep.Finished.UTC().Format("15:04:05 MST"), rep.Finished.Sub(rep.Started).Round(time.Second))
	}
	if m.Commit != "" {
		fmt.Fprintf(w, "* Tree: %s.\n", m.Commit)
	}
	fmt.Fprintf(w, "* CPU: %s.\n", m.CPU)
	if m.Memory != "" {
		fmt.Fprintf(w, "* Memory: %s.\n", m.Memory)
	}
	if m.Kernel != "" {
		fmt.Fprintf(w, "* Kernel: Linux %s.\n", m.Kernel)
	}
	fmt.Fprintf(w, "* Go: `%s`.\n", m.Go)
	fmt.Fprintf(w, "* Redis: `%s`.\n", m.Redis)
	if m.LoadStart != "" {
		fmt.Fprintf(w, "* Load average (1, 5, 15 min): %s at the start, %s at the end. Other work on the machine shares its cores: read the ratios within one run rather than the absolute figures.\n", m.LoadStart, m.LoadEnd)
	}

	fmt.Fprintf(w, "\n## Summary\n\n")
	rep.suitesTable().markdown(w)
	fmt.Fprintln(w)
	rep.summary().markdown(w)

	if sr := rep.suite(brokerSuite); sr != nil && len(sr.Results) > 0 {
		fmt.Fprintf(w, "\n## Decision latency vs number of clusters\n\n")
		if rep.Plot != "" {
			fmt.Fprintf(w, "![decision latency (p50, p99) vs clusters, full scan vs index](%s)\n\n", rep.Plot)
			fmt.Fprintf(w, "The plot shows the %s runs; log scales. ", plotMode)
		}
		if t := sr.brokerOverview(); t != nil {
			fmt.Fprintf(w, "Serial: one caller, so p50/p99 are the decision's own latency seen by the client, Redis round trip included. "+
				"Parallel: 16 in flight, so p50/p99 include queueing.\n\n")
			t.markdown(w)
		}
	}

	fmt.Fprintf(w, "\n## Every figure, with its baseline and ratio\n\nRatio = value / baseline. With `-count` > 1, medians.\n")
	for _, sr := range rep.Suites {
		if len(sr.Results) == 0 {
			continue
		}
		fmt.Fprintf(w, "\n### %s: %s\n\n", sr.Suite.Name, sr.Suite.About)
		sr.figures().markdown(w)
	}

	fmt.Fprintf(w, "\n## Commands\n\nRun from the repository root, one after the other:\n\n```sh\n")
	for _, sr := range rep.Suites {
		for _, o := range sr.Runs {
			took := ""
			if o.Took > 0 {
				took = fmt.Sprintf("   # %s", o.Took.Round(time.Second))
			}
			fmt.Fprintf(w, "%s%s\n", o.Command, took)
		}
	}
	fmt.Fprintf(w, "```\n")

	fmt.Fprintf(w, "\n## Raw results\n\nThe benchmark lines as go test printed them (benchstat reads this block).\n\n<details><summary>go test -bench output</summary>\n\n```text\n")
	for _, sr := range rep.Suites {
		if len(sr.Results) == 0 {
			continue
		}
		for _, c := range sr.Config {
			fmt.Fprintln(w, c)
		}
		for _, r := range sr.Results {
			fmt.Fprintln(w, r.Line)
		}
	}
	fmt.Fprintf(w, "```\n\n</details>\n")
}

func opText(op string) string {
	if op == ">=" {
		return "≥"
	}
	return op
}

// unitText shortens units in the summary, where the figure's name says what
// is measured: "p99-ms" is "ms", "agent-MiB" is "MiB", "agent-idle-%cpu" is
// "% CPU".
func unitText(u string) string {
	switch {
	case strings.HasSuffix(u, "-ms") && strings.HasPrefix(u, "p"):
		return "ms"
	case strings.HasSuffix(u, "-MiB") && !strings.Contains(u, "/"):
		return "MiB"
	case strings.HasSuffix(u, "-%cpu") && !strings.Contains(u, "/"):
		return "% CPU"
	}
	return u
}

// fmtLimit prints a target's limit as written: 0.3, 5, 20,000.
func fmtLimit(v float64) string {
	if v >= 1000 && v == math.Trunc(v) {
		return fmtInt(v)
	}
	return strconv.FormatFloat(v, 'f', -1, 64)
}

func ratio(v, base float64) string {
	if base == 0 {
		return "n/a"
	}
	return fmtNum(v / base)
}

// fmtNum prints a figure with three or so significant digits and thousands
// separators.
func fmtNum(v float64) string {
	a := math.Abs(v)
	switch {
	case math.IsNaN(v) || math.IsInf(v, 0):
		return strconv.FormatFloat(v, 'g', -1, 64)
	case a == 0:
		return "0"
	case a >= 999.5:
		return fmtInt(v)
	case a >= 99.95:
		return strconv.FormatFloat(v, 'f', 0, 64)
	case a >= 9.995:
		return strconv.FormatFloat(v, 'f', 1, 64)
	case a >= 0.9995:
		return strconv.FormatFloat(v, 'f', 2, 64)
	case a >= 0.001:
		return strconv.FormatFloat(v, 'f', 2-int(math.Floor(math.Log10(a))), 64)
	default:
		return strconv.FormatFloat(v, 'g', 3, 64)
	}
}

// fmtInt rounds to an integer with thousands separators.
func fmtInt(v float64) string {
	s := strconv.FormatFloat(math.Round(math.Abs(v)), 'f', 0, 64)
	var b strings.Builder
	if v < 0 {
		b.WriteByte('-')
	}
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	return b.String()
}

func plural(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}
