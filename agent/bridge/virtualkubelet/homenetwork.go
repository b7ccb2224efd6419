package virtualkubelet

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/tools/cache"
	"k8s.io/kubernetes/pkg/kubelet/envvars"
	"k8s.io/utils/ptr"
)

// A borrowed pod sees, by default, the network of the provider it runs in:
// the provider's DNS and Services, the environment variables of its
// tenant namespace's Services. With HomeNetwork it keeps its home
// cluster's view, as if it ran on one of this cluster's nodes:
//
//   - DNS: its nameserver is this cluster's DNS (kube-dns's ClusterIP) with
//     the search path of its home namespace, so backend, backend.shop and
//     backend.shop.svc.cluster.local name this cluster's Services;
//   - the Service environment variables (enableServiceLinks, and those of
//     Service default/kubernetes, which every pod gets) are this cluster's,
//     as its kubelet would have set them when the container started; the
//     provider's are turned off.
//
// What it needs of the network between the clusters: the provider's pods
// reach this cluster's DNS and ClusterIPs, that is, this cluster's service
// CIDR is routed (to its nodes, whose kube-proxy takes it further) beside
// the pod CIDRs: Calico or Cilium advertising Service addresses over BGP,
// static routes of a routed VPC, or the test bed. docs/install.md says how
// to check it.
type HomeNetwork struct {
	// DNS is this cluster's DNS server, as the provider's pods reach it.
	DNS string
	// ClusterDomain is this cluster's DNS domain (default cluster.local).
	ClusterDomain string
}

// homeView is what a pod's copy needs of the home network: the DNS and the
// Service environment variables of the pod's namespace.
type homeView struct {
	network HomeNetwork
	// env: the Service variables the copy carries itself; envFrom: the
	// ConfigMaps at the provider it reads them from instead (serviceenv.go).
	env     []corev1.EnvVar
	envFrom []string
}

// applyHomeNetwork gives spec (a copy's) the home DNS and Service
// environment variables of namespace ns. A pod that chose its DNS itself
// (dnsPolicy None or Default) keeps it.
func applyHomeNetwork(spec *corev1.PodSpec, ns string, v *homeView) {
	if policy := spec.DNSPolicy; policy == "" || policy == corev1.DNSClusterFirst || policy == corev1.DNSClusterFirstWithHostNet {
		domain := v.network.ClusterDomain
		if domain == "" {
			domain = "cluster.local"
		}
		// What the kubelet writes for ClusterFirst, then the pod's own dnsConfig.
		cfg := &corev1.PodDNSConfig{Nameservers: []string{v.network.DNS},
			Searches: []string{ns + ".svc." + domain, "svc." + domain, domain},
			Options:  []corev1.PodDNSConfigOption{{Name: "ndots", Value: ptr.To("5")}}}
		if own := spec.DNSConfig; own != nil {
			cfg.Nameservers = append(cfg.Nameservers, own.Nameservers...)
			cfg.Searches = append(cfg.Searches, own.Searches...)
			cfg.Options = append(cfg.Options, own.Options...)
		}
		spec.DNSPolicy, spec.DNSConfig = corev1.DNSNone, cfg
	}
	spec.EnableServiceLinks = ptr.To(false) // not the provider's Services
	withEnv := func(cs []corev1.Container) {
		for i := range cs {
			cs[i].Env = prependUnset(v.env, cs[i].Env)
		}
	}
	withEnv(spec.InitContainers)
	withEnv(spec.Containers)
}

// readServiceEnv makes the containers of spec (a copy's, its own sources
// pointing at their copies already) read the home Service variables from
// the provider's ConfigMaps of v, before their own sources, which win.
func readServiceEnv(spec *corev1.PodSpec, v *homeView) {
	if len(v.envFrom) == 0 {
		return
	}
	from := make([]corev1.EnvFromSource, len(v.envFrom))
	for i, name := range v.envFrom {
		from[i] = corev1.EnvFromSource{ConfigMapRef: &corev1.ConfigMapEnvSource{LocalObjectReference: corev1.LocalObjectReference{Name: name}}}
	}
	withFrom := func(cs []corev1.Container) {
		for i := range cs {
			cs[i].EnvFrom = append(slices.Clone(from), cs[i].EnvFrom...)
		}
	}
	withFrom(spec.InitContainers)
	withFrom(spec.Containers)
}

// prependUnset is env with the variables of vars it does not set first: the
// container's own come after, so they win, as over a kubelet's.
func prependUnset(vars, env []corev1.EnvVar) []corev1.EnvVar {
	out := make([]corev1.EnvVar, 0, len(vars)+len(env))
	for _, v := range vars {
		if !slices.ContainsFunc(env, func(e corev1.EnvVar) bool { return e.Name == v.Name }) {
			out = append(out, v)
		}
	}
	return append(out, env...)
}

// serviceEnv is what this cluster's kubelet would give a container of a pod
// of namespace ns: the variables of Service default/kubernetes (master,
// nil if unknown) always, and of ns's Services with enableServiceLinks.
func serviceEnv(master *corev1.Service, inNamespace []*corev1.Service, enableServiceLinks bool) []corev1.EnvVar {
	byName := map[string]*corev1.Service{}
	if enableServiceLinks {
		for _, s := range inNamespace {
			byName[s.Name] = s
		}
	}
	if master != nil {
		byName[master.Name] = master // the kubelet's choice when ns is default too
	}
	var services []*corev1.Service
	for _, s := range byName {
		services = append(services, s)
	}
	env := envvars.FromServices(services)
	slices.SortFunc(env, func(a, b corev1.EnvVar) int { return strings.Compare(a.Name, b.Name) })
	return env
}

// masterServiceTTL is how long the bridge trusts its last read of Service
// default/kubernetes (its ClusterIP and port change only by hand).
const masterServiceTTL = 30 * time.Second

// masterService caches Service default/kubernetes.
type masterService struct {
	mu   sync.Mutex
	svc  *corev1.Service
	read time.Time
}

// homeView returns the home network view of a pod of namespace ns (nil
// without HomeNetwork).
func (b *Bridge) homeView(ctx context.Context, pod *corev1.Pod) (*homeView, error) {
	if b.cfg.HomeNetwork == nil {
		return nil, nil
	}
	if serviceLinks(pod) {
		// The variables come from the provider's ConfigMaps (serviceEnvs.attach).
		return &homeView{network: *b.cfg.HomeNetwork}, nil
	}
	master, err := b.master(ctx)
	if err != nil {
		return nil, fmt.Errorf("reading Service default/kubernetes for the pod's environment: %w", err)
	}
	return &homeView{network: *b.cfg.HomeNetwork, env: serviceEnv(master, nil, false)}, nil
}

// serviceEnvOf is what this cluster's kubelet gives a container of a pod of
// namespace ns with enableServiceLinks, split into ConfigMap data
// (serviceEnvChunks).
func (b *Bridge) serviceEnvOf(ctx context.Context, ns string) ([]map[string]string, error) {
	objs, err := b.localObjects(ctx, ns)
	if err != nil {
		return nil, err
	}
	if !cache.WaitForCacheSync(ctx.Done(), objs.synced...) {
		return nil, ctx.Err()
	}
	inNamespace, err := objs.services.List(labels.Everything())
	if err != nil {
		return nil, err
	}
	master, err := b.master(ctx)
	if err != nil {
		return nil, fmt.Errorf("reading Service default/kubernetes for the pod's environment: %w", err)
	}
	return b.serviceEnvs.get(ns, master, inNamespace), nil
}

// serviceEnvCache keeps the last Service variables computed per namespace,
// as ConfigMap data (13 ms at 1,000 Services on a busy machine,
// BenchmarkHomeView), computed again when one of the Services (or
// default/kubernetes) is not the one they came from. Shared, never written.
type serviceEnvCache struct {
	mu   sync.Mutex
	byNS map[string]cachedServiceEnv
}

type cachedServiceEnv struct {
	versions string // the Services they came from, uid@resourceVersion
	chunks   []map[string]string
}

func (c *serviceEnvCache) get(ns string, master *corev1.Service, inNamespace []*corev1.Service) []map[string]string {
	all := append([]*corev1.Service{master}, inNamespace...) // a lister's order varies
	slices.SortFunc(all[1:], func(a, b *corev1.Service) int { return strings.Compare(a.Name, b.Name) })
	var versions strings.Builder
	for _, s := range all {
		if s != nil {
			versions.WriteString(string(s.UID) + "@" + s.ResourceVersion + ",")
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if hit, ok := c.byNS[ns]; ok && hit.versions == versions.String() {
		return hit.chunks
	}
	chunks := serviceEnvChunks(serviceEnv(master, inNamespace, true))
	if c.byNS == nil {
		c.byNS = map[string]cachedServiceEnv{}
	}
	c.byNS[ns] = cachedServiceEnv{versions: versions.String(), chunks: chunks}
	return chunks
}
func (b *Bridge) master(ctx context.Context) (*corev1.Service, error) {
	m := &b.masterSvc
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.svc != nil && time.Since(m.read) < masterServiceTTL {
		return m.svc, nil
	}
	svc, err := b.local.CoreV1().Services(metav1.NamespaceDefault).Get(ctx, "kubernetes", metav1.GetOptions{})
	if err != nil {
		return nil, err
	}
	m.svc, m.read = svc, time.Now()
	return svc, nil
}
