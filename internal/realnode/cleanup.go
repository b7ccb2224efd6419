package realnode

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// cgroupHierarchies lists the mounted cgroup v1 hierarchies ("" when there
// are none), and the v2 tree of a hybrid host where it is mounted.
func cgroupHierarchies() []string {
	var out []string
	for _, h := range []string{"cpu", "cpuacct", "cpuset", "memory", "devices", "freezer", "blkio", "pids", "systemd", "hugetlb", "net_cls", "net_prio", "perf_event", "unified"} {
		p := filepath.Join("/sys/fs/cgroup", h)
		if fi, err := os.Stat(p); err == nil && fi.IsDir() {
			if _, err := os.Stat(filepath.Join(p, "cgroup.procs")); err == nil {
				out = append(out, p)
			}
		}
	}
	if len(out) == 0 {
		return []string{""}
	}
	return out
}

// processesUnder lists the pids whose command line mentions Root: node
// scripts, containerd, its shims (-address <Root>/...), kubelets.
func processesUnder() []int {
	entries, _ := os.ReadDir("/proc")
	var pids []int
	self := os.Getpid()
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == self {
			continue
		}
		cmdline, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil {
			continue
		}
		if bytes.Contains(cmdline, []byte(Root+"/")) {
			pids = append(pids, pid)
		}
	}
	return pids
}

// cgroupDirs lists a node's cgroups (cgroupPrefix+node, or every node's when
// node is ""), deepest first, across hierarchies.
func cgroupDirs(node string) []string {
	var dirs []string
	for _, h := range cgroupHierarchies() {
		if h == "" {
			continue
		}
		tops, _ := filepath.Glob(filepath.Join(h, cgroupPrefix+nodeOrAll(node)))
		for _, top := range tops {
			_ = filepath.WalkDir(top, func(p string, d os.DirEntry, err error) error {
				if err == nil && d.IsDir() {
					dirs = append(dirs, p)
				}
				return nil
			})
		}
	}
	sort.Slice(dirs, func(i, j int) bool { return strings.Count(dirs[i], "/") > strings.Count(dirs[j], "/") })
	return dirs
}

func nodeOrAll(node string) string {
	if node == "" {
		return "*"
	}
	return node
}

// killCgroups SIGKILLs every process in the cgroups (containers whose shim
// is gone would otherwise live on) and removes the cgroups, deepest first.
func killCgroups(dirs []string) error {
	for range 50 {
		alive := 0
		for _, d := range dirs {
			for _, pid := range readPids(filepath.Join(d, "cgroup.procs")) {
				alive++
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
		}
		if alive == 0 {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	var errs []error
	for _, d := range dirs {
		var err error
		for range 50 { // a cgroup whose last process just died may be busy for a moment
			if err = os.Remove(d); err == nil || errors.Is(err, os.ErrNotExist) {
				err = nil
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("remove cgroup %s: %w", d, err))
		}
	}
	return errors.Join(errs...)
}

func readPids(path string) []int {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil
	}
	var pids []int
	for _, f := range strings.Fields(string(raw)) {
		if pid, err := strconv.Atoi(f); err == nil {
			pids = append(pids, pid)
		}
	}
	return pids
}

// killPids sends SIGTERM, waits up to grace, then SIGKILLs what is left.
func killPids(pids []int, grace time.Duration) {
	for _, pid := range pids {
		_ = syscall.Kill(pid, syscall.SIGTERM)
	}
	deadline := time.Now().Add(grace)
	for time.Now().Before(deadline) {
		if !anyAlive(pids) {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	for _, pid := range pids {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	for range 100 {
		if !anyAlive(pids) {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func anyAlive(pids []int) bool {
	for _, pid := range pids {
		// A zombie still answers kill 0: look at its state instead.
		stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			continue
		}
		if i := bytes.LastIndexByte(stat, ')'); i > 0 && i+2 < len(stat) && stat[i+2] == 'Z' {
			continue
		}
		return true
	}
	return false
}

// nodeBridges lists the CNI bridges of the nodes (rbn<index>) in the host's
// network namespace.
func nodeBridges() []string {
	var out []string
	for _, l := range hostLinks() {
		if strings.HasPrefix(l, bridgePrefix) && l != HostBridge {
			out = append(out, l)
		}
	}
	return out
}

func hostLinks() []string {
	ifaces, _ := net.Interfaces()
	out := make([]string, 0, len(ifaces))
	for _, i := range ifaces {
		out = append(out, i.Name)
	}
	return out
}

// mountsUnder lists mount points under Root in this mount namespace (none
// when the nodes ran in their own, as they do).
func mountsUnder() []string {
	raw, _ := os.ReadFile("/proc/self/mountinfo")
	var out []string
	for _, line := range strings.Split(string(raw), "\n") {
		f := strings.Fields(line)
		if len(f) > 4 && strings.HasPrefix(f[4], Root+"/") {
			out = append(out, f[4])
		}
	}
	sort.Sort(sort.Reverse(sort.StringSlice(out)))
	return out
}

// teardownNetwork removes the host bridge and the blackhole route and
// restores ip_forward.
func teardownNetwork() error {
	var errs []error
	if _, err := net.InterfaceByName(HostBridge); err == nil {
		errs = append(errs, ip("link", "del", HostBridge))
	}
	if out, _ := exec.Command("ip", "route", "show", "type", "blackhole", Range).Output(); len(bytes.TrimSpace(out)) > 0 {
		errs = append(errs, ip("route", "del", "blackhole", Range))
	}
	saved := filepath.Join(runDir, "ip_forward.orig")
	if v, err := os.ReadFile(saved); err == nil {
		errs = append(errs, os.WriteFile("/proc/sys/net/ipv4/ip_forward", v, 0o644))
		errs = append(errs, os.Remove(saved))
	}
	return errors.Join(errs...)
}

// removeLeftovers removes whatever nodes of this package left on the host
// (processes, cgroups, bridges, mounts, state, the host network) and says
// what it found. Only called while holding the host lock.
func removeLeftovers() []string {
	var found []string
	if pids := processesUnder(); len(pids) > 0 {
		found = append(found, fmt.Sprintf("processes %v", pids))
		killPids(pids, 2*time.Second)
	}
	if dirs := cgroupDirs(""); len(dirs) > 0 {
		found = append(found, fmt.Sprintf("%d cgroups", len(dirs)))
		if err := killCgroups(dirs); err != nil {
			found = append(found, err.Error())
		}
	}
	namespaces, veths := nodeNetworks()
	for _, ns := range namespaces {
		found = append(found, "network namespace "+ns)
		if err := ip("netns", "del", ns); err != nil {
			found = append(found, err.Error())
		}
	}
	for _, v := range veths {
		found = append(found, "veth "+v)
		_ = ip("link", "del", v) // gone with its namespace, usually
	}
	for _, br := range nodeBridges() {
		found = append(found, "bridge "+br)
		if err := ip("link", "del", br); err != nil {
			found = append(found, err.Error())
		}
	}
	for _, m := range mountsUnder() {
		found = append(found, "mount "+m)
		if err := syscall.Unmount(m, syscall.MNT_DETACH); err != nil {
			found = append(found, fmt.Sprintf("unmount %s: %v", m, err))
		}
	}
	if entries, _ := os.ReadDir(Root); len(entries) > 0 {
		found = append(found, fmt.Sprintf("%d node directories in %s", len(entries), Root))
		for _, e := range entries {
			if err := os.RemoveAll(filepath.Join(Root, e.Name())); err != nil {
				found = append(found, err.Error())
			}
		}
	}
	if _, err := net.InterfaceByName(HostBridge); err == nil {
		found = append(found, "bridge "+HostBridge)
	}
	if _, err := os.Stat(filepath.Join(runDir, "ip_forward.orig")); err == nil {
		found = append(found, "ip_forward not restored")
	}
	if err := teardownNetwork(); err != nil {
		found = append(found, err.Error())
	}
	return found
}
