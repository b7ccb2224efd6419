// Package liqobed runs Liqo itself (v1.2.0, go.mod's version, built by `make
// liqo-bin` into bin/liqo) in the clusters of a real-node test bed
// (internal/testbed with Options.RealNodes), so that the agent's Liqo mode
// (rb-agent --bridge=liqo) is tested against Liqo's own controllers rather
// than a stand-in for them.
//
// What runs, per cluster, from Liqo's sources:
//
//   - Liqo's Helm chart (deployments/liqo of the module), rendered by helm
//     (`helm template`, the helm version Liqo's go.mod requires) with the
//     networking module disabled, and applied as rendered: the CRDs, the
//     liqo namespace's ServiceAccounts, every ClusterRole, Role and binding,
//     the cluster-id ConfigMap, the webhook configurations and their
//     certificate Secret, the virtual-kubelet options template, the
//     RuntimeClass, the StorageClass, the Deployments.
//   - liqo-controller-manager, liqo-crd-replicator and liqo-webhook: the
//     chart's Deployments, each run as a host process (below).
//   - The virtual kubelet of every VirtualNode: Liqo's controller-manager
//     creates its Deployment in the tenant namespace (from the chart's
//     VkOptionsTemplate); liqobed runs it as a host process the same way.
//
// Peering and namespace offloading are liqoctl's (bin/liqo/liqoctl, run as a
// user would, with the bed's admin kubeconfigs): `liqoctl peer
// --networking-disabled --create-resource-slice=false` (the agent creates the
// ResourceSlices, one per reservation) and `liqoctl offload namespace`.
// Everything after that (authentication: nonces, Tenant, Identity,
// certificates, kubeconfig Secrets; ResourceSlice replication and
// acceptance; VirtualNode, Node, NamespaceMap, remote namespaces, ShadowPods,
// pod status reflection) is Liqo's controllers at work.
//
// Deviations from a Liqo install, and why:
//
//   - No container runs Liqo: there is no registry here, so its images cannot
//     be pulled (and pods of the bed had no kube-proxy or DNS when this was
//     built). Every Liqo Deployment is applied with
//     spec.replicas=0 (chart values controllerManager.replicas,
//     webhook.replicas and virtualKubelet.replicas; crd-replicator has no such
//     value, its rendered Deployment is set to 0), and liqobed runs its one
//     replica as a host process instead (a "pod stand-in"): the container's
//     command from bin/liqo, its args and env as Kubernetes would expand them
//     (fieldRefs: pod name <deployment>-host, its namespace, the pod IP;
//     ConfigMap and Secret keys read from the cluster), a kubeconfig holding a
//     token of the pod's ServiceAccount (TokenRequest) in KUBECONFIG, so each
//     component has exactly its chart RBAC, and its own mount namespace with
//     private tmpfs over /tmp/k8s-webhook-server and /tmp/certs (the webhook's
//     serving certificate and the virtual kubelet's are written to these fixed
//     paths; processes of two clusters must not share them). A stand-in that
//     exits is restarted (as restartPolicy Always would); one whose
//     Deployment goes is stopped (SIGTERM).
//   - Ports: host processes share the host's network namespace, so each gets
//     its own free ports (--health-probe-address on loopback,
//     --webhook-port, --listen-port of the virtual kubelet; metrics off).
//   - The pod IP of a cluster's Liqo processes is the cluster's AgentIP (an
//     address on the real nodes' host bridge): the virtual kubelet registers
//     it as its Node's InternalIP (the API server reaches the virtual
//     kubelet's port there), and the Endpoints of the liqo-webhook Service
//     point at it.
//   - The liqo-webhook Service is applied without its selector, with an
//     Endpoints object naming the webhook process (AgentIP and its port);
//     the API servers of the real-node bed run with
//     --enable-aggregator-routing, which makes them call webhooks at a
//     Service's endpoints rather than its ClusterIP.
//   - Not rendered (chart values off): the networking module (gateways,
//     IPAM, fabric: networking.enabled=false, as `liqoctl peer
//     --networking-disabled` expects; its fabric needs geneve interfaces,
//     which this kernel lacks: docs/liqo-testbed.md), the metric agent (virtual node
//     metrics; it needs an APIService and a certificate init container), the
//     API server proxy (in-band peering only), telemetry (no internet). The
//     chart's pre-delete hook Job (uninstaller) is not applied: the bed is
//     thrown away. All CIDRs given to the chart (pod, service, external,
//     internal CIDRs and the IPAM pools) are in 198.18.0.0/15.
//
// What runs is stopped by pid (Close): virtual kubelets first, then the
// controller-managers and crd-replicators, the webhooks last. Logs go to
// <bed.LogDir>/liqo-<cluster>-<deployment>.log and liqo-liqoctl.log.
package liqobed

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/debug"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"

	authv1beta1 "github.com/liqotech/liqo/apis/authentication/v1beta1"
	liqov1beta1 "github.com/liqotech/liqo/apis/core/v1beta1"
	offloadingv1beta1 "github.com/liqotech/liqo/apis/offloading/v1beta1"

	rbv1 "github.com/fluidos-project/resource-broker/api/v1alpha1"
	"github.com/fluidos-project/resource-broker/internal/testbed"
	"github.com/fluidos-project/resource-broker/internal/testenv"
)

// Namespace is where Liqo is installed (the chart's release namespace).
const Namespace = "liqo"

// BinDirEnv names a directory holding what `make liqo-bin` builds (default
// <module root>/bin/liqo).
const BinDirEnv = "RB_LIQO_BIN"

// Binaries are what liqobed needs in the bin directory (chart is a directory).
var Binaries = []string{"liqo-controller-manager", "virtual-kubelet", "crd-replicator", "webhook", "liqoctl", "helm", "chart"}

// Scheme knows the built-in types, resource-broker's and Liqo's APIs.
var Scheme = func() *runtime.Scheme {
	s := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{clientgoscheme.AddToScheme, rbv1.AddToScheme,
		liqov1beta1.AddToScheme, authv1beta1.AddToScheme, offloadingv1beta1.AddToScheme} {
		if err := add(s); err != nil {
			panic(err)
		}
	}
	return s
}()

// Options configure Liqo in a bed.
type Options struct {
	// BinDir holds Liqo's binaries, helm and the chart (default
	// $RB_LIQO_BIN, else <module root>/bin/liqo).
	BinDir string
	// Verbosity (--klog.v) of Liqo's components (default 0).
	Verbosity int
	// Values are extra chart values (helm --set).
	Values []string
	// Logf receives progress lines (default: none).
	Logf func(format string, args ...any)
}

// Liqo is Liqo installed in some clusters of a bed.
type Liqo struct {
	BinDir string
	// Version is Liqo's (from the stamp of make liqo-bin, else go.mod's).
	Version  string
	Clusters []*Cluster
	// Timings of the installation steps.
	Timings map[string]time.Duration

	bed       *testbed.Bed
	opts      Options
	ctx       context.Context
	cancel    context.CancelFunc
	wg        sync.WaitGroup // the virtual-kubelet supervisor
	stops     sync.WaitGroup // stand-ins being stopped because their Deployment went
	mountDirs []string       // mount points liqobed created on the host
	closeOnce sync.Once
	tmu       sync.Mutex
}

// Cluster is one cluster with Liqo.
type Cluster struct {
	*testbed.Cluster
	// Client knows Liqo's types (Scheme).
	Client client.Client
	// IP is the pod IP of the cluster's Liqo processes (its AgentIP).
	IP string

	liqo *Liqo
	dir  string
	mu   sync.Mutex
	pods map[string]*standIn // by namespace/name of the Deployment
}

// Start installs Liqo in clusters of bed (all of them when none is named)
// and stops it when the test ends, printing the tails of its logs first if
// the test failed.
func Start(t testing.TB, bed *testbed.Bed, o Options, clusters ...*testbed.Cluster) *Liqo {
	t.Helper()
	if o.Logf == nil {
		o.Logf = t.Logf
	}
	l, err := Install(context.Background(), bed, o, clusters...)
	if l != nil {
		t.Cleanup(func() {
			if t.Failed() {
				l.DumpLogs(t.Logf, 60)
			}
			if err := l.Close(); err != nil {
				t.Errorf("liqobed: %v", err)
			}
		})
	}
	if err != nil {
		t.Fatalf("liqobed: %v", err)
	}
	return l
}

// Install renders Liqo's chart for each cluster, applies it, starts the
// chart's components as host processes and waits until they serve; then
// it runs the virtual kubelets of the VirtualNodes Liqo creates until
// Close. On error the returned Liqo (if not nil) holds what was started:
// Close it.
func Install(ctx context.Context, bed *testbed.Bed, o Options, clusters ...*testbed.Cluster) (*Liqo, error) {
	if o.Logf == nil {
		o.Logf = func(string, ...any) {}
	}
	if o.BinDir == "" {
		o.BinDir = os.Getenv(BinDirEnv)
	}
	if o.BinDir == "" {
		root, err := testenv.ModuleRoot()
		if err != nil {
			return nil, err
		}
		o.BinDir = filepath.Join(root, "bin", "liqo")
	}
	for _, b := range Binaries {
		if _, err := os.Stat(filepath.Join(o.BinDir, b)); err != nil {
			return nil, fmt.Errorf("%s not found in %s: run \"make liqo-bin\"", b, o.BinDir)
		}
	}
	for _, tool := range []string{"unshare", "mount", "sh"} {
		if _, err := exec.LookPath(tool); err != nil {
			return nil, fmt.Errorf("liqobed needs %s: %w", tool, err)
		}
	}
	if len(clusters) == 0 {
		clusters = bed.Clusters
	}
	l := &Liqo{BinDir: o.BinDir, bed: bed, opts: o, Timings: map[string]time.Duration{}}
	if stamps, _ := filepath.Glob(filepath.Join(o.BinDir, ".built-liqo-*")); len(stamps) == 1 {
		l.Version = strings.TrimPrefix(filepath.Base(stamps[0]), ".built-liqo-")
	} else if bi, ok := debug.ReadBuildInfo(); ok {
		for _, d := range bi.Deps {
			if d.Path == "github.com/liqotech/liqo" {
				l.Version = d.Version // the version go.mod pins, which make liqo-bin builds
			}
		}
	}
	l.ctx, l.cancel = context.WithCancel(context.Background())
	for _, tc := range clusters {
		if tc.AgentIP == "" {
			return nil, fmt.Errorf("%s has no AgentIP: liqobed needs a real-node bed (testbed.Options.RealNodes)", tc.Name)
		}
		cl, err := client.New(tc.Config, client.Options{Scheme: Scheme})
		if err != nil {
			return nil, err
		}
		c := &Cluster{Cluster: tc, Client: cl, IP: tc.AgentIP, liqo: l, dir: filepath.Join(bed.Dir, "liqo", tc.Name),
			pods: map[string]*standIn{}}
		if err := os.MkdirAll(c.dir, 0o755); err != nil {
			return nil, err
		}
		l.Clusters = append(l.Clusters, c)
	}
	if err := l.makeMountPoints(); err != nil {
		return l, err
	}
	began := time.Now()
	errs := make(chan error, len(l.Clusters))
	for _, c := range l.Clusters {
		go func() {
			t0 := time.Now()
			err := c.install(ctx)
			l.timing("install "+c.Name, time.Since(t0))
			if err != nil {
				err = fmt.Errorf("%s: %w", c.Name, err)
			}
			errs <- err
		}()
	}
	var all []error
	for range l.Clusters {
		all = append(all, <-errs)
	}
	if err := errors.Join(all...); err != nil {
		return l, err
	}
	l.wg.Add(1)
	go l.superviseVirtualKubelets()
	l.timing("total", time.Since(began))
	o.Logf("liqobed: Liqo %s up in %s in %s (%s)", l.Version, time.Since(began).Round(time.Millisecond), l.names(), l.timingSummary())
	return l, nil
}

func (l *Liqo) timing(what string, d time.Duration) {
	l.tmu.Lock()
	defer l.tmu.Unlock()
	l.Timings[what] = d
}

func (l *Liqo) timingSummary() string {
	l.tmu.Lock()
	defer l.tmu.Unlock()
	var parts []string
	for k, v := range l.Timings {
		if k != "total" {
			parts = append(parts, fmt.Sprintf("%s %s", k, v.Round(time.Millisecond)))
		}
	}
	sort.Strings(parts)
	return strings.Join(parts, ", ")
}

func (l *Liqo) names() string {
	var n []string
	for _, c := range l.Clusters {
		n = append(n, c.Name)
	}
	return strings.Join(n, ", ")
}

// Cluster returns the cluster named name (nil if Liqo is not installed there).
func (l *Liqo) Cluster(name string) *Cluster {
	for _, c := range l.Clusters {
		if c.Name == name {
			return c
		}
	}
	return nil
}

// mountPoints are the fixed paths Liqo's processes write below /tmp; each
// process gets a private tmpfs over them.
var mountPoints = []string{"/tmp/k8s-webhook-server", "/tmp/certs"}

func (l *Liqo) makeMountPoints() error {
	for _, d := range mountPoints {
		if _, err := os.Stat(d); err == nil {
			continue
		}
		if err := os.MkdirAll(d, 0o700); err != nil {
			return err
		}
		l.mountDirs = append(l.mountDirs, d)
	}
	return nil
}

// Close stops every process liqobed started (virtual kubelets, then the
// controller-managers and crd-replicators, the webhooks last) and removes
// the mount points it created.
func (l *Liqo) Close() error {
	var errs []error
	l.closeOnce.Do(func() {
		l.cancel()
		l.wg.Wait()
		l.stops.Wait()
		stop := func(match func(*standIn) bool) {
			var wg sync.WaitGroup
			var mu sync.Mutex
			for _, c := range l.Clusters {
				for _, s := range c.standIns() {
					if !match(s) {
						continue
					}
					wg.Add(1)
					go func() {
						defer wg.Done()
						if err := s.stop(); err != nil {
							mu.Lock()
							errs = append(errs, err)
							mu.Unlock()
						}
					}()
				}
			}
			wg.Wait()
		}
		stop(func(s *standIn) bool { return s.binary == "virtual-kubelet" })
		stop(func(s *standIn) bool { return s.binary != "webhook" })
		stop(func(*standIn) bool { return true })
		for _, d := range l.mountDirs {
			if err := os.Remove(d); err != nil && !os.IsNotExist(err) {
				errs = append(errs, err)
			}
		}
	})
	return errors.Join(errs...)
}

// DumpLogs prints the last lines of every Liqo log of the bed.
func (l *Liqo) DumpLogs(logf func(string, ...any), lines int) {
	logs, _ := filepath.Glob(filepath.Join(l.bed.LogDir, "liqo-*.log"))
	for _, p := range logs {
		logf("---- %s, last %d lines:\n%s", p, lines, testbed.TailFile(p, lines))
	}
}

// Processes lists the running Liqo processes: name -> pid.
func (l *Liqo) Processes() map[string]int {
	out := map[string]int{}
	for _, c := range l.Clusters {
		for _, s := range c.standIns() {
			if pid := s.proc.Pid(); pid != 0 && s.proc.Running() {
				out[s.proc.Name] = pid
			}
		}
	}
	return out
}

// Restarts counts, per process, how often it was restarted after exiting.
func (l *Liqo) Restarts() map[string]int {
	out := map[string]int{}
	for _, c := range l.Clusters {
		for _, s := range c.standIns() {
			if n := s.restartCount(); n > 0 {
				out[s.proc.Name] = n
			}
		}
	}
	return out
}

// RSS is the resident memory of each running Liqo process, in bytes.
func (l *Liqo) RSS() map[string]int64 {
	out := map[string]int64{}
	for name, pid := range l.Processes() {
		if rss := rssOf(pid); rss > 0 {
			out[name] = rss
		}
	}
	return out
}

// Liqoctl runs bin/liqo/liqoctl with args; its output goes to
// liqo-liqoctl.log and is returned.
func (l *Liqo) Liqoctl(ctx context.Context, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, filepath.Join(l.BinDir, "liqoctl"), args...)
	cmd.Env = append(os.Environ(), "HOME="+filepath.Join(l.bed.Dir, "liqo"))
	out, err := cmd.CombinedOutput()
	logf, lerr := os.OpenFile(filepath.Join(l.bed.LogDir, "liqo-liqoctl.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if lerr == nil {
		fmt.Fprintf(logf, "=== %s: liqoctl %s\n%s=== %v\n", time.Now().Format(time.RFC3339Nano), strings.Join(args, " "), out, err)
		logf.Close()
	}
	if err != nil {
		return string(out), fmt.Errorf("liqoctl %s: %w\n%s", strings.Join(args, " "), err, out)
	}
	return string(out), nil
}

// Peer peers consumer with provider as `liqoctl peer` does, with the
// networking module disabled and no ResourceSlice (the agent makes those):
// tenant namespaces, nonce and signed nonce, Tenant, Identity, the
// control-plane kubeconfig Secret, the ForeignClusters.
func (l *Liqo) Peer(ctx context.Context, consumer, provider *Cluster) (string, error) {
	return l.Liqoctl(ctx, "peer", "--kubeconfig", consumer.Kubeconfig, "--remote-kubeconfig", provider.Kubeconfig,
		"--networking-disabled", "--create-resource-slice=false", "--timeout=3m", "--skip-confirm")
}

// OffloadNamespace offloads namespace ns of c as `liqoctl offload
// namespace` does (a NamespaceOffloading named "offloading" in ns), with
// the given pod offloading strategy (Local, Remote, LocalAndRemote) and
// namespace mapping strategy (DefaultName: <ns>-<cluster ID> in the
// providers; EnforceSameName: ns, so that names qualified with the
// namespace, such as svc.ns, resolve there too).
func (l *Liqo) OffloadNamespace(ctx context.Context, c *Cluster, ns, podStrategy, mappingStrategy string) (string, error) {
	return l.Liqoctl(ctx, "offload", "namespace", ns, "--kubeconfig", c.Kubeconfig,
		"--pod-offloading-strategy", podStrategy, "--namespace-mapping-strategy", mappingStrategy, "--timeout=60s", "--skip-confirm")
}
