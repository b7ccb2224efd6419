package testbed

import (
	"context"
	"crypto/tls"
	"fmt"
	"maps"
	"net/http"
	"os"
	"path/filepath"
	goruntime "runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	apiregistrationv1 "k8s.io/kube-aggregator/pkg/apis/apiregistration/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	"sigs.k8s.io/yaml"

	rbv1 "github.com/fluidos-project/resource-broker/api/v1alpha1"
	brokerclient "github.com/fluidos-project/resource-broker/broker/client"
	"github.com/fluidos-project/resource-broker/broker/model"
	"github.com/fluidos-project/resource-broker/internal/certauthority"
	"github.com/fluidos-project/resource-broker/internal/kubelet"
	"github.com/fluidos-project/resource-broker/internal/realnode"
	"github.com/fluidos-project/resource-broker/internal/testenv"
	"github.com/fluidos-project/resource-broker/internal/testimages"
)

// AgentNamespace is where the agents keep their objects (as in manifests/agent).
const AgentNamespace = "resource-broker"

// Scheme knows the built-in types, resource-broker's CRDs, APIServices and
// CustomResourceDefinitions.
var Scheme = func() *runtime.Scheme {
	s := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(s); err != nil {
		panic(err)
	}
	if err := rbv1.AddToScheme(s); err != nil {
		panic(err)
	}
	if err := apiregistrationv1.AddToScheme(s); err != nil {
		panic(err)
	}
	if err := apiextensionsv1.AddToScheme(s); err != nil {
		panic(err)
	}
	return s
}()

// Resources is a shorthand for a node's size: Resources("8", "32Gi") or
// Resources("16", "64Gi", "4") with GPUs; pods and ephemeral storage are
// filled in as devclusters does.
func Resources(cpu, memory string, gpus ...string) corev1.ResourceList {
	l := corev1.ResourceList{
		corev1.ResourceCPU: resource.MustParse(cpu), corev1.ResourceMemory: resource.MustParse(memory),
		corev1.ResourcePods: resource.MustParse("110"), corev1.ResourceEphemeralStorage: resource.MustParse("100Gi"),
	}
	if len(gpus) > 0 {
		l[rbv1.ResourceGPU] = resource.MustParse(gpus[0])
	}
	return l
}

// ClusterSpec describes a member cluster of the bed.
type ClusterSpec struct {
	Name string
	// Nodes are the sizes of its real nodes, named <name>-node-<i> from 1.
	Nodes []corev1.ResourceList
	// Prices per core-, GiB- and GPU-hour, as rb-agent's --price-* flags.
	PriceCPU, PriceMemory, PriceGPU string
	// Labels advertised (rb-agent --labels).
	Labels map[string]string
	// Requester clusters run rb-scheduler with the resource-broker profile
	// (and the default one), the Deployment and ReplicaSet controllers and
	// the garbage collector. Other clusters run rb-scheduler with the default
	// profile only, as a provider's own kube-scheduler.
	Requester bool
}

// The clusters of the bed, as the issue describes them: rome, a small
// requester; paris, a cheaper provider; berlin, a pricier and bigger one
// with GPUs.
var (
	Rome = ClusterSpec{Name: "rome", Requester: true, Nodes: []corev1.ResourceList{Resources("2", "4Gi")},
		PriceCPU: "0.04", PriceMemory: "0.005", Labels: map[string]string{"region": "eu-south"}}
	Paris = ClusterSpec{Name: "paris", Nodes: []corev1.ResourceList{Resources("8", "32Gi")},
		PriceCPU: "0.02", PriceMemory: "0.003", Labels: map[string]string{"region": "eu-west"}}
	Berlin = ClusterSpec{Name: "berlin", Nodes: []corev1.ResourceList{Resources("16", "64Gi", "4")},
		PriceCPU: "0.035", PriceMemory: "0.004", PriceGPU: "0.9", Labels: map[string]string{"region": "eu-central"}}
)

// The clusters of a real-node bed (Options.RealNodes): real kubelets, so
// sizes are what 2 cores can fake (see realnode) and providers have nodes of
// different sizes. rome's one 1-CPU node holds no 1.5-CPU pod; paris has a
// 4-CPU and a 2-CPU node (two such pods on the first, one on the second);
// berlin a 4-CPU node with 2 GPUs and a 2-CPU one.
var (
	RealRome = ClusterSpec{Name: "rome", Requester: true, Nodes: []corev1.ResourceList{Resources("1", "2Gi")},
		PriceCPU: "0.04", PriceMemory: "0.005", Labels: map[string]string{"region": "eu-south"}}
	RealParis = ClusterSpec{Name: "paris", Nodes: []corev1.ResourceList{Resources("4", "8Gi"), Resources("2", "4Gi")},
		PriceCPU: "0.02", PriceMemory: "0.003", Labels: map[string]string{"region": "eu-west"}}
	RealBerlin = ClusterSpec{Name: "berlin", Nodes: []corev1.ResourceList{Resources("4", "16Gi", "2"), Resources("2", "8Gi")},
		PriceCPU: "0.035", PriceMemory: "0.004", PriceGPU: "0.9", Labels: map[string]string{"region": "eu-central"}}
)

// Cluster is a running member cluster: a real API server and etcd (envtest),
// its agent, its scheduler, and in-process stand-ins.
type Cluster struct {
	Spec ClusterSpec
	Name string
	// Config is an admin (system:masters) config; Kubeconfig the same as a file.
	Config     *rest.Config
	Kubeconfig string
	Client     client.Client
	Clientset  kubernetes.Interface
	// AgentKubeconfig and SchedulerKubeconfig are what rb-agent and
	// rb-scheduler run with: a token of their ServiceAccount, bound by the
	// manifests' RBAC (identities.go).
	AgentKubeconfig, SchedulerKubeconfig string
	// CertDir holds the cluster's broker client certificate (CN = Name).
	CertDir string
	// Agent is rb-agent; Scheduler is rb-scheduler; ControllerManager is
	// kube-controller-manager (with Options.RealNodes only); MetricsServer
	// is metrics-server (with Options.MetricsServer only), serving at
	// MetricsServerAddr (an address of its own on the host bridge).
	Agent, Scheduler, ControllerManager, MetricsServer *Process
	// KubeScheduler is the cluster's plain kube-scheduler (Options.Deployed only).
	KubeScheduler     *Process
	MetricsServerAddr string
	// Kueue is Kueue's controller-manager (with Options.Kueue, in requester
	// clusters only), its webhooks served at KueueWebhookURL (kueue.go).
	Kueue           *Process
	KueueWebhookURL string
	// CA is the cluster's CA (with Options.RealNodes or Kueue): with
	// RealNodes the API server's client CA, issuer of the kubelets' serving
	// certificates and kube-controller-manager's CSR signer; the issuer of
	// Kueue's serving certificate.
	CA *certauthority.CA
	// AgentIP is the address of the agent's virtual-kubelet endpoint (with
	// Options.RealNodes: an address on the host bridge, as a pod IP).
	AgentIP string
	// With Options.RealNodes: APIServerIP is the API server's address (behind
	// Service kubernetes), DNSAddr CoreDNS's (behind Service kube-system/kube-dns,
	// DNSServiceIP), ClusterDNS the CoreDNS process.
	APIServerIP, DNSAddr string
	ClusterDNS           *Process

	bed        *Bed
	index      int
	env        *envtest.Environment
	dir        string
	caFile     string
	realNodes  map[string]*realnode.Node
	agentProbe string // 127.0.0.1:<port> of the agent's /readyz
	schedPort  int
	kubelet    *kubeletStandIn
	mu         sync.Mutex
	nodes      []string
	frozen     bool // freeze.go
}

// startControlPlane starts the API server and prepares the cluster: CRDs,
// the agent's namespace and the agent's and scheduler's identities and
// permissions from the manifests (identities.go), Ready nodes, an admin
// kubeconfig.
func (c *Cluster) startControlPlane(ctx context.Context, crdDirs ...string) error {
	opts := []testenv.Option{testenv.WithCRDDirectories(crdDirs...),
		testenv.WithAPIServerArg("service-cluster-ip-range", serviceCIDR(c.index))}
	if c.bed.opts.RealNodes {
		real, err := c.controlPlaneOptions(ctx)
		if err != nil {
			return err
		}
		opts = append(opts, real...)
	}
	env, err := testenv.New(opts...)
	if err != nil {
		return err
	}
	if _, err := env.Start(); err != nil {
		_ = env.Stop()
		return fmt.Errorf("%s: start control plane: %w", c.Name, err)
	}
	c.env = env
	user, err := env.AddUser(envtest.User{Name: "testbed-admin", Groups: []string{"system:masters"}}, nil)
	if err != nil {
		return err
	}
	kc, err := user.KubeConfig()
	if err != nil {
		return err
	}
	c.Kubeconfig = filepath.Join(c.dir, "kubeconfig")
	if err := os.WriteFile(c.Kubeconfig, kc, 0o600); err != nil {
		return err
	}
	c.Config = user.Config()
	c.Config.QPS, c.Config.Burst = 200, 400
	if c.Client, err = client.New(c.Config, client.Options{Scheme: Scheme}); err != nil {
		return err
	}
	if c.Clientset, err = kubernetes.NewForConfig(c.Config); err != nil {
		return err
	}
	if !c.bed.opts.Deployed { // deployed from the manifests by the test
		if err := c.installIdentities(ctx); err != nil {
			return err
		}
	}
	if c.bed.opts.RealNodes {
		return c.prepareRealCluster(ctx)
	}
	if c.kubelet, err = newKubeletStandIn(c.Config); err != nil {
		return err
	}
	return c.addSpecNodes(ctx)
}

// addSpecNodes adds the nodes of the cluster's spec, named <name>-node-<i>.
func (c *Cluster) addSpecNodes(ctx context.Context) error {
	for i, size := range c.Spec.Nodes {
		if err := c.AddNode(ctx, fmt.Sprintf("%s-node-%d", c.Name, i+1), size); err != nil {
			return err
		}
	}
	return nil
}

// startInProcess runs the cluster's stand-ins and controllers.
func (c *Cluster) startInProcess(ctx context.Context) error {
	if err := c.kubelet.start(ctx); err != nil {
		return err
	}
	if err := startNamespaceController(ctx, c.Config); err != nil {
		return err
	}
	if err := startNodeTaints(ctx, c.Config); err != nil {
		return err
	}
	if !c.Spec.Requester {
		return nil
	}
	if err := startWorkloadControllers(ctx, c.Config); err != nil {
		return err
	}
	return startGarbageCollector(ctx, c.Config)
}

// AddNode adds a Ready node of the given size, which the agent counts: a
// real node with Options.RealNodes, else a Node object (no taints) that the
// kubelet stand-in serves.
func (c *Cluster) AddNode(ctx context.Context, name string, size corev1.ResourceList) error {
	if c.bed.opts.RealNodes {
		return c.addRealNode(ctx, name, size)
	}
	c.kubelet.addNode(name)
	if _, err := kubelet.ReadyNode(ctx, c.Clientset, name, size, map[string]string{corev1.LabelHostname: name}); err != nil {
		c.kubelet.removeNode(name)
		return fmt.Errorf("%s: node %s: %w", c.Name, name, err)
	}
	c.mu.Lock()
	c.nodes = append(c.nodes, name)
	c.mu.Unlock()
	return nil
}

// DeleteNode removes a node AddNode made.
func (c *Cluster) DeleteNode(ctx context.Context, name string) error {
	if n := c.RealNode(name); n != nil {
		if err := n.Stop(); err != nil {
			return err
		}
	}
	err := c.Clientset.CoreV1().Nodes().Delete(ctx, name, metav1.DeleteOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		return err
	}
	if c.kubelet != nil {
		c.kubelet.removeNode(name)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.realNodes, name)
	for i, n := range c.nodes {
		if n == name {
			c.nodes = append(c.nodes[:i], c.nodes[i+1:]...)
			break
		}
	}
	return nil
}

// RealNodes lists the cluster's running real nodes.
func (c *Cluster) RealNodes() []*realnode.Node {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]*realnode.Node, 0, len(c.realNodes))
	for _, n := range c.realNodes {
		out = append(out, n)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// Nodes lists the nodes of the cluster (not the virtual ones).
func (c *Cluster) Nodes() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]string(nil), c.nodes...)
}

// BrokerClient is a client of the broker (through the proxy) with this
// cluster's identity.
func (c *Cluster) BrokerClient(opts ...brokerclient.Option) (*brokerclient.Client, error) {
	return brokerclient.New(c.bed.BrokerURL, c.CertDir, opts...)
}

func (c *Cluster) agentArgs(probe string) []string {
	o := c.bed.opts
	args := []string{
		"--kubeconfig=" + c.AgentKubeconfig,
		"--cluster-id=" + c.Name,
		"--broker-url=" + c.bed.BrokerURL,
		"--broker-cert-dir=" + c.CertDir,
		"--namespace=" + AgentNamespace,
		"--leader-elect=false",
		"--metrics-bind-address=0",
		"--health-probe-bind-address=" + probe,
		"--debounce=" + o.Debounce.String(),
		"--publish-period=" + o.PublishPeriod.String(),
		"--token-ttl=" + o.TokenTTL.String(),
	}
	for flag, v := range map[string]string{"--price-cpu": c.Spec.PriceCPU, "--price-memory": c.Spec.PriceMemory, "--price-gpu": c.Spec.PriceGPU} {
		if v != "" {
			args = append(args, flag+"="+v)
		}
	}
	labels := maps.Clone(c.Spec.Labels)
	if c.bed.opts.RealNodes {
		// What a provider's real nodes are, advertised as a member cluster
		// of a real federation would, so that pods selecting them can be
		// placed (and their virtual nodes carry them).
		if labels == nil {
			labels = map[string]string{}
		}
		labels[corev1.LabelArchStable], labels[corev1.LabelOSStable] = goruntime.GOARCH, "linux"
		if r, ok := labels["region"]; ok {
			labels[corev1.LabelTopologyRegion] = r
		}
	}
	if len(labels) > 0 {
		var kv []string
		for k, v := range labels {
			kv = append(kv, k+"="+v)
		}
		sort.Strings(kv)
		args = append(args, "--labels="+strings.Join(kv, ","))
	}
	// The bridge's flags, once rb-agent has them: its kubelet endpoint (one
	// per agent, so not the default :10250) on loopback, where the API
	// server reaches it.
	switch {
	case c.AgentIP != "":
		// A real cluster: the agent's kubelet endpoint on its own address
		// at the kubelet port, as a pod of the agent would have it.
		args = append(args, "--kubelet-address="+c.AgentIP+":10250", "--node-ip="+c.AgentIP)
	case c.bed.agentHasFlag("kubelet-address"):
		if ports, err := FreePorts(1); err == nil {
			args = append(args, "--kubelet-address=127.0.0.1:"+strconv.Itoa(ports[0]), "--node-ip=127.0.0.1")
		}
	}
	if o.RealNodes && c.bed.agentHasFlag("placeholder-image") {
		// The placeholders of the provider-side hold run the bed's pause
		// image (imported on every node, never pulled).
		args = append(args, "--placeholder-image="+testimages.Pause)
	}
	if o.AgentArgs != nil {
		args = append(args, o.AgentArgs(c.Name)...)
	}
	return append(args, "--v="+strconv.Itoa(o.Verbosity))
}

// StartAgent starts rb-agent and waits until it serves /readyz and its
// advertisement has reached the broker.
func (c *Cluster) StartAgent(ctx context.Context) error {
	if c.bed.real != nil && c.AgentIP == "" {
		ip, err := c.bed.real.allocHostIP()
		if err != nil {
			return err
		}
		if err := c.bed.real.host.AddAddress(ip); err != nil {
			return err
		}
		c.AgentIP = ip
	}
	var last error
	for range 3 {
		ports, err := FreePorts(1)
		if err != nil {
			return err
		}
		c.agentProbe = "127.0.0.1:" + strconv.Itoa(ports[0])
		if c.Agent == nil {
			c.Agent = &Process{Name: "rb-agent-" + c.Name, Path: filepath.Join(c.bed.BinDir, "rb-agent"),
				LogPath: filepath.Join(c.bed.LogDir, "agent-"+c.Name+".log"), Env: []string{"POD_IP=127.0.0.1"}}
		}
		c.Agent.Args = c.agentArgs(c.agentProbe)
		began, err := c.bed.BrokerNow(ctx) // SeenAt is on the broker's clock
		if err != nil {
			return err
		}
		if err := c.Agent.Start(); err != nil {
			return err
		}
		if last = c.waitAgent(ctx, began); last == nil {
			return nil
		}
		_ = c.Agent.Kill()
		if !c.Agent.portInUse() {
			return last
		}
	}
	return last
}

// waitAgent waits until the agent is ready and the broker saw an
// advertisement of it after since (on the broker's clock: BrokerNow).
func (c *Cluster) waitAgent(ctx context.Context, since time.Time) error {
	return c.bed.poll(ctx, c.Agent, 90*time.Second, "agent "+c.Name+" ready and advertised", func() (bool, error) {
		if !HTTPOK("http://" + c.agentProbe + "/readyz") {
			return false, nil
		}
		cl, err := c.bed.Store.Cluster(ctx, c.Name)
		if err != nil {
			return false, nil //nolint:nilerr // not advertised yet
		}
		return cl.SeenAt.After(since.Add(-time.Second)) && cl.Allocatable == c.expectedAllocatable(), nil
	})
}

// expectedAllocatable is what the agent should advertise: the sum of the nodes.
func (c *Cluster) expectedAllocatable() model.Resources {
	var sum model.Resources
	c.mu.Lock()
	names := append([]string(nil), c.nodes...)
	c.mu.Unlock()
	for _, n := range names {
		node, err := c.Clientset.CoreV1().Nodes().Get(context.Background(), n, metav1.GetOptions{})
		if err != nil {
			continue
		}
		a := node.Status.Allocatable
		sum.CPU += a.Cpu().MilliValue()
		sum.Memory += a.Memory().Value()
		sum.Storage += a.StorageEphemeral().Value()
		if g, ok := a[rbv1.ResourceGPU]; ok {
			sum.GPU += g.Value()
		}
	}
	return sum
}

// StopAgent stops rb-agent (SIGTERM), as a deleted or evicted agent pod.
func (c *Cluster) StopAgent() error {
	if c.Agent == nil {
		return nil
	}
	return c.Agent.Stop(15 * time.Second)
}

// schedulerConfig is manifests/scheduler's KubeSchedulerConfiguration with the
// bed's kubeconfig and no leader election; a requester gets the
// default-scheduler profile too, a provider only that one.
func (c *Cluster) schedulerConfig(moduleRoot string) ([]byte, error) {
	raw, err := os.ReadFile(filepath.Join(moduleRoot, "manifests", "scheduler", "configmap.yaml"))
	if err != nil {
		return nil, err
	}
	var cm corev1.ConfigMap
	if err := yaml.Unmarshal(raw, &cm); err != nil {
		return nil, err
	}
	var cfg map[string]any
	if err := yaml.Unmarshal([]byte(cm.Data["config.yaml"]), &cfg); err != nil {
		return nil, err
	}
	cfg["leaderElection"] = map[string]any{"leaderElect": false}
	cfg["clientConnection"] = map[string]any{"kubeconfig": c.SchedulerKubeconfig, "qps": 200, "burst": 400}
	def := map[string]any{"schedulerName": corev1.DefaultSchedulerName}
	if c.Spec.Requester {
		profiles, _ := cfg["profiles"].([]any)
		if c.bed.opts.Gangs {
			if err := enableCoscheduling(profiles); err != nil {
				return nil, err
			}
		}
		cfg["profiles"] = append(profiles, def)
	} else {
		cfg["profiles"] = []any{def}
	}
	return yaml.Marshal(cfg)
}

// schedulerFeatureGates are the --feature-gates flags of rb-scheduler in
// manifests/scheduler's Deployment: the bed runs the scheduler as shipped.
func schedulerFeatureGates(moduleRoot string) ([]string, error) {
	raw, err := os.ReadFile(filepath.Join(moduleRoot, "manifests", "scheduler", "deployment.yaml"))
	if err != nil {
		return nil, err
	}
	var d appsv1.Deployment
	if err := yaml.Unmarshal(raw, &d); err != nil {
		return nil, err
	}
	var gates []string
	for _, ctr := range d.Spec.Template.Spec.Containers {
		for _, a := range ctr.Args {
			if strings.HasPrefix(a, "--feature-gates=") {
				gates = append(gates, a)
			}
		}
	}
	return gates, nil
}

// startScheduler runs rb-scheduler (kube-scheduler with the plugin built in)
// and waits for its /readyz.
func (c *Cluster) startScheduler(ctx context.Context) error {
	cfg, err := c.schedulerConfig(c.bed.moduleRoot)
	if err != nil {
		return fmt.Errorf("%s: scheduler configuration: %w", c.Name, err)
	}
	path := filepath.Join(c.dir, "scheduler.yaml")
	if err := os.WriteFile(path, cfg, 0o600); err != nil {
		return err
	}
	// A requester runs rb-scheduler as shipped (its feature gates); a
	// provider's scheduler is a plain kube-scheduler (default profile,
	// default gates), as a member cluster has: its preemption is what the
	// provider-side hold relies on.
	var gates []string
	if c.Spec.Requester {
		var err error
		if gates, err = schedulerFeatureGates(c.bed.moduleRoot); err != nil {
			return fmt.Errorf("%s: scheduler feature gates: %w", c.Name, err)
		}
	}
	var last error
	for range 3 {
		ports, err := FreePorts(1)
		if err != nil {
			return err
		}
		c.schedPort = ports[0]
		c.Scheduler = &Process{Name: "rb-scheduler-" + c.Name, Path: filepath.Join(c.bed.BinDir, "rb-scheduler"),
			LogPath: filepath.Join(c.bed.LogDir, "scheduler-"+c.Name+".log"),
			Args: []string{"--config=" + path, "--secure-port=" + strconv.Itoa(c.schedPort), "--bind-address=127.0.0.1",
				"--authentication-kubeconfig=" + c.SchedulerKubeconfig, "--authorization-kubeconfig=" + c.SchedulerKubeconfig,
				"--v=" + strconv.Itoa(max(c.bed.opts.Verbosity, 2))}}
		c.Scheduler.Args = append(c.Scheduler.Args, gates...)
		if err := c.Scheduler.Start(); err != nil {
			return err
		}
		last = c.bed.poll(ctx, c.Scheduler, 120*time.Second, "rb-scheduler "+c.Name+" ready", func() (bool, error) {
			return httpsOK(fmt.Sprintf("https://127.0.0.1:%d/readyz", c.schedPort)), nil
		})
		if last == nil {
			return nil
		}
		_ = c.Scheduler.Kill()
		if !c.Scheduler.portInUse() {
			return last
		}
	}
	return last
}

var insecureHTTPS = &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{
	TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}} //nolint:gosec // the scheduler's self-signed serving certificate

func httpsOK(url string) bool {
	resp, err := insecureHTTPS.Get(url)
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

var plainHTTP = &http.Client{Timeout: 2 * time.Second}

// HTTPOK tells whether a plain-HTTP GET of url answers 200 within 2 s.
func HTTPOK(url string) bool {
	resp, err := plainHTTP.Get(url)
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}
