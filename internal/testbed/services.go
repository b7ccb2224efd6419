package testbed

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
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

// The pods of a real-node bed (Options.RealNodes) reach Services and
// resolve their names as in any cluster:
//
//   - every node has a network namespace of its own (realnode.Config.
//     OwnNetwork) and runs a real kube-proxy (bin/k8s/kube-proxy, `make
//     node-bin`, go.mod's Kubernetes version) in iptables mode;
//   - CoreDNS (bin/coredns, `make coredns-bin`, built from the Go module
//     proxy) runs per cluster as a host process on an address of its own,
//     serving cluster.local from the cluster's API server, behind Service
//     kube-system/kube-dns, whose ClusterIP every kubelet has as clusterDNS.
//
// The host routes every node's pod CIDR to the node, so pods of all
// clusters reach each other (a flat network), and each cluster's service
// CIDR and load-balancer pool to one of its nodes, whose kube-proxy takes
// them further: the host's own connections (rbctl, the tests) and other
// clusters' pods reach a cluster's Services too. loadBalancers plays the
// cloud's load-balancer controller: a LoadBalancer Service gets an address
// of the cluster's pool (loadBalancerCIDR) in its status.

// CoreDNSBinEnv names the directory holding coredns (default <module root>/bin/coredns).
const CoreDNSBinEnv = "RB_COREDNS_BIN"

// ClusterDomain is the bed's cluster domain.
const ClusterDomain = "cluster.local"

// loadBalancerCIDR of the i-th cluster: its LoadBalancer Services' addresses.
func loadBalancerCIDR(i int) string { return fmt.Sprintf("198.18.%d.0/24", 150+i) }

// kubernetesServiceIP is the first address of the service CIDR, which the API
// server gives to Service default/kubernetes.
func kubernetesServiceIP(i int) string { return fmt.Sprintf("198.18.%d.1", 100+i) }

// DNSServiceIP is the ClusterIP of the i-th cluster's Service
// kube-system/kube-dns, every kubelet's cluster DNS (as kubeadm's .10).
func DNSServiceIP(i int) string { return fmt.Sprintf("198.18.%d.10", 100+i) }

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
	err := c.bed.poll(ctx, c.ClusterDNS, 60*time.Second, "CoreDNS of "+c.Name+" resolving kubernetes.default", func() (bool, error) {
		qctx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		addrs, err := resolver.LookupHost(qctx, "kubernetes.default.svc."+ClusterDomain)
		return err == nil && len(addrs) == 1 && addrs[0] == want, nil
	})
	if err != nil {
		return err
	}
	return c.createDNSService(ctx)
}

// createDNSService puts CoreDNS behind Service kube-system/kube-dns, as in
// any cluster: ClusterIP DNSServiceIP, which the kubelets give pods as their
// nameserver and kube-proxy takes to CoreDNS (an EndpointSlice of its own,
// CoreDNS being a host process, not a pod).
func (c *Cluster) createDNSService(ctx context.Context) error {
	ports := []corev1.ServicePort{{Name: "dns", Port: 53, Protocol: corev1.ProtocolUDP}, {Name: "dns-tcp", Port: 53, Protocol: corev1.ProtocolTCP}}
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: metav1.NamespaceSystem, Name: "kube-dns",
		Labels: map[string]string{"k8s-app": "kube-dns"}},
		Spec: corev1.ServiceSpec{ClusterIP: DNSServiceIP(c.index), Ports: ports}}
	if _, err := c.Clientset.CoreV1().Services(svc.Namespace).Create(ctx, svc, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("%s: Service kube-dns: %w", c.Name, err)
	}
	slice := &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Namespace: svc.Namespace, Name: "kube-dns-coredns",
		Labels: map[string]string{discoveryv1.LabelServiceName: svc.Name, discoveryv1.LabelManagedBy: "testbed"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{c.DNSAddr}, Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)}}}}
	for _, p := range ports {
		slice.Ports = append(slice.Ports, discoveryv1.EndpointPort{Name: ptr.To(p.Name), Port: ptr.To(p.Port), Protocol: ptr.To(p.Protocol)})
	}
	if _, err := c.Clientset.DiscoveryV1().EndpointSlices(svc.Namespace).Create(ctx, slice, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("%s: kube-dns's EndpointSlice: %w", c.Name, err)
	}
	return nil
}

// loadBalancers gives the cluster's LoadBalancer Services their addresses.
type loadBalancers struct {
	c       *Cluster
	pool    *net.IPNet
	kick    chan struct{}
	factory informers.SharedInformerFactory
}

// startLoadBalancers assigns load-balancer addresses until the bed's
// context ends.
func (c *Cluster) startLoadBalancers(ctx context.Context) error {
	_, pool, _ := net.ParseCIDR(loadBalancerCIDR(c.index))
	p := &loadBalancers{c: c, pool: pool, kick: make(chan struct{}, 1), factory: informers.NewSharedInformerFactory(c.Clientset, 0)}
	handler := cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { p.trigger() },
		UpdateFunc: func(any, any) { p.trigger() },
	}
	if _, err := p.factory.Core().V1().Services().Informer().AddEventHandler(handler); err != nil {
		return err
	}
	runCtx := c.bed.ctx
	p.factory.Start(runCtx.Done())
	for typ, ok := range p.factory.WaitForCacheSync(ctx.Done()) {
		if !ok {
			return fmt.Errorf("%s: load balancers: %v informer did not sync", c.Name, typ)
		}
	}
	go p.run(runCtx)
	return nil
}

func (p *loadBalancers) trigger() {
	select {
	case p.kick <- struct{}{}:
	default:
	}
}

func (p *loadBalancers) run(ctx context.Context) {
	log := klog.FromContext(ctx).WithValues("cluster", p.c.Name, "component", "load-balancers")
	for {
		select {
		case <-ctx.Done():
			return
		case <-p.kick:
		}
		services, err := p.factory.Core().V1().Services().Lister().List(labels.Everything())
		if err == nil {
			err = p.assign(ctx, services)
		}
		if err != nil && ctx.Err() == nil {
			log.Error(err, "Assigning load-balancer addresses")
			time.AfterFunc(time.Second, p.trigger)
		}
	}
}

// routeServices routes the cluster's service CIDR and load-balancer pool
// from the host to node (the node last added: any node's kube-proxy serves
// them all).
func (c *Cluster) routeServices(nodeIP string) error {
	for _, cidr := range []string{serviceCIDR(c.index), loadBalancerCIDR(c.index)} {
		if out, err := exec.Command("ip", "route", "replace", cidr, "via", nodeIP, "dev", realnode.HostBridge).CombinedOutput(); err != nil {
			return fmt.Errorf("ip route replace %s via %s: %w: %s", cidr, nodeIP, err, bytes.TrimSpace(out))
		}
	}
	return nil
}

// assign gives every LoadBalancer Service without an address the next free
// one of the pool, as a cloud's controller would.
func (p *loadBalancers) assign(ctx context.Context, services []*corev1.Service) error {
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
			cand := p.pool.IP.To4()
			candidate := net.IPv4(cand[0], cand[1], cand[2], byte(next)).String()
			if !used[candidate] {
				ip = candidate
			}
		}
		if ip == "" {
			return fmt.Errorf("%s: load-balancer pool %s exhausted", p.c.Name, p.pool)
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
