package main

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Run is one go test invocation of a suite.
type Run struct {
	Bench     string // -bench
	Benchtime string // -benchtime
	Timeout   string // -timeout; empty: go test's default (10m)
}

// Baseline pairs a figure with the one it is compared with: for a benchmark
// whose name matches Match, the baseline's name is the name with Match
// replaced by Replace (empty Replace: the same benchmark); Units maps the
// figure's unit to the baseline's unit (nil: every unit, to itself; otherwise
// only the units listed have this baseline).
type Baseline struct {
	Label   string
	Match   string
	Replace string
	Units   map[string]string

	re *regexp.Regexp
}

// Suite is a group of benchmarks of one package.
type Suite struct {
	Name      string
	Pkg       string
	About     string
	Runs      []Run
	Baselines []Baseline
}

// Target is a goal a figure is checked against in the summary.
type Target struct {
	Suite    string
	Figure   string
	Name     string // regular expression on the benchmark name
	Unit     string
	Baseline string // label of one of the suite's baselines; may be empty
	OnRatio  bool   // the limit applies to value / baseline
	Op       string // ">=" or "<"; empty with Info
	Limit    float64
	// Info, when set, makes the row a figure shown beside a target, not
	// checked against one (Op and Limit unset): it says why (such as the
	// burst beside the paced run the end-to-end target is read on) and
	// takes the place of the target.
	Info string

	re *regexp.Regexp
}

// of returns the baseline of a figure, if this rule gives it one.
func (b *Baseline) of(name, unit string) (string, string, bool) {
	if !b.re.MatchString(name) {
		return "", "", false
	}
	bunit := unit
	if b.Units != nil {
		u, ok := b.Units[unit]
		if !ok {
			return "", "", false
		}
		bunit = u
	}
	bname := name
	if b.Replace != "" {
		bname = b.re.ReplaceAllString(name, b.Replace)
	}
	if bname == name && bunit == unit {
		return "", "", false
	}
	return bname, bunit, true
}

func suiteNames() []string {
	var out []string
	for _, s := range suites {
		out = append(out, s.Name)
	}
	return out
}

// validateTables compiles the regular expressions of the tables above and
// checks that targets name existing suites and baselines.
func validateTables() error {
	for i := range suites {
		for j := range suites[i].Baselines {
			b := &suites[i].Baselines[j]
			re, err := regexp.Compile(b.Match)
			if err != nil {
				return fmt.Errorf("suite %s, baseline %q: %w", suites[i].Name, b.Label, err)
			}
			b.re = re
		}
		for _, r := range suites[i].Runs {
			for _, lv := range splitPattern(r.Bench) {
				if _, err := regexp.Compile(lv); err != nil {
					return fmt.Errorf("suite %s, -bench %q: %w", suites[i].Name, r.Bench, err)
				}
			}
		}
	}
	for i := range targets {
		t := &targets[i]
		re, err := regexp.Compile(t.Name)
		if err != nil {
			return fmt.Errorf("target %q: %w", t.Figure, err)
		}
		t.re = re
		s := suiteByName(t.Suite)
		if s == nil {
			return fmt.Errorf("target %q: no suite %q", t.Figure, t.Suite)
		}
		if t.Baseline != "" && s.baseline(t.Baseline) == nil {
			return fmt.Errorf("target %q: suite %s has no baseline %q", t.Figure, t.Suite, t.Baseline)
		}
		if t.OnRatio && t.Baseline == "" {
			return fmt.Errorf("target %q: a ratio needs a baseline", t.Figure)
		}
		switch {
		case t.Info != "" && (t.Op != "" || t.Limit != 0 || t.OnRatio):
			return fmt.Errorf("target %q: an Info row has no op, limit or ratio", t.Figure)
		case t.Info == "" && t.Op != ">=" && t.Op != "<":
			return fmt.Errorf("target %q: op %q (>= or <)", t.Figure, t.Op)
		}
	}
	return nil
}

func suiteByName(name string) *Suite {
	for i := range suites {
		if suites[i].Name == name {
			return &suites[i]
		}
	}
	return nil
}

func (s *Suite) baseline(label string) *Baseline {
	for i := range s.Baselines {
		if s.Baselines[i].Label == label {
			return &s.Baselines[i]
		}
	}
	return nil
}

// selectSuites returns the names selected by --only (all when empty).
func selectSuites(only string) (map[string]bool, error) {
	sel := map[string]bool{}
	if strings.TrimSpace(only) == "" {
		for _, s := range suites {
			sel[s.Name] = true
		}
		return sel, nil
	}
	for _, n := range strings.Split(only, ",") {
		n = strings.TrimSpace(n)
		if n == "" {
			continue
		}
		if suiteByName(n) == nil {
			return nil, fmt.Errorf("--only: no suite %q (suites: %s)", n, strings.Join(suiteNames(), ", "))
		}
		sel[n] = true
	}
	return sel, nil
}

// applyBenchtime overrides the -benchtime of the selected suites' runs:
// "200x" for all of them, or "broker=200x,e2e=1x".
func applyBenchtime(sel map[string]bool, v string) error {
	v = strings.TrimSpace(v)
	if v == "" {
		return nil
	}
	set := func(name, bt string) {
		s := suiteByName(name)
		for i := range s.Runs {
			s.Runs[i].Benchtime = bt
		}
	}
	if !strings.Contains(v, "=") {
		for name := range sel {
			set(name, v)
		}
		return nil
	}
	for _, kv := range strings.Split(v, ",") {
		k, bt, ok := strings.Cut(strings.TrimSpace(kv), "=")
		if !ok || bt == "" {
			return fmt.Errorf("--benchtime: %q is not suite=value", kv)
		}
		if suiteByName(k) == nil {
			return fmt.Errorf("--benchtime: no suite %q", k)
		}
		set(k, bt)
	}
	return nil
}

// args is the go test command line of a run.
func (r Run) args(pkg string, count int) []string {
	a := []string{"test", "-run", "^$", "-bench", r.Bench, "-benchtime", r.Benchtime}
	if count > 1 {
		a = append(a, "-count", strconv.Itoa(count))
	}
	if r.Timeout != "" {
		a = append(a, "-timeout", r.Timeout)
	}
	return append(a, pkg)
}

// shellQuote renders a command so that it can be pasted into a shell.
func shellQuote(name string, args []string) string {
	parts := []string{name}
	for _, a := range args {
		if a == "" || strings.ContainsAny(a, " \t\n'\"$\\|&;()<>*?[]{}^!#~`") {
			a = "'" + strings.ReplaceAll(a, "'", `'\''`) + "'"
		}
		parts = append(parts, a)
	}
	return strings.Join(parts, " ")
}

func printSuites(w io.Writer, sel map[string]bool) {
	for _, s := range suites {
		if sel != nil && !sel[s.Name] {
			continue
		}
		fmt.Fprintf(w, "  %-10s %s: %s\n", s.Name, s.Pkg, s.About)
		for _, r := range s.Runs {
			fmt.Fprintf(w, "      %s\n", shellQuote("go", r.args(s.Pkg, 1)))
		}
	}
}

// moduleRoot is the folder of the main module's go.mod.
func moduleRoot() (string, error) {
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		return "", fmt.Errorf("go env GOMOD: %w", err)
	}
	gomod := strings.TrimSpace(string(out))
	if gomod == "" || gomod == os.DevNull {
		return "", errors.New("not inside a Go module: run from the repository")
	}
	return filepath.Dir(gomod), nil
}

var benchFunc = regexp.MustCompile(`(?m)^func (Benchmark\w*)\(\w+ \*testing\.B\)`)

// benchmarksIn lists the Benchmark functions declared in the _test.go files
// of a package folder.
func benchmarksIn(dir string) ([]string, error) {
	files, err := filepath.Glob(filepath.Join(dir, "*_test.go"))
	if err != nil {
		return nil, err
	}
	var names []string
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			return nil, err
		}
		for _, m := range benchFunc.FindAllSubmatch(b, -1) {
			names = append(names, string(m[1]))
		}
	}
	return names, nil
}

// declared reports whether one of the functions is selected by the top level
// of the run's -bench pattern.
func (r Run) declared(funcs []string) bool {
	re, err := regexp.Compile(splitPattern(r.Bench)[0])
	if err != nil {
		return false
	}
	return slices.ContainsFunc(funcs, re.MatchString)
}

// RunOutcome is what one go test invocation did.
type RunOutcome struct {
	Command  string
	Took     time.Duration
	ExitErr  string // empty when go test exited 0
	Failed   []string
	Skipped  []Skip
	NResults int
}

// execute runs one go test invocation in root, streaming its output to
// progress, and returns what the parser read.
func execute(root, pkg string, r Run, count int, progress io.Writer) (*Parser, RunOutcome) {
	args := r.args(pkg, count)
	o := RunOutcome{Command: shellQuote("go", args)}
	fmt.Fprintf(progress, "\n>> %s\n", o.Command)
	cmd := exec.Command("go", args...)
	cmd.Dir = root
	pr, pw, err := os.Pipe()
	p := NewParser()
	if err != nil {
		o.ExitErr = err.Error()
		return p, o
	}
	cmd.Stdout, cmd.Stderr = pw, pw
	began := time.Now()
	if err := cmd.Start(); err != nil {
		_ = pr.Close()
		_ = pw.Close()
		o.ExitErr = err.Error()
		return p, o
	}
	_ = pw.Close()
	// The tee shows partial lines at once: testing prints a benchmark's name
	// before it runs it.
	sc := bufio.NewScanner(io.TeeReader(pr, progress))
	sc.Buffer(make([]byte, 64<<10), 16<<20)
	for sc.Scan() {
		p.Line(sc.Text())
	}
	if err := sc.Err(); err != nil {
		// Keep draining so that go test is not blocked on a full pipe.
		_, _ = io.Copy(progress, pr)
	}
	_ = pr.Close()
	if err := cmd.Wait(); err != nil {
		o.ExitErr = err.Error()
	}
	o.Took = time.Since(began)
	o.Failed, o.Skipped, o.NResults = p.Failed, p.Skipped, len(p.Results)
	fmt.Fprintf(progress, "<< %s: %d results in %s", o.Command, o.NResults, o.Took.Round(time.Millisecond))
	if o.ExitErr != "" {
		fmt.Fprintf(progress, ", %s", o.ExitErr)
	}
	fmt.Fprintln(progress)
	return p, o
}
