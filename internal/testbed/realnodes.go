package testbed

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	rbv1 "github.com/fluidos-project/resource-broker/api/v1alpha1"
	"github.com/fluidos-project/resource-broker/internal/certauthority"
	"github.com/fluidos-project/resource-broker/internal/realnode"
	"github.com/fluidos-project/resource-broker/internal/testenv"
	"github.com/fluidos-project/resource-broker/internal/testimages"
)

// With Options.RealNodes every cluster of the bed is a small real cluster:
// its nodes are real kubelets with containerd (internal/realnode), and
// kube-controller-manager runs as a subprocess (namespaces, service accounts
// and their tokens, garbage collection, Deployments, ReplicaSets, quotas,
// node lifecycle, CSR signing) instead of the in-process stand-ins. Each
// cluster has a CA whose key the bed holds, as kubeadm's: it is the API
// server's client CA, signs the kubelets' serving certificates (the API
// server verifies them: --kubelet-certificate-authority) and
// kube-controller-manager signs CSRs with it.
//
// Addresses (all of realnode.Range, see REAL-NODES.md): node and agent
// addresses 198.18.0.10 and up on the host bridge, pod CIDRs 198.19.<n>.0/24
// (one per node), service CIDRs 198.18.<100+i>.0/24 (one per cluster;
// every node runs kube-proxy, services.go).

// RealNodesKubeletAPIUser is the API server's identity towards kubelets.
const RealNodesKubeletAPIUser = "kube-apiserver-kubelet-client"

// realNodes is the bed's share of the host while it runs real nodes.
type realNodes struct {
	host   *realnode.Host
	images []testimages.Image

	mu       sync.Mutex
	nextHost int // last octet of the next host address in 198.18.0.0/24
	nextPod  int // third octet of the next pod CIDR in 198.19.0.0/16
}

// allocHostIP hands out the next node or agent address.
func (r *realNodes) allocHostIP() (string, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.nextHost > 250 {
		return "", errors.New("no host address left in 198.18.0.0/24")
	}
	ip := "198.18.0." + strconv.Itoa(r.nextHost)
	r.nextHost++
	return ip, nil
}

func (r *realNodes) allocPodCIDR() (string, int, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.nextPod > 250 {
		return "", 0, errors.New("no pod CIDR left in 198.19.0.0/16")
	}
	n := r.nextPod
	r.nextPod++
	return fmt.Sprintf("198.19.%d.0/24", n), n, nil
}

// serviceCIDR of the i-th cluster (also for beds without real nodes: no
// address of the bed is ever outside realnode.Range).
func serviceCIDR(i int) string { return fmt.Sprintf("198.18.%d.0/24", 100+i) }

// nodeBinaries are the real nodes' binaries, from `make node-bin`.
func nodeBinary(name string) (string, error) {
	dir, err := testenv.AssetsDir()
	if err != nil {
		return "", err
	}
	p := filepath.Join(dir, name)
	if _, err := os.Stat(p); err != nil {
		return "", fmt.Errorf("%s not found in %s: run \"make node-bin\"", name, dir)
	}
	return p, nil
}

// CheckNodeBinaries tells whether the real nodes' binaries (kubelet,
// kube-proxy, kube-controller-manager) are built.
func CheckNodeBinaries() error {
	for _, bin := range []string{"kubelet", "kube-proxy", "kube-controller-manager"} {
		if _, err := nodeBinary(bin); err != nil {
			return err
		}
	}
	return nil
}

// startRealNodesHost takes the host and builds (or finds) the images.
func (b *Bed) startRealNodesHost(ctx context.Context) error {
	if err := CheckNodeBinaries(); err != nil {
		return err
	}
	host, err := realnode.Acquire(ctx, b.opts.Logf)
	if err != nil {
		return err
	}
	b.real = &realNodes{host: host, nextHost: 10, nextPod: 1}
	close(b.hostReady)
	b.real.images, err = testimages.Build(ctx, b.moduleRoot, filepath.Join(b.BinDir, "images"))
	return err
}

// Image is the reference of one of the bed's images (testimages.TestApp...).
func (b *Bed) imagePaths() []string {
	var out []string
	for _, im := range b.real.images {
		out = append(out, im.Path)
	}
	return append(out, b.opts.Images...)
}

// controlPlaneOptions are the API server settings of a real cluster.
func (c *Cluster) controlPlaneOptions(ctx context.Context) ([]testenv.Option, error) {
	ca, err := certauthority.NewCA(c.Name + " cluster CA")
	if err != nil {
		return nil, err
	}
	c.CA = ca
	pki := filepath.Join(c.dir, "pki")
	if err := ca.Save(pki); err != nil {
		return nil, err
	}
	c.caFile = filepath.Join(pki, certauthority.CACertFile)
	kubeletClient, err := ca.IssueUser(RealNodesKubeletAPIUser, nil)
	if err != nil {
		return nil, err
	}
	if err := certauthority.WriteTLSDir(filepath.Join(pki, "kubelet-client"), kubeletClient, ca.CertPEM); err != nil {
		return nil, err
	}
	// The aggregation layer (metrics.k8s.io, ...): a front-proxy CA of its
	// own, as kubeadm sets it up; the API server dials an APIService's
	// endpoints itself (no kube-proxy here).
	frontProxy, err := certauthority.NewCA(c.Name + " front-proxy CA")
	if err != nil {
		return nil, err
	}
	proxyClient, err := frontProxy.IssueUser("front-proxy-client", nil)
	if err != nil {
		return nil, err
	}
	if err := certauthority.WriteTLSDir(filepath.Join(pki, "front-proxy-client"), proxyClient, frontProxy.CertPEM); err != nil {
		return nil, err
	}
	opts := []testenv.Option{
		testenv.WithClientCA(ca),
		testenv.WithAPIServerArg("requestheader-client-ca-file", filepath.Join(pki, "front-proxy-client", certauthority.CACertFile)),
		testenv.WithAPIServerArg("requestheader-allowed-names", "front-proxy-client"),
		testenv.WithAPIServerArg("requestheader-username-headers", "X-Remote-User"),
		testenv.WithAPIServerArg("requestheader-group-headers", "X-Remote-Group"),
		testenv.WithAPIServerArg("requestheader-extra-headers-prefix", "X-Remote-Extra-"),
		testenv.WithAPIServerArg("proxy-client-cert-file", filepath.Join(pki, "front-proxy-client", certauthority.TLSCertFile)),
		testenv.WithAPIServerArg("proxy-client-key-file", filepath.Join(pki, "front-proxy-client", certauthority.TLSKeyFile)),
		testenv.WithAPIServerArg("enable-aggregator-routing", "true"),
		testenv.WithAPIServerArg("authorization-mode", "Node,RBAC"),
		testenv.WithAPIServerArg("enable-admission-plugins", "NodeRestriction"),
		// envtest turns the ServiceAccount admission plugin off because it
		// runs no controllers; kube-controller-manager runs here.
		testenv.WithAPIServerArg("disable-admission-plugins", "DefaultStorageClass"),
		testenv.WithAPIServerArg("kubelet-client-certificate", filepath.Join(pki, "kubelet-client", certauthority.TLSCertFile)),
		testenv.WithAPIServerArg("kubelet-client-key", filepath.Join(pki, "kubelet-client", certauthority.TLSKeyFile)),
		testenv.WithAPIServerArg("kubelet-certificate-authority", c.caFile),
		testenv.WithAPIServerArg("kubelet-preferred-address-types", "InternalIP"),
	}
	if c.bed.opts.RealNodes {
		serving, err := c.servicesAddresses(ctx)
		if err != nil {
			return nil, err
		}
		opts = append(opts, serving...)
	}
	return opts, nil
}

// servicesAddresses waits for the host, takes the
// addresses of the API server and of CoreDNS on the host bridge, and
// returns the API server's listening address and serving certificate: pods
// reach it through Service kubernetes (its ClusterIP is a name of the
// certificate) and verify it with their ca.crt, the cluster CA.
func (c *Cluster) servicesAddresses(ctx context.Context) ([]testenv.Option, error) {
	select {
	case <-c.bed.hostReady:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	var ips []string
	for range 2 {
		ip, err := c.bed.real.allocHostIP()
		if err != nil {
			return nil, err
		}
		if err := c.bed.real.host.AddAddress(ip); err != nil {
			return nil, err
		}
		ips = append(ips, ip)
	}
	c.APIServerIP, c.DNSAddr = ips[0], ips[1]
	dir := filepath.Join(c.dir, "pki", "apiserver")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	names := []string{kubernetesServiceIP(c.index), "kubernetes", "kubernetes.default", "kubernetes.default.svc",
		"kubernetes.default.svc." + ClusterDomain}
	logf, err := os.Create(filepath.Join(c.bed.LogDir, "kube-apiserver-"+c.Name+".log"))
	if err != nil {
		return nil, err
	}
	return []testenv.Option{testenv.WithServingCert(c.CA, dir, c.APIServerIP, names...),
		testenv.WithEnvironment(func(env *envtest.Environment) {
			api := env.ControlPlane.GetAPIServer()
			api.Out, api.Err = logf, logf
		})}, nil
}

// prepareRealCluster grants the API server's kubelet client its role (as
// kubeadm does) once the API server runs.
func (c *Cluster) prepareRealCluster(ctx context.Context) error {
	crb := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "testbed:" + RealNodesKubeletAPIUser},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "system:kubelet-api-admin"},
		Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: RealNodesKubeletAPIUser}},
	}
	if err := c.Client.Create(ctx, crb); err != nil && !apierrors.IsAlreadyExists(err) {
		return err
	}
	return nil
}

// kubeconfigFor writes a kubeconfig of a user of the cluster's CA.
func (c *Cluster) kubeconfigFor(user envtest.User, file string) (string, error) {
	u, err := c.env.AddUser(user, nil)
	if err != nil {
		return "", err
	}
	kc, err := u.KubeConfig()
	if err != nil {
		return "", err
	}
	path := filepath.Join(c.dir, file)
	return path, os.WriteFile(path, kc, 0o600)
}

// startControllerManager runs kube-controller-manager as kubeadm configures
// it: every controller under its own service account
// (--use-service-account-credentials), the cluster CA for CSR signing, the
// API server's service-account key for tokens.
func (c *Cluster) startControllerManager(ctx context.Context) error {
	path, err := nodeBinary("kube-controller-manager")
	if err != nil {
		return err
	}
	kc, err := c.kubeconfigFor(envtest.User{Name: "system:kube-controller-manager"}, "kube-controller-manager.kubeconfig")
	if err != nil {
		return err
	}
	rootCA := filepath.Join(c.dir, "pki", "apiserver-ca.crt")
	if err := os.WriteFile(rootCA, c.Config.CAData, 0o644); err != nil {
		return err
	}
	apiserver := c.env.ControlPlane.GetAPIServer()
	grace := c.bed.opts.NodeMonitorGracePeriod
	c.ControllerManager, err = c.startOnFreePort(ctx, "kube-controller-manager "+c.Name, func(port int) *Process {
		p := &Process{Name: "kube-controller-manager-" + c.Name, Path: path,
			LogPath: filepath.Join(c.bed.LogDir, "kube-controller-manager-"+c.Name+".log"),
			Args: []string{"--kubeconfig=" + kc, "--authentication-kubeconfig=" + kc, "--authorization-kubeconfig=" + kc,
				"--bind-address=127.0.0.1", "--secure-port=" + strconv.Itoa(port), "--leader-elect=false",
				"--use-service-account-credentials=true",
				"--service-account-private-key-file=" + filepath.Join(apiserver.CertDir, "sa-signer.key"),
				"--root-ca-file=" + rootCA,
				"--cluster-signing-cert-file=" + c.caFile,
				"--cluster-signing-key-file=" + filepath.Join(c.dir, "pki", certauthority.CAKeyFile),
				"--controllers=*,-nodeipam,-cloud-node-lifecycle,-service-lb-controller,-node-route-controller",
				"--node-monitor-grace-period=" + grace.String(), "--node-monitor-period=2s",
				"--concurrent-namespace-syncs=5",
				"--v=" + strconv.Itoa(max(c.bed.opts.Verbosity, 1))}}
		if c.bed.opts.MetricsServer {
			// HorizontalPodAutoscalers act within seconds of a change in
			// the metrics (defaults: every 15 s, and 5 min before scaling in).
			p.Args = append(p.Args,
				"--horizontal-pod-autoscaler-sync-period=5s", "--horizontal-pod-autoscaler-downscale-stabilization=0s")
		}
		return p
	})
	if err != nil {
		return err
	}
	// Healthy is not yet serving: until the serviceaccount controller made
	// default/default, the ServiceAccount admission plugin refuses pods there.
	return c.WaitServiceAccount(ctx, metav1.NamespaceDefault)
}

// WaitServiceAccount waits (up to a minute) for kube-controller-manager to
// make namespace ns's default ServiceAccount: pods in ns are refused until it
// exists. Only with Options.RealNodes (no controller makes it otherwise).
func (c *Cluster) WaitServiceAccount(ctx context.Context, ns string) error {
	return c.bed.poll(ctx, c.ControllerManager, time.Minute, "ServiceAccount "+ns+"/default in "+c.Name, func() (bool, error) {
		err := c.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "default"}, &corev1.ServiceAccount{})
		return err == nil, nil
	})
}

// addRealNode starts a real node of the given size and waits until it is
// Ready. Extended resources (GPUs) are advertised on the Node's status, as
// for a device without a device plugin: the kubelet keeps them.
func (c *Cluster) addRealNode(ctx context.Context, name string, size corev1.ResourceList) error {
	r := c.bed.real
	ip, err := r.allocHostIP()
	if err != nil {
		return err
	}
	podCIDR, index, err := r.allocPodCIDR()
	if err != nil {
		return err
	}
	kc, err := c.kubeconfigFor(envtest.User{Name: "system:node:" + name, Groups: []string{"system:nodes"}}, "kubelet-"+name+".kubeconfig")
	if err != nil {
		return err
	}
	serving, err := c.CA.IssueServer(name, []string{ip, name})
	if err != nil {
		return err
	}
	certDir := filepath.Join(c.dir, "pki", "kubelet-"+name)
	if err := certauthority.WriteTLSDir(certDir, serving, c.CA.CertPEM); err != nil {
		return err
	}
	kubelet, err := nodeBinary("kubelet")
	if err != nil {
		return err
	}
	var kubeProxy, kubeProxyKC string
	if c.bed.opts.RealNodes {
		if kubeProxy, err = nodeBinary("kube-proxy"); err != nil {
			return err
		}
		// User system:kube-proxy has its role (system:node-proxier) by
		// the API server's bootstrap policy.
		if kubeProxyKC, err = c.kubeconfigFor(envtest.User{Name: "system:kube-proxy"}, "kube-proxy-"+name+".kubeconfig"); err != nil {
			return err
		}
	}
	node, err := r.host.StartNode(ctx, realnode.Config{
		Name: name, IP: ip, PodCIDR: podCIDR, BridgeIndex: index,
		CPU: int(size.Cpu().Value()), Memory: size.Memory().Value(),
		Labels:      map[string]string{"topology.kubernetes.io/region": c.Spec.Labels["region"]},
		KubeletPath: kubelet, Kubeconfig: kc, ClientCAFile: c.caFile,
		ServingCertFile: filepath.Join(certDir, certauthority.TLSCertFile), ServingKeyFile: filepath.Join(certDir, certauthority.TLSKeyFile),
		Images: c.bed.imagePaths(), PauseImage: testimages.Pause,
		LogDir: filepath.Join(c.bed.LogDir, "nodes", name), Verbosity: max(c.bed.opts.Verbosity, 1),
		ClusterDNS: DNSServiceIP(c.index),
		OwnNetwork: true, KubeProxyPath: kubeProxy, KubeProxyKubeconfig: kubeProxyKC,
	})
	if err != nil {
		return err
	}
	c.mu.Lock()
	c.realNodes[name] = node
	c.mu.Unlock()
	err = c.bed.poll(ctx, nil, 90*time.Second, "node "+name+" Ready", func() (bool, error) {
		n, err := c.Clientset.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, nil //nolint:nilerr // not registered yet
		}
		for _, cond := range n.Status.Conditions {
			if cond.Type == corev1.NodeReady {
				return cond.Status == corev1.ConditionTrue, nil
			}
		}
		return false, nil
	})
	if err != nil {
		return fmt.Errorf("%w (logs in %s)", err, node.LogDir)
	}
	if c.bed.opts.RealNodes {
		if err := c.routeServices(ip); err != nil {
			return err
		}
	}
	if gpus, ok := size[rbv1.ResourceGPU]; ok {
		patch, _ := json.Marshal(map[string]any{"status": map[string]any{"capacity": map[string]any{string(rbv1.ResourceGPU): gpus.String()}}})
		if _, err := c.Clientset.CoreV1().Nodes().Patch(ctx, name, types.MergePatchType, patch, metav1.PatchOptions{}, "status"); err != nil {
			return fmt.Errorf("node %s: advertise %s: %w", name, rbv1.ResourceGPU, err)
		}
		// The kubelet copies it into allocatable at its next status update.
		err := c.bed.poll(ctx, nil, 30*time.Second, "node "+name+" allocatable "+string(rbv1.ResourceGPU), func() (bool, error) {
			n, err := c.Clientset.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return false, err
			}
			a, ok := n.Status.Allocatable[rbv1.ResourceGPU]
			return ok && a.Equal(gpus), nil
		})
		if err != nil {
			return err
		}
	}
	c.mu.Lock()
	c.nodes = append(c.nodes, name)
	c.mu.Unlock()
	return nil
}

// RealNode returns a running real node of the cluster (nil if none).
func (c *Cluster) RealNode(name string) *realnode.Node {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.realNodes[name]
}

// startKubeScheduler runs the cluster's own kube-scheduler (default
// profile, as user system:kube-scheduler with its bootstrap roles), for a
// bed whose components are deployed as pods (Options.Deployed): something
// must schedule them, as in any cluster.
func (c *Cluster) startKubeScheduler(ctx context.Context) error {
	path, err := nodeBinary("kube-scheduler")
	if err != nil {
		return err
	}
	kc, err := c.kubeconfigFor(envtest.User{Name: "system:kube-scheduler"}, "kube-scheduler.kubeconfig")
	if err != nil {
		return err
	}
	c.KubeScheduler, err = c.startOnFreePort(ctx, "kube-scheduler "+c.Name, func(port int) *Process {
		return &Process{Name: "kube-scheduler-" + c.Name, Path: path,
			LogPath: filepath.Join(c.bed.LogDir, "kube-scheduler-"+c.Name+".log"),
			Args: []string{"--kubeconfig=" + kc, "--authentication-kubeconfig=" + kc, "--authorization-kubeconfig=" + kc,
				"--bind-address=127.0.0.1", "--secure-port=" + strconv.Itoa(port), "--leader-elect=false",
				"--v=" + strconv.Itoa(max(c.bed.opts.Verbosity, 1))}}
	})
	return err
}

// startOnFreePort starts the process newProcess makes for a free port (its
// --secure-port on 127.0.0.1) and waits until its /healthz answers; a port
// taken before the process bound it is tried again with another, twice.
func (c *Cluster) startOnFreePort(ctx context.Context, what string, newProcess func(port int) *Process) (*Process, error) {
	var last error
	for range 3 {
		ports, err := FreePorts(1)
		if err != nil {
			return nil, err
		}
		p := newProcess(ports[0])
		if err := p.Start(); err != nil {
			return nil, err
		}
		last = c.bed.poll(ctx, p, 60*time.Second, what+" healthy", func() (bool, error) {
			return httpsOK(fmt.Sprintf("https://127.0.0.1:%d/healthz", ports[0])), nil
		})
		if last == nil {
			return p, nil
		}
		_ = p.Kill()
		if !p.portInUse() {
			return p, last
		}
	}
	return nil, last
}
