// Package resourcebroker is the ResourceBroker scheduler plugin: a pod of
// the rb-scheduler profile that fits no local node gets a broker
// Reservation (owned by the pod) and is bound to the provider's virtual node
// once the broker has reserved capacity there. A pod that fits locally is
// scheduled exactly as by the default profile. See README.md beside this
// file.
//
// Files: resourcebroker.go (the plugin and New), args.go (its args, whose
// types live in plugins/apis/config), eligibility.go (which pods are
// offloaded, and why not), prefilter.go, filter.go (and SignPod),
// postfilter.go, reserve.go (Reserve, Unreserve, PostBind), hints.go
// (EventsToRegister and the queueing hints), informers.go (the plugin's own
// reactions to Reservation, Node and Pod changes), reservations.go (the
// Reservation cache, naming and sizing, the node tracker), worker.go (the
// API calls, off the scheduling path).
package resourcebroker

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	utilfeature "k8s.io/apiserver/pkg/util/feature"
	"k8s.io/client-go/dynamic"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"
	fwk "k8s.io/kube-scheduler/framework"
	"k8s.io/kubernetes/pkg/features"

	"github.com/fluidos-project/resource-broker/plugins/apis/config"
)

// Name is the name of the plugin used in the plugin registry and in configurations.
const Name = "ResourceBroker"

// Unschedulable reasons; they are aggregated per node in the pod's
// PodScheduled condition, so they do not name the node.
const (
	ErrReasonVirtualNode       = "node(s) were broker virtual nodes not reserved for the pod"
	ErrReasonUntoleratedTaint  = "node(s) had untolerated taint(s)"
	errReasonReservationFormat = "node(s) had too little %s left in the pod's broker reservation"
)

// createRetryDelay: how long after giving up on a create the pod is retried.
const createRetryDelay = 30 * time.Second

// cacheSyncTimeout bounds the wait for the first list of Reservations at start-up.
const cacheSyncTimeout = time.Minute

const stateKey fwk.StateKey = Name

var (
	_ fwk.PreFilterPlugin   = &ResourceBroker{}
	_ fwk.FilterPlugin      = &ResourceBroker{}
	_ fwk.PostFilterPlugin  = &ResourceBroker{}
	_ fwk.ReservePlugin     = &ResourceBroker{}
	_ fwk.PostBindPlugin    = &ResourceBroker{}
	_ fwk.EnqueueExtensions = &ResourceBroker{}
	_ fwk.SignPlugin        = &ResourceBroker{}
)

// ResourceBroker is the plugin.
type ResourceBroker struct {
	handle   fwk.Handle
	args     *config.ResourceBrokerArgs
	selector labels.Selector
	excluded sets.Set[string]
	allowed  sets.Set[string] // nil: every namespace not excluded

	comparisonOperators bool // TaintTolerationComparisonOperators

	rsvs      *reservationCache
	conv      conversions // of the scheduler's Reservation events, for the hint
	nodes     *nodeTracker
	worker    *worker
	podLister corelisters.PodLister
	nsLister  corelisters.NamespaceLister // the namespace's provider preferences
	dyn       dynamic.Interface           // reads PodGroups (gang.go)

	// hintsOnly turns off the retries by the plugin's own informers (a pod
	// moved to the active queue when its reservation or its virtual node
	// changes in a way that matters), leaving the requeueing to the
	// scheduler's queueing hints. Off in production; tests turn it on
	// (export_test.go) to check that the hints alone requeue the pod.
	hintsOnly atomic.Bool

	mu      sync.Mutex
	claims  map[types.UID]claim            // pod -> reservation it was reserved against (Reserve..Unreserve/deletion)
	blocked map[string]sets.Set[types.UID] // namespace -> pods held back by the per-namespace limit
	told    map[types.UID]string           // pod -> why it is not offloaded, as last told in an Event
}

// claim records, from Reserve on, which reservation a pod is placed with.
type claim struct {
	rsvUID    types.UID
	namespace string
	name      string
	requests  v1.ResourceList
	local     bool // placed on a local node: the reservation is released once the pod is bound
}

// New builds the plugin: decodes and checks the args (invalid args stop the
// scheduler), starts its Reservation informer and its API worker, and hooks
// into the scheduler's Node and Pod informers.
func New(ctx context.Context, obj runtime.Object, h fwk.Handle) (fwk.Plugin, error) {
	logger := klog.FromContext(ctx).WithValues("plugin", Name)
	args, err := DecodeArgs(obj)
	if err != nil {
		return nil, err
	}
	selector := labels.Everything()
	if args.Selector != nil {
		if selector, err = metav1.LabelSelectorAsSelector(args.Selector); err != nil {
			return nil, err
		}
	}
	if h.KubeConfig() == nil {
		return nil, fmt.Errorf("%s: the scheduler handle has no kubeconfig", Name)
	}
	client, err := dynamic.NewForConfig(h.KubeConfig())
	if err != nil {
		return nil, err
	}
	rsvs, err := newReservationCache(client)
	if err != nil {
		return nil, err
	}
	pl := &ResourceBroker{
		handle:              h,
		args:                args,
		selector:            selector,
		excluded:            sets.New(args.ExcludedNamespaces...),
		allowed:             allowedNamespaces(args.Namespaces),
		comparisonOperators: utilfeature.DefaultFeatureGate.Enabled(features.TaintTolerationComparisonOperators),
		rsvs:                rsvs,
		nodes:               newNodeTracker(),
		worker:              newWorker(client),
		dyn:                 client,
		podLister:           h.SharedInformerFactory().Core().V1().Pods().Lister(),
		nsLister:            h.SharedInformerFactory().Core().V1().Namespaces().Lister(),
		claims:              map[types.UID]claim{},
		blocked:             map[string]sets.Set[types.UID]{},
		told:                map[types.UID]string{},
	}
	pl.worker.build = pl.buildReservation
	pl.worker.done = pl.created

	if _, err := rsvs.informer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { pl.onReservation(ctx, nil, toReservation(obj)) },
		UpdateFunc: func(old, obj any) { pl.onReservation(ctx, toReservation(old), toReservation(obj)) },
		DeleteFunc: func(obj any) { pl.onReservationDelete(ctx, toReservation(obj)) },
	}); err != nil {
		return nil, err
	}
	if _, err := h.SharedInformerFactory().Core().V1().Nodes().Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { pl.onNode(ctx, nil, obj) },
		UpdateFunc: func(old, obj any) { pl.onNode(ctx, old, obj) },
		DeleteFunc: func(obj any) {
			if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = t.Obj
			}
			if n, ok := obj.(*v1.Node); ok {
				pl.nodes.remove(n.Name)
			}
		},
	}); err != nil {
		return nil, err
	}
	if _, err := h.SharedInformerFactory().Core().V1().Pods().Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		UpdateFunc: func(oldObj, obj any) {
			// A pod bound: its reservation, if it has one, no longer counts
			// against its namespace's limit.
			old, ok1 := oldObj.(*v1.Pod)
			p, ok2 := obj.(*v1.Pod)
			if ok1 && ok2 && old.Spec.NodeName == "" && p.Spec.NodeName != "" && pl.retryOnChanges() && pl.hasBlocked(p.Namespace) {
				pl.activateBlocked(p.Namespace)
			}
		},
		DeleteFunc: func(obj any) {
			if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = t.Obj
			}
			if p, ok := obj.(*v1.Pod); ok {
				pl.forgetPod(p)
			}
		},
	}); err != nil {
		return nil, err
	}

	if err := rsvs.start(ctx, cacheSyncTimeout); err != nil {
		return nil, fmt.Errorf("%s: %w", Name, err)
	}
	pl.worker.run(klog.NewContext(ctx, logger))
	if args.ReservationDuration != nil {
		logger.Info("Warning: the reservationDuration arg is deprecated and ignored: reservations opened for pods are leases, "+
			"asked for with rb-agent's --lease-length and --hold-time and renewed while their pod runs; remove it from the scheduler's configuration",
			"reservationDuration", args.ReservationDuration.Duration)
	}
	logger.V(2).Info("Plugin started", "selector", selector.String(),
		"maxOutstandingReservationsPerNamespace", args.MaxOutstandingReservationsPerNamespace, "excludedNamespaces", args.ExcludedNamespaces, "namespaces", args.Namespaces)
	return pl, nil
}

// retryOnChanges: the plugin's own informers retry pods (see hintsOnly).
func (pl *ResourceBroker) retryOnChanges() bool { return !pl.hintsOnly.Load() }

// Name returns the name of the plugin.
func (pl *ResourceBroker) Name() string { return Name }

func allowedNamespaces(names []string) sets.Set[string] {
	if len(names) == 0 {
		return nil
	}
	return sets.New(names...)
}
