// Package virtualkubelet is the built-in bridge: for every provider that
// holds an active reservation of this cluster, a virtual node rb-<provider>
// served in-process with github.com/virtual-kubelet/virtual-kubelet's node
// package. Its capacity is the sum of the active reservations to that
// provider; the pods the scheduler binds to it are mirrored into the
// provider's tenant namespace with the credentials the provider granted
// through the broker, and their status flows back from an informer on that
// namespace.
//
// Pieces, in virtual-kubelet's terms:
//   - Bridge: a controller over Reservations that starts, sizes and removes the
//     virtual nodes, and writes status.virtualNode;
//   - providerNode: the NodeProvider of one node (Ready while the provider's
//     API answers with the granted token), its credentials and probe;
//   - podHandler: the PodLifecycleHandler and PodNotifier of one node;
//   - objectMirror: the ConfigMaps and Secrets its pods use;
//   - kubeletServer: the nodes' kubelet endpoints, one port each (kubectl
//     logs, exec, attach, port-forward reach the copies through the
//     provider's API; metrics-server reads the usage each node polls from
//     the provider's metrics.k8s.io, nodeUsage), with a serving certificate
//     from the cluster's kubelet-serving signer (servingCert).
package virtualkubelet

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/events"
	"k8s.io/client-go/util/workqueue"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	"github.com/fluidos-project/resource-broker/agent/bridge/internal/rsvstatus"
	rbv1 "github.com/fluidos-project/resource-broker/api/v1alpha1"
	"github.com/fluidos-project/resource-broker/broker/api"
)

// GrantSource reads a reservation with its grant (the broker client).
type GrantSource interface {
	Reservation(ctx context.Context, id string) (api.Reservation, error)
}

// Config of the virtual-kubelet bridge; see bridge.Options for the meaning
// and defaults.
type Config struct {
	ClusterID        string
	Grants           GrantSource
	Log              logr.Logger
	LeaseDuration    time.Duration
	StatusSyncPeriod time.Duration
	ProbePeriod      time.Duration
	// HeartbeatPeriod and HeartbeatLease shape the heartbeat Lease at each
	// provider (heartbeat.go); defaults DefaultHeartbeatPeriod and
	// DefaultHeartbeatLease.
	HeartbeatPeriod, HeartbeatLease time.Duration
	PodsPerReservation              int64
	// KubeletAddress host:port is the first port of the nodes' kubelet
	// endpoints (default ":10250"; port 0: any free port; "off": none).
	KubeletAddress string
	// KubeletPorts is how many ports from there the nodes may take, one
	// each (default 100).
	KubeletPorts    int
	NodeIP          string
	KubeletClientCA []byte
	// KubeletServingCert is where the kubelet endpoint's serving certificate
	// comes from: ServingCertCSR (default) or ServingCertSelfSigned.
	KubeletServingCert string
	// KubeletServingCertTimeout is how long a CSR may wait for the signer
	// before the agent says it serves a self-signed certificate (default 1m).
	KubeletServingCertTimeout time.Duration
	// PodSyncWorkers per virtual node (default 10).
	PodSyncWorkers int
	// CreateTimeout bounds the retries of a pod's creation at the provider
	// before the pod is reported failed (default 30s).
	CreateTimeout time.Duration
	// UnschedulableAfter is how long a copy may stay unplaced by the
	// provider's scheduler before it is reported (default 30s).
	UnschedulableAfter time.Duration
	// MetricsPeriod is how often each node lists its pods' usage from the
	// provider's metrics.k8s.io (default 10s, at least 1s).
	MetricsPeriod time.Duration
	// ProviderLostGrace is how long the provider's API server may leave the
	// probe unanswered before its node is Ready=Unknown and tainted
	// unreachable (default 40s, at least ProbePeriod).
	ProviderLostGrace time.Duration
	// ProviderLostReplaceAfter is how long after the last answer the pods
	// bound to a lost provider's node are deleted to be replaced elsewhere
	// (default 2m, at least ProviderLostGrace); see lost.go.
	ProviderLostReplaceAfter time.Duration
}

// Bridge runs the virtual nodes of this cluster.
type Bridge struct {
	cfg      Config
	log      logr.Logger
	client   client.Client
	reader   client.Reader
	local    kubernetes.Interface
	recorder events.EventRecorder
	kubelet  *kubeletServer

	ctx    context.Context // the nodes' lifetime: until the manager stops
	cancel context.CancelFunc
	events chan event.GenericEvent

	objectsMu sync.Mutex
	objects   map[string]*namespaceObjects // by namespace (objects.go)
	whoami    string                       // this agent's user name, once known (mirroraccess.go)

	mu    sync.Mutex
	nodes map[string]*providerNode // by provider

	namingSem chan struct{}
	namingMu  sync.Mutex
	naming    map[string]map[types.UID]time.Time // provider -> reservation -> when its status.virtualNode was written
}

// New checks the configuration and fills in the defaults.
func New(cfg Config) (*Bridge, error) {
	if cfg.ClusterID == "" || cfg.Grants == nil {
		return nil, errors.New("virtual-kubelet bridge: a cluster id and a grant source are required")
	}
	if cfg.LeaseDuration == 0 {
		cfg.LeaseDuration = 40 * time.Second
	}
	if cfg.LeaseDuration < 4*time.Second {
		return nil, fmt.Errorf("lease duration %s: at least 4s", cfg.LeaseDuration)
	}
	if cfg.StatusSyncPeriod == 0 {
		cfg.StatusSyncPeriod = time.Minute
	}
	if cfg.HeartbeatPeriod <= 0 {
		cfg.HeartbeatPeriod = DefaultHeartbeatPeriod
	}
	if cfg.HeartbeatLease <= 0 {
		cfg.HeartbeatLease = DefaultHeartbeatLease
	}
	if cfg.ProbePeriod == 0 {
		cfg.ProbePeriod = 5 * time.Second
	}
	if cfg.ProbePeriod < time.Second {
		return nil, fmt.Errorf("probe period %s: at least 1s", cfg.ProbePeriod)
	}
	if cfg.ProviderLostGrace == 0 {
		cfg.ProviderLostGrace = 40 * time.Second
	}
	if cfg.ProviderLostGrace < cfg.ProbePeriod {
		return nil, fmt.Errorf("provider lost grace %s: at least the probe period %s", cfg.ProviderLostGrace, cfg.ProbePeriod)
	}
	if cfg.ProviderLostReplaceAfter == 0 {
		cfg.ProviderLostReplaceAfter = 2 * time.Minute
	}
	if cfg.ProviderLostReplaceAfter < cfg.ProviderLostGrace {
		return nil, fmt.Errorf("provider lost replace-after %s: at least the grace %s", cfg.ProviderLostReplaceAfter, cfg.ProviderLostGrace)
	}
	if cfg.PodsPerReservation == 0 {
		cfg.PodsPerReservation = 110
	}
	if cfg.KubeletAddress == "" {
		cfg.KubeletAddress = ":10250"
	}
	if cfg.KubeletPorts == 0 {
		cfg.KubeletPorts = 100
	}
	if cfg.KubeletPorts < 0 {
		return nil, fmt.Errorf("kubelet ports %d: want at least 1", cfg.KubeletPorts)
	}
	if cfg.MetricsPeriod == 0 {
		cfg.MetricsPeriod = 10 * time.Second
	}
	if cfg.MetricsPeriod < time.Second {
		return nil, fmt.Errorf("provider metrics period %s: at least 1s", cfg.MetricsPeriod)
	}
	switch cfg.KubeletServingCert {
	case "":
		cfg.KubeletServingCert = ServingCertCSR
	case ServingCertCSR, ServingCertSelfSigned:
	default:
		return nil, fmt.Errorf("kubelet serving certificate %q: want %q or %q", cfg.KubeletServingCert, ServingCertCSR, ServingCertSelfSigned)
	}
	if cfg.KubeletServingCertTimeout == 0 {
		cfg.KubeletServingCertTimeout = time.Minute
	}
	if cfg.NodeIP == "" {
		cfg.NodeIP = os.Getenv("POD_IP")
	}
	if cfg.PodSyncWorkers == 0 {
		cfg.PodSyncWorkers = 10
	}
	if cfg.CreateTimeout == 0 {
		cfg.CreateTimeout = 30 * time.Second
	}
	if cfg.UnschedulableAfter == 0 {
		cfg.UnschedulableAfter = 30 * time.Second
	}
	if cfg.UnschedulableAfter < 0 {
		return nil, fmt.Errorf("unschedulable-after %s: must be positive", cfg.UnschedulableAfter)
	}
	return &Bridge{cfg: cfg, nodes: map[string]*providerNode{}, events: make(chan event.GenericEvent, 256),
		namingSem: make(chan struct{}, namingParallelism), naming: map[string]map[types.UID]time.Time{}}, nil
}

// SetupWithManager registers the controller and the runnable that serves the
// kubelet endpoint and stops the nodes with the manager.
func (b *Bridge) SetupWithManager(mgr ctrl.Manager) error {
	b.log = b.cfg.Log
	if b.log.GetSink() == nil {
		b.log = mgr.GetLogger()
	}
	b.log = b.log.WithName("bridge")
	local, err := kubernetes.NewForConfig(mgr.GetConfig())
	if err != nil {
		return err
	}
	b.local, b.client, b.reader = local, mgr.GetClient(), mgr.GetAPIReader()
	b.recorder = mgr.GetEventRecorder("rb-virtual-kubelet")
	b.ctx, b.cancel = context.WithCancel(context.Background())
	if b.cfg.KubeletAddress != "off" {
		if b.kubelet, err = newKubeletServer(b, b.cfg.KubeletAddress, b.cfg.KubeletPorts); err != nil {
			return err
		}
	}
	if err := mgr.GetFieldIndexer().IndexField(context.Background(), &rbv1.Reservation{}, rsvstatus.ProviderIndex, rsvstatus.IndexProvider); err != nil {
		return err
	}
	provider := func(o client.Object, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
		if p := o.(*rbv1.Reservation).Status.Provider; p != "" {
			q.Add(reconcile.Request{NamespacedName: types.NamespacedName{Name: p}})
		}
	}
	byProvider := handler.Funcs{
		CreateFunc: func(_ context.Context, e event.CreateEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			provider(e.Object, q)
		},
		UpdateFunc: func(_ context.Context, e event.UpdateEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			provider(e.ObjectOld, q) // a provider that lost a reservation is resized too
			provider(e.ObjectNew, q)
		},
		DeleteFunc: func(_ context.Context, e event.DeleteEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			provider(e.Object, q)
		},
	}
	ourNodes := handler.EnqueueRequestsFromMapFunc(func(_ context.Context, o client.Object) []reconcile.Request {
		l := o.GetLabels()
		if p := l[rbv1.ProviderLabel]; p != "" && l[TypeLabel] == TypeValue && l[rbv1.ManagedByLabel] == rbv1.ManagedByValue {
			return []reconcile.Request{{NamespacedName: types.NamespacedName{Name: p}}}
		}
		return nil
	})
	if err := mgr.Add(b); err != nil {
		return err
	}
	return ctrl.NewControllerManagedBy(mgr).
		Named("bridge-virtual-kubelet").
		// One provider's reconcile does not wait for another's.
		WithOptions(controller.Options{MaxConcurrentReconciles: 4}).
		Watches(&rbv1.Reservation{}, byProvider).
		Watches(&corev1.Node{}, ourNodes, builder.WithPredicates(predicate.Funcs{
			// Creations, deletions, a new capacity (someone else wrote
			// it: put ours back), and the node becoming schedulable or
			// not (the reservations are named once it is).
			UpdateFunc: func(e event.UpdateEvent) bool {
				o, ok1 := e.ObjectOld.(*corev1.Node)
				n, ok2 := e.ObjectNew.(*corev1.Node)
				return ok1 && ok2 && (!equality.Semantic.DeepEqual(o.Status.Allocatable, n.Status.Allocatable) ||
					!equality.Semantic.DeepEqual(o.Status.Capacity, n.Status.Capacity) || schedulable(o) != schedulable(n))
			},
		})).
		WatchesRawSource(source.Channel(b.events, &handler.EnqueueRequestForObject{})).
		Complete(b)
}

// Start runs the kubelet endpoint's shared parts (client CA, serving
// certificate; each node serves its own port) until ctx ends, then stops the
// virtual nodes (their Node objects stay: the pods run on; the next leader
// takes over).
func (b *Bridge) Start(ctx context.Context) error {
	if b.kubelet != nil {
		b.kubelet.run(ctx)
	}
	<-ctx.Done()
	b.cancel()
	b.mu.Lock()
	nodes := b.nodes
	b.nodes = map[string]*providerNode{}
	b.mu.Unlock()
	var wg sync.WaitGroup
	for _, n := range nodes {
		wg.Add(1)
		go func() { defer wg.Done(); n.stop() }()
	}
	wg.Wait()
	return nil
}

// enqueue asks the controller to look at a provider again.
func (b *Bridge) enqueue(provider string) {
	select {
	case b.events <- event.GenericEvent{Object: &metav1.PartialObjectMetadata{ObjectMeta: metav1.ObjectMeta{Name: provider}}}:
	default: // full: a reconcile of everything queued is coming anyway
	}
}

func (b *Bridge) runningNodes() []*providerNode {
	b.mu.Lock()
	defer b.mu.Unlock()
	out := make([]*providerNode, 0, len(b.nodes))
	for _, n := range b.nodes {
		out = append(out, n)
	}
	return out
}

// Reconcile brings the virtual node of one provider (req.Name) in line with
// the reservations to it: started once one is active, sized to the active
// ones (writeCapacity), removed when none is live and no pod is left on it.
// An active reservation is named in status.virtualNode once the node's
// capacity, as the API server holds it, counts it and the node is
// schedulable: the scheduler plugin retries a pod when its reservation names
// a node, and the attempt then finds room for it there.
func (b *Bridge) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	provider := req.Name
	if b.ctx.Err() != nil {
		return ctrl.Result{}, nil
	}
	var list rbv1.ReservationList
	if err := b.client.List(ctx, &list, client.MatchingFields{rsvstatus.ProviderIndex: provider}); err != nil {
		return ctrl.Result{}, err
	}
	var live, active []*rbv1.Reservation
	for i := range list.Items {
		r := &list.Items[i]
		if rsvstatus.Live(r) {
			live = append(live, r)
		}
		if rsvstatus.Active(r) {
			active = append(active, r)
		}
	}
	slices.SortFunc(active, func(x, y *rbv1.Reservation) int { // newest first: their grants last longest
		return cmp.Or(y.CreationTimestamp.Compare(x.CreationTimestamp.Time), cmp.Compare(x.Name, y.Name))
	})
	ids := make([]string, 0, len(active))
	for _, r := range active {
		if r.Status.ReservationID != "" {
			ids = append(ids, r.Status.ReservationID)
		}
	}
	name := NodeName(provider)

	b.mu.Lock()
	n := b.nodes[provider]
	b.mu.Unlock()
	if n == nil {
		start := len(active) > 0
		if !start {
			// A node left by an earlier run: serve it while something needs it.
			exists, pods, err := b.leftover(ctx, name)
			if err != nil {
				return ctrl.Result{}, err
			}
			switch {
			case exists && (len(live) > 0 || pods > 0):
				start = true
			case exists:
				return ctrl.Result{}, b.removeNode(ctx, name)
			default:
				return ctrl.Result{}, nil
			}
		}
		if start {
			var err error
			if n, err = b.newProviderNode(provider); err != nil {
				return ctrl.Result{}, err
			}
			b.mu.Lock()
			b.nodes[provider] = n
			b.mu.Unlock()
		}
	}
	n.setReservations(ids, rsvstatus.Sum(active))
	n.pods.recheck() // the pods not admitted may be now
	var cur corev1.Node
	err := b.client.Get(ctx, types.NamespacedName{Name: name}, &cur)
	if apierrors.IsNotFound(err) {
		n.push() // deleted by someone: the status update fails and registers it again
	}
	if err == nil {
		if _, err := n.writeCapacity(ctx, &cur); err != nil {
			return ctrl.Result{}, err
		}
	}

	if len(live) == 0 {
		if !n.localSynced() {
			return ctrl.Result{RequeueAfter: time.Second}, nil
		}
		if n.hasPods() {
			b.log.V(1).Info("no live reservation, waiting for the pods to leave", "node", name)
			return ctrl.Result{}, nil
		}
		// A lost provider cannot be asked: its agent evicts the copies of
		// the ended reservations itself once it is back.
		if !n.isLost() {
			if err := n.deleteLeftCopies(ctx); err != nil {
				return ctrl.Result{}, err
			}
		}
		b.mu.Lock()
		delete(b.nodes, provider)
		b.mu.Unlock()
		b.namingMu.Lock()
		delete(b.naming, provider)
		b.namingMu.Unlock()
		n.stop()
		return ctrl.Result{}, b.removeNode(ctx, name)
	}
	if err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err) // not registered yet: its creation triggers a reconcile
	}
	if !schedulable(&cur) {
		return ctrl.Result{}, nil // named once it is: the change triggers a reconcile
	}
	b.nameNode(provider, name, active)
	return ctrl.Result{}, nil
}

// schedulable: the node is Ready and carries no NoSchedule or NoExecute
// taint but ours (such as node.kubernetes.io/not-ready, which the API server
// puts on a new node and the node lifecycle controller lifts once it is
// Ready): the scheduler can bind the reservations' pods to it.
func schedulable(node *corev1.Node) bool {
	if node.Spec.Unschedulable {
		return false
	}
	for _, t := range node.Spec.Taints {
		if t.Key != rbv1.VirtualNodeTaint && (t.Effect == corev1.TaintEffectNoSchedule || t.Effect == corev1.TaintEffectNoExecute) {
			return false
		}
	}
	for _, c := range node.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// namingParallelism bounds the status.virtualNode writes in flight.
const namingParallelism = 16

// namingRetry: a reservation named this long ago that the cache still shows
// unnamed is named again (the write was lost, or its event was).
const namingRetry = 10 * time.Second

// nameNode writes status.virtualNode = node on the active reservations that
// do not name it yet: the node is schedulable and its capacity (written by
// writeCapacity, or found already so) counts all of them. The writes are
// independent merge patches, made in the background, in parallel: the
// reconcile does not wait for them, so that the next resize of the node (a
// burst activates reservations faster than one round trip per name) is not
// held up behind them. A failed write asks for another reconcile.
func (b *Bridge) nameNode(provider, name string, active []*rbv1.Reservation) {
	b.namingMu.Lock()
	defer b.namingMu.Unlock()
	now := time.Now()
	marks := map[types.UID]time.Time{} // what is being named now; the others are done or gone
	for _, r := range active {
		if r.Status.VirtualNode == name {
			continue
		}
		if since, ok := b.naming[provider][r.UID]; ok && now.Sub(since) < namingRetry {
			marks[r.UID] = since
			continue
		}
		marks[r.UID] = now
		go func() {
			select {
			case b.namingSem <- struct{}{}:
			case <-b.ctx.Done():
				return
			}
			err := rsvstatus.SetVirtualNode(b.ctx, b.client, r, name)
			<-b.namingSem
			if err != nil && b.ctx.Err() == nil {
				b.log.V(1).Info("naming the virtual node in a reservation's status, retrying", "reservation", client.ObjectKeyFromObject(r), "error", err.Error())
				b.namingMu.Lock()
				delete(b.naming[provider], r.UID)
				b.namingMu.Unlock()
				b.enqueue(provider)
			}
		}()
	}
	if len(marks) == 0 {
		delete(b.naming, provider)
	} else {
		b.naming[provider] = marks
	}
}

// leftover tells whether our node exists and how many unfinished pods it has.
func (b *Bridge) leftover(ctx context.Context, name string) (bool, int, error) {
	var node corev1.Node
	if err := b.reader.Get(ctx, types.NamespacedName{Name: name}, &node); err != nil {
		return false, 0, client.IgnoreNotFound(err)
	}
	if node.Labels[rbv1.ManagedByLabel] != rbv1.ManagedByValue || node.Labels[TypeLabel] != TypeValue {
		return false, 0, nil // not ours
	}
	var pods corev1.PodList
	if err := b.reader.List(ctx, &pods, client.MatchingFields{"spec.nodeName": name}); err != nil {
		return true, 0, err
	}
	count := 0
	for i := range pods.Items {
		if holdsNode(&pods.Items[i]) {
			count++
		}
	}
	return true, count, nil
}

// removeNode deletes the virtual node and its lease.
func (b *Bridge) removeNode(ctx context.Context, name string) error {
	b.log.Info("removing virtual node: no live reservation and no pod left", "node", name)
	err := b.local.CoordinationV1().Leases(corev1.NamespaceNodeLease).Delete(ctx, name, metav1.DeleteOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		return err
	}
	err = b.local.CoreV1().Nodes().Delete(ctx, name, metav1.DeleteOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		return err
	}
	return nil
}

// NeedLeaderElection is true: the virtual nodes are served by the leader only.
func (b *Bridge) NeedLeaderElection() bool { return true }
