// Package realnode runs real Kubernetes worker nodes on one Linux host, for
// the test bed and the demo: per node a mount namespace of its own, its own
// containerd (two kubelets on one containerd kill each other's sandboxes),
// a kubelet built from go.mod's Kubernetes version, and bridge CNI with a
// pod CIDR of its own. A node reports the size it is given (a copy of
// /proc/meminfo and fake NUMA CPU entries in its namespace), so a 2-core
// host can hold a 2-CPU and a 4-CPU node.
//
// Addresses come only from 198.18.0.0/15 (RFC 2544's benchmark range): node
// addresses are /32s, pod CIDRs are /24s on one bridge per node, and a
// blackhole route for the whole range keeps anything addressed to it on
// this machine. A node with Config.OwnNetwork is a network namespace of its
// own, wired to one host bridge by a veth and routed by the host
// (network.go), and may run kube-proxy; otherwise its address is on the
// host bridge and its bridge in the host's namespace. The facts behind every setting are in
// ../shared/design/REAL-NODES.md.
//
// Everything a node starts is removed again: processes by pid (and, for
// what a killed test left, by their command line under Root or their
// cgroup), cgroups, bridges, addresses, state. Acquire removes the leftovers
// of an earlier run first, so a killed test is harmless to the next one.
//
//	host, err := realnode.Acquire(ctx, logf) // one user of real nodes per host at a time
//	defer host.Close()
//	n, err := host.StartNode(ctx, realnode.Config{Name: "paris-1", IP: "198.18.0.11", ...})
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
	"sync"
	"syscall"
	"time"
)

const (
	// Root holds every node's state (containerd's root, the kubelet's
	// directories, configuration); its contents are removed on Close.
	Root = "/var/lib/rb-realnode"
	// runDir holds the host lock and the saved ip_forward setting.
	runDir = "/run/rb-realnode"
	// HostBridge carries the nodes' (and agents') addresses.
	HostBridge = "rbtb0"
	// bridgePrefix names the nodes' CNI bridges: rbn<index>.
	bridgePrefix = "rbn"
	// cgroupPrefix names the nodes' cgroup roots: /rbn-<node>.
	cgroupPrefix = "rbn-"
	// Range is the only address range the nodes use.
	Range = "198.18.0.0/15"
)

// Tools the nodes need on PATH (besides the kubelet, which Config names).
var tools = []string{"containerd", "containerd-shim-runc-v2", "runc", "ctr", "unshare", "nsenter", "setsid", "ip", "iptables-restore", "sysctl", "mount"}

// cniPlugins are the CNI plugins a node's network uses.
var cniPlugins = []string{"bridge", "host-local", "loopback"}

// CNIBinDir is where Debian's containernetworking-plugins installs them.
const CNIBinDir = "/usr/lib/cni"

// Check tells whether real nodes can run on this machine: root, Linux
// cgroup v1 hierarchies (what the recipe was verified on), containerd, runc,
// the CNI plugins. The error lists everything missing and how to get it.
func Check() error {
	var missing []string
	if os.Geteuid() != 0 {
		missing = append(missing, "root (mount namespaces, cgroups, bridges)")
	}
	for _, t := range tools {
		if _, err := exec.LookPath(t); err != nil {
			missing = append(missing, t)
		}
	}
	for _, p := range cniPlugins {
		if _, err := os.Stat(filepath.Join(CNIBinDir, p)); err != nil {
			missing = append(missing, filepath.Join(CNIBinDir, p))
		}
	}
	for _, h := range cgroupHierarchies() {
		if h == "" {
			missing = append(missing, "cgroup v1 hierarchies under /sys/fs/cgroup")
			break
		}
	}
	if len(missing) == 0 {
		return nil
	}
	return fmt.Errorf("real nodes cannot run here: missing %s (make node-deps installs containerd, runc and the CNI plugins)",
		strings.Join(missing, ", "))
}

// Host is this machine while a user of real nodes holds it.
type Host struct {
	logf func(string, ...any)
	lock *os.File

	mu     sync.Mutex
	nodes  []*Node
	closed bool
}

// Acquire takes the host for real nodes (waiting while another process
// holds it), removes what an earlier run left, and sets up the host network:
// the bridge for node addresses and the blackhole route for Range.
func Acquire(ctx context.Context, logf func(string, ...any)) (*Host, error) {
	if logf == nil {
		logf = func(string, ...any) {}
	}
	if err := Check(); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(runDir, 0o755); err != nil {
		return nil, err
	}
	lock, err := os.OpenFile(filepath.Join(runDir, "host.lock"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, err
	}
	for {
		err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			break
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) {
			lock.Close()
			return nil, fmt.Errorf("lock %s: %w", lock.Name(), err)
		}
		select {
		case <-ctx.Done():
			lock.Close()
			return nil, fmt.Errorf("waiting for the host (another test bed holds %s): %w", lock.Name(), ctx.Err())
		case <-time.After(200 * time.Millisecond):
		}
	}
	h := &Host{logf: logf, lock: lock}
	if left := removeLeftovers(); len(left) > 0 {
		logf("realnode: removed what an earlier run left: %s", strings.Join(left, "; "))
	}
	if err := h.setupNetwork(); err != nil {
		_ = h.Close()
		return nil, fmt.Errorf("host network: %w", err)
	}
	return h, nil
}

func (h *Host) setupNetwork() error {
	// Saved once per host, restored by cleanup: the bridge plugin (isGateway)
	// turns on forwarding host-wide.
	saved := filepath.Join(runDir, "ip_forward.orig")
	if _, err := os.Stat(saved); errors.Is(err, os.ErrNotExist) {
		v, err := os.ReadFile("/proc/sys/net/ipv4/ip_forward")
		if err != nil {
			return err
		}
		if err := os.WriteFile(saved, v, 0o644); err != nil {
			return err
		}
	}
	for _, args := range [][]string{
		{"link", "add", HostBridge, "type", "bridge"},
		{"link", "set", HostBridge, "up"},
		{"addr", "add", Gateway + "/32", "dev", HostBridge},
		{"route", "add", "blackhole", Range},
	} {
		if err := ip(args...); err != nil {
			return err
		}
	}
	// The host routes between nodes with networks of their own.
	return os.WriteFile("/proc/sys/net/ipv4/ip_forward", []byte("1\n"), 0o644)
}

// AddAddress puts addr (a /32 of Range) on the host bridge, for a node's
// kubelet or another endpoint the nodes' API servers must reach.
func (h *Host) AddAddress(addr string) error {
	if err := inRange(addr); err != nil {
		return err
	}
	return ip("addr", "add", addr+"/32", "dev", HostBridge)
}

func inRange(addr string) error {
	_, r, _ := net.ParseCIDR(Range)
	parsed := net.ParseIP(addr)
	if parsed == nil || !r.Contains(parsed) {
		return fmt.Errorf("address %q: must be an IPv4 address of %s", addr, Range)
	}
	return nil
}

// StopNodes stops every node and removes all of it, and keeps the host
// network (and the addresses on the host bridge) until Close.
func (h *Host) StopNodes() error {
	h.mu.Lock()
	nodes := h.nodes
	h.nodes = nil
	h.mu.Unlock()
	return stopNodes(nodes)
}

// Close stops every node and removes all of it, restores ip_forward and
// releases the host.
func (h *Host) Close() error {
	h.mu.Lock()
	if h.closed {
		h.mu.Unlock()
		return nil
	}
	h.closed = true
	nodes := h.nodes
	h.mu.Unlock()
	errs := []error{stopNodes(nodes)}
	errs = append(errs, teardownNetwork())
	// What Stop and teardownNetwork missed is a bug of ours: remove it, and say so.
	if left := removeLeftovers(); len(left) > 0 {
		errs = append(errs, fmt.Errorf("left behind and removed now: %s", strings.Join(left, "; ")))
	}
	if h.lock != nil {
		_ = syscall.Flock(int(h.lock.Fd()), syscall.LOCK_UN)
		h.lock.Close()
	}
	return errors.Join(errs...)
}

func stopNodes(nodes []*Node) error {
	var errs []error
	var wg sync.WaitGroup
	var emu sync.Mutex
	for _, n := range nodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := n.Stop(); err != nil {
				emu.Lock()
				errs = append(errs, err)
				emu.Unlock()
			}
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

func ip(args ...string) error {
	out, err := exec.Command("ip", args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("ip %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}
