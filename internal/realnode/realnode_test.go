package realnode

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestCPUEntriesNameOnlyRealCPUIDs(t *testing.T) {
	assert.Equal(t, []string{"cpu0:0", "cpu1:1", "cpu00:2", "cpu01:3"}, cpuEntries(4, 2))
	assert.Equal(t, []string{"cpu0:0"}, cpuEntries(1, 2))
	assert.Equal(t, []string{"cpu0:0", "cpu00:1", "cpu000:2"}, cpuEntries(3, 1))
}

func TestFakeMeminfoSetsMemTotal(t *testing.T) {
	raw, err := fakeMeminfo(8 << 30)
	require.NoError(t, err)
	assert.Contains(t, string(raw), fmt.Sprintf("MemTotal:       %d kB\n", (8<<30)/1024))
	assert.Contains(t, string(raw), "MemFree:", "the other lines stay")
}

func TestConfigValidationNamesEachProblem(t *testing.T) {
	err := Config{Name: "Bad_Name", IP: "10.0.0.1", PodCIDR: "192.168.0.0/24", CPU: 0, Memory: 1}.validate()
	require.Error(t, err)
	for _, want := range []string{`name "Bad_Name"`, `address "10.0.0.1": must be an IPv4 address of 198.18.0.0/15`,
		`pod CIDR "192.168.0.0/24"`, "at least 1 CPU and 1 GiB", "kubelet:", "no pause image", "no log directory"} {
		assert.Contains(t, err.Error(), want)
	}
}

// fakeNode is a node whose "kubelet" is a script: the node's namespace,
// mounts and containerd are real, the kubelet is not (these tests are about
// the harness, not about Kubernetes).
func fakeNode(t *testing.T, name, ip string, index int, kubeletScript string) Config {
	dir := t.TempDir()
	kubelet := filepath.Join(dir, "kubelet")
	require.NoError(t, os.WriteFile(kubelet, []byte("#!/bin/sh\n"+kubeletScript+"\n"), 0o755))
	for _, f := range []string{"kubeconfig", "ca.crt", "tls.crt", "tls.key"} {
		require.NoError(t, os.WriteFile(filepath.Join(dir, f), nil, 0o600))
	}
	return Config{Name: name, IP: ip, PodCIDR: fmt.Sprintf("198.19.%d.0/24", 200+index), BridgeIndex: 200 + index,
		CPU: 2, Memory: 2 << 30, KubeletPath: kubelet, Kubeconfig: filepath.Join(dir, "kubeconfig"),
		ClientCAFile: filepath.Join(dir, "ca.crt"), ServingCertFile: filepath.Join(dir, "tls.crt"),
		ServingKeyFile: filepath.Join(dir, "tls.key"), PauseImage: "rb.test/pause:3.10", LogDir: filepath.Join(dir, "logs")}
}

func requireHost(t *testing.T) {
	t.Helper()
	require.NoError(t, Check(), "the real-node tests need root, containerd, runc and the CNI plugins (make node-deps)")
}

// hostState is what a node may leave behind, to compare before and after.
func hostState() string {
	var parts []string
	if pids := processesUnder(); len(pids) > 0 {
		parts = append(parts, fmt.Sprintf("processes %v", pids))
	}
	if dirs := cgroupDirs(""); len(dirs) > 0 {
		parts = append(parts, fmt.Sprintf("cgroups %v", dirs))
	}
	if br := nodeBridges(); len(br) > 0 {
		parts = append(parts, fmt.Sprintf("bridges %v", br))
	}
	if _, err := net.InterfaceByName(HostBridge); err == nil {
		parts = append(parts, "host bridge")
	}
	if entries, _ := os.ReadDir(Root); len(entries) > 0 {
		parts = append(parts, fmt.Sprintf("%d entries in %s", len(entries), Root))
	}
	if m := mountsUnder(); len(m) > 0 {
		parts = append(parts, fmt.Sprintf("mounts %v", m))
	}
	return strings.Join(parts, "; ")
}

func TestANodeThatCannotStartFailsWithItsStepAndLeavesNothing(t *testing.T) {
	requireHost(t)
	// The host's own setting: the one a run killed before restoring it saved
	// (Acquire restores it), else the current one.
	forward, err := os.ReadFile(filepath.Join(runDir, "ip_forward.orig"))
	if errors.Is(err, os.ErrNotExist) {
		forward, err = os.ReadFile("/proc/sys/net/ipv4/ip_forward")
	}
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	h, err := Acquire(ctx, t.Logf)
	require.NoError(t, err)
	cfg := fakeNode(t, "rn-test-fails", "198.18.0.250", 1, "echo 'kubelet: cannot start' >&2; exit 1")
	_, err = h.StartNode(ctx, cfg)
	require.Error(t, err)
	assert.Contains(t, err.Error(), `step "kubelet"`, "the error names the step")
	assert.Contains(t, err.Error(), filepath.Join(cfg.LogDir, "kubelet.log"), "and the log to read")
	require.NoError(t, h.Close(), "Close finds nothing left behind")
	assert.Empty(t, hostState())
	after, err := os.ReadFile("/proc/sys/net/ipv4/ip_forward")
	require.NoError(t, err)
	assert.Equal(t, string(forward), string(after), "ip_forward restored")
}

// killedChildEnv makes the test binary, run again, a process that starts a
// node and waits to be killed (as a test that crashed or timed out).
const killedChildEnv = "RB_REALNODE_KILLED_CHILD"

func TestMain(m *testing.M) {
	if os.Getenv(killedChildEnv) != "" {
		os.Exit(runKilledChild())
	}
	os.Exit(m.Run())
}

func runKilledChild() int {
	ctx := context.Background()
	h, err := Acquire(ctx, nil)
	if err != nil {
		fmt.Fprintln(os.Stderr, "child:", err)
		return 1
	}
	dir := os.Getenv(killedChildEnv)
	kubelet := filepath.Join(dir, "kubelet")
	cfg := Config{Name: "rn-test-killed", IP: "198.18.0.251", PodCIDR: "198.19.250.0/24", BridgeIndex: 250, CPU: 2, Memory: 2 << 30,
		KubeletPath: kubelet, Kubeconfig: kubelet, ClientCAFile: kubelet, ServingCertFile: kubelet, ServingKeyFile: kubelet,
		PauseImage: "rb.test/pause:3.10", LogDir: filepath.Join(dir, "logs")}
	fmt.Println("starting")
	_, err = h.StartNode(ctx, cfg) // waits for a healthz that never comes: the parent kills us first
	fmt.Fprintln(os.Stderr, "child: StartNode returned:", err)
	return 1
}

func TestAKilledRunIsRemovedByTheNextAcquire(t *testing.T) {
	requireHost(t)
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "kubelet"), []byte("#!/bin/sh\nexec sleep 600\n"), 0o755))
	exe, err := os.Executable()
	require.NoError(t, err)
	child := exec.Command(exe, "-test.run=^$")
	child.Env = append(os.Environ(), killedChildEnv+"="+dir)
	out := &strings.Builder{}
	child.Stdout, child.Stderr = out, out
	require.NoError(t, child.Start())
	// Killed once its node runs: containerd and the "kubelet" are up (the
	// child may first wait for the host while another test bed holds it).
	deadline := time.Now().Add(5 * time.Minute)
	for {
		raw, _ := os.ReadFile(filepath.Join(dir, "logs", "node.log"))
		if strings.Contains(string(raw), "node rn-test-killed: running") {
			break
		}
		if time.Now().After(deadline) {
			_ = child.Process.Kill()
			_ = child.Wait()
			t.Fatalf("the child's node never ran; child:\n%s\nnode.log:\n%s", out, raw)
		}
		time.Sleep(100 * time.Millisecond)
	}
	require.NoError(t, child.Process.Signal(syscall.SIGKILL))
	_ = child.Wait()
	require.NotEmpty(t, hostState(), "the killed run left its node behind")

	var said []string
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	h, err := Acquire(ctx, func(f string, a ...any) { said = append(said, fmt.Sprintf(f, a...)) })
	require.NoError(t, err, "the lock of a killed process is free")
	require.Len(t, said, 1, "Acquire says what it removed")
	assert.Contains(t, said[0], "processes")
	assert.Contains(t, said[0], "bridge "+HostBridge)
	require.NoError(t, h.Close())
	assert.Empty(t, hostState())
}
