package reservation

import (
	"context"
	"fmt"
	"maps"
	"net/http"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	toolscache "k8s.io/client-go/tools/cache"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/cluster"
	"sigs.k8s.io/controller-runtime/pkg/log"

	rbv1 "github.com/fluidos-project/resource-broker/api/v1alpha1"
)

// PodState is what the requester side knows of a pod: enough to tell
// whether its lease is to be renewed (bound and running) or released
// (gone, Succeeded or Failed).
type PodState struct {
	UID      types.UID
	NodeName string
	Phase    corev1.PodPhase
	// Ready: the pod's condition Ready is True.
	Ready bool
	// Annotations are the pod's annotations that agent/home reads (its
	// deletion cost and return-home policy); nil for most pods.
	Annotations map[string]string
}

// TrackedAnnotations are the pod annotations PodState keeps.
var TrackedAnnotations = []string{
	"controller.kubernetes.io/pod-deletion-cost",
	"broker.fluidos.eu/deletion-cost",
	"broker.fluidos.eu/return-home",
	"broker.fluidos.eu/return-home-after",
}

// Finished: the pod Succeeded or Failed; its containers will not run again.
func (p PodState) Finished() bool {
	return p.Phase == corev1.PodSucceeded || p.Phase == corev1.PodFailed
}

// PodLookup finds the state of a pod by namespace and name.
type PodLookup interface {
	Pod(namespace, name string) (PodState, bool)
}

// podOf is the pod rsv was opened for, and whether the lookup knows it: a
// Reservation owned by a pod (the scheduler plugin's) belongs to that pod
// only, not to another one later created under the same name.
func podOf(pods PodLookup, rsv *rbv1.Reservation) (PodState, bool) {
	if rsv.Spec.PodName == "" || pods == nil {
		return PodState{}, false
	}
	p, ok := pods.Pod(rsv.Namespace, rsv.Spec.PodName)
	if !ok {
		return PodState{}, false
	}
	if uid := ownerPod(rsv); uid != "" && uid != p.UID {
		return PodState{}, false
	}
	return p, true
}

// ownerPod is the UID of the pod that controls rsv, if one does.
func ownerPod(rsv *rbv1.Reservation) types.UID {
	if ref := metav1.GetControllerOfNoCopy(rsv); ref != nil && ref.Kind == "Pod" && ref.APIVersion == "v1" {
		return ref.UID
	}
	return ""
}

// renewable: rsv is a live lease whose pod exists, is bound and runs.
func renewable(pods PodLookup, rsv *rbv1.Reservation) bool {
	if rsv.Status.Lease == nil || !isLive(rsv.Status.Phase) || !rsv.DeletionTimestamp.IsZero() || rsv.Status.ReservationID == "" {
		return false
	}
	p, ok := podOf(pods, rsv)
	return ok && p.NodeName != "" && !p.Finished()
}

// podGone tells whether the pod rsv was opened for has ended: Succeeded,
// Failed, or deleted. A pod the cache does not show is looked up on the
// API server before it is taken for deleted (the cache may lag behind the
// Reservation that names it). Only a Reservation owned by its pod (the
// scheduler plugin's) is taken as ended when its pod is missing: one made
// by hand may name a pod that does not exist yet; if none comes, its lease
// lapses after its hold time.
func (r *Reconciler) podGone(ctx context.Context, rsv *rbv1.Reservation) (bool, string, error) {
	if rsv.Spec.PodName == "" || r.Pods == nil {
		return false, "", nil
	}
	if p, ok := podOf(r.Pods, rsv); ok {
		if p.Finished() {
			return true, fmt.Sprintf("pod %s %s", rsv.Spec.PodName, p.Phase), nil
		}
		return false, "", nil
	}
	owner := ownerPod(rsv)
	if owner == "" || r.APIReader == nil {
		return false, "", nil
	}
	var pod corev1.Pod
	err := r.APIReader.Get(ctx, types.NamespacedName{Namespace: rsv.Namespace, Name: rsv.Spec.PodName}, &pod)
	switch {
	case apierrors.IsNotFound(err):
		return true, fmt.Sprintf("pod %s deleted", rsv.Spec.PodName), nil
	case err != nil:
		return false, "", err
	case pod.UID != owner:
		return true, fmt.Sprintf("pod %s deleted (another pod has its name)", rsv.Spec.PodName), nil
	case pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed:
		return true, fmt.Sprintf("pod %s %s", rsv.Spec.PodName, pod.Status.Phase), nil
	}
	return false, "", nil
}

// deleteForPod deletes a Reservation whose pod has ended, at once rather
// than when the garbage collector gets to it (or never, for a pod that
// Succeeded and stays): the release finalizer then gives the capacity back
// at the broker within the same second.
func (r *Reconciler) deleteForPod(ctx context.Context, rsv *rbv1.Reservation, why string) error {
	err := r.Client.Delete(ctx, rsv, client.Preconditions{UID: &rsv.UID})
	if apierrors.IsNotFound(err) || apierrors.IsConflict(err) {
		return nil
	}
	if err != nil {
		return err
	}
	log.FromContext(ctx).Info("pod ended: deleting its reservation to release it", "why", why, "phase", rsv.Status.Phase)
	r.Recorder.Eventf(rsv, nil, corev1.EventTypeNormal, "PodEnded", "Release", "%s: releasing the reservation", why)
	return nil
}

// PodTracker watches the cluster's pods, reduced to PodState, in a cache
// of its own: every pod of the cluster, but a few words each (the
// manager's cache would keep whole Pod objects, 1 KiB each before their
// contents, for 30,000 pods tens of MiB). It tells the reconciler when a
// pod with a Reservation ends, and the renewer when one is bound.
type PodTracker struct {
	informer cache.Informer
	store    toolscache.Store
	client   client.Reader // the manager's cache, for the Reservations of a pod

	// OnEnded is told the Reservations of a pod that ended (deleted,
	// Succeeded or Failed); OnBound those of a pod just bound to a node;
	// OnChanged those of a bound pod whose readiness or tracked annotations
	// changed.
	OnEnded, OnBound, OnChanged func(keys []types.NamespacedName)
}

// trackedPod is a pod as the tracker's cache keeps it.
type trackedPod struct {
	metav1.ObjectMeta
	PodState
}

// NewPodTracker creates the tracker's cache and adds it to mgr, which
// starts it with its caches (on every replica) and waits for it to sync
// before it starts the leader's runnables (the renewer).
func NewPodTracker(mgr ctrl.Manager) (*PodTracker, error) {
	scheme := runtime.NewScheme()
	if err := corev1.AddToScheme(scheme); err != nil {
		return nil, err
	}
	cl, err := cluster.New(mgr.GetConfig(), func(o *cluster.Options) {
		o.Scheme = scheme
		o.Logger = mgr.GetLogger().WithName("pods")
		o.HTTPClient = mgr.GetHTTPClient()
		o.MapperProvider = func(*rest.Config, *http.Client) (meta.RESTMapper, error) { return mgr.GetRESTMapper(), nil }
		o.Cache = cache.Options{ByObject: map[client.Object]cache.ByObject{&corev1.Pod{}: {Transform: reducePod}}}
	})
	if err != nil {
		return nil, err
	}
	inf, err := cl.GetCache().GetInformer(context.Background(), &corev1.Pod{}, cache.BlockUntilSynced(false))
	if err != nil {
		return nil, err
	}
	sii, ok := inf.(toolscache.SharedIndexInformer)
	if !ok {
		return nil, fmt.Errorf("pod informer %T has no store", inf)
	}
	t := &PodTracker{informer: inf, store: sii.GetStore(), client: mgr.GetClient()}
	if _, err := inf.AddEventHandler(toolscache.ResourceEventHandlerDetailedFuncs{
		AddFunc: func(obj any, initial bool) {
			if p, ok := obj.(*trackedPod); ok && (p.Finished() || (p.NodeName != "" && !initial)) {
				t.changed(nil, p)
			}
		},
		UpdateFunc: func(old, obj any) {
			o, _ := old.(*trackedPod)
			if p, ok := obj.(*trackedPod); ok {
				t.changed(o, p)
			}
		},
		DeleteFunc: func(obj any) {
			if d, ok := obj.(toolscache.DeletedFinalStateUnknown); ok {
				obj = d.Obj
			}
			if p, ok := obj.(*trackedPod); ok {
				t.notify(p, t.OnEnded)
			}
		},
	}); err != nil {
		return nil, err
	}
	return t, mgr.Add(cl)
}

// reducePod is the tracker cache's transform.
func reducePod(obj any) (any, error) {
	p, ok := obj.(*corev1.Pod)
	if !ok {
		return obj, nil
	}
	var kept map[string]string
	for _, k := range TrackedAnnotations {
		if v, ok := p.Annotations[k]; ok {
			if kept == nil {
				kept = map[string]string{}
			}
			kept[k] = v
		}
	}
	return &trackedPod{
		ObjectMeta: metav1.ObjectMeta{Name: p.Name, Namespace: p.Namespace, UID: p.UID, ResourceVersion: p.ResourceVersion},
		PodState:   PodState{UID: p.UID, NodeName: p.Spec.NodeName, Phase: p.Status.Phase, Ready: PodReady(p), Annotations: kept},
	}, nil
}

// PodReady: the pod's condition Ready is True.
func PodReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// HasSynced: the tracker has listed the cluster's pods.
func (t *PodTracker) HasSynced() bool { return t.informer.HasSynced() }

// Pod implements PodLookup.
func (t *PodTracker) Pod(namespace, name string) (PodState, bool) {
	obj, ok, err := t.store.GetByKey(namespace + "/" + name)
	if err != nil || !ok {
		return PodState{}, false
	}
	p, ok := obj.(*trackedPod)
	if !ok {
		return PodState{}, false
	}
	return p.PodState, true
}

func (t *PodTracker) changed(old, p *trackedPod) {
	switch {
	case p.Finished() && (old == nil || !old.Finished()):
		t.notify(p, t.OnEnded)
	case p.NodeName != "" && (old == nil || old.NodeName == ""):
		t.notify(p, t.OnBound)
	case p.NodeName != "" && old != nil && (old.Ready != p.Ready || !maps.Equal(old.PodState.Annotations, p.PodState.Annotations)):
		t.notify(p, t.OnChanged)
	}
}

// notify tells to f the Reservations opened for p.
func (t *PodTracker) notify(p *trackedPod, f func([]types.NamespacedName)) {
	if f == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var list rbv1.ReservationList
	if err := t.client.List(ctx, &list, client.InNamespace(p.Namespace), client.MatchingFields{PodIndex: p.Namespace + "/" + p.Name},
		client.UnsafeDisableDeepCopy); err != nil || len(list.Items) == 0 {
		return
	}
	keys := make([]types.NamespacedName, 0, len(list.Items))
	for i := range list.Items {
		keys = append(keys, client.ObjectKeyFromObject(&list.Items[i]))
	}
	f(keys)
}
