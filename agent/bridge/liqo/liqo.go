// Package liqo is the bridge for clusters peered with Liqo: per live
// reservation, a Liqo ResourceSlice in liqo-tenant-<provider> sized to the
// reservation, with the annotation that makes Liqo create a virtual node for
// it. Once the provider accepts the slice, the virtual node (a Liqo
// VirtualNode and its Node) is labelled broker.fluidos.eu/provider=<id>, so
// the scheduler plugin treats it as ours, and the reservation's
// status.virtualNode names it. A denied slice is reported as the
// reservation's reason; the slice is deleted when the reservation ends.
// Liqo itself runs the pods (offload the namespace with liqoctl).
package liqo

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/go-logr/logr"
	authv1beta1 "github.com/liqotech/liqo/apis/authentication/v1beta1"
	liqov1beta1 "github.com/liqotech/liqo/apis/core/v1beta1"
	offloadingv1beta1 "github.com/liqotech/liqo/apis/offloading/v1beta1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/fluidos-project/resource-broker/agent/bridge/internal/rsvstatus"
	rbv1 "github.com/fluidos-project/resource-broker/api/v1alpha1"
)

// Liqo's labels and annotations (github.com/liqotech/liqo/pkg/consts).
const (
	RemoteClusterIDLabel        = "liqo.io/remote-cluster-id"
	ReplicationRequestedLabel   = "liqo.io/replication"
	ReplicationDestinationLabel = "liqo.io/remoteID"
	ResourceSliceNameLabel      = "liqo.io/resourceslice-name"
	CreateVirtualNodeAnnotation = "liqo.io/create-virtual-node"
	// ReplicatedLabel marks the copy Liqo's crd-replicator keeps in a
	// provider of a slice another cluster made: never ours to touch, though
	// it carries our labels and annotations.
	ReplicatedLabel = "liqo.io/replicated"
)

// Where a slice comes from (annotations on the slice).
const (
	ReservationNamespaceAnnotation = "broker.fluidos.eu/reservation-namespace"
	ReservationNameAnnotation      = "broker.fluidos.eu/reservation-name"
)

// Reasons of the reservation's VirtualNode condition (and, for a refusal, of
// status.reason).
const (
	ReasonDenied         = "ResourceSliceDenied"
	ReasonNotPeered      = "LiqoNotPeered"
	ReasonWaitingSlice   = "WaitingForResourceSlice"
	ReasonWaitingNode    = "WaitingForVirtualNode"
	ReasonVirtualNodeUp  = "VirtualNodeReady"
	defaultTenantPattern = "liqo-tenant-%s"
)

// Config of the Liqo bridge.
type Config struct {
	ClusterID string
	Log       logr.Logger
	// TenantNamespace maps a provider to its Liqo tenant namespace (default liqo-tenant-<provider>).
	TenantNamespace func(provider string) string
	// RetryPeriod paces the look at a reservation whose provider is not peered (default 30s).
	RetryPeriod time.Duration
}

// Bridge reconciles Reservations into Liqo ResourceSlices.
type Bridge struct {
	cfg    Config
	log    logr.Logger
	client client.Client
}

// New fills in the defaults.
func New(cfg Config) (*Bridge, error) {
	if cfg.ClusterID == "" {
		return nil, errors.New("liqo bridge: the cluster id is required")
	}
	if cfg.TenantNamespace == nil {
		cfg.TenantNamespace = func(p string) string { return fmt.Sprintf(defaultTenantPattern, p) }
	}
	if cfg.RetryPeriod == 0 {
		cfg.RetryPeriod = 30 * time.Second
	}
	return &Bridge{cfg: cfg}, nil
}

// SliceName is the ResourceSlice (hence the VirtualNode and Node) of a
// reservation: rb-<provider>-<first 8 characters of its UID>.
func SliceName(r *rbv1.Reservation) string {
	uid := string(r.UID)
	if len(uid) > 8 {
		uid = uid[:8]
	}
	return "rb-" + r.Status.Provider + "-" + uid
}

// SetupWithManager adds Liqo's types to the manager's scheme and registers the controller.
func (b *Bridge) SetupWithManager(mgr ctrl.Manager) error {
	b.log = b.cfg.Log
	if b.log.GetSink() == nil {
		b.log = mgr.GetLogger()
	}
	b.log = b.log.WithName("bridge-liqo")
	b.client = mgr.GetClient()
	if err := errors.Join(authv1beta1.AddToScheme(mgr.GetScheme()), offloadingv1beta1.AddToScheme(mgr.GetScheme())); err != nil {
		return err
	}
	if err := mgr.GetFieldIndexer().IndexField(context.Background(), &rbv1.Reservation{}, rsvstatus.ProviderIndex, rsvstatus.IndexProvider); err != nil {
		return err
	}
	toReservation := func(o metav1.Object) []reconcile.Request {
		a := o.GetAnnotations()
		if a[ReservationNamespaceAnnotation] == "" || a[ReservationNameAnnotation] == "" {
			return nil
		}
		return []reconcile.Request{{NamespacedName: types.NamespacedName{Namespace: a[ReservationNamespaceAnnotation], Name: a[ReservationNameAnnotation]}}}
	}
	slices := handler.EnqueueRequestsFromMapFunc(func(_ context.Context, o client.Object) []reconcile.Request { return toReservation(o) })
	virtualNodes := handler.EnqueueRequestsFromMapFunc(func(ctx context.Context, o client.Object) []reconcile.Request {
		var slice authv1beta1.ResourceSlice
		name := o.GetLabels()[ResourceSliceNameLabel]
		if name == "" {
			name = o.GetName()
		}
		if err := b.client.Get(ctx, types.NamespacedName{Namespace: o.GetNamespace(), Name: name}, &slice); err != nil {
			return nil
		}
		return toReservation(&slice)
	})
	nodes := handler.EnqueueRequestsFromMapFunc(func(ctx context.Context, o client.Object) []reconcile.Request {
		provider := o.GetLabels()[RemoteClusterIDLabel]
		if provider == "" {
			return nil
		}
		var list rbv1.ReservationList
		if err := b.client.List(ctx, &list, client.MatchingFields{rsvstatus.ProviderIndex: provider}); err != nil {
			return nil
		}
		var out []reconcile.Request
		for i := range list.Items {
			if rsvstatus.Live(&list.Items[i]) {
				out = append(out, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&list.Items[i])})
			}
		}
		return out
	})
	ours := predicate.NewPredicateFuncs(func(o client.Object) bool { return own(o) })
	liqoNodes := predicate.NewPredicateFuncs(func(o client.Object) bool { return o.GetLabels()[RemoteClusterIDLabel] != "" })
	return ctrl.NewControllerManagedBy(mgr).
		Named("bridge-liqo").
		For(&rbv1.Reservation{}).
		Watches(&authv1beta1.ResourceSlice{}, slices, builder.WithPredicates(ours)).
		Watches(&offloadingv1beta1.VirtualNode{}, virtualNodes).
		Watches(&corev1.Node{}, nodes, builder.WithPredicates(liqoNodes)).
		Complete(b)
}

// Reconcile keeps the slice of one reservation.
func (b *Bridge) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	var rsv rbv1.Reservation
	if err := b.client.Get(ctx, req.NamespacedName, &rsv); err != nil {
		if apierrors.IsNotFound(err) {
			return ctrl.Result{}, b.deleteSlices(ctx, req.NamespacedName, "")
		}
		return ctrl.Result{}, err
	}
	if rsv.Status.Provider == "" {
		return ctrl.Result{}, nil
	}
	if !rsvstatus.Live(&rsv) {
		return ctrl.Result{}, b.deleteSlices(ctx, req.NamespacedName, rsv.UID)
	}
	slice, err := b.ensureSlice(ctx, &rsv)
	if apierrors.IsNotFound(err) { // no tenant namespace: not peered with the provider
		msg := fmt.Sprintf("no Liqo tenant namespace %s: is this cluster peered with %s?", b.cfg.TenantNamespace(rsv.Status.Provider), rsv.Status.Provider)
		return ctrl.Result{RequeueAfter: b.cfg.RetryPeriod}, b.report(ctx, &rsv, metav1.ConditionFalse, ReasonNotPeered, msg, true)
	}
	if err != nil {
		return ctrl.Result{}, err
	}
	where := slice.Namespace + "/" + slice.Name
	if c := condition(slice, authv1beta1.ResourceSliceConditionTypeResources); c != nil && c.Status == authv1beta1.ResourceSliceConditionDenied {
		msg := fmt.Sprintf("%s denied ResourceSlice %s", rsv.Status.Provider, where)
		if c.Message != "" {
			msg += ": " + c.Message
		}
		return ctrl.Result{}, b.report(ctx, &rsv, metav1.ConditionFalse, ReasonDenied, msg, true)
	}
	if !accepted(slice) {
		return ctrl.Result{}, b.report(ctx, &rsv, metav1.ConditionFalse, ReasonWaitingSlice,
			fmt.Sprintf("waiting for %s to accept ResourceSlice %s", rsv.Status.Provider, where), false)
	}
	node, err := b.virtualNode(ctx, slice)
	if err != nil {
		return ctrl.Result{}, err
	}
	if node == nil {
		return ctrl.Result{}, b.report(ctx, &rsv, metav1.ConditionFalse, ReasonWaitingNode,
			fmt.Sprintf("ResourceSlice %s accepted; waiting for Liqo's virtual node", where), false)
	}
	if node.Labels[rbv1.ProviderLabel] != rsv.Status.Provider {
		patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"labels": map[string]string{rbv1.ProviderLabel: rsv.Status.Provider}}})
		if err := b.client.Patch(ctx, node, client.RawPatch(types.MergePatchType, patch)); err != nil {
			return ctrl.Result{}, client.IgnoreNotFound(err)
		}
		b.log.Info("labelled Liqo virtual node for the scheduler", "node", node.Name, "provider", rsv.Status.Provider, "reservation", req.String())
	}
	if err := rsvstatus.SetVirtualNode(ctx, b.client, &rsv, node.Name); err != nil {
		return ctrl.Result{}, err
	}
	return ctrl.Result{}, b.report(ctx, &rsv, metav1.ConditionTrue, ReasonVirtualNodeUp,
		fmt.Sprintf("node %s (Liqo, ResourceSlice %s) stands for %s", node.Name, where, rsv.Status.Provider), false)
}

func (b *Bridge) report(ctx context.Context, rsv *rbv1.Reservation, status metav1.ConditionStatus, reason, msg string, setReason bool) error {
	return rsvstatus.Report(ctx, b.client, rsv, metav1.Condition{Type: rsvstatus.ConditionVirtualNode, Status: status, Reason: reason, Message: msg}, setReason)
}

// ensureSlice creates the reservation's slice if it is not there.
func (b *Bridge) ensureSlice(ctx context.Context, rsv *rbv1.Reservation) (*authv1beta1.ResourceSlice, error) {
	provider := rsv.Status.Provider
	key := types.NamespacedName{Namespace: b.cfg.TenantNamespace(provider), Name: SliceName(rsv)}
	var slice authv1beta1.ResourceSlice
	err := b.client.Get(ctx, key, &slice)
	if err == nil || !apierrors.IsNotFound(err) {
		return &slice, err
	}
	remote := liqov1beta1.ClusterID(provider)
	slice = authv1beta1.ResourceSlice{
		ObjectMeta: metav1.ObjectMeta{
			Name: key.Name, Namespace: key.Namespace,
			Labels: map[string]string{
				RemoteClusterIDLabel:        provider,
				ReplicationRequestedLabel:   "true",
				ReplicationDestinationLabel: provider,
				rbv1.ManagedByLabel:         rbv1.ManagedByValue,
				rbv1.ReservationLabel:       string(rsv.UID),
			},
			Annotations: map[string]string{
				CreateVirtualNodeAnnotation:    "true",
				ReservationNamespaceAnnotation: rsv.Namespace,
				ReservationNameAnnotation:      rsv.Name,
			},
		},
		Spec: authv1beta1.ResourceSliceSpec{
			ProviderClusterID: &remote,
			Class:             authv1beta1.ResourceSliceClassDefault,
			Resources:         rsv.Spec.Resources.DeepCopy(),
		},
	}
	if err := b.client.Create(ctx, &slice); err != nil {
		if apierrors.IsAlreadyExists(err) {
			err = b.client.Get(ctx, key, &slice)
		}
		return &slice, err // NotFound: no tenant namespace
	}
	b.log.Info("ResourceSlice created", "slice", key.String(), "reservation", client.ObjectKeyFromObject(rsv).String(), "resources", fmt.Sprint(rsv.Spec.Resources))
	return &slice, nil
}

// virtualNode finds the Node Liqo made for slice (through its VirtualNode).
func (b *Bridge) virtualNode(ctx context.Context, slice *authv1beta1.ResourceSlice) (*corev1.Node, error) {
	var vns offloadingv1beta1.VirtualNodeList
	if err := b.client.List(ctx, &vns, client.InNamespace(slice.Namespace), client.MatchingLabels{ResourceSliceNameLabel: slice.Name}); err != nil {
		return nil, err
	}
	name := slice.Name // Liqo names the VirtualNode, and its Node, after the slice
	if len(vns.Items) > 0 {
		name = vns.Items[0].Name
	}
	var node corev1.Node
	if err := b.client.Get(ctx, types.NamespacedName{Name: name}, &node); err != nil {
		return nil, client.IgnoreNotFound(err)
	}
	return &node, nil
}

// deleteSlices deletes the slices of a reservation that ended or is gone.
func (b *Bridge) deleteSlices(ctx context.Context, key types.NamespacedName, uid types.UID) error {
	var list authv1beta1.ResourceSliceList
	if err := b.client.List(ctx, &list, client.MatchingLabels{rbv1.ManagedByLabel: rbv1.ManagedByValue}); err != nil {
		return err
	}
	var errs []error
	for i := range list.Items {
		s := &list.Items[i]
		a := s.Annotations
		if !own(s) || a[ReservationNamespaceAnnotation] != key.Namespace || a[ReservationNameAnnotation] != key.Name ||
			(uid != "" && s.Labels[rbv1.ReservationLabel] != string(uid)) || !s.DeletionTimestamp.IsZero() {
			continue
		}
		if err := b.client.Delete(ctx, s); client.IgnoreNotFound(err) != nil {
			errs = append(errs, err)
			continue
		}
		b.log.Info("ResourceSlice deleted: the reservation ended", "slice", s.Namespace+"/"+s.Name, "reservation", key.String())
	}
	return errors.Join(errs...)
}

// own: a slice this cluster's agent made (not a replica of another
// cluster's: Liqo copies a consumer's slice, labels and annotations
// included, into its provider's tenant namespace).
func own(o client.Object) bool {
	l := o.GetLabels()
	return l[rbv1.ManagedByLabel] == rbv1.ManagedByValue && l[ReplicatedLabel] != "true"
}

func condition(s *authv1beta1.ResourceSlice, t authv1beta1.ResourceSliceConditionType) *authv1beta1.ResourceSliceCondition {
	for i := range s.Status.Conditions {
		if s.Status.Conditions[i].Type == t {
			return &s.Status.Conditions[i]
		}
	}
	return nil
}

// accepted: the provider accepted the resources (Liqo creates the virtual
// node once authentication is accepted too; the bridge then waits for it).
func accepted(s *authv1beta1.ResourceSlice) bool {
	r := condition(s, authv1beta1.ResourceSliceConditionTypeResources)
	return r != nil && r.Status == authv1beta1.ResourceSliceConditionAccepted
}
