package virtualkubelet

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"github.com/virtual-kubelet/virtual-kubelet/node"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/resourceversion"
	"k8s.io/client-go/informers"
	corev1listers "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"

	rbv1 "github.com/fluidos-project/resource-broker/api/v1alpha1"
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

// readiness is the node's Ready condition as the probe last judged it.
type readiness struct {
	status          corev1.ConditionStatus
	reason, message string
	since           metav1.Time
}

func (r readiness) ready() bool { return r.status == corev1.ConditionTrue }

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
	endpoint    *nodeEndpoint // its kubelet endpoint; nil when off
	usage       nodeUsage     // its pods' resource usage at the provider
	started     time.Time

	refresh  chan struct{} // fetch the grant again now
	probeNow chan struct{}
	pushNow  chan struct{}

	mu      sync.Mutex
	active  []string // broker ids of the active reservations, newest first
	grantOf string   // the reservation whose grant the connection uses
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

	factory := informers.NewSharedInformerFactoryWithOptions(b.local, 0,
		informers.WithTransform(stripManagedFields),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.FieldSelector = fields.OneTermEqualSelector("spec.nodeName", n.name).String()
		}))
	podInformer := factory.Core().V1().Pods()
	if _, err := podInformer.Informer().AddEventHandler(n.objects); err != nil {
		cancel()
		return nil, err
	}
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
		PodClient:                 b.local.CoreV1(),
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

// NotifyNodeStatus records how to tell the node controller of changes.
func (n *providerNode) NotifyNodeStatus(_ context.Context, cb func(*corev1.Node)) {
	n.mu.Lock()
	n.notify = cb
	n.mu.Unlock()
	n.push()
}

// push asks for the node's status to be written (coalesced).
func (n *providerNode) push() {
	select {
	case n.pushNow <- struct{}{}:
	default:
	}
}

func (n *providerNode) pushLoop(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-n.pushNow:
		}
		n.mu.Lock()
		cb := n.notify
		n.mu.Unlock()
		if cb == nil {
			continue
		}
		sent := make(chan struct{})
		go func() {
			cb(n.nodeObject())
			close(sent)
		}()
		select {
		case <-ctx.Done():
			return
		case <-sent:
		}
	}
}

// nodeObject is the Node as it should be now.
//
// It carries no capacity or allocatable: those the bridge writes itself
// (writeCapacity). virtual-kubelet's node controller writes the status as a
// three-way patch that makes the API server's copy equal to this object for
// every field the object has, so a capacity here, captured when the object
// was handed over and written later, could undo a newer one.
func (n *providerNode) nodeObject() *corev1.Node {
	n.mu.Lock()
	defer n.mu.Unlock()
	ready := n.ready.status
	now := metav1.Now()
	condition := func(t corev1.NodeConditionType, s corev1.ConditionStatus, reason, msg string, since metav1.Time) corev1.NodeCondition {
		return corev1.NodeCondition{Type: t, Status: s, Reason: reason, Message: msg, LastHeartbeatTime: now, LastTransitionTime: since}
	}
	created := n.ready.since
	nodeObj := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{
			Name: n.name,
			Labels: map[string]string{
				rbv1.ProviderLabel:   n.provider,
				TypeLabel:            TypeValue,
				"kubernetes.io/role": "agent",
				corev1.LabelHostname: n.name,
				corev1.LabelOSStable: "linux",
				rbv1.ManagedByLabel:  rbv1.ManagedByValue,
				rbv1.RequesterLabel:  n.b.cfg.ClusterID,
				"node.kubernetes.io/exclude-from-external-load-balancers": "true",
			},
		},
		Spec: corev1.NodeSpec{Taints: []corev1.Taint{{Key: rbv1.VirtualNodeTaint, Value: "true", Effect: corev1.TaintEffectNoSchedule}}},
		Status: corev1.NodeStatus{
			Phase: corev1.NodeRunning,
			Conditions: []corev1.NodeCondition{
				condition(corev1.NodeReady, ready, n.ready.reason, n.ready.message, n.ready.since),
				condition(corev1.NodeMemoryPressure, corev1.ConditionFalse, "ProviderHasSufficientMemory", "capacity is reserved at the broker", created),
				condition(corev1.NodeDiskPressure, corev1.ConditionFalse, "ProviderHasNoDiskPressure", "capacity is reserved at the broker", created),
				condition(corev1.NodePIDPressure, corev1.ConditionFalse, "ProviderHasSufficientPID", "capacity is reserved at the broker", created),
				condition(corev1.NodeNetworkUnavailable, corev1.ConditionFalse, "ProviderNetwork", "pods use the provider's network", created),
			},
			NodeInfo: corev1.NodeSystemInfo{
				OperatingSystem: "linux",
				KubeletVersion:  kubeletVersion(),
				OSImage:         "provider " + n.provider + " (resource broker)",
			},
		},
	}
	for k, v := range n.providerLabels {
		nodeObj.Labels[k] = v
	}
	// The API server (logs, exec, attach, port-forward, node proxy) and
	// metrics-server reach the node's kubelet endpoint at the agent's IP,
	// which its serving certificate names, and the node's own port; no host
	// name address, which the API server would try first and could not
	// resolve.
	if e := n.endpoint; e != nil && n.b.cfg.NodeIP != "" {
		nodeObj.Status.DaemonEndpoints.KubeletEndpoint.Port = e.port
		nodeObj.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: n.b.cfg.NodeIP}}
	}
	return nodeObj
}

// capacityLocked is the node's capacity (and allocatable): the sum of the
// active reservations and PodsPerReservation pods for each.
func (n *providerNode) capacityLocked() corev1.ResourceList {
	capacity := corev1.ResourceList{
		corev1.ResourceCPU:    resource.MustParse("0"),
		corev1.ResourceMemory: resource.MustParse("0"),
		corev1.ResourcePods:   *resource.NewQuantity(n.b.cfg.PodsPerReservation*int64(len(n.active)), resource.DecimalSI),
	}
	maps.Copy(capacity, n.capacity)
	refused, count := n.pods.refusedResources()
	addResources(capacity, refused)
	addResources(capacity, corev1.ResourceList{corev1.ResourcePods: *resource.NewQuantity(count, resource.DecimalSI)})
	return capacity
}

// writeCapacity makes the node's status.capacity and status.allocatable, as
// the API server holds them (cur, from the cache), what they should be now:
// one merge patch of the status, nothing when they already are. The bridge
// writes them itself, not virtual-kubelet's node controller (see
// nodeObject), whose writes are a read and a patch queued behind its other
// updates: when this returns, the capacity counts every active reservation,
// and the bridge can name the node in their status at once.
func (n *providerNode) writeCapacity(ctx context.Context, cur *corev1.Node) (bool, error) {
	n.mu.Lock()
	want := n.capacityLocked()
	written, writtenRV := n.written, n.writtenRV
	n.mu.Unlock()
	if equality.Semantic.DeepEqual(cur.Status.Capacity, want) && equality.Semantic.DeepEqual(cur.Status.Allocatable, want) {
		return false, nil
	}
	if older, err := resourceversion.CompareResourceVersion(cur.ResourceVersion, writtenRV); err == nil && older < 0 && equality.Semantic.DeepEqual(written, want) {
		return false, nil // the cache has not seen the last write yet, which was this capacity
	}
	values := func(have corev1.ResourceList) map[string]any {
		m := map[string]any{}
		for k := range have {
			m[string(k)] = nil // gone unless wanted
		}
		for k, q := range want {
			m[string(k)] = q.String()
		}
		return m
	}
	data, err := json.Marshal(map[string]any{"status": map[string]any{
		"capacity": values(cur.Status.Capacity), "allocatable": values(cur.Status.Allocatable)}})
	if err != nil {
		return false, err
	}
	node, err := n.b.local.CoreV1().Nodes().Patch(ctx, n.name, types.MergePatchType, data, metav1.PatchOptions{FieldManager: FieldManager}, "status")
	if err != nil {
		return false, err
	}
	n.mu.Lock()
	n.written, n.writtenRV = want, node.ResourceVersion
	n.mu.Unlock()
	return true, nil
}

// setReservations is what the bridge's controller tells the node: the active
// reservations (ids, newest first) and their sum.
func (n *providerNode) setReservations(ids []string, capacity corev1.ResourceList) {
	n.mu.Lock()
	newIDs := !slices.Equal(n.active, ids)
	changed := newIDs || !equality.Semantic.DeepEqual(n.capacity, capacity)
	n.active, n.capacity = ids, capacity
	noRemote := n.remote == nil
	lost := n.grantOf != "" && !slices.Contains(ids, n.grantOf)
	n.mu.Unlock()
	if changed {
		n.log.V(1).Info("capacity", "reservations", len(ids), "resources", fmt.Sprint(capacity))
	}
	// Read the grants again when there is no connection yet, or the
	// reservation whose grant it uses has ended. Not on every new
	// reservation: the connection's token is renewed halfway to its expiry
	// anyway, and in a burst of reservations each refresh would read up to
	// five grants from the broker.
	if newIDs && len(ids) > 0 && (noRemote || lost) {
		n.refreshNow()
	}
}

func (n *providerNode) activeIDs() []string {
	n.mu.Lock()
	defer n.mu.Unlock()
	return slices.Clone(n.active)
}

func (n *providerNode) currentRemote() *remoteCluster {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.remote
}

func (n *providerNode) refreshNow() {
	select {
	case n.refresh <- struct{}{}:
	default:
	}
}

// credentialsLoop keeps a valid grant: it reads the grants of the active
// reservations from the broker and takes the one that lasts longest, then
// reads again halfway to its expiry (the provider renews grants after two
// thirds of their lifetime), or at once when the provider rejects the token.
func (n *providerNode) credentialsLoop(ctx context.Context) {
	first := backoff.Exponential(time.Second, 30*time.Second)
	retry := first
	for ctx.Err() == nil {
		var next time.Duration
		g, from, err := n.fetchGrantFrom(ctx)
		switch {
		case err != nil:
			next = retry.Step()
			n.log.Info("cannot read the provider's grant from the broker", "error", err.Error(), "retryIn", next)
		case g == nil:
			next = retry.Step()
		default:
			retry = first
			if err := n.useGrant(g); err != nil {
				n.log.Error(err, "cannot use the provider's grant")
				next = 5 * time.Second
				break
			}
			n.mu.Lock()
			n.grantOf = from
			n.mu.Unlock()
			next = refreshIn(g.ExpiresAt, n.b.cfg.ProbePeriod)
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(next):
		case <-n.refresh:
		}
	}
}

// refreshIn: halfway to expiry, no sooner than floor, no later than 30 minutes.
func refreshIn(expires time.Time, floor time.Duration) time.Duration {
	if expires.IsZero() {
		return 30 * time.Minute
	}
	return min(max(time.Until(expires)/2, floor), 30*time.Minute)
}

// fetchGrant reads the grants of (up to 5 of) the newest active reservations.
func (n *providerNode) fetchGrant(ctx context.Context) (*api.Grant, error) {
	g, _, err := n.fetchGrantFrom(ctx)
	return g, err
}

// fetchGrantFrom is fetchGrant, also naming the reservation the grant is of.
func (n *providerNode) fetchGrantFrom(ctx context.Context) (*api.Grant, string, error) {
	ids := n.activeIDs()
	if len(ids) > 5 {
		ids = ids[:5]
	}
	var best *api.Grant
	var bestID string
	var lastErr error
	for _, id := range ids {
		rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		at, err := n.b.cfg.Grants.Reservation(rctx, id)
		cancel()
		if err != nil {
			lastErr = err
			continue
		}
		if g := at.Grant; g != nil && g.Token != "" && (best == nil || g.ExpiresAt.After(best.ExpiresAt)) {
			best, bestID = g, id
		}
	}
	if best == nil {
		return nil, "", lastErr
	}
	return best, bestID, nil
}

// useGrant takes a grant: a new token for the same access is swapped in
// place; another endpoint, CA or namespace gets a new connection.
func (n *providerNode) useGrant(g *api.Grant) error {
	n.mu.Lock()
	rc := n.remote
	n.mu.Unlock()
	if rc != nil && rc.sameAccess(g) {
		if old, _ := rc.token.get(); old != g.Token {
			n.log.V(1).Info("provider credentials refreshed", "expires", g.ExpiresAt)
			rc.token.set(g.Token, g.ExpiresAt)
			n.probeSoon()
		}
		return nil
	}
	fresh, err := newRemoteCluster(n.ctx, g, n.b.cfg.ClusterID, n.pods.remoteEvents(), n.log)
	if err != nil {
		return err
	}
	n.mu.Lock()
	n.remote = fresh
	n.mu.Unlock()
	if rc != nil {
		rc.stop()
	}
	n.log.Info("connected to the provider", "endpoint", g.Endpoint, "namespace", g.Namespace, "expires", g.ExpiresAt)
	n.probeSoon()
	return nil
}

func (n *providerNode) probeSoon() {
	select {
	case n.probeNow <- struct{}{}:
	default:
	}
}

// probeLoop checks the provider's API with the tenant token every ProbePeriod.
func (n *providerNode) probeLoop(ctx context.Context) {
	t := time.NewTicker(n.b.cfg.ProbePeriod)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-n.probeNow:
		}
		n.probe(ctx)
	}
}

// probe judges the Ready condition: a namespaced request with the token tells
// reachability and access apart. A rejected token makes the node NotReady at
// once (and the grant is read again); a provider that does not answer is
// judged by how long ago it last did (unanswered, lost.go).
func (n *providerNode) probe(ctx context.Context) {
	rc := n.currentRemote()
	if rc == nil {
		if !n.withinGrace(time.Now()) && !n.isLost() {
			n.setReady(corev1.ConditionFalse, ReasonWaitingCredentials, fmt.Sprintf("no grant from %s yet", n.provider))
		}
		return
	}
	if _, expires := rc.token.get(); !expires.IsZero() && time.Now().After(expires) {
		n.setReady(corev1.ConditionFalse, ReasonCredentialsExpired, fmt.Sprintf("the token granted by %s expired at %s and no newer grant was found",
			n.provider, expires.Format(time.RFC3339)))
		n.refreshNow()
		return
	}
	pctx, cancel := context.WithTimeout(ctx, min(n.b.cfg.ProbePeriod, 5*time.Second))
	defer cancel()
	_, err := rc.client.CoreV1().Pods(rc.namespace).List(pctx, metav1.ListOptions{Limit: 1})
	if ctx.Err() != nil {
		return
	}
	switch {
	case err == nil:
		was := n.isReady()
		n.answered()
		if !was.ready() && was.reason != ReasonWaitingCredentials {
			n.reconnect(ctx, rc)
		}
		n.setReady(corev1.ConditionTrue, ReasonReachable, fmt.Sprintf("%s's API server answers at %s", n.provider, rc.endpoint))
		n.returned(ctx)
	case apierrors.IsUnauthorized(err):
		n.answered()
		n.setReady(corev1.ConditionFalse, ReasonCredentialsDenied, fmt.Sprintf("%s rejects the granted token: %v", n.provider, err))
		n.returned(ctx)
		n.refreshNow()
	case apierrors.IsForbidden(err):
		n.answered()
		n.setReady(corev1.ConditionFalse, ReasonAccessRevoked, fmt.Sprintf("%s revoked access to namespace %s: %v", n.provider, rc.namespace, err))
		n.returned(ctx)
		n.refreshNow()
	default:
		n.unanswered(ctx, rc, err)
	}
}

// reconnect replaces the provider's informer after an outage: a fresh one
// lists at once (the old one's reflector may be backing off for up to 30 s),
// and the copies the old one knew that the fresh list lacks were deleted
// meanwhile, which the pod handler hears of as it would from a watch.
func (n *providerNode) reconnect(ctx context.Context, old *remoteCluster) {
	fresh, err := old.reconnect(n.ctx, n.b.cfg.ClusterID, n.pods.remoteEvents(), n.log)
	if err != nil {
		n.log.Error(err, "reconnecting to the provider")
		return
	}
	sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if !cache.WaitForCacheSync(sctx.Done(), fresh.synced) {
		fresh.stop()
		return
	}
	n.mu.Lock()
	if n.remote != old { // a new grant came in meanwhile
		n.mu.Unlock()
		fresh.stop()
		return
	}
	n.remote = fresh
	n.mu.Unlock()
	old.stop()
	known, _ := old.pods.List(everything)
	for _, p := range known {
		if _, err := fresh.pods.Get(p.Name); apierrors.IsNotFound(err) {
			n.pods.remoteGone(p)
		}
	}
	n.log.Info("reconnected to the provider", "copies", len(known))
}

func (n *providerNode) setReady(status corev1.ConditionStatus, reason, message string) {
	n.mu.Lock()
	r := &n.ready
	transition := r.status != status
	changed := transition || r.reason != reason || r.message != message
	if transition {
		r.since = metav1.Now()
	}
	r.status, r.reason, r.message = status, reason, message
	n.mu.Unlock()
	if !changed {
		return
	}
	n.log.Info("virtual node readiness", "ready", status, "reason", reason, "message", message)
	n.push()
}

// isReady reports the Ready condition.
func (n *providerNode) isReady() readiness {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.ready
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
