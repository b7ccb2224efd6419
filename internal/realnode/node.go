package realnode

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"
)

//go:embed node.sh
var nodeScript []byte

// Config describes one node.
type Config struct {
	// Name is the node's name (a DNS-1123 label, at most 40 characters).
	Name string
	// IP is the node's address (a /32 of Range, put on the host bridge):
	// the kubelet listens there and registers it as the node's InternalIP.
	IP string
	// PodCIDR is the node's pod network, a /24 of Range distinct from every
	// other node's; BridgeIndex names its bridge rbn<BridgeIndex>.
	PodCIDR     string
	BridgeIndex int
	// CPU (cores) and Memory (bytes) the node reports as its capacity.
	CPU    int
	Memory int64
	// Labels registered with the node.
	Labels map[string]string

	// KubeletPath is the kubelet binary.
	KubeletPath string
	// Kubeconfig holds the node's credentials (system:node:<Name> in
	// system:nodes).
	Kubeconfig string
	// ClientCAFile: callers of the kubelet API (the API server) present a
	// certificate of this CA; authorization is by the API server (webhook).
	ClientCAFile string
	// ServingCertFile and ServingKeyFile are the kubelet's serving
	// certificate (IP SAN = IP), so an API server started with
	// --kubelet-certificate-authority can verify it.
	ServingCertFile, ServingKeyFile string
	// Images are image tarballs imported into the node's containerd;
	// PauseImage (one of them) is the sandbox image.
	Images     []string
	PauseImage string
	// LogDir receives node.log, containerd.log and kubelet.log.
	LogDir string
	// ClusterDNS is the address of the cluster's DNS server (domain
	// cluster.local), which pods with dnsPolicy ClusterFirst resolve with;
	// empty: none, such pods resolve with the node's resolv.conf.
	ClusterDNS string
	// Verbosity of the kubelet (-v).
	Verbosity int

	// OwnNetwork puts the node in a network namespace of its own, as a
	// machine of its own: IP on its eth0, a veth whose other end is on the
	// host bridge; the host routes PodCIDR to IP and is the node's default
	// route (Gateway), so every node's pods reach every other's. kube-proxy
	// needs it: its rules hold for a whole network namespace.
	OwnNetwork bool
	// KubeProxyPath (with OwnNetwork) runs kube-proxy on the node, in
	// iptables mode, with the credentials of KubeProxyKubeconfig.
	KubeProxyPath, KubeProxyKubeconfig string
}

var nodeName = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]{0,38}[a-z0-9])?$`)

func (c Config) validate() error {
	var errs []error
	if !nodeName.MatchString(c.Name) {
		errs = append(errs, fmt.Errorf("name %q: a DNS-1123 label of at most 40 characters", c.Name))
	}
	if err := inRange(c.IP); err != nil {
		errs = append(errs, err)
	}
	_, r, _ := net.ParseCIDR(Range)
	if ipn, cidr, err := net.ParseCIDR(c.PodCIDR); err != nil || !r.Contains(ipn) {
		errs = append(errs, fmt.Errorf("pod CIDR %q: a subnet of %s", c.PodCIDR, Range))
	} else if ones, _ := cidr.Mask.Size(); ones > 28 {
		errs = append(errs, fmt.Errorf("pod CIDR %q: at least a /28", c.PodCIDR))
	}
	if c.CPU < 1 || c.Memory < 1<<30 {
		errs = append(errs, fmt.Errorf("size %d CPU, %d bytes: at least 1 CPU and 1 GiB", c.CPU, c.Memory))
	}
	for name, path := range map[string]string{"kubelet": c.KubeletPath, "kubeconfig": c.Kubeconfig, "client CA": c.ClientCAFile,
		"serving certificate": c.ServingCertFile, "serving key": c.ServingKeyFile} {
		if _, err := os.Stat(path); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", name, err))
		}
	}
	for _, img := range c.Images {
		if _, err := os.Stat(img); err != nil {
			errs = append(errs, fmt.Errorf("image: %w", err))
		}
	}
	if c.PauseImage == "" {
		errs = append(errs, errors.New("no pause image"))
	}
	if c.LogDir == "" {
		errs = append(errs, errors.New("no log directory"))
	}
	if c.KubeProxyPath != "" && !c.OwnNetwork {
		errs = append(errs, errors.New("kube-proxy needs a network of the node's own (OwnNetwork)"))
	}
	if c.KubeProxyPath != "" {
		for name, path := range map[string]string{"kube-proxy": c.KubeProxyPath, "kube-proxy kubeconfig": c.KubeProxyKubeconfig} {
			if _, err := os.Stat(path); err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", name, err))
			}
		}
	}
	if c.ClusterDNS != "" && net.ParseIP(c.ClusterDNS) == nil {
		errs = append(errs, fmt.Errorf("cluster DNS %q: not an IP address", c.ClusterDNS))
	}
	return errors.Join(errs...)
}

// Node is a running node.
type Node struct {
	Config
	dir    string
	sock   string
	cmd    *exec.Cmd
	done   chan struct{}
	logf   *os.File
	host   *Host
	exited error
}

// StartNode starts a node and returns once its kubelet answers on its
// healthz port (registration with the API server follows within a second;
// the caller, who has a client, waits for the Node to be Ready). On failure
// nothing of the node is left, and the error names the step and the log.
func (h *Host) StartNode(ctx context.Context, cfg Config) (*Node, error) {
	if err := cfg.validate(); err != nil {
		return nil, fmt.Errorf("node %s: %w", cfg.Name, err)
	}
	n := &Node{Config: cfg, dir: filepath.Join(Root, cfg.Name), host: h, done: make(chan struct{})}
	n.sock = filepath.Join(n.dir, "containerd.sock")
	h.mu.Lock()
	if h.closed {
		h.mu.Unlock()
		return nil, errors.New("host closed")
	}
	h.nodes = append(h.nodes, n)
	h.mu.Unlock()
	if err := n.start(ctx); err != nil {
		stopErr := n.Stop()
		return nil, errors.Join(fmt.Errorf("node %s: %w", cfg.Name, err), stopErr)
	}
	return n, nil
}

func (n *Node) start(ctx context.Context) error {
	if err := n.prepare(); err != nil {
		return fmt.Errorf("step \"prepare\": %w", err)
	}
	args := []string{"unshare", "--mount", "--propagation", "private", "--", "bash", filepath.Join(n.dir, "node.sh"), n.dir}
	if n.OwnNetwork {
		if err := n.setupNetwork(); err != nil {
			return fmt.Errorf("step \"network\": %w", err)
		}
		args = append([]string{"nsenter", "--net=" + n.netnsPath()}, args...)
	} else if err := n.host.AddAddress(n.IP); err != nil {
		return fmt.Errorf("step \"address\": %w", err)
	}
	var err error
	if n.logf, err = os.OpenFile(filepath.Join(n.LogDir, "node.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644); err != nil {
		return err
	}
	n.cmd = exec.Command("setsid", args...)
	n.cmd.Stdout, n.cmd.Stderr = n.logf, n.logf
	// The node outlives a crashed test process (its processes are in other
	// sessions anyway); the next Acquire removes it.
	if err := n.cmd.Start(); err != nil {
		return fmt.Errorf("step \"namespace\": %w", err)
	}
	go func() {
		n.exited = n.cmd.Wait()
		close(n.done)
	}()
	healthz := fmt.Sprintf("http://%s:10248/healthz", n.IP)
	deadline := time.Now().Add(90 * time.Second)
	for {
		if resp, err := http.Get(healthz); err == nil { //nolint:noctx // short-lived probe
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		select {
		case <-n.done:
			return fmt.Errorf("%s (see %s):\n%s", n.failedStep(), n.logf.Name(), n.tails())
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("kubelet not healthy within 90s (%s, see %s):\n%s", n.failedStep(), n.logf.Name(), n.tails())
		}
		// The step first: the script writes kubelet.pid before it logs
		// "running", so a pid read after seeing the step is this start's,
		// not the last test's (the node's directory outlives a test).
		if n.stepReached("running") && !n.kubeletAlive() {
			return fmt.Errorf("step \"kubelet\": the kubelet exited (see %s):\n%s", filepath.Join(n.LogDir, "kubelet.log"), n.tails())
		}
	}
}

// failedStep is the last step the node script logged (its failure, or the
// step it was in).
func (n *Node) failedStep() string {
	raw, _ := os.ReadFile(n.logf.Name())
	lines := strings.Split(strings.TrimSpace(string(raw)), "\n")
	for i := len(lines) - 1; i >= 0; i-- {
		if strings.Contains(lines[i], "node "+n.Name+": ") {
			return strings.TrimSpace(lines[i])
		}
	}
	return "the node script exited before its first step"
}

func (n *Node) stepReached(step string) bool {
	raw, _ := os.ReadFile(n.logf.Name())
	return strings.Contains(string(raw), "node "+n.Name+": "+step)
}

func (n *Node) tails() string {
	var b strings.Builder
	for _, f := range []string{"node.log", "containerd.log", "kubelet.log"} {
		p := filepath.Join(n.LogDir, f)
		if raw, err := os.ReadFile(p); err == nil {
			lines := strings.Split(strings.TrimRight(string(raw), "\n"), "\n")
			if len(lines) > 15 {
				lines = lines[len(lines)-15:]
			}
			fmt.Fprintf(&b, "--- %s:\n%s\n", p, strings.Join(lines, "\n"))
		}
	}
	return b.String()
}

// prepare writes the node's directory: the script and its parameters, the
// containerd, CNI and kubelet configurations, the fake meminfo, and the
// node's cgroup root in every hierarchy.
func (n *Node) prepare() error {
	for _, d := range []string{"kubelet", "cni", "containers", "sys", "pki", "pod-logs", "cni-conf", "ipam", "containerd"} {
		if err := os.MkdirAll(filepath.Join(n.dir, d), 0o755); err != nil {
			return err
		}
	}
	// Mount points of the node's namespace must exist on the host.
	for _, d := range []string{"/run/containerd", "/var/lib/kubelet", "/var/lib/cni", "/var/log/containers"} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return err
		}
	}
	if err := os.MkdirAll(n.LogDir, 0o755); err != nil {
		return err
	}
	meminfo, err := fakeMeminfo(n.Memory)
	if err != nil {
		return err
	}
	files := map[string][]byte{
		"node.sh":                             nodeScript,
		"node.env":                            []byte(n.env()),
		"meminfo":                             meminfo,
		"containerd.toml":                     []byte(n.containerdConfig()),
		"cni-conf/10-" + n.Name + ".conflist": []byte(n.cniConfig()),
		"kubelet.yaml":                        []byte(n.kubeletConfig()),
		"resolv.conf":                         []byte("# no cluster DNS in the test bed\noptions ndots:1\n"),
	}
	if n.KubeProxyPath != "" {
		files["kube-proxy.yaml"] = []byte(n.kubeProxyConfig())
	}
	for name, data := range files {
		if err := os.WriteFile(filepath.Join(n.dir, name), data, 0o644); err != nil {
			return err
		}
	}
	return n.makeCgroupRoot()
}

// makeCgroupRoot creates /rbn-<node> in every hierarchy; a cpuset cgroup
// needs its cpus and mems before a process may join.
func (n *Node) makeCgroupRoot() error {
	for _, h := range cgroupHierarchies() {
		d := filepath.Join(h, cgroupPrefix+n.Name)
		if err := os.MkdirAll(d, 0o755); err != nil {
			return fmt.Errorf("cgroup %s: %w", d, err)
		}
		if filepath.Base(h) == "cpuset" {
			for _, f := range []string{"cpuset.cpus", "cpuset.mems"} {
				v, err := os.ReadFile(filepath.Join(h, f))
				if err != nil {
					return err
				}
				if err := os.WriteFile(filepath.Join(d, f), v, 0o644); err != nil {
					return fmt.Errorf("cgroup %s/%s: %w", d, f, err)
				}
			}
		}
	}
	return nil
}

func (n *Node) env() string {
	var labels []string
	for k, v := range n.Labels {
		labels = append(labels, k+"="+v)
	}
	sort.Strings(labels)
	vars := [][2]string{
		{"NODE", n.Name}, {"NODE_IP", n.IP}, {"SOCK", n.sock}, {"LOG_DIR", n.LogDir},
		{"KUBELET", n.KubeletPath}, {"KUBECONFIG_FILE", n.Kubeconfig}, {"NODE_LABELS", strings.Join(labels, ",")},
		{"VERBOSITY", strconv.Itoa(n.Verbosity)}, {"IMAGES", strings.Join(n.Images, " ")},
		{"CPU_ENTRIES", strings.Join(cpuEntries(n.CPU, runtime.NumCPU()), " ")},
		{"KUBE_PROXY", n.KubeProxyPath},
	}
	var b strings.Builder
	for _, kv := range vars {
		fmt.Fprintf(&b, "%s=%s\n", kv[0], strconv.Quote(kv[1]))
	}
	return b.String()
}

// cpuEntries names the fake CPU entries of NUMA node 0 as name:core_id.
// cAdvisor counts the entries; their names parse to the host's real CPU
// ids (cpu0, cpu1, cpu00, cpu01, ... on a 2-core host): ids above the real
// ones make the kubelet write a cpuset the kernel refuses.
func cpuEntries(cores, hostCPUs int) []string {
	hostCPUs = max(hostCPUs, 1)
	out := make([]string, cores)
	for i := range cores {
		out[i] = fmt.Sprintf("cpu%s%d:%d", strings.Repeat("0", i/hostCPUs), i%hostCPUs, i)
	}
	return out
}

// fakeMeminfo is the host's /proc/meminfo with MemTotal set to bytes.
func fakeMeminfo(bytes int64) ([]byte, error) {
	raw, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return nil, err
	}
	lines := strings.Split(string(raw), "\n")
	for i, l := range lines {
		if strings.HasPrefix(l, "MemTotal:") {
			lines[i] = fmt.Sprintf("MemTotal:       %d kB", bytes/1024)
		}
	}
	return []byte(strings.Join(lines, "\n")), nil
}

func (n *Node) containerdConfig() string {
	return fmt.Sprintf(`version = 2
root = %q
state = "/run/containerd"
# The opt plugin would install into /opt/containerd, shared by every node.
disabled_plugins = ["io.containerd.internal.v1.opt"]

[grpc]
  address = %q

[ttrpc]
  address = ""

[debug]
  address = ""

[metrics]
  address = ""

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = %q
  # Without it every sandbox fails: "can't get final child's PID from pipe".
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = %q
    conf_dir = %q
  [plugins."io.containerd.grpc.v1.cri".containerd]
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
`, filepath.Join(n.dir, "containerd"), n.sock, n.PauseImage, CNIBinDir, filepath.Join(n.dir, "cni-conf"))
}

// BridgeName is the node's CNI bridge.
func (n *Node) BridgeName() string { return bridgePrefix + strconv.Itoa(n.BridgeIndex) }

func (n *Node) cniConfig() string {
	return fmt.Sprintf(`{
  "cniVersion": "1.0.0",
  "name": %q,
  "plugins": [
    {
      "type": "bridge",
      "bridge": %q,
      "isGateway": true,
      "ipMasq": false,
      "hairpinMode": true,
      "ipam": {
        "type": "host-local",
        "ranges": [[{"subnet": %q}]],
        "routes": [{"dst": "0.0.0.0/0"}],
        "dataDir": %q
      }
    }
  ]
}
`, n.Name, n.BridgeName(), n.PodCIDR, filepath.Join(n.dir, "ipam"))
}

func (n *Node) kubeletConfig() string {
	return fmt.Sprintf(`apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: %[1]s
port: 10250
readOnlyPort: 0
healthzBindAddress: %[1]s
healthzPort: 10248
containerRuntimeEndpoint: unix://%[2]s
imageServiceEndpoint: unix://%[2]s
cgroupDriver: cgroupfs
cgroupRoot: /%[3]s
failSwapOn: false
failCgroupV1: false
makeIPTablesUtilChains: false
resolvConf: %[4]s
podLogsDir: %[5]s
tlsCertFile: %[6]s
tlsPrivateKeyFile: %[7]s
authentication:
  anonymous:
    enabled: false
  webhook:
    enabled: true
  x509:
    clientCAFile: %[8]s
authorization:
  mode: Webhook
# memory.available is the node's (faked) capacity minus the whole host's
# working set: on a busy host a small node would evict its pods for memory
# other nodes or builds use. 0%% turns that signal off.
evictionHard:
  memory.available: "0%%"
  nodefs.available: 1%%
  nodefs.inodesFree: 1%%
  imagefs.available: 1%%
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
serializeImagePulls: false
maxPods: 110
# The node's lease is renewed every quarter of its duration: every 2.5 s
# instead of 10 s, so that on a loaded host a kubelet a few seconds late does
# not go NotReady under the beds' short node-monitor-grace-period (its
# capacity would leave the cluster's advertisement while reservations hold it).
nodeLeaseDurationSeconds: 10
%[9]s`, n.IP, n.sock, cgroupPrefix+n.Name, filepath.Join(n.dir, "resolv.conf"), filepath.Join(n.dir, "pod-logs"),
		n.ServingCertFile, n.ServingKeyFile, n.ClientCAFile, n.clusterDNSConfig())
}

func (n *Node) clusterDNSConfig() string {
	if n.ClusterDNS == "" {
		return ""
	}
	return fmt.Sprintf("clusterDomain: cluster.local\nclusterDNS:\n  - %s\n", n.ClusterDNS)
}

func (n *Node) pidOf(name string) int {
	raw, err := os.ReadFile(filepath.Join(n.dir, name+".pid"))
	if err != nil {
		return 0
	}
	pid, _ := strconv.Atoi(strings.TrimSpace(string(raw)))
	return pid
}

func (n *Node) kubeletAlive() bool {
	pid := n.pidOf("kubelet")
	return pid > 0 && anyAlive([]int{pid})
}

// KillKubelet SIGKILLs the node's kubelet, as a crash would, and keeps it
// down until StartKubelet: containerd and the containers keep running, the
// Node stops reporting.
func (n *Node) KillKubelet() error {
	pid := n.pidOf("kubelet")
	if pid == 0 || !n.kubeletAlive() {
		return fmt.Errorf("node %s: no kubelet running", n.Name)
	}
	if err := os.WriteFile(filepath.Join(n.dir, "kubelet.held"), nil, 0o644); err != nil {
		return err
	}
	killPids([]int{pid}, 0)
	return nil
}

// StartKubelet starts the kubelet KillKubelet stopped, and returns once it
// is healthy.
func (n *Node) StartKubelet(ctx context.Context) error {
	old := n.pidOf("kubelet")
	if err := os.Remove(filepath.Join(n.dir, "kubelet.held")); err != nil {
		return fmt.Errorf("node %s: kubelet not held down: %w", n.Name, err)
	}
	healthz := fmt.Sprintf("http://%s:10248/healthz", n.IP)
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		if pid := n.pidOf("kubelet"); pid != old && pid > 0 {
			if resp, err := http.Get(healthz); err == nil { //nolint:noctx // short-lived probe
				resp.Body.Close()
				if resp.StatusCode == http.StatusOK {
					return nil
				}
			}
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-n.done:
			return fmt.Errorf("node %s exited (see %s)", n.Name, n.logf.Name())
		case <-time.After(100 * time.Millisecond):
		}
	}
	return fmt.Errorf("node %s: kubelet not healthy within 60s after restart (see %s)", n.Name, filepath.Join(n.LogDir, "kubelet.log"))
}

// RunningTasks lists the container tasks (sandboxes and containers) that
// run on the node, from its containerd.
func (n *Node) RunningTasks(ctx context.Context) ([]string, error) {
	out, err := exec.CommandContext(ctx, "ctr", "--address", n.sock, "-n", "k8s.io", "tasks", "ls").Output()
	if err != nil {
		return nil, fmt.Errorf("node %s: ctr tasks ls: %w", n.Name, err)
	}
	var tasks []string
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n")[1:] {
		if f := strings.Fields(line); len(f) >= 3 && f[2] == "RUNNING" {
			tasks = append(tasks, f[0])
		}
	}
	return tasks, nil
}

// Stop stops the node and removes all of it: the kubelet, the containers
// (by their cgroups), the shims, containerd, the cgroups, the node's bridge
// and address, its directory. Safe to call more than once.
func (n *Node) Stop() error {
	var errs []error
	_ = os.WriteFile(filepath.Join(n.dir, "stopping"), nil, 0o644) // the script's loop ends with the kubelet
	if pid := n.pidOf("kubelet"); pid > 0 {
		killPids([]int{pid}, 10*time.Second)
	}
	// Containers first (their shims would restart nothing, but a shim
	// killed first leaves its container running), then shims and containerd.
	errs = append(errs, killCgroups(cgroupDirs(n.Name)))
	var rest []int
	for _, pid := range processesUnder() {
		cmdline, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		if strings.Contains(string(cmdline), n.dir+"/") || strings.Contains(string(cmdline), n.dir+"\x00") {
			rest = append(rest, pid)
		}
	}
	killPids(rest, 5*time.Second)
	if n.cmd != nil && n.cmd.Process != nil {
		select {
		case <-n.done:
		case <-time.After(10 * time.Second):
			_ = n.cmd.Process.Signal(syscall.SIGKILL)
			<-n.done
		}
	}
	if n.logf != nil {
		n.logf.Close()
	}
	if n.OwnNetwork {
		errs = append(errs, n.teardownNetwork())
	} else {
		if _, err := net.InterfaceByName(n.BridgeName()); err == nil {
			errs = append(errs, ip("link", "del", n.BridgeName()))
		}
		if n.IP != "" {
			_ = ip("addr", "del", n.IP+"/32", "dev", HostBridge)
		}
	}
	if err := os.RemoveAll(n.dir); err != nil {
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("stop node %s: %w", n.Name, err)
	}
	return nil
}

// CPUTime is the CPU the node has used so far: its kubelet, containerd and
// containerd's shims (with the runc runs they waited for), and its pods (the
// cpuacct cgroup under its cgroup root). Shims of pods that are gone no
// longer count.
func (n *Node) CPUTime() time.Duration {
	var total time.Duration
	for _, pid := range processesUnder() {
		cmdline, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		if strings.Contains(string(cmdline), n.dir+"/") {
			total += processCPU(pid)
		}
	}
	if raw, err := os.ReadFile(filepath.Join("/sys/fs/cgroup/cpuacct", cgroupPrefix+n.Name, "cpuacct.usage")); err == nil {
		ns, _ := strconv.ParseInt(strings.TrimSpace(string(raw)), 10, 64)
		total += time.Duration(ns)
	}
	return total
}

// processCPU is a process's user and system time, its waited-for children's
// included (USER_HZ = 100).
func processCPU(pid int) time.Duration {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	i := strings.LastIndexByte(string(raw), ')')
	if i < 0 {
		return 0
	}
	f := strings.Fields(string(raw[i+1:]))
	if len(f) < 15 {
		return 0
	}
	var ticks int64
	for _, v := range f[11:15] { // utime, stime, cutime, cstime
		t, _ := strconv.ParseInt(v, 10, 64)
		ticks += t
	}
	return time.Duration(ticks) * time.Second / 100
}

// ImportImages imports image tarballs into the running node's containerd,
// as an operator loads images onto a node that has no registry to pull from.
func (n *Node) ImportImages(ctx context.Context, paths ...string) error {
	for _, p := range paths {
		out, err := exec.CommandContext(ctx, "ctr", "--address", n.sock, "-n", "k8s.io", "images", "import", p).CombinedOutput()
		if err != nil {
			return fmt.Errorf("node %s: import %s: %w: %s", n.Name, p, err, strings.TrimSpace(string(out)))
		}
	}
	return nil
}
