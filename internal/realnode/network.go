package realnode

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
)

// A node with a network of its own (Config.OwnNetwork) is wired as a
// machine on a routed network:
//
//	pod ── rbn<i> (CNI bridge, pod CIDR) ── node netns rbnet-<node>: eth0 IP/32
//	     ── veth rbv<i> ── host bridge rbtb0 (Gateway) ── every other node
//
// The host routes each node's address and pod CIDR to it and forwards
// between them: the flat pod network a production federation gets from
// Liqo's network, Submariner, Cilium ClusterMesh or a routed VPC.
const (
	// Gateway is the host's address on the host bridge, every node's
	// default route.
	Gateway = "198.18.0.1"
	// netnsPrefix names the nodes' network namespaces: rbnet-<node>.
	netnsPrefix = "rbnet-"
	// vethPrefix names the host ends of the nodes' veths: rbv<index>.
	vethPrefix = "rbv"
	// netnsDir is where `ip netns` keeps its namespaces.
	netnsDir = "/run/netns"
)

func (n *Node) netnsName() string { return netnsPrefix + n.Name }
func (n *Node) netnsPath() string { return filepath.Join(netnsDir, n.netnsName()) }
func (n *Node) vethName() string  { return vethPrefix + strconv.Itoa(n.BridgeIndex) }

// setupNetwork makes the node's network namespace and wires it to the host.
func (n *Node) setupNetwork() error {
	ns, veth := n.netnsName(), n.vethName()
	steps := [][]string{
		{"netns", "add", ns},
		{"link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns},
		{"link", "set", veth, "master", HostBridge, "up"},
		{"-n", ns, "link", "set", "lo", "up"},
		{"-n", ns, "addr", "add", n.IP + "/32", "dev", "eth0"},
		{"-n", ns, "link", "set", "eth0", "up"},
		{"-n", ns, "route", "add", Gateway, "dev", "eth0", "scope", "link"},
		{"-n", ns, "route", "add", "default", "via", Gateway, "dev", "eth0"},
		{"route", "add", n.IP + "/32", "dev", HostBridge},
		{"route", "add", n.PodCIDR, "via", n.IP, "dev", HostBridge},
	}
	for _, args := range steps {
		if err := ip(args...); err != nil {
			return err
		}
	}
	// Forwarding for the node's pods; bridged pod-to-pod traffic through
	// iptables, so that a Service's reply from a pod on the same bridge is
	// un-NATed (kube-proxy's requirement, br_netfilter).
	out, err := exec.Command("ip", "netns", "exec", ns, "sysctl", "-qw",
		"net.ipv4.ip_forward=1", "net.bridge.bridge-nf-call-iptables=1").CombinedOutput()
	if err != nil {
		return fmt.Errorf("sysctl in %s: %w: %s", ns, err, strings.TrimSpace(string(out)))
	}
	return nil
}

// teardownNetwork removes the node's namespace (its CNI bridge and eth0 go
// with it), its veth and its host routes. Parts already gone are no error.
func (n *Node) teardownNetwork() error {
	var errs []error
	if _, err := os.Stat(n.netnsPath()); err == nil {
		errs = append(errs, ip("netns", "del", n.netnsName()))
	}
	_ = ip("link", "del", n.vethName()) // gone with the namespace, unless a process still held it
	_ = ip("route", "del", n.PodCIDR, "via", n.IP, "dev", HostBridge)
	_ = ip("route", "del", n.IP+"/32", "dev", HostBridge)
	return errors.Join(errs...)
}

// nodeNetworks lists the nodes' network namespaces and host veths.
func nodeNetworks() (namespaces, veths []string) {
	entries, _ := os.ReadDir(netnsDir)
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), netnsPrefix) {
			namespaces = append(namespaces, e.Name())
		}
	}
	for _, l := range hostLinks() {
		if strings.HasPrefix(l, vethPrefix) {
			veths = append(veths, l)
		}
	}
	return namespaces, veths
}

// kubeProxyConfig is the node's kube-proxy configuration: iptables mode;
// traffic from the node's own bridge is local, everything else that
// reaches a Service here (the host, other nodes and clusters) is
// masqueraded so its replies come back through this node; the host's
// conntrack limits are left alone (they are not the namespace's to set).
func (n *Node) kubeProxyConfig() string {
	return fmt.Sprintf(`apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection:
  kubeconfig: %s
hostnameOverride: %s
mode: iptables
detectLocalMode: BridgeInterface
detectLocal:
  bridgeInterface: %s
nodePortAddresses: [primary]
healthzBindAddress: 127.0.0.1:10256
metricsBindAddress: 127.0.0.1:10249
conntrack:
  maxPerCore: 0
  min: 0
  tcpEstablishedTimeout: 0s
  tcpCloseWaitTimeout: 0s
  udpTimeout: 0s
  udpStreamTimeout: 0s
iptables:
  minSyncPeriod: 200ms
`, n.KubeProxyKubeconfig, n.Name, n.BridgeName())
}
