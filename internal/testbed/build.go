package testbed

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"syscall"
	"time"
)

// Binaries the bed runs, built from this module's cmd/.
var Binaries = []string{"rb-broker", "rb-agent", "rb-scheduler"}

// BinDirEnv names a directory of prebuilt binaries; when set, nothing is built.
const BinDirEnv = "RB_TESTBED_BIN"

// DefaultBinDir is where Build puts the binaries when Options.BinDir is
// empty: a directory per module checkout under the user's cache, so that a
// second run finds them up to date (go build skips a target whose build ID
// matches) instead of linking rb-scheduler again.
func DefaultBinDir(moduleRoot string) (string, error) {
	if d := os.Getenv(BinDirEnv); d != "" {
		return d, nil
	}
	cache, err := os.UserCacheDir()
	if err != nil {
		cache = os.TempDir()
	}
	sum := sha256.Sum256([]byte(moduleRoot))
	return filepath.Join(cache, "rb-testbed", hex.EncodeToString(sum[:6])), nil
}

// Build runs `go build -o dir/ ./cmd/...` for Binaries in moduleRoot, under a
// lock so that concurrent test processes do not write the same files.
func Build(ctx context.Context, moduleRoot, dir string) (time.Duration, error) {
	began := time.Now()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return 0, err
	}
	lock, err := os.OpenFile(filepath.Join(dir, ".lock"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return 0, err
	}
	defer lock.Close()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		return 0, fmt.Errorf("lock %s: %w", dir, err)
	}
	defer syscall.Flock(int(lock.Fd()), syscall.LOCK_UN) //nolint:errcheck // closing releases it too

	args := []string{"build", "-o", dir + string(os.PathSeparator)}
	for _, b := range Binaries {
		args = append(args, "./cmd/"+b)
	}
	cmd := exec.CommandContext(ctx, goCommand(), args...)
	cmd.Dir = moduleRoot
	out, err := cmd.CombinedOutput()
	if err != nil {
		return 0, fmt.Errorf("go %v: %w\n%s", args, err, out)
	}
	return time.Since(began), nil
}

func goCommand() string {
	if p, err := exec.LookPath("go"); err == nil {
		return p
	}
	return filepath.Join(runtime.GOROOT(), "bin", "go") //nolint:staticcheck // fallback when go is not on PATH
}
