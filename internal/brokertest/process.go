package brokertest

import (
	"errors"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fluidos-project/resource-broker/internal/testenv"
)

// Process is an rb-broker binary serving the same Redis with the same
// certificates as its Broker: the broker as deployed (its own process, its
// own GC settings), and a way to measure its CPU apart from its clients'.
type Process struct {
	URL    string // https://127.0.0.1:<port>, the mutual-TLS API
	Health string
	Pid    int
	Log    string // its standard error
}

// BuildBroker builds cmd/rb-broker of this module into dir and returns its path.
func BuildBroker(t testing.TB, dir string) string {
	t.Helper()
	root, err := testenv.ModuleRoot()
	require.NoError(t, err)
	bin := filepath.Join(dir, "rb-broker")
	cmd := exec.Command("go", "build", "-o", bin, "./cmd/rb-broker")
	cmd.Dir = root
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "go build ./cmd/rb-broker in %s: %s", root, out)
	return bin
}

// StartProcess runs bin (an rb-broker) on b's Redis (or Redis Cluster) and certificates, with
// the store settings given as flags (such as --stale-threshold=1h) and env
// added to its environment (such as GOGC=100), and stops it at cleanup.
func (b *Broker) StartProcess(bin string, env []string, flags ...string) *Process {
	b.t.Helper()
	api, health := freeAddr(b.t), freeAddr(b.t)
	logPath := filepath.Join(b.Dir, "rb-broker-"+strings.ReplaceAll(api, ":", "-")+".log")
	logf, err := os.Create(logPath)
	require.NoError(b.t, err)
	args := []string{"--listen-address=" + api, "--health-address=" + health, "--cert-dir=" + filepath.Join(b.Dir, "broker")}
	if b.Cluster != nil { // a broker of StartCells: its Redis Cluster (the flags name its cells)
		addrs := make([]string, len(b.Cluster.Primaries))
		for i, p := range b.Cluster.Primaries {
			addrs[i] = p.Addr
		}
		args = append(append(args, "--redis-cluster-addrs="+strings.Join(addrs, ",")), b.Cluster.Users.BrokerFlags()...)
	} else {
		args = append(append(args, "--redis-url=redis://"+b.Redis.Addr+"/0"), b.Redis.Users.BrokerFlags()...)
	}
	args = append(args, flags...)
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdout, cmd.Stderr = logf, logf
	require.NoError(b.t, cmd.Start())
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait(); logf.Close() }()
	b.t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(15 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
	})
	p := &Process{URL: "https://" + api, Health: "http://" + health, Pid: cmd.Process.Pid, Log: logPath}
	deadline := time.Now().Add(20 * time.Second)
	for {
		select {
		case err := <-exited:
			data, _ := os.ReadFile(logPath)
			b.t.Fatalf("rb-broker exited: %v\n%s", err, data)
		default:
		}
		if resp, err := http.Get(p.Health + "/readyz"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return p
			}
		}
		if time.Now().After(deadline) {
			data, _ := os.ReadFile(logPath)
			b.t.Fatalf("rb-broker not ready after 20s\n%s", data)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// CPU returns the CPU time (user + system) the process has used so far.
func (p *Process) CPU() (time.Duration, error) {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(p.Pid) + "/stat")
	if err != nil {
		return 0, err
	}
	// The command name (field 2) may hold spaces: count from the last ')'.
	i := strings.LastIndexByte(string(data), ')')
	if i < 0 {
		return 0, errors.New("unexpected /proc stat format")
	}
	f := strings.Fields(string(data[i+1:])) // f[0] is field 3 (state)
	if len(f) < 13 {
		return 0, errors.New("unexpected /proc stat format")
	}
	utime, err1 := strconv.ParseInt(f[11], 10, 64) // field 14
	stime, err2 := strconv.ParseInt(f[12], 10, 64) // field 15
	if err := errors.Join(err1, err2); err != nil {
		return 0, err
	}
	const ticksPerSecond = 100 // USER_HZ on Linux
	return time.Duration(utime+stime) * time.Second / ticksPerSecond, nil
}

func freeAddr(t testing.TB) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	return ln.Addr().String()
}
