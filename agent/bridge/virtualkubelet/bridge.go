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
//   - objectMirror: the ConfigMaps and Secrets its pods use, whose copies
//     its reflectors keep at the provider (reflection.go);
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

// Config of the virtual-kubelet bridge. Zero values take the defaults.
type Config struct {
	// ClusterID is this (requester) cluster's id.
	ClusterID string
	// Grants reads the providers' grants (required).
	Grants GrantSource
	// Log is the bridge's logger (default: the manager's).
	Log logr.Logger

	// LeaseDuration of the virtual nodes' Lease in kube-node-lease (default 40s,
	// the kubelet's); it is renewed every quarter of it.
	LeaseDuration time.Duration
	// StatusSyncPeriod is how often a virtual node's status is rewritten when
	// nothing changed (default 1m); changes are written at once.
	StatusSyncPeriod time.Duration
	// ProbePeriod is how often the provider's API is checked with the granted
	// token (default 5s, at least 1s).
	ProbePeriod time.Duration
	// HeartbeatPeriod and HeartbeatLease: the bridge renews a Lease in its
	// tenant namespace at each provider every HeartbeatPeriod, claiming
	// HeartbeatLease; the provider renews this cluster's leases at the broker
	// while it sees it renewed (defaults DefaultHeartbeatPeriod and
	// DefaultHeartbeatLease: the reservations' renew interval and lease
	// length; heartbeat.go).
	HeartbeatPeriod, HeartbeatLease time.Duration
	// ProviderLostGrace is how long a provider's API server may leave the
	// probe unanswered while its virtual node stays Ready (default 40s, at
	// least ProbePeriod): brief glitches change nothing. Past it the node is
	// Ready=Unknown and tainted node.kubernetes.io/unreachable.
	ProviderLostGrace time.Duration
	// ProviderLostReplaceAfter is how long after a lost provider's last
	// answer the pods on its virtual node are deleted so that their
	// controllers replace them elsewhere (default 2m, at least
	// ProviderLostGrace); StatefulSet pods and pods annotated
	// broker.fluidos.eu/replace-on-provider-loss: "false" stay (lost.go).
	ProviderLostReplaceAfter time.Duration
	// UnschedulableAfter is how long the provider's scheduler may leave a
	// pod's copy unplaced before the pod gets a Warning Event and its
	// reservation ProviderScheduled=False (default 30s).
	UnschedulableAfter time.Duration
	// PodsPerReservation is the pod capacity each active reservation adds to its
	// virtual node (default 110, the kubelet's default).
	PodsPerReservation int64
	// HomeNetwork keeps borrowed pods in this cluster's network view (its
	// DNS and Service environment variables; homenetwork.go); nil: the
	// provider's.
	HomeNetwork *HomeNetwork
	// PodSyncWorkers per virtual node (default 10).
	PodSyncWorkers int
	// CreateTimeout bounds the retries of a pod's creation at the provider
	// before the pod is reported failed (default 30s).
	CreateTimeout time.Duration

	// KubeletAddress is where the virtual nodes' kubelet endpoints listen,
	// for `kubectl logs`, `exec`, `attach`, `port-forward` and metrics-server
	// (default ":10250"; "off" disables them): host:port is the first port,
	// each virtual node takes the lowest free one of KubeletPorts from there
	// (port 0: any free port).
	KubeletAddress string
	// KubeletPorts is the size of that port range (default 100).
	KubeletPorts int
	// MetricsPeriod is how often each virtual node lists its pods' usage
	// from the provider's metrics.k8s.io API (default 10s, at least 1s).
	MetricsPeriod time.Duration
	// NodeIP is the address the API server uses to reach that endpoint: the
	// agent pod's IP (default $POD_IP).
	NodeIP string
	// KubeletClientCA (PEM) verifies the API server's client certificate on the
	// kubelet endpoint (default: client-ca-file of
	// kube-system/extension-apiserver-authentication).
	KubeletClientCA []byte
	// KubeletServingCert is where that endpoint's serving certificate comes
	// from: ServingCertCSR (default: a CertificateSigningRequest to the
	// cluster's kubernetes.io/kubelet-serving signer, approved by the agent
	// itself; self-signed until it is issued) or ServingCertSelfSigned.
	KubeletServingCert string
	// KubeletServingCertTimeout is how long the CSR may wait for the signer
	// before the agent warns (log and Event) that it serves a self-signed
	// certificate (default 1m; it goes on waiting).
	KubeletServingCertTimeout time.Duration

	// HomeAPIServer is this cluster's API server as the provider's pods
	// reach it, https://host[:port] (default: the address and port of
	// EndpointSlice default/kubernetes, which the API server advertises):
	// where the copies' KUBERNETES_SERVICE_* variables point (homeapi.go).
	HomeAPIServer string
	// HomeTokenTTL is the lifetime of the ServiceAccount tokens the copies
	// get (default DefaultHomeTokenTTL, at least MinHomeTokenTTL); each is
	// replaced at 80 % of it.
	HomeTokenTTL time.Duration
	// HomeTokenRefresh, when set and shorter, replaces the tokens that
	// often instead (tests).
	HomeTokenRefresh time.Duration
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

	homeAPI      *homeAPIServer // Config.HomeAPIServer, if set (homeapi.go)
	advertisedMu sync.Mutex
	advertised   *homeAPIServer // else the API server's advertised address, as last read
	advertisedAt time.Time
	whoami       string        // this agent's user name, once known (mirroraccess.go)
	masterSvc    masterService // Service default/kubernetes, with HomeNetwork
	serviceEnvs  serviceEnvCache

	mu    sync.Mutex
	nodes map[string]*providerNode // by provider

	toName chan event.GenericEvent // reservations for the namer (naming.go)
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
	if cfg.HomeTokenTTL == 0 {
		cfg.HomeTokenTTL = DefaultHomeTokenTTL
	}
	if cfg.HomeTokenTTL < MinHomeTokenTTL {
		return nil, fmt.Errorf("home API token lifetime %s: at least %s (the API server's minimum)", cfg.HomeTokenTTL, MinHomeTokenTTL)
	}
	if cfg.HomeTokenRefresh < 0 {
		return nil, fmt.Errorf("home API token refresh %s: must be positive", cfg.HomeTokenRefresh)
	}
	var home *homeAPIServer
	if cfg.HomeAPIServer != "" {
		var err error
		if home, err = parseHomeAPIServer(cfg.HomeAPIServer); err != nil {
			return nil, err
		}
	}
	return &Bridge{cfg: cfg, nodes: map[string]*providerNode{}, events: make(chan event.GenericEvent, 256),
		toName: make(chan event.GenericEvent, 256), homeAPI: home}, nil
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
	if err := b.setupNamer(mgr); err != nil {
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
// Once the node is schedulable and its capacity counts them, the namer
// names it in the active reservations' status (naming.go).
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
		n.setCounted(ids)
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
		n.stop()
		return ctrl.Result{}, b.removeNode(ctx, name)
	}
	if err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err) // not registered yet: its creation triggers a reconcile
	}
	if !schedulable(&cur) {
		return ctrl.Result{}, nil // named once it is: the change triggers a reconcile
	}
	b.askNames(ctx, name, active)
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
