package bridgetest

import (
	"bytes"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
)

// Logger records log lines in memory and prints the last ones when the test
// fails (or all of them, to stderr, as they come when RB_TEST_LOG is set). It
// never calls t.Log after the test, so late goroutines cannot panic it.
func Logger(t testing.TB, verbosity int) logr.Logger {
	var mu sync.Mutex
	var buf bytes.Buffer
	live := os.Getenv("RB_TEST_LOG") != ""
	start := time.Now()
	l := funcr.New(func(prefix, args string) {
		line := fmt.Sprintf("%7.3fs %s %s\n", time.Since(start).Seconds(), prefix, args)
		if live {
			fmt.Fprint(os.Stderr, line)
			return
		}
		mu.Lock()
		buf.WriteString(line)
		mu.Unlock()
	}, funcr.Options{Verbosity: verbosity})
	t.Cleanup(func() {
		if !t.Failed() || live {
			return
		}
		mu.Lock()
		defer mu.Unlock()
		lines := strings.Split(buf.String(), "\n")
		if len(lines) > 400 {
			lines = lines[len(lines)-400:]
		}
		t.Logf("last log lines:\n%s", strings.Join(lines, "\n"))
	})
	return l
}
