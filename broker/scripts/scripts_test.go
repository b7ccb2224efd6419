package scripts

import (
	"io/fs"
	"regexp"
	"strings"
	"testing"
)

// The scripts are the broker's decision: each file is kept to what one
// reads in a sitting, and so is each function.
const (
	maxFileLines     = 300
	maxFunctionLines = 80
)

// functionStart matches a function definition; the function ends at the
// first "end" line at its indentation (the scripts indent by two spaces).
var functionStart = regexp.MustCompile(`^(\s*)(?:local\s+)?(?:function\s+[\w.:]+|[\w.]+\s*=\s*function)\s*\(|^(\s*).*\breturn function\s*\(|^(\s*)[^-]*[=,(]\s*function\s*\(`)

func luaFiles(t *testing.T) []string {
	var names []string
	err := fs.WalkDir(files, ".", func(path string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() && strings.HasSuffix(path, ".lua") {
			names = append(names, path)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return names
}

func TestScriptSizes(t *testing.T) {
	for _, name := range luaFiles(t) {
		b, err := files.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		lines := strings.Split(strings.TrimSuffix(string(b), "\n"), "\n")
		if len(lines) > maxFileLines {
			t.Errorf("%s: %d lines, more than %d", name, len(lines), maxFileLines)
		}
		for i, line := range lines {
			m := functionStart.FindStringSubmatch(line)
			if m == nil || strings.HasSuffix(strings.TrimSpace(line), " end") {
				continue // not a function, or one on a single line
			}
			indent := m[1] + m[2] + m[3]
			end := i
			for end < len(lines) && !strings.HasPrefix(lines[end], indent+"end") {
				end++
			}
			if n := end - i + 1; n > maxFunctionLines {
				t.Errorf("%s:%d: a function of %d lines, more than %d", name, i+1, n, maxFunctionLines)
			}
		}
	}
}

// TestSourcesResolveEveryInclude: every script loads with each include
// once, none left unresolved.
func TestSourcesResolveEveryInclude(t *testing.T) {
	for name := range All {
		src := Source(name)
		if strings.Contains(src, "-- @include") {
			t.Errorf("%s: an include is left unresolved", name)
		}
		for _, def := range []string{"local function now_ms(", "local function emit("} {
			if n := strings.Count(src, def); n > 1 {
				t.Errorf("%s: %q defined %d times", name, def, n)
			}
		}
	}
	if strings.Contains(Source("protect"), "local function end_reservation(") {
		t.Error("protect.lua carries includes it does not use")
	}
}
