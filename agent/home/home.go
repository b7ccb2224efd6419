// Package home is what a requester cluster does about the pods it borrowed
// capacity for: borrowing is bursting, paid for only while the cluster is
// full. It ranks borrowed pods below local ones for scale-in (the
// pod-deletion cost the ReplicaSet controller reads: the dearer the
// provider, the sooner its pod goes), and, where the return-home policy
// allows, moves a borrowed pod of a Deployment home once a local node can
// hold it, replacement first (move.go).
//
// One reconciler of Reservations (requester side, the scheduler plugin's:
// spec.podName set): level-based, it reads the pod from the agent's pod
// tracker and writes only when the pod's annotations or the Deployment
// differ from what they should be.
package home

import (
	"context"
	"math"
	"strconv"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/source"

	"github.com/fluidos-project/resource-broker/agent/collector"
	"github.com/fluidos-project/resource-broker/agent/reservation"
	rbv1 "github.com/fluidos-project/resource-broker/api/v1alpha1"
)

// Annotations this package reads and writes.
const (
	// DeletionCostAnnotation is Kubernetes' pod-deletion cost: of the pods of
	// a ReplicaSet scaled in, those of lower cost go first.
	DeletionCostAnnotation = "controller.kubernetes.io/pod-deletion-cost"
	// CostSetAnnotation marks a deletion cost the agent wrote; a pod whose
	// cost someone else set is left alone.
	CostSetAnnotation = "broker.fluidos.eu/deletion-cost"
	// PolicyAnnotation, on a pod (its template) or its namespace, is the
	// return-home policy: Never, or WhenLocalFits. The pod's wins.
	PolicyAnnotation = "broker.fluidos.eu/return-home"
	// MinStayAnnotation, on a pod or its namespace, is how long a borrowed
	// pod stays at its provider before it may move home (a Go duration).
	MinStayAnnotation = "broker.fluidos.eu/return-home-after"
)

// Return-home policies.
const (
	PolicyNever         = "Never"
	PolicyWhenLocalFits = "WhenLocalFits"
)

// DeletionCost is a borrowed pod's deletion cost for an hourly price in
// micro-units: below every local pod's (0 unless set), lower the dearer,
// clamped to what the annotation holds (int32).
func DeletionCost(priceMicros int64) int32 {
	return int32(-1 - min(max(priceMicros, 0), math.MaxInt32-1))
}

// LocalCapacity tells what the local nodes offer (agent/collector).
type LocalCapacity interface {
	Measure() collector.Measurement
	Subscribe() <-chan struct{}
}

// Reconciler ranks and moves the borrowed pods of this cluster.
type Reconciler struct {
	Client    client.Client
	APIReader client.Reader
	Pods      reservation.PodLookup
	Local     LocalCapacity
	Recorder  events.EventRecorder
	// DefaultPolicy applies where neither the pod nor its namespace says
	// (--return-home, default Never).
	DefaultPolicy string
	// MinStay is the least time at a provider before a move home, unless
	// the pod or namespace says otherwise (--return-home-min-stay).
	MinStay time.Duration
	// Cooldown is the least time between two moves of one Deployment
	// (--return-home-cooldown, default DefaultCooldown).
	Cooldown time.Duration
	// ReplacementTimeout bounds the wait for a replacement to be Ready at
	// home (default DefaultReplacementTimeout); past it the move is undone.
	ReplacementTimeout time.Duration
	Now                func() time.Time

	// kick carries the collector's changes: local capacity freed may let a
	// borrowed pod come home.
	kick chan event.GenericEvent

	mu       sync.Mutex
	measured collector.Measurement
	measAt   time.Time
	// moving maps the Reservation of a pod being moved to its Deployment:
	// when the pod (and so its Reservation) goes first, its reconcile still
	// takes the move further.
	moving map[types.NamespacedName]types.NamespacedName
}

// Defaults of the return-home timings.
const (
	DefaultCooldown           = 2 * time.Minute
	DefaultReplacementTimeout = 2 * time.Minute
	// remeasure is how old a measurement of the local nodes may be reused.
	remeasure = time.Second
)

// SetupWithManager registers the reconciler: Reservations, and every live
// one again when the local capacity changes (at most once a second).
func (r *Reconciler) SetupWithManager(mgr ctrl.Manager) error {
	if r.Now == nil {
		r.Now = time.Now
	}
	if r.APIReader == nil {
		r.APIReader = mgr.GetAPIReader()
	}
	r.kick = make(chan event.GenericEvent, 1024)
	if r.Local != nil {
		if err := mgr.Add(ctrlRunnable(r.followLocal)); err != nil {
			return err
		}
	}
	return ctrl.NewControllerManagedBy(mgr).
		Named("home").
		For(&rbv1.Reservation{}).
		WatchesRawSource(source.Channel(r.kick, &handler.EnqueueRequestForObject{})).
		Complete(r)
}

// Enqueue asks for the Reservations of a pod again (the pod was bound).
func (r *Reconciler) Enqueue(keys []types.NamespacedName) {
	for _, k := range keys {
		rsv := &rbv1.Reservation{}
		rsv.Namespace, rsv.Name = k.Namespace, k.Name
		select {
		case r.kick <- event.GenericEvent{Object: rsv}:
		default:
		}
	}
}

// followLocal enqueues the live Reservations bound to virtual nodes when the
// local capacity changed, at most once a second.
func (r *Reconciler) followLocal(ctx context.Context) error {
	changed := r.Local.Subscribe()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-changed:
		}
		r.mu.Lock()
		r.measAt = time.Time{} // measured again at the next look
		r.mu.Unlock()
		var list rbv1.ReservationList
		if err := r.Client.List(ctx, &list); err == nil {
			var keys []types.NamespacedName
			for i := range list.Items {
				if borrowedPodOf(&list.Items[i]) {
					keys = append(keys, client.ObjectKeyFromObject(&list.Items[i]))
				}
			}
			r.Enqueue(keys)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(remeasure):
		}
	}
}

type ctrlRunnable func(context.Context) error

func (f ctrlRunnable) Start(ctx context.Context) error { return f(ctx) }

// borrowedPodOf: rsv is the live reservation of a pod, on a virtual node.
func borrowedPodOf(rsv *rbv1.Reservation) bool {
	return rsv.Spec.PodName != "" && rsv.Status.VirtualNode != "" && rsv.DeletionTimestamp.IsZero() &&
		(rsv.Status.Phase == rbv1.ReservationActive || rsv.Status.Phase == rbv1.ReservationReserved)
}

// Reconcile ranks the Reservation's pod for scale-in and moves it home when
// its policy allows.
func (r *Reconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	var rsv rbv1.Reservation
	if err := r.Client.Get(ctx, req.NamespacedName, &rsv); err != nil {
		if apierrors.IsNotFound(err) {
			return r.orphanedMove(ctx, req.NamespacedName)
		}
		return ctrl.Result{}, err
	}
	if !borrowedPodOf(&rsv) {
		return r.orphanedMove(ctx, req.NamespacedName)
	}
	pod, ok := r.Pods.Pod(rsv.Namespace, rsv.Spec.PodName)
	if !ok || pod.NodeName != rsv.Status.VirtualNode || pod.Finished() {
		return r.orphanedMove(ctx, req.NamespacedName)
	}
	if err := r.rank(ctx, &rsv, pod); err != nil {
		return ctrl.Result{}, err
	}
	return r.returnHome(ctx, &rsv, pod)
}

// rank writes the pod's deletion cost from its reservation's price, unless
// someone else set one.
func (r *Reconciler) rank(ctx context.Context, rsv *rbv1.Reservation, pod reservation.PodState) error {
	price, ok := reservation.PriceMicros(rsv.Status.PricePerHour)
	if !ok {
		return nil // an older agent's status: ranked once the broker is read again
	}
	want := strconv.Itoa(int(DeletionCost(price)))
	have, set := pod.Annotations[DeletionCostAnnotation]
	marker := pod.Annotations[CostSetAnnotation]
	if have == want || (set && marker == "") || marker == movingMarker {
		return nil // ranked; someone else's; or the pod goes (a move home)
	}
	err := r.setCost(ctx, rsv.Namespace, rsv.Spec.PodName, pod.UID, want, rsv.Status.Provider)
	if err == nil {
		log.FromContext(ctx).Info("ranked a borrowed pod for scale-in", "pod", rsv.Spec.PodName, "deletionCost", want, "provider", rsv.Status.Provider)
	}
	return err
}

// movingMarker, as CostSetAnnotation, marks the pod a move home scales in:
// its cost is the lowest there is, and rank leaves it so.
const movingMarker = "moving-home"

// setCost writes a pod's deletion cost and the agent's marker.
func (r *Reconciler) setCost(ctx context.Context, namespace, name string, uid types.UID, cost, marker string) error {
	patch := []byte(`{"metadata":{"annotations":{"` + DeletionCostAnnotation + `":"` + cost + `","` + CostSetAnnotation + `":"` + marker + `"}}}`)
	obj := &corev1.Pod{}
	obj.Namespace, obj.Name, obj.UID = namespace, name, uid
	err := r.Client.Patch(ctx, obj, client.RawPatch(types.MergePatchType, patch))
	if apierrors.IsNotFound(err) {
		return nil
	}
	return err
}
