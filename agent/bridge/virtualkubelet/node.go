package virtualkubelet

import (
	"context"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"github.com/virtual-kubelet/virtual-kubelet/node"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	corev1listers "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/fluidos-project/resource-broker/broker/api"
	"github.com/fluidos-project/resource-broker/internal/backoff"
)

// NodePrefix prefixes the virtual node of a provider: rb-<provider>.
const NodePrefix = "rb-"

// NodeName is the virtual node that stands for provider.
func NodeName(provider string) string { return NodePrefix + provider }

// Labels of our virtual nodes, besides rbv1.ProviderLabel.
const (
	TypeLabel = "type"
	TypeValue = "virtual-kubelet"
)

// Reasons of the virtual node's Ready condition.
const (
	ReasonReachable          = "ProviderReachable"
	ReasonUnreachable        = "ProviderUnreachable"
	ReasonWaitingCredentials = "WaitingForCredentials"
	ReasonCredentialsExpired = "CredentialsExpired"
	ReasonCredentialsDenied  = "CredentialsRejected"
	ReasonAccessRevoked      = "AccessRevoked"
)

// providerNode serves the virtual node of one provider: the Node and its Lease
// (virtual-kubelet's NodeController, with this as its NodeProvider), the pods
// bound to it (virtual-kubelet's PodController, with a podHandler), the
// provider's credentials and a probe of its API.
type providerNode struct {
	b        *Bridge
	provider string
	name     string
	log      logr.Logger

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	localPods   corev1listers.PodLister // pods bound to this node
	localSynced cache.InformerSynced
	pods        *podHandler
	objects     *objectMirror
	tokens      *homeTokens   // its copies' home API tokens
	serviceEnv  *serviceEnvs  // its copies' home Service variables (HomeNetwork)
	endpoint    *nodeEndpoint // its kubelet endpoint; nil when off
	usage       nodeUsage     // its pods' resource usage at the provider
	started     time.Time

	refresh  chan struct{} // fetch the grant again now
	probeNow chan struct{}
	pushNow  chan struct{}

	mu      sync.Mutex
	active  []string // broker ids of the active reservations, newest first
	grantOf string   // the reservation whose grant the connection uses
	// counted: the active reservations the capacity as the API server holds it counts.
	counted []string
	// written is the capacity writeCapacity last wrote, at resourceVersion writtenRV.
	written   corev1.ResourceList
	writtenRV string
	capacity  corev1.ResourceList
	ready     readiness
	// lastContact is when the provider's API server last answered the
	// probe (zero: never); lostSince when the node was declared lost
	// (zero: it is not). See lost.go.
	lastContact, lostSince time.Time
	// told: the pods whose fate on the lost provider an Event has told.
	told   map[types.UID]bool
	notify func(*corev1.Node)
	remote *remoteCluster
	// providerLabels are the provider's advertised labels the node carries.
	providerLabels map[string]string
}

var _ node.NodeProvider = (*providerNode)(nil)

func (b *Bridge) newProviderNode(provider string) (*providerNode, error) {
	ctx, cancel := context.WithCancel(b.ctx)
	n := &providerNode{
		b: b, provider: provider, name: NodeName(provider), log: b.log.WithValues("provider", provider, "node", NodeName(provider)),
		ctx: ctx, cancel: cancel,
		refresh: make(chan struct{}, 1), probeNow: make(chan struct{}, 1), pushNow: make(chan struct{}, 1),
		capacity: corev1.ResourceList{}, started: time.Now(),
		ready: readiness{status: corev1.ConditionFalse, reason: ReasonWaitingCredentials, message: "no grant from " + provider + " yet", since: metav1.Now()},
	}
	n.resumeReadiness(ctx)
	n.pods = &podHandler{n: n, deleting: map[string]bool{}, unscheduled: map[types.UID]bool{}}
	n.objects = newObjectMirror(n)
	n.tokens = newHomeTokens(n)
	n.serviceEnv = newServiceEnvs(n)

	factory := informers.NewSharedInformerFactoryWithOptions(b.local, 0,
		informers.WithTransform(stripManagedFields),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.FieldSelector = fields.OneTermEqualSelector("spec.nodeName", n.name).String()
		}))
	podInformer := factory.Core().V1().Pods()
	counted, err := podInformer.Informer().AddEventHandler(n.objects)
	if err != nil {
		cancel()
		return nil, err
	}
	n.objects.synced = counted.HasSynced
	if _, err := podInformer.Informer().AddEventHandler(n.pods.admissionEvents()); err != nil {
		cancel()
		return nil, err
	}
	n.localPods, n.localSynced = podInformer.Lister(), podInformer.Informer().HasSynced

	// The pod controller insists on ConfigMap, Secret and Service informers to
	// resolve the downward API; the bridge leaves that to the provider's
	// kubelet (SkipDownwardAPIResolution) and copies the objects instead, so
	// these informers are never started.
	idle := informers.NewSharedInformerFactory(b.local, 0)
	pc, err := node.NewPodController(node.PodControllerConfig{
		PodClient:                 statusClient{CoreV1Interface: b.local.CoreV1(), pods: n.localPods},
		PodInformer:               podInformer,
		EventRecorder:             podControllerRecorder{b.recorder},
		Provider:                  n.pods,
		ConfigMapInformer:         idle.Core().V1().ConfigMaps(),
		SecretInformer:            idle.Core().V1().Secrets(),
		ServiceInformer:           idle.Core().V1().Services(),
		SkipDownwardAPIResolution: true,
		PodEventFilterFunc:        n.pods.handles, // the admitted pods (admission.go)
	})
	if err != nil {
		cancel()
		return nil, err
	}

	if b.kubelet != nil {
		// Before the node is registered: its port is in the Node. Without a
		// free port the node still runs pods; logs, exec and metrics fail.
		if n.endpoint, err = b.kubelet.listen(n); err != nil {
			n.log.Error(err, "the virtual node has no kubelet endpoint")
		}
	}

	vkctx := withVKLogger(ctx, n.log.WithName("virtual-kubelet"))
	factory.Start(ctx.Done())
	if n.endpoint != nil {
		n.goRun(func() { n.endpoint.serve(ctx) })
	}
	n.goRun(func() { n.usageLoop(ctx) })
	n.goRun(func() { n.tokens.run(ctx) })
	n.goRun(func() { n.serviceEnv.run(ctx) })
	n.goRun(func() { n.objects.run(ctx) })
	n.goRun(func() {
		if err := pc.Run(vkctx, b.cfg.PodSyncWorkers); err != nil && ctx.Err() == nil {
			n.log.Error(err, "pod controller stopped")
		}
	})
	n.goRun(func() { n.runNodeController(vkctx) })
	n.goRun(func() { n.pushLoop(ctx) })
	n.goRun(func() {
		// Credentials (hence the provider's pod informer) once the pod
		// controller listens for status notifications.
		select {
		case <-ctx.Done():
			return
		case <-pc.Ready():
		}
		n.credentialsLoop(ctx)
	})
	n.goRun(func() { n.probeLoop(ctx) })
	n.goRun(func() { n.heartbeatLoop(ctx) })
	n.log.Info("virtual node started")
	return n, nil
}

func (n *providerNode) goRun(fn func()) {
	n.wg.Add(1)
	go func() {
		defer n.wg.Done()
		fn()
	}()
}

// stop ends every loop of the node and waits for them; the Node object stays.
func (n *providerNode) stop() {
	n.cancel()
	n.wg.Wait()
	n.mu.Lock()
	rc := n.remote
	n.remote = nil
	n.mu.Unlock()
	if rc != nil {
		rc.stop()
	}
	n.log.Info("virtual node stopped")
}

// runNodeController registers the node and keeps its status and lease up to
// date; it starts over if registration fails.
func (n *providerNode) runNodeController(ctx context.Context) {
	cfg := n.b.cfg
	leases := n.b.local.CoordinationV1().Leases(corev1.NamespaceNodeLease)
	n.learnProviderLabels(ctx)
	for retry := backoff.Exponential(time.Second, 30*time.Second); ctx.Err() == nil; {
		nc, err := node.NewNodeController(n, n.nodeObject(), n.b.local.CoreV1().Nodes(),
			node.WithNodeEnableLeaseV1(leases, int32(cfg.LeaseDuration/time.Second)),
			node.WithNodeStatusUpdateInterval(cfg.StatusSyncPeriod),
			node.WithNodePingInterval(cfg.ProbePeriod),
			node.WithNodeStatusUpdateErrorHandler(n.recreateNode))
		if err != nil {
			n.log.Error(err, "node controller")
			return
		}
		if err := nc.Run(ctx); err != nil && ctx.Err() == nil {
			wait := retry.Step()
			n.log.Error(err, "registering the virtual node, retrying", "in", wait)
			select {
			case <-ctx.Done():
			case <-time.After(wait):
			}
			continue
		}
		return
	}
}

// ClusterSource reads a cluster's record at the broker (the broker client
// is one): a GrantSource that is one too lets the virtual node carry the
// provider's advertised node labels.
type ClusterSource interface {
	Cluster(ctx context.Context, id string) (api.Cluster, error)
}

// learnProviderLabels takes, of the labels the provider advertises at the
// broker, those in CarriedNodeLabels (architecture, OS, region, zone, GPU
// model), so that pods whose selectors made the broker choose this
// provider also match its virtual node. Best effort: read once, before the
// node is registered.
func (n *providerNode) learnProviderLabels(ctx context.Context) {
	src, ok := n.b.cfg.Grants.(ClusterSource)
	if !ok {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	c, err := src.Cluster(ctx, n.provider)
	if err != nil {
		n.log.Info("the provider's labels are unknown; its virtual node carries none of them", "error", err.Error())
		return
	}
	labels := map[string]string{}
	for k, v := range c.Labels {
		if CarriedNodeLabels[k] {
			labels[k] = v
		}
	}
	n.mu.Lock()
	n.providerLabels = labels
	n.mu.Unlock()
}

// recreateNode registers the node again when someone deleted it.
func (n *providerNode) recreateNode(ctx context.Context, err error) error {
	if !apierrors.IsNotFound(err) {
		return err
	}
	n.log.Info("virtual node was deleted, registering it again")
	node := n.nodeObject()
	n.mu.Lock()
	node.Status.Capacity = n.capacityLocked()
	n.mu.Unlock()
	node.Status.Allocatable = node.Status.Capacity.DeepCopy()
	_, err = n.b.local.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{})
	return err
}

// Ping is the virtual kubelet's own liveness: the lease is renewed while the
// agent runs. The provider's health is the Ready condition (see probe).
func (n *providerNode) Ping(ctx context.Context) error { return ctx.Err() }

func (n *providerNode) currentRemote() *remoteCluster {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.remote
}

// hasPods: some pod bound to the node has not finished (or the informer does
// not know yet).
func (n *providerNode) hasPods() bool {
	if !n.localSynced() {
		return true
	}
	pods, err := n.localPods.List(everything)
	if err != nil {
		return true
	}
	for _, p := range pods {
		if holdsNode(p) {
			return true
		}
	}
	return false
}

func finished(p *corev1.Pod) bool {
	return p.DeletionTimestamp == nil && (p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed)
}

// mirrorParams for the current node and tenant namespace.
func (n *providerNode) mirrorParams(rc *remoteCluster) mirrorParams {
	return mirrorParams{clusterID: n.b.cfg.ClusterID, namespace: rc.namespace, node: n.nodeObject()}
}
