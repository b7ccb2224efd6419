// Package redistest starts a real redis-server for tests: one process per
// call, on a free loopback port, with its data in the test's temp dir, stopped
// when the test ends. It never falls back to an in-process fake.
package redistest

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// InstallHint is printed when redis-server is not on PATH.
const InstallHint = "redis-server not found on PATH: install it (Debian/Ubuntu: `apt-get install -y redis-server`; " +
	"macOS: `brew install redis`) or set REDIS_SERVER to its path; .ci/run installs it"

// Server is a running redis-server.
type Server struct {
	Addr string
	Dir  string
	cmd  *exec.Cmd
	args []string
	t    testing.TB
}

// Option changes the server's configuration.
type Option func(*[]string)

// WithAppendOnly turns on AOF persistence (appendonly yes, fsync every second).
func WithAppendOnly() Option {
	return func(a *[]string) { *a = append(*a, "--appendonly", "yes", "--appendfsync", "everysec") }
}

// Binary returns the redis-server path, or an error with InstallHint.
func Binary() (string, error) {
	if p := os.Getenv("REDIS_SERVER"); p != "" {
		if _, err := os.Stat(p); err != nil {
			return "", fmt.Errorf("REDIS_SERVER=%s: %w; %s", p, err, InstallHint)
		}
		return p, nil
	}
	p, err := exec.LookPath("redis-server")
	if err != nil {
		return "", fmt.Errorf("%s", InstallHint)
	}
	return p, nil
}

// Start runs a fresh redis-server for t and stops it at cleanup.
func Start(t testing.TB, opts ...Option) *Server {
	t.Helper()
	bin, err := Binary()
	if err != nil {
		t.Fatal(err)
	}
	args := []string{"--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--protected-mode", "no"}
	for _, o := range opts {
		o(&args)
	}
	s := &Server{Dir: t.TempDir(), args: args, t: t}
	var lastErr error
	for attempt := 0; attempt < 5; attempt++ { // a free port can be taken before we bind it
		port, err := freePort()
		if err != nil {
			t.Fatal(err)
		}
		s.Addr = net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
		if lastErr = s.start(bin); lastErr == nil {
			t.Cleanup(s.Stop)
			return s
		}
	}
	t.Fatalf("start redis-server: %v", lastErr)
	return nil
}

func (s *Server) start(bin string) error {
	_, port, _ := net.SplitHostPort(s.Addr)
	args := append([]string{"--port", port, "--dir", s.Dir}, s.args...)
	s.cmd = exec.Command(bin, args...)
	logf, err := os.Create(filepath.Join(s.Dir, "redis.log"))
	if err != nil {
		return err
	}
	s.cmd.Stdout, s.cmd.Stderr = logf, logf
	if err := s.cmd.Start(); err != nil {
		return err
	}
	exited := make(chan error, 1)
	go func() { exited <- s.cmd.Wait(); logf.Close() }()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case err := <-exited:
			return fmt.Errorf("redis-server exited: %w; log:\n%s", err, tail(filepath.Join(s.Dir, "redis.log")))
		default:
		}
		c := redis.NewClient(&redis.Options{Addr: s.Addr, MaxRetries: -1})
		err := c.Ping(context.Background()).Err()
		c.Close()
		if err == nil {
			return nil
		}
		time.Sleep(10 * time.Millisecond)
	}
	_ = s.cmd.Process.Kill()
	return fmt.Errorf("redis-server did not answer PING within 10s")
}

// Client returns a new client for the server, closed at cleanup.
func (s *Server) Client() *redis.Client {
	c := redis.NewClient(&redis.Options{Addr: s.Addr, PoolSize: 64})
	s.t.Cleanup(func() { _ = c.Close() })
	return c
}

// Stop kills the server (idempotent).
func (s *Server) Stop() {
	if s.cmd != nil && s.cmd.Process != nil {
		_ = s.cmd.Process.Kill()
		for i := 0; i < 200; i++ { // wait until the port is free for a restart
			if c, err := net.DialTimeout("tcp", s.Addr, 20*time.Millisecond); err != nil {
				break
			} else {
				c.Close()
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
}

// Restart stops the server and starts it again on the same port and data dir
// (with appendonly, the data survives).
func (s *Server) Restart() {
	s.t.Helper()
	s.Stop()
	bin, err := Binary()
	if err != nil {
		s.t.Fatal(err)
	}
	if err := s.start(bin); err != nil {
		s.t.Fatalf("restart redis-server: %v", err)
	}
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func tail(path string) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	var lines []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		lines = append(lines, sc.Text())
		if len(lines) > 20 {
			lines = lines[1:]
		}
	}
	return strings.Join(lines, "\n")
}
