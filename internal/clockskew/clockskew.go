// Package clockskew runs a C program (the tests' redis-server) with its wall
// clock moved by a fixed offset: an LD_PRELOAD library built from csrc/skew.c with
// the host's C compiler. Go programs read the clock through the vDSO, not
// libc, so it cannot move them; the tests move the broker's clock (Redis'
// TIME) instead, which is the same skew seen from the agents.
package clockskew

import (
	_ "embed"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"time"
)

//go:embed csrc/skew.c
var source []byte

// OffsetEnv is the variable the library reads its offset from (milliseconds).
const OffsetEnv = "RB_CLOCK_OFFSET_MS"

// InstallHint is returned when no C compiler is found.
const InstallHint = "cc not found: install a C compiler (Debian/Ubuntu: apt-get install -y gcc libc6-dev); .ci/run installs it"

// Build compiles the library into dir and returns its path.
func Build(dir string) (string, error) {
	cc, err := exec.LookPath("cc")
	if err != nil {
		return "", fmt.Errorf("%s", InstallHint)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	src, lib := filepath.Join(dir, "skew.c"), filepath.Join(dir, "libskew.so")
	if err := os.WriteFile(src, source, 0o644); err != nil {
		return "", err
	}
	out, err := exec.Command(cc, "-shared", "-fPIC", "-O2", "-Wall", "-o", lib, src).CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("build %s: %v\n%s", lib, err, out)
	}
	return lib, nil
}

// Env is the environment that runs a program with the library at lib and
// its wall clock moved by offset.
func Env(lib string, offset time.Duration) []string {
	return []string{"LD_PRELOAD=" + lib, OffsetEnv + "=" + strconv.FormatInt(offset.Milliseconds(), 10)}
}
