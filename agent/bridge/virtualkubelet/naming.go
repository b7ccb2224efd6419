package virtualkubelet

import (
	"context"
	"slices"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/source"

	"github.com/fluidos-project/resource-broker/agent/bridge/internal/rsvstatus"
	rbv1 "github.com/fluidos-project/resource-broker/api/v1alpha1"
)

// namingWorkers bounds the status.virtualNode writes in flight: in a burst
// the names are written in parallel, and none holds up the node's resize.
const namingWorkers = 16

// nodeNamer names the virtual node in status.virtualNode of an active
// reservation once the node is schedulable and its capacity, as the API
// server holds it, counts the reservation: the scheduler plugin retries a
// pod when its reservation names a node, and the attempt then finds room for
// it there. One reconcile per Reservation; the bridge's reconcile, which
// writes the capacity, asks for it (Bridge.askNames).
type nodeNamer struct{ b *Bridge }

func (nn nodeNamer) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	b := nn.b
	var r rbv1.Reservation
	if err := b.client.Get(ctx, req.NamespacedName, &r); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	provider := r.Status.Provider
	if !rsvstatus.Active(&r) || provider == "" || r.Status.VirtualNode == NodeName(provider) {
		return ctrl.Result{}, nil
	}
	b.mu.Lock()
	n := b.nodes[provider]
	b.mu.Unlock()
	if n == nil || !n.counts(r.Status.ReservationID) {
		return ctrl.Result{}, nil // the bridge asks again once the capacity counts it
	}
	var node corev1.Node
	if err := b.client.Get(ctx, types.NamespacedName{Name: n.name}, &node); err != nil || !schedulable(&node) {
		return ctrl.Result{}, client.IgnoreNotFound(err) // asked again when it is
	}
	return ctrl.Result{}, rsvstatus.SetVirtualNode(ctx, b.client, &r, n.name)
}

// setupNamer registers the namer's controller: it reconciles the
// reservations the bridge asks it to name and, after a restart, every active
// one still unnamed.
func (b *Bridge) setupNamer(mgr ctrl.Manager) error {
	unnamed := predicate.NewPredicateFuncs(func(o client.Object) bool {
		r, ok := o.(*rbv1.Reservation)
		return ok && rsvstatus.Active(r) && r.Status.Provider != "" && r.Status.VirtualNode != NodeName(r.Status.Provider)
	})
	return ctrl.NewControllerManagedBy(mgr).
		Named("bridge-virtual-node-names").
		WithOptions(controller.Options{MaxConcurrentReconciles: namingWorkers}).
		For(&rbv1.Reservation{}, builder.WithPredicates(unnamed)).
		WatchesRawSource(source.Channel(b.toName, &handler.EnqueueRequestForObject{})).
		Complete(nodeNamer{b})
}

// askNames asks the namer to name node in the active reservations that do
// not name it yet. It waits for room in the namer's channel (which the
// controller drains into its queue at once): a name dropped would leave its
// pod Pending.
func (b *Bridge) askNames(ctx context.Context, node string, active []*rbv1.Reservation) {
	for _, r := range active {
		if r.Status.VirtualNode == node {
			continue
		}
		select {
		case b.toName <- event.GenericEvent{Object: r}:
		case <-ctx.Done():
			return
		}
	}
}

// setCounted records the reservations (broker ids) whose sum the node's
// capacity, as the API server holds it, now counts.
func (n *providerNode) setCounted(ids []string) {
	n.mu.Lock()
	n.counted = slices.Clone(ids)
	n.mu.Unlock()
}

// counts tells whether the node's capacity counts reservation id.
func (n *providerNode) counts(id string) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return id != "" && slices.Contains(n.counted, id)
}
