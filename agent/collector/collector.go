// Package collector measures what this cluster can offer the broker: the
// capacity and allocatable of its Ready, schedulable, real nodes and the
// effective requests of the pods bound to them (cpu, memory, nvidia.com/gpu,
// ephemeral-storage), in total and for a bounded summary of its nodes (the
// broker's per-node fit, nodes.go), with the reservations whose pods run here.
//
// It keeps running totals, updated from informer events in O(1) per event,
// so a measurement costs O(number of resources) however large the cluster.
// Its informers live in a cache of their own whose transforms reduce every
// Pod, Node and Namespace to a few numbers as it arrives (see objects.go),
// and whose field selector leaves out unbound and terminal pods.
//
// What is not local (architecture, section 2.3): virtual nodes (ours,
// labelled broker.fluidos.eu/provider, and Liqo's, labelled
// liqo.io/type=virtual-node) are not capacity and pods bound to them are not
// usage; pods in tenant namespaces (labelled broker.fluidos.eu/tenant) run
// on reservations the broker already holds, so they are not usage either.
// Pods on a node that does not count (NotReady, cordoned) are left out with
// that node's capacity.
package collector

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/rest"
	toolscache "k8s.io/client-go/tools/cache"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/cluster"
)

// Measurement is one snapshot of the running totals. Each list holds cpu,
// memory, nvidia.com/gpu and ephemeral-storage, zero when absent.
type Measurement struct {
	// Capacity and Allocatable of the counted nodes.
	Capacity, Allocatable corev1.ResourceList
	// Allocated: effective requests of the local pods on counted nodes.
	Allocated corev1.ResourceList
	// Nodes counted, and pods whose requests are in Allocated.
	Nodes, Pods int
	// NodeSummary are the counted nodes listed for the broker's per-node
	// fit, in name order: a bounded summary (nodes.go). Their Allocated
	// includes tenant pods.
	NodeSummary []NodeMeasurement
	// NodeSummaryExact: every node that no other node matches or beats in
	// every resource is in NodeSummary (a request one node can hold, one of
	// them can hold).
	NodeSummaryExact bool
	// ReservationsOnNodes are the ids of the broker reservations whose
	// tenant pods are bound to a node here, sorted (bounded: nodes.go).
	ReservationsOnNodes []string
}

// Options tune how pods' effective requests are computed; the zero value
// matches a Kubernetes 1.35 scheduler with default feature gates.
type Options struct {
	// IgnorePodLevelResources ignores pod-level requests (spec.resources), as
	// with the PodLevelResources feature gate off.
	IgnorePodLevelResources bool
	// IgnoreStatusResources ignores the resources a resized pod reports in
	// its status, as with the InPlacePodVerticalScaling feature gate off.
	IgnoreStatusResources bool
}

// Collector keeps the running totals. It is safe for concurrent use.
type Collector struct {
	opts    Options
	changed chan struct{}
	log     logr.Logger

	mu    sync.Mutex
	tally *tally

	regsMu sync.Mutex
	regs   []toolscache.ResourceEventHandlerRegistration

	subsMu sync.Mutex
	subs   []chan struct{} // Subscribe's readers
}

// New returns a collector; SetupWithManager starts its informers.
func New(opts Options) *Collector {
	return &Collector{
		opts:    opts,
		changed: make(chan struct{}, 1),
		log:     logr.Discard(),
		tally:   newTally(),
	}
}

// SetupWithManager creates the collector's own cache (informers on Nodes,
// bound non-terminal Pods and tenant Namespaces, with reducing transforms)
// and adds it to mgr, which starts it with its caches, on every replica
// (leader or not), and waits for it to sync before it starts the runnables.
func (c *Collector) SetupWithManager(mgr ctrl.Manager) error {
	c.log = mgr.GetLogger().WithName("collector")
	scheme := runtime.NewScheme()
	if err := corev1.AddToScheme(scheme); err != nil {
		return err
	}
	cl, err := cluster.New(mgr.GetConfig(), func(o *cluster.Options) {
		o.Scheme = scheme
		o.Logger = c.log
		o.HTTPClient = mgr.GetHTTPClient()
		o.MapperProvider = func(*rest.Config, *http.Client) (meta.RESTMapper, error) { return mgr.GetRESTMapper(), nil }
		o.Cache = c.cacheOptions()
	})
	if err != nil {
		return err
	}
	if err := c.watch(context.Background(), cl.GetCache()); err != nil {
		return err
	}
	return mgr.Add(cl)
}

// cacheOptions select and reduce what the collector's cache holds.
func (c *Collector) cacheOptions() cache.Options {
	// Pending (unbound) and terminal pods never count: the API server
	// leaves them out, and a pod that ends arrives as a deletion.
	podFields := fields.AndSelectors(
		fields.OneTermNotEqualSelector("spec.nodeName", ""),
		fields.OneTermNotEqualSelector("status.phase", string(corev1.PodSucceeded)),
		fields.OneTermNotEqualSelector("status.phase", string(corev1.PodFailed)),
	)
	// Every namespace, reduced to whether it is a tenant's: ours carry a
	// label, Liqo's an annotation, which no selector can pick.
	return cache.Options{
		ByObject: map[client.Object]cache.ByObject{
			&corev1.Pod{}:       {Field: podFields, Transform: c.transformPod},
			&corev1.Node{}:      {Transform: transformNode},
			&corev1.Namespace{}: {Transform: transformNamespace},
		},
	}
}

// watch registers the event handlers on informers.
func (c *Collector) watch(ctx context.Context, informers cache.Informers) error {
	handlers := []struct {
		obj client.Object
		h   toolscache.ResourceEventHandler
	}{
		{&corev1.Namespace{}, toolscache.ResourceEventHandlerFuncs{
			AddFunc:    func(obj any) { c.onNamespace(obj, false) },
			UpdateFunc: func(_, obj any) { c.onNamespace(obj, false) },
			DeleteFunc: func(obj any) { c.onNamespace(obj, true) },
		}},
		{&corev1.Node{}, toolscache.ResourceEventHandlerFuncs{
			AddFunc:    func(obj any) { c.onNode(obj, false) },
			UpdateFunc: func(_, obj any) { c.onNode(obj, false) },
			DeleteFunc: func(obj any) { c.onNode(obj, true) },
		}},
		{&corev1.Pod{}, toolscache.ResourceEventHandlerFuncs{
			AddFunc:    func(obj any) { c.onPod(obj, false) },
			UpdateFunc: func(_, obj any) { c.onPod(obj, false) },
			DeleteFunc: func(obj any) { c.onPod(obj, true) },
		}},
	}
	for _, h := range handlers {
		inf, err := informers.GetInformer(ctx, h.obj, cache.BlockUntilSynced(false))
		if err != nil {
			return err
		}
		reg, err := inf.AddEventHandler(h.h)
		if err != nil {
			return err
		}
		c.regsMu.Lock()
		c.regs = append(c.regs, reg)
		c.regsMu.Unlock()
	}
	return nil
}

// HasSynced reports whether the handlers have seen every Node, Pod and
// Namespace that existed when the informers started: before that, the
// totals are incomplete and must not be published.
func (c *Collector) HasSynced() bool {
	c.regsMu.Lock()
	defer c.regsMu.Unlock()
	if len(c.regs) == 0 {
		return false
	}
	for _, r := range c.regs {
		if !r.HasSynced() {
			return false
		}
	}
	return true
}

// WaitForSync blocks until HasSynced or ctx ends, and reports HasSynced.
func (c *Collector) WaitForSync(ctx context.Context) bool {
	t := time.NewTicker(20 * time.Millisecond)
	defer t.Stop()
	for !c.HasSynced() {
		select {
		case <-ctx.Done():
			return false
		case <-t.C:
		}
	}
	return true
}

// Measure returns the current totals, node summary and reservations; the
// totals cost O(number of resources), the summary O(nodes × SummaryMax)
// (a few milliseconds at 5,000 nodes, once per publish).
func (c *Collector) Measure() Measurement {
	c.mu.Lock()
	t := c.tally.totals
	nodes := c.tally.countedNodes()
	listed := c.tally.listedReservations()
	c.mu.Unlock()
	summary, exact := summarize(nodes, SummaryPerResource, SummaryMax)
	m := Measurement{
		Capacity:            t.capacity.list(),
		Allocatable:         t.allocatable.list(),
		Allocated:           t.allocated.list(),
		Nodes:               t.nodes,
		Pods:                t.pods,
		NodeSummaryExact:    exact,
		ReservationsOnNodes: listed,
	}
	for _, n := range summary {
		m.NodeSummary = append(m.NodeSummary, NodeMeasurement{Name: n.name, Allocatable: n.alloc.list(), Allocated: n.used.list()})
	}
	return m
}

// Changed receives a value after the totals, a counted node's figures or the
// reservations on nodes changed (coalesced: one pending value stands for any
// number of changes). It is meant for one reader.
func (c *Collector) Changed() <-chan struct{} { return c.changed }

// Subscribe returns a channel of its own that, as Changed, receives a value
// after what is measured changed (coalesced), for a reader besides the
// publisher.
func (c *Collector) Subscribe() <-chan struct{} {
	ch := make(chan struct{}, 1)
	c.subsMu.Lock()
	c.subs = append(c.subs, ch)
	c.subsMu.Unlock()
	return ch
}

// update applies fn to the tally and signals a change of what is measured.
func (c *Collector) update(fn func(*tally)) {
	c.mu.Lock()
	before := c.tally.totals
	fn(c.tally)
	changed := c.tally.totals != before || c.tally.nodesChanged
	c.tally.nodesChanged = false
	c.mu.Unlock()
	if changed {
		signal(c.changed)
		c.subsMu.Lock()
		for _, ch := range c.subs {
			signal(ch)
		}
		c.subsMu.Unlock()
	}
}

// signal puts a value in ch unless one is pending already.
func signal(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// unwrap returns the last known state of a deleted object.
func unwrap(obj any) any {
	if d, ok := obj.(toolscache.DeletedFinalStateUnknown); ok {
		return d.Obj
	}
	return obj
}

func (c *Collector) onPod(obj any, deleted bool) {
	var u *podUsage
	switch o := unwrap(obj).(type) {
	case *podUsage:
		u = o
	case *corev1.Pod: // not reduced (a cache without the transform)
		u = c.usageOf(o)
	default:
		c.log.V(1).Info("ignoring an unexpected pod event object", "type", typeName(obj))
		return
	}
	if deleted {
		uid := u.UID
		c.update(func(t *tally) { t.deletePod(uid) })
		return
	}
	c.update(func(t *tally) { t.setPod(u) })
}

func (c *Collector) onNode(obj any, deleted bool) {
	var n *nodeCapacity
	switch o := unwrap(obj).(type) {
	case *nodeCapacity:
		n = o
	case *corev1.Node:
		n = capacityOf(o)
	default:
		c.log.V(1).Info("ignoring an unexpected node event object", "type", typeName(obj))
		return
	}
	if deleted {
		c.update(func(t *tally) { t.deleteNode(n.Name) })
	} else {
		c.update(func(t *tally) { t.setNode(n) })
	}
	c.log.V(2).Info("node", "node", n.Name, "deleted", deleted, "counted", n.Counted && !deleted, "virtual", n.Virtual)
}

func (c *Collector) onNamespace(obj any, deleted bool) {
	var ns *namespaceTenancy
	switch o := unwrap(obj).(type) {
	case *namespaceTenancy:
		ns = o
	case *corev1.Namespace:
		ns = tenancyOf(o)
	default:
		c.log.V(1).Info("ignoring an unexpected namespace event object", "type", typeName(obj))
		return
	}
	tenant := ns.Tenant && !deleted
	c.update(func(t *tally) { t.setTenant(ns.Name, tenant, ns.Requester) })
}

func typeName(obj any) string { return fmt.Sprintf("%T", obj) }
