package testbed

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"

	"github.com/fluidos-project/resource-broker/internal/realnode"
)

// With Options.Services the pods of a real-node bed reach Services and
// resolve their names as in a cluster with kube-proxy and CoreDNS:
//
//   - CoreDNS (bin/coredns, `make coredns-bin`, built from the Go module
//     proxy) runs per cluster as a host process on an address of its own,
//     serving cluster.local from the cluster's API server; every kubelet
//     has it as clusterDNS.
//   - kube-proxy cannot: every cluster of the bed shares the host's network
//     namespace, and kube-proxy owns host-wide chains (iptables) or a table
//     of fixed name (nftables), so a second cluster's kube-proxy would erase
//     the first's rules. serviceProxy stands in for it: per cluster, one
//     iptables chain of its own (RB-SVC-<cluster>) that DNATs each Service's
//     ClusterIP, load-balancer addresses and external IPs to its ready
//     endpoints (EndpointSlices, picked at random as kube-proxy's iptables
//     mode does), and masquerades that traffic so that replies from a pod on
//     the same bridge come back through the host. It also plays the
//     cloud's load-balancer controller: a LoadBalancer Service gets an
//     address of the cluster's pool (LoadBalancerCIDR) in its status.
//
// The service CIDRs and pools of all clusters are distinct and routed on
// the host, so a pod reaches another cluster's Services too (as over a
// flat network; the deploy test uses it for the broker's load balancer).

// CoreDNSBinEnv names the directory holding coredns (default <module root>/bin/coredns).
const CoreDNSBinEnv = "RB_COREDNS_BIN"

// ClusterDomain is the bed's cluster domain.
const ClusterDomain = "cluster.local"

// loadBalancerCIDR of the i-th cluster: its LoadBalancer Services' addresses.
func loadBalancerCIDR(i int) string { return fmt.Sprintf("198.18.%d.0/24", 150+i) }

// kubernetesServiceIP is the first address of the service CIDR, which the API
// server gives to Service default/kubernetes.
func kubernetesServiceIP(i int) string { return fmt.Sprintf("198.18.%d.1", 100+i) }

// CoreDNSDir is where coredns is: $RB_COREDNS_BIN, else <module root>/bin/coredns.
func CoreDNSDir(moduleRoot string) string {
	if d := os.Getenv(CoreDNSBinEnv); d != "" {
		return d
	}
	return filepath.Join(moduleRoot, "bin", "coredns")
}

// CheckCoreDNS tells whether coredns is built into CoreDNSDir.
func CheckCoreDNS(moduleRoot string) error {
	p := filepath.Join(CoreDNSDir(moduleRoot), "coredns")
	if _, err := os.Stat(p); err != nil {
		return fmt.Errorf("%s not found: run \"make coredns-bin\"", p)
	}
	return nil
}

// startClusterDNS runs the cluster's CoreDNS on an address of its own
// (c.DNSAddr, port 53) and waits until it resolves Service kubernetes.
func (c *Cluster) startClusterDNS(ctx context.Context) error {
	root := c.bed.moduleRoot
	if err := CheckCoreDNS(root); err != nil {
		return err
	}
	corefile := filepath.Join(c.dir, "Corefile")
	// No forward plugin: nothing outside the bed resolves anyway.
	conf := fmt.Sprintf(`.:53 {
    bind %s
    errors
    kubernetes %s in-addr.arpa ip6.arpa {
        kubeconfig %s
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
        ttl 5
    }
    cache 5
}
`, c.DNSAddr, ClusterDomain, c.Kubeconfig)
	if err := os.WriteFile(corefile, []byte(conf), 0o644); err != nil {
		return err
	}
	c.ClusterDNS = &Process{Name: "coredns-" + c.Name, Path: filepath.Join(CoreDNSDir(root), "coredns"),
		LogPath: filepath.Join(c.bed.LogDir, "coredns-"+c.Name+".log"),
		Args:    []string{"-conf", corefile}}
	if err := c.ClusterDNS.Start(); err != nil {
		return err
	}
	resolver := &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, network, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, network, net.JoinHostPort(c.DNSAddr, "53"))
	}}
	want := kubernetesServiceIP(c.index)
	return c.bed.poll(ctx, c.ClusterDNS, 60*time.Second, "CoreDNS of "+c.Name+" resolving kubernetes.default", func() (bool, error) {
		qctx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		addrs, err := resolver.LookupHost(qctx, "kubernetes.default.svc."+ClusterDomain)
		return err == nil && len(addrs) == 1 && addrs[0] == want, nil
	})
}

// serviceProxy is the stand-in for one cluster's kube-proxy (see above).
type serviceProxy struct {
	c       *Cluster
	chain   string
	lbPool  *net.IPNet
	kick    chan struct{}
	factory informers.SharedInformerFactory
	last    string // the rules last written
}

// startServiceProxy installs the cluster's chain and keeps it in step with
// its Services and EndpointSlices until the bed's context ends.
func (c *Cluster) startServiceProxy(ctx context.Context) error {
	_, pool, _ := net.ParseCIDR(loadBalancerCIDR(c.index))
	p := &serviceProxy{c: c, chain: "RB-SVC-" + c.Name, lbPool: pool, kick: make(chan struct{}, 1),
		factory: informers.NewSharedInformerFactory(c.Clientset, 0)}
	if len(p.chain) > 28 {
		return fmt.Errorf("cluster name %q too long for an iptables chain", c.Name)
	}
	p.teardown() // leftovers of a killed run
	if err := p.setup(); err != nil {
		return err
	}
	c.serviceProxy = p
	handler := cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { p.trigger() },
		UpdateFunc: func(any, any) { p.trigger() },
		DeleteFunc: func(any) { p.trigger() },
	}
	if _, err := p.factory.Core().V1().Services().Informer().AddEventHandler(handler); err != nil {
		return err
	}
	if _, err := p.factory.Discovery().V1().EndpointSlices().Informer().AddEventHandler(handler); err != nil {
		return err
	}
	runCtx := c.bed.ctx
	p.factory.Start(runCtx.Done())
	for typ, ok := range p.factory.WaitForCacheSync(ctx.Done()) {
		if !ok {
			return fmt.Errorf("%s: service proxy: %v informer did not sync", c.Name, typ)
		}
	}
	if err := p.sync(ctx); err != nil {
		return err
	}
	go p.run(runCtx)
	return nil
}

func (p *serviceProxy) trigger() {
	select {
	case p.kick <- struct{}{}:
	default:
	}
}

func (p *serviceProxy) run(ctx context.Context) {
	log := klog.FromContext(ctx).WithValues("cluster", p.c.Name, "component", "service-proxy")
	for {
		select {
		case <-ctx.Done():
			return
		case <-p.kick:
		}
		if err := p.sync(ctx); err != nil && ctx.Err() == nil {
			log.Error(err, "Syncing Service rules")
			time.AfterFunc(time.Second, p.trigger)
		}
	}
}

// postrouting is the rule that masquerades the traffic p's chain DNATed.
func (p *serviceProxy) postrouting(cidr string) []string {
	return []string{"-t", "nat", "POSTROUTING", "-m", "conntrack", "--ctstate", "DNAT", "--ctorigdst", cidr,
		"-m", "comment", "--comment", p.chain, "-j", "MASQUERADE"}
}

func (p *serviceProxy) jumps() [][]string {
	return [][]string{
		{"-t", "nat", "PREROUTING", "-j", p.chain},
		{"-t", "nat", "OUTPUT", "-j", p.chain},
		p.postrouting(serviceCIDR(p.c.index)),
		p.postrouting(loadBalancerCIDR(p.c.index)),
	}
}

// routedCIDRs are the cluster's virtual addresses. A route through the host
// bridge lets the host's own connections to them (rbctl, the API server)
// get past the range's blackhole route to the OUTPUT chain, which DNATs
// them; pods' packets are DNATed before routing anyway.
func (p *serviceProxy) routedCIDRs() []string {
	return []string{serviceCIDR(p.c.index), loadBalancerCIDR(p.c.index)}
}

func (p *serviceProxy) setup() error {
	for _, cidr := range p.routedCIDRs() {
		if out, err := exec.Command("ip", "route", "replace", cidr, "dev", realnode.HostBridge).CombinedOutput(); err != nil {
			return fmt.Errorf("ip route replace %s: %w: %s", cidr, err, bytes.TrimSpace(out))
		}
	}
	if err := iptables("-t", "nat", "-N", p.chain); err != nil {
		return err
	}
	for _, rule := range p.jumps() {
		if err := iptables(append([]string{rule[0], rule[1], "-I"}, rule[2:]...)...); err != nil {
			return err
		}
	}
	return nil
}

// teardown removes the chain and every rule that jumps to it (errors
// ignored: parts may be gone already).
func (p *serviceProxy) teardown() {
	for _, rule := range p.jumps() {
		for iptables(append([]string{rule[0], rule[1], "-D"}, rule[2:]...)...) == nil {
		}
	}
	_ = iptables("-t", "nat", "-F", p.chain)
	_ = iptables("-t", "nat", "-X", p.chain)
	for _, cidr := range p.routedCIDRs() {
		_ = exec.Command("ip", "route", "del", cidr, "dev", realnode.HostBridge).Run()
	}
}

func iptables(args ...string) error {
	out, err := exec.Command("iptables", append([]string{"-w"}, args...)...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("iptables %s: %w: %s", strings.Join(args, " "), err, bytes.TrimSpace(out))
	}
	return nil
}

// sync assigns load-balancer addresses and rewrites the chain (only when
// its rules change).
func (p *serviceProxy) sync(ctx context.Context) error {
	services, err := p.factory.Core().V1().Services().Lister().List(labels.Everything())
	if err != nil {
		return err
	}
	slices, err := p.factory.Discovery().V1().EndpointSlices().Lister().List(labels.Everything())
	if err != nil {
		return err
	}
	if err := p.assignLoadBalancers(ctx, services); err != nil {
		return err
	}
	rules := p.rules(services, slices)
	if rules == p.last {
		return nil
	}
	cmd := exec.Command("iptables-restore", "-w", "--noflush")
	cmd.Stdin = strings.NewReader(rules)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("iptables-restore: %w: %s\n%s", err, bytes.TrimSpace(out), rules)
	}
	p.last = rules
	return nil
}

// rules renders the chain: for each port of each Service, one DNAT rule per
// ready endpoint, the i-th of n taken with probability 1/(n-i).
func (p *serviceProxy) rules(services []*corev1.Service, slices []*discoveryv1.EndpointSlice) string {
	bySvc := map[string][]*discoveryv1.EndpointSlice{}
	for _, s := range slices {
		key := s.Namespace + "/" + s.Labels[discoveryv1.LabelServiceName]
		bySvc[key] = append(bySvc[key], s)
	}
	sort.Slice(services, func(i, j int) bool {
		return services[i].Namespace+"/"+services[i].Name < services[j].Namespace+"/"+services[j].Name
	})
	var b strings.Builder
	fmt.Fprintf(&b, "*nat\n:%s - [0:0]\n", p.chain)
	for _, svc := range services {
		var vips []string
		if ip := svc.Spec.ClusterIP; ip != "" && ip != corev1.ClusterIPNone {
			vips = append(vips, ip)
		}
		for _, in := range svc.Status.LoadBalancer.Ingress {
			if in.IP != "" {
				vips = append(vips, in.IP)
			}
		}
		vips = append(vips, svc.Spec.ExternalIPs...)
		for _, port := range svc.Spec.Ports {
			eps := readyEndpoints(bySvc[svc.Namespace+"/"+svc.Name], port)
			proto := strings.ToLower(string(port.Protocol))
			for _, vip := range vips {
				for i, ep := range eps {
					fmt.Fprintf(&b, "-A %s -d %s/32 -p %s -m %s --dport %d -m comment --comment %q", p.chain, vip, proto, proto, port.Port,
						svc.Namespace+"/"+svc.Name+":"+port.Name)
					if n := len(eps) - i; n > 1 {
						fmt.Fprintf(&b, " -m statistic --mode random --probability %.5f", 1/float64(n))
					}
					fmt.Fprintf(&b, " -j DNAT --to-destination %s\n", ep)
				}
			}
		}
	}
	b.WriteString("COMMIT\n")
	return b.String()
}

// readyEndpoints are the ip:port of the ready endpoints serving port.
func readyEndpoints(slices []*discoveryv1.EndpointSlice, port corev1.ServicePort) []string {
	var out []string
	for _, s := range slices {
		if s.AddressType != discoveryv1.AddressTypeIPv4 {
			continue
		}
		for _, sp := range s.Ports {
			if sp.Port == nil || ptr.Deref(sp.Name, "") != port.Name || (sp.Protocol != nil && *sp.Protocol != port.Protocol) {
				continue
			}
			for _, ep := range s.Endpoints {
				if ep.Conditions.Ready != nil && !*ep.Conditions.Ready {
					continue
				}
				for _, a := range ep.Addresses {
					out = append(out, net.JoinHostPort(a, strconv.Itoa(int(*sp.Port))))
				}
			}
		}
	}
	sort.Strings(out)
	return out
}

// assignLoadBalancers gives every LoadBalancer Service without an address
// the next free one of the pool, as a cloud's controller would.
func (p *serviceProxy) assignLoadBalancers(ctx context.Context, services []*corev1.Service) error {
	used := map[string]bool{}
	for _, svc := range services {
		for _, in := range svc.Status.LoadBalancer.Ingress {
			used[in.IP] = true
		}
	}
	next := 10
	for _, svc := range services {
		if svc.Spec.Type != corev1.ServiceTypeLoadBalancer || len(svc.Status.LoadBalancer.Ingress) > 0 {
			continue
		}
		ip := ""
		for ; next < 250 && ip == ""; next++ {
			cand := p.lbPool.IP.To4()
			candidate := net.IPv4(cand[0], cand[1], cand[2], byte(next)).String()
			if !used[candidate] {
				ip = candidate
			}
		}
		if ip == "" {
			return fmt.Errorf("%s: load-balancer pool %s exhausted", p.c.Name, p.lbPool)
		}
		used[ip] = true
		upd := svc.DeepCopy()
		upd.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: ip, IPMode: ptr.To(corev1.LoadBalancerIPModeVIP)}}
		if _, err := p.c.Clientset.CoreV1().Services(svc.Namespace).UpdateStatus(ctx, upd, metav1.UpdateOptions{}); err != nil {
			return fmt.Errorf("%s: Service %s/%s load-balancer address: %w", p.c.Name, svc.Namespace, svc.Name, err)
		}
	}
	return nil
}
