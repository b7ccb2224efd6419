package resourcebroker

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/resourceversion"
	"k8s.io/apimachinery/pkg/util/sets"
	utilfeature "k8s.io/apiserver/pkg/util/feature"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/tools/cache"
	resourcehelper "k8s.io/component-helpers/resource"
	v1helper "k8s.io/component-helpers/scheduling/corev1"
	"k8s.io/klog/v2"
	"k8s.io/kubernetes/pkg/features"
	schedutil "k8s.io/kubernetes/pkg/scheduler/util"
	"k8s.io/utils/ptr"

	brokerv1alpha1 "github.com/fluidos-project/resource-broker/api/v1alpha1"
	"github.com/fluidos-project/resource-broker/plugins/apis/config"
)

// ReservationEventResource is how the scheduler names Reservation events
// (<plural>.<version>.<group>): registering it in EventsToRegister makes
// the scheduler watch Reservations with a dynamic informer and run this
// plugin's queueing hint on every change.
const ReservationEventResource = "reservations.v1alpha1.broker.fluidos.eu"

var reservationGVR = brokerv1alpha1.GroupVersion.WithResource("reservations")

const (
	indexPodUID   = "broker.fluidos.eu/pod-uid"  // controller owner: a Pod's UID
	indexPodName  = "broker.fluidos.eu/pod-name" // <ns>/<spec.podName> of a reservation made by hand
	indexProvider = "broker.fluidos.eu/provider" // status.provider of a usable reservation
)

// reservationCache is the plugin's own informer on Reservations. The
// scheduler's dynamic informer (the one behind the queueing hints) is not
// reachable from a plugin, so this one is what PreFilter, Filter and
// PostFilter read: no API call on the scheduling path.
//
// The scheduler's informer may deliver a change (and run the queueing hint,
// which requeues the pod) before this one does; the hint then records the
// newer object here (ahead), and reads prefer it until this informer has
// caught up, so that the attempt the hint triggered sees what the hint saw.
type reservationCache struct {
	informer cache.SharedIndexInformer

	mu    sync.Mutex
	ahead map[types.UID]aheadEntry
}

type aheadEntry struct {
	rv      string
	obj     *brokerv1alpha1.Reservation // nil: deleted
	expires time.Time
}

// aheadTTL bounds how long an object seen ahead is preferred (if this
// informer never delivers it, e.g. a watch restart skipped it).
const aheadTTL = 30 * time.Second

func newReservationCache(client dynamic.Interface) (*reservationCache, error) {
	inf := dynamicinformer.NewFilteredDynamicInformer(client, reservationGVR, metav1.NamespaceAll, 0, cache.Indexers{
		cache.NamespaceIndex: cache.MetaNamespaceIndexFunc,
		indexPodUID: func(obj any) ([]string, error) {
			if uid := ownerPodUID(obj.(*brokerv1alpha1.Reservation)); uid != "" {
				return []string{string(uid)}, nil
			}
			return nil, nil
		},
		indexPodName: func(obj any) ([]string, error) {
			r := obj.(*brokerv1alpha1.Reservation)
			if r.Spec.PodName != "" && metav1.GetControllerOfNoCopy(r) == nil {
				return []string{r.Namespace + "/" + r.Spec.PodName}, nil
			}
			return nil, nil
		},
		indexProvider: func(obj any) ([]string, error) {
			r := obj.(*brokerv1alpha1.Reservation)
			if usable(r) && r.Status.Provider != "" {
				return []string{r.Status.Provider}, nil
			}
			return nil, nil
		},
	}, nil)
	// Store typed objects: the indexers, the plugin and the tests see
	// *v1alpha1.Reservation, converted once per change.
	if err := inf.Informer().SetTransform(func(obj any) (any, error) {
		if u, ok := obj.(*unstructured.Unstructured); ok {
			r := &brokerv1alpha1.Reservation{}
			if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, r); err != nil {
				return nil, fmt.Errorf("decoding Reservation %s/%s: %w", u.GetNamespace(), u.GetName(), err)
			}
			return r, nil
		}
		return obj, nil
	}); err != nil {
		return nil, err
	}
	return &reservationCache{informer: inf.Informer(), ahead: map[types.UID]aheadEntry{}}, nil
}

// newer compares resourceVersions as the API server allows (apimachinery's
// resourceversion): -1, 0 or 1; ok is false when one is not comparable
// (empty, or not the server's form), and then nothing is preferred.
func newer(a, b string) (int, bool) {
	c, err := resourceversion.CompareResourceVersion(a, b)
	return c, err == nil
}

// observe records r (or its deletion) from a scheduler event when it is
// newer than what this cache holds.
func (c *reservationCache) observe(r *brokerv1alpha1.Reservation, deleted bool) {
	rv := r.ResourceVersion
	if _, ok := newer(rv, rv); !ok || r.UID == "" {
		return
	}
	if obj, exists, err := c.informer.GetIndexer().Get(r); err == nil && exists {
		if cmp, ok := newer(obj.(*brokerv1alpha1.Reservation).ResourceVersion, rv); ok && cmp >= 0 && !deleted {
			return
		}
	} else if deleted {
		return
	}
	entry := aheadEntry{rv: rv, expires: time.Now().Add(aheadTTL)}
	if !deleted {
		entry.obj = r
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	cur, ok := c.ahead[r.UID]
	if cmp, comparable := newer(cur.rv, rv); !ok || (comparable && cmp < 0) || deleted {
		c.ahead[r.UID] = entry
	}
}

// caughtUp is called by this informer's handlers: what it delivered is at
// least as new as what was seen ahead.
func (c *reservationCache) caughtUp(r *brokerv1alpha1.Reservation, deleted bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if cur, ok := c.ahead[r.UID]; ok {
		if cmp, comparable := newer(cur.rv, r.ResourceVersion); deleted || !comparable || cmp <= 0 {
			delete(c.ahead, r.UID)
		}
	}
}

// fresh is r, or the newer version (nil when deleted) seen ahead.
func (c *reservationCache) fresh(r *brokerv1alpha1.Reservation) (*brokerv1alpha1.Reservation, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.ahead) == 0 {
		return r, true
	}
	cur, ok := c.ahead[r.UID]
	if !ok {
		return r, true
	}
	// A deletion carries the last version (or a later one); anything else must be newer.
	if cmp, comparable := newer(cur.rv, r.ResourceVersion); !comparable || cmp < 0 || (cur.obj != nil && cmp == 0) {
		return r, true
	}
	if time.Now().After(cur.expires) {
		delete(c.ahead, r.UID)
		return r, true
	}
	return cur.obj, cur.obj != nil
}

// start runs the informer until ctx ends and waits (at most timeout) for its
// first list, so that a missing CRD or missing RBAC is an error at start-up.
func (c *reservationCache) start(ctx context.Context, timeout time.Duration) error {
	go c.informer.RunWithContext(ctx)
	wctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if !cache.WaitForCacheSync(wctx.Done(), c.informer.HasSynced) {
		return fmt.Errorf("reservations.%s not listed within %s: are the CRDs installed (manifests/crds) and may the scheduler list and watch them (manifests/scheduler)?",
			brokerv1alpha1.GroupVersion.Group, timeout)
	}
	return nil
}

func (c *reservationCache) byIndex(index, key string) []*brokerv1alpha1.Reservation {
	objs, err := c.informer.GetIndexer().ByIndex(index, key)
	if err != nil || len(objs) == 0 {
		return nil
	}
	out := make([]*brokerv1alpha1.Reservation, 0, len(objs))
	for _, o := range objs {
		if r, ok := c.fresh(o.(*brokerv1alpha1.Reservation)); ok {
			out = append(out, r)
		}
	}
	return out
}

// forPod is the reservation that pod may use: the one it controls (made by
// this plugin), else one made by hand naming it in spec.podName. Nil when
// there is none.
func (c *reservationCache) forPod(pod *v1.Pod) *brokerv1alpha1.Reservation {
	if rs := c.byIndex(indexPodUID, string(pod.UID)); len(rs) > 0 {
		return pickReservation(rs)
	}
	if rs := c.byIndex(indexPodName, pod.Namespace+"/"+pod.Name); len(rs) > 0 {
		return pickReservation(rs)
	}
	return nil
}

// pickReservation prefers, among several, one that is usable, then one that
// is not being deleted; ties by name.
func pickReservation(rs []*brokerv1alpha1.Reservation) *brokerv1alpha1.Reservation {
	rank := func(r *brokerv1alpha1.Reservation) int {
		switch {
		case r.DeletionTimestamp != nil:
			return 2
		case usable(r):
			return 0
		default:
			return 1
		}
	}
	best := rs[0]
	for _, r := range rs[1:] {
		if rank(r) < rank(best) || (rank(r) == rank(best) && r.Name < best.Name) {
			best = r
		}
	}
	return best
}

// usable: the broker holds capacity for it on a provider and it is not being deleted.
func usable(r *brokerv1alpha1.Reservation) bool {
	if r == nil || r.DeletionTimestamp != nil {
		return false
	}
	return r.Status.Phase == brokerv1alpha1.ReservationReserved || r.Status.Phase == brokerv1alpha1.ReservationActive
}

// ended: it will never become usable again.
func ended(r *brokerv1alpha1.Reservation) bool {
	if r.DeletionTimestamp != nil {
		return true
	}
	switch r.Status.Phase {
	case brokerv1alpha1.ReservationReleased, brokerv1alpha1.ReservationFailed, brokerv1alpha1.ReservationExpired:
		return true
	}
	return false
}

// waitingCondition is the Reserved=False condition of a reservation that
// is still Pending: the broker refused it for now (its reason, e.g.
// NoCapacity, and message) and the agent keeps asking. Nil otherwise.
func waitingCondition(r *brokerv1alpha1.Reservation) *metav1.Condition {
	if r == nil || r.DeletionTimestamp != nil || (r.Status.Phase != brokerv1alpha1.ReservationPending && r.Status.Phase != "") {
		return nil
	}
	c := meta.FindStatusCondition(r.Status.Conditions, brokerv1alpha1.ConditionReserved)
	if c == nil || c.Status != metav1.ConditionFalse {
		return nil
	}
	return c
}

func ownerPodUID(r *brokerv1alpha1.Reservation) types.UID {
	if ref := metav1.GetControllerOfNoCopy(r); ref != nil && ref.Kind == "Pod" && ref.APIVersion == "v1" {
		return ref.UID
	}
	return ""
}

// toReservation reads a Reservation out of an event object: typed (this
// plugin's cache), unstructured (the scheduler's dynamic informer) or a
// tombstone of either.
func toReservation(obj any) *brokerv1alpha1.Reservation {
	switch o := obj.(type) {
	case *brokerv1alpha1.Reservation:
		return o
	case *unstructured.Unstructured:
		r := &brokerv1alpha1.Reservation{}
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, r); err != nil {
			return nil
		}
		return r
	case cache.DeletedFinalStateUnknown:
		return toReservation(o.Obj)
	}
	return nil
}

// ReservationName is the name of the reservation the plugin makes for pod:
// the pod's name and a hash of its UID, so that it is the same on every
// scheduling attempt and after a scheduler restart (a create that finds it
// already there is success: one reservation per pod), and a pod recreated
// under the same name does not collide with its predecessor's reservation
// while the garbage collector removes that one.
func ReservationName(pod *v1.Pod) string {
	sum := sha256.Sum256([]byte(pod.UID))
	suffix := hex.EncodeToString(sum[:])[:8]
	prefix := pod.Name
	if max := 253 - len(suffix) - 1; len(prefix) > max {
		prefix = strings.TrimRight(prefix[:max], "-.")
	}
	return prefix + "-" + suffix
}

// podLabelValue is the pod's name when it fits in a label value, else a
// shortened form that still ends with a hash of the full name.
func podLabelValue(name string) string {
	if len(name) <= 63 {
		return name
	}
	sum := sha256.Sum256([]byte(name))
	return strings.TrimRight(name[:54], "-._") + "-" + hex.EncodeToString(sum[:])[:8]
}

// PodRequests are the pod's effective requests as the scheduler counts them
// (init containers, restartable init containers i.e. sidecars, overhead,
// pod-level resources when that feature is on).
func PodRequests(pod *v1.Pod) v1.ResourceList {
	return resourcehelper.PodRequests(pod, resourcehelper.PodResourcesOptions{
		SkipPodLevelResources: !utilfeature.DefaultFeatureGate.Enabled(features.PodLevelResources),
	})
}

// ReservationResources sizes a reservation for requests: cpu and memory
// (at least the scheduler's defaults for a container that requests none,
// 100m and 200Mi, since a reservation must be positive), and the GPUs and
// ephemeral storage when requested.
func ReservationResources(requests v1.ResourceList) v1.ResourceList {
	out := v1.ResourceList{}
	cpu := requests.Cpu().DeepCopy()
	if cpu.Sign() <= 0 {
		cpu = *resource.NewMilliQuantity(schedutil.DefaultMilliCPURequest, resource.DecimalSI)
	}
	mem := requests.Memory().DeepCopy()
	if mem.Sign() <= 0 {
		mem = *resource.NewQuantity(schedutil.DefaultMemoryRequest, resource.BinarySI)
	}
	out[v1.ResourceCPU] = cpu
	out[v1.ResourceMemory] = mem
	for _, name := range []v1.ResourceName{brokerv1alpha1.ResourceGPU, v1.ResourceEphemeralStorage} {
		if q, ok := requests[name]; ok && q.Sign() > 0 {
			out[name] = q.DeepCopy()
		}
	}
	return out
}

// newReservation is the Reservation the plugin asks for on behalf of pod,
// from providers whose labels match selector. It names no duration: a
// reservation opened for a pod is a lease, asked for with the agent's lease
// length and hold time and renewed while the pod runs.
func newReservation(pod *v1.Pod, args *config.ResourceBrokerArgs, selector map[string]string) *brokerv1alpha1.Reservation {
	var priority int32
	if pod.Spec.Priority != nil {
		priority = *pod.Spec.Priority
	}
	return &brokerv1alpha1.Reservation{
		TypeMeta: metav1.TypeMeta{APIVersion: brokerv1alpha1.GroupVersion.String(), Kind: "Reservation"},
		ObjectMeta: metav1.ObjectMeta{
			Name:      ReservationName(pod),
			Namespace: pod.Namespace,
			Labels:    map[string]string{brokerv1alpha1.PodLabel: podLabelValue(pod.Name)},
			OwnerReferences: []metav1.OwnerReference{{
				APIVersion:         "v1",
				Kind:               "Pod",
				Name:               pod.Name,
				UID:                pod.UID,
				Controller:         ptr.To(true),
				BlockOwnerDeletion: ptr.To(true),
			}},
		},
		Spec: brokerv1alpha1.ReservationSpec{
			Resources:           ReservationResources(PodRequests(pod)),
			ProviderSelector:    selector,
			ProviderPreferences: providerPreferences(pod),
			Priority:            priority,
			PodName:             pod.Name,
			// A pod that may preempt here may preempt at the broker (its priority above 0).
			PreemptionPolicy: preemptionPolicy(pod),
		},
	}
}

// preemptionPolicy is the pod's preemption policy for its reservation:
// PreemptLowerPriority when the pod has a priority above 0 and may preempt
// (kube-scheduler's default for such a pod), else nil (it waits).
func preemptionPolicy(pod *v1.Pod) *v1.PreemptionPolicy {
	if pod.Spec.Priority == nil || *pod.Spec.Priority <= 0 {
		return nil
	}
	if p := pod.Spec.PreemptionPolicy; p != nil && *p == v1.PreemptNever {
		return nil
	}
	return ptr.To(v1.PreemptLowerPriority)
}

// fitsReservation reports whether requests fit in what is left of the
// reservation's resources after used; it names the first resource short.
func fitsReservation(requests, reserved, used v1.ResourceList) (bool, v1.ResourceName) {
	for _, name := range []v1.ResourceName{v1.ResourceCPU, v1.ResourceMemory, brokerv1alpha1.ResourceGPU, v1.ResourceEphemeralStorage} {
		want, ok := requests[name]
		if !ok || want.Sign() <= 0 {
			continue
		}
		left := reserved[name].DeepCopy()
		if u, ok := used[name]; ok {
			left.Sub(u)
		}
		if want.Cmp(left) > 0 {
			return false, name
		}
	}
	return true, ""
}

// nodeTracker keeps, from the scheduler's Node informer, what PreFilter needs
// in O(1): whether any node is one of our virtual nodes or carries a taint
// that a pod must tolerate.
type nodeTracker struct {
	mu      sync.RWMutex
	virtual map[string]string // node -> provider ("" when only the taint marks it)
	tainted sets.Set[string]  // nodes with a NoSchedule/NoExecute taint other than ours
}

func newNodeTracker() *nodeTracker {
	return &nodeTracker{virtual: map[string]string{}, tainted: sets.New[string]()}
}

func (t *nodeTracker) set(node *v1.Node) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.removeLocked(node.Name)
	if provider, ok := virtualNodeProvider(node); ok {
		t.virtual[node.Name] = provider
	}
	for i := range node.Spec.Taints {
		if hardTaint(&node.Spec.Taints[i]) {
			t.tainted.Insert(node.Name)
			break
		}
	}
}

func (t *nodeTracker) remove(name string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.removeLocked(name)
}

func (t *nodeTracker) removeLocked(name string) {
	delete(t.virtual, name)
	t.tainted.Delete(name)
}

// plain: no virtual node and no tainted node, so the Filter has nothing to
// do for a pod without a reservation.
func (t *nodeTracker) plain() bool {
	t.mu.RLock()
	defer t.mu.RUnlock()
	return len(t.virtual) == 0 && t.tainted.Len() == 0
}

// isVirtual: the tracker knows node as one of our virtual nodes.
func (t *nodeTracker) isVirtual(node string) bool {
	t.mu.RLock()
	defer t.mu.RUnlock()
	_, ok := t.virtual[node]
	return ok
}

// virtualNodeProvider tells whether node is one of our virtual nodes (label
// ProviderLabel, or taint VirtualNodeTaint) and for which provider.
func virtualNodeProvider(node *v1.Node) (string, bool) {
	if p, ok := node.Labels[brokerv1alpha1.ProviderLabel]; ok {
		return p, true
	}
	for i := range node.Spec.Taints {
		if node.Spec.Taints[i].Key == brokerv1alpha1.VirtualNodeTaint {
			return "", true
		}
	}
	return "", false
}

// hardTaint: a taint the TaintToleration filter enforces (NoSchedule,
// NoExecute), except ours, which this plugin handles.
func hardTaint(t *v1.Taint) bool {
	return (t.Effect == v1.TaintEffectNoSchedule || t.Effect == v1.TaintEffectNoExecute) && t.Key != brokerv1alpha1.VirtualNodeTaint
}

// untoleratedTaint is TaintToleration's filter rule for every taint but ours.
func untoleratedTaint(logger klog.Logger, node *v1.Node, pod *v1.Pod, comparisonOperators bool) (v1.Taint, bool) {
	return v1helper.FindMatchingUntoleratedTaint(logger, node.Spec.Taints, pod.Spec.Tolerations, hardTaint, comparisonOperators)
}

// tolerates: the pod tolerates taint (TaintToleration's rule).
func tolerates(logger klog.Logger, pod *v1.Pod, taint *v1.Taint, comparisonOperators bool) bool {
	return v1helper.TolerationsTolerateTaint(logger, pod.Spec.Tolerations, taint, comparisonOperators)
}
