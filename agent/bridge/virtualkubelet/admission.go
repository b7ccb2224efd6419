package virtualkubelet

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
	resourcehelper "k8s.io/component-helpers/resource"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/fluidos-project/resource-broker/agent/bridge/internal/rsvstatus"
	rbv1 "github.com/fluidos-project/resource-broker/api/v1alpha1"
)

// PodConditionReserved, on a pod bound to a virtual node, is the bridge's
// admission of the pod, as a kubelet admits the pods bound to its node: True
// (reason Reserved) once a live reservation at the node's provider names the
// pod, and only then is the pod copied to the provider; False (reason
// NotReserved) while none does. A refused pod stays Pending rather than
// Failed: a failed pod is replaced by its controller, and the replacement
// refused again (DaemonSet pods on a kubelet that rejects them churn so).
const PodConditionReserved corev1.PodConditionType = "broker.fluidos.eu/Reserved"

// Reasons of PodConditionReserved, and of the Events that say the same.
const (
	ReasonReserved    = "Reserved"
	ReasonNotReserved = "NotReserved"
)

// accountedResources are what a reservation holds for a pod (the plugin's
// ReservationResources): a pod is admitted only if its reservation covers
// its requests of them.
var accountedResources = []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory, rbv1.ResourceGPU, corev1.ResourceEphemeralStorage}

// admitted tells, from its status alone, that the bridge admitted the pod:
// PodConditionReserved is True, or, without the condition, the pod has a
// status that only a copy gives (it was admitted before the bridge wrote
// the condition). virtual-kubelet's pod controller sees the admitted pods
// only (and the pods being deleted: see handles), so this must not depend
// on anything but the object, and must not turn false once true.
func admitted(p *corev1.Pod) bool {
	if c := podCondition(p, PodConditionReserved); c != nil {
		return c.Status == corev1.ConditionTrue
	}
	return p.Status.StartTime != nil || len(p.Status.ContainerStatuses) > 0
}

// handles is virtual-kubelet's PodEventFilterFunc: its pod controller
// copies, updates and deletes the admitted pods, and finishes the deletion of
// every pod (a refused one, which has no copy, goes at once).
func (h *podHandler) handles(_ context.Context, p *corev1.Pod) bool {
	return p.DeletionTimestamp != nil || admitted(p)
}

// verdict is the admission decision for one pod.
type verdict struct {
	admit       bool
	reservation *rbv1.Reservation
	message     string
}

// decide admits pod to virtual node node of provider if a live reservation
// at provider, among rsvs (the reservations of the pod's namespace), names it
// in spec.podName and covers its requests, and every container requests cpu
// and memory (the provider's tenant quota refuses a copy that does not).
func decide(pod *corev1.Pod, rsvs []rbv1.Reservation, provider, node string) verdict {
	how := fmt.Sprintf("pods on virtual node %s run on capacity the broker reserved for each of them: give the pod "+
		"schedulerName: resource-broker and requests (rb-scheduler reserves them and binds the pod), "+
		"instead of binding it here by hand, with the default scheduler or as a DaemonSet pod", node)
	if missing := missingRequests(pod); missing != "" {
		return verdict{message: fmt.Sprintf("the pod is not run on %s: %s; %s", provider, missing, how)}
	}
	var others []string
	var r *rbv1.Reservation
	for i := range rsvs {
		c := &rsvs[i]
		switch {
		case c.Spec.PodName != pod.Name:
		case c.Status.Provider == provider && rsvstatus.Live(c):
			r = c
		case c.Status.Provider != "" && c.Status.Provider != provider:
			others = append(others, fmt.Sprintf("%s is at provider %s", c.Name, c.Status.Provider))
		default:
			others = append(others, fmt.Sprintf("%s is %s", c.Name, cmp.Or(string(c.Status.Phase), "new")))
		}
	}
	if r == nil {
		msg := fmt.Sprintf("no live broker reservation at %s names this pod, so it is not run there", provider)
		if len(others) > 0 {
			slices.Sort(others)
			msg += " (reservation " + strings.Join(others, "; ") + ")"
		}
		return verdict{message: msg + "; " + how}
	}
	requests := resourcehelper.PodRequests(pod, resourcehelper.PodResourcesOptions{})
	var short []string
	for _, name := range accountedResources {
		if want, ok := requests[name]; ok && want.Cmp(r.Spec.Resources[name]) > 0 {
			short = append(short, fmt.Sprintf("%s=%s", name, want.String()))
		}
	}
	if len(short) > 0 {
		return verdict{reservation: r, message: fmt.Sprintf("reservation %s at %s holds %s, less than the pod requests (%s), so it is not run there",
			r.Name, provider, formatResources(r.Spec.Resources), strings.Join(short, ", "))}
	}
	return verdict{admit: true, reservation: r, message: fmt.Sprintf("reservation %s (broker id %s) at %s holds %s for this pod",
		r.Name, r.Status.ReservationID, provider, formatResources(r.Spec.Resources))}
}

// missingRequests names the containers that request no cpu or no memory
// (as the provider's ResourceQuota admission would: each container must,
// unless the pod sets pod-level requests), "" if none.
func missingRequests(pod *corev1.Pod) string {
	if r := pod.Spec.Resources; r != nil && !r.Requests.Cpu().IsZero() && !r.Requests.Memory().IsZero() {
		return ""
	}
	var parts []string
	for _, c := range slices.Concat(pod.Spec.InitContainers, pod.Spec.Containers) {
		var missing []string
		for _, name := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory} {
			if q, ok := c.Resources.Requests[name]; !ok || q.IsZero() {
				missing = append(missing, string(name))
			}
		}
		if len(missing) > 0 {
			parts = append(parts, fmt.Sprintf("container %s requests no %s", c.Name, strings.Join(missing, " and no ")))
		}
	}
	return strings.Join(parts, ", ")
}

func formatResources(l corev1.ResourceList) string {
	parts := make([]string, 0, len(l))
	for _, name := range slices.Sorted(maps.Keys(l)) {
		q := l[name]
		parts = append(parts, fmt.Sprintf("%s=%s", name, q.String()))
	}
	return strings.Join(parts, ", ")
}

// refusedStatus is the status of a pod the bridge does not admit: Pending,
// reason NotReserved and why, PodConditionReserved False, every container
// Waiting with the same reason (so that kubectl get pod shows NotReserved).
func refusedStatus(pod *corev1.Pod, message string) corev1.PodStatus {
	s := *pod.Status.DeepCopy()
	s.Phase, s.Reason, s.Message = corev1.PodPending, ReasonNotReserved, message
	setCondition(&s, corev1.PodCondition{Type: PodConditionReserved, Status: corev1.ConditionFalse, Reason: ReasonNotReserved, Message: message})
	waiting := func(cs []corev1.Container) []corev1.ContainerStatus {
		out := make([]corev1.ContainerStatus, 0, len(cs))
		for _, c := range cs {
			out = append(out, corev1.ContainerStatus{Name: c.Name, Image: c.Image,
				State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: ReasonNotReserved, Message: message}}})
		}
		return out
	}
	s.InitContainerStatuses, s.ContainerStatuses = waiting(pod.Spec.InitContainers), waiting(pod.Spec.Containers)
	return s
}

// admittedStatus is the status of a pod the bridge admits: Pending (the
// copy's status follows), PodConditionReserved True; what a refusal wrote
// is cleared.
func admittedStatus(pod *corev1.Pod, message string) corev1.PodStatus {
	s := *pod.Status.DeepCopy()
	s.Phase = corev1.PodPending
	if s.Reason == ReasonNotReserved {
		s.Reason, s.Message = "", ""
		s.InitContainerStatuses, s.ContainerStatuses = nil, nil
	}
	setCondition(&s, corev1.PodCondition{Type: PodConditionReserved, Status: corev1.ConditionTrue, Reason: ReasonReserved, Message: message})
	return s
}

// setCondition sets c in s, with a new transition time when its status changes.
func setCondition(s *corev1.PodStatus, c corev1.PodCondition) {
	c.LastTransitionTime = metav1.Now()
	for i := range s.Conditions {
		if s.Conditions[i].Type == c.Type {
			if s.Conditions[i].Status == c.Status {
				c.LastTransitionTime = s.Conditions[i].LastTransitionTime
			}
			s.Conditions[i] = c
			return
		}
	}
	s.Conditions = append(s.Conditions, c)
}

// admission decides, for each pod bound to the node that its status does
// not show admitted, whether to admit it, and writes the verdict on the pod:
// an admitted pod is then handed to virtual-kubelet (handles), a refused one
// is left Pending with one Warning Event. It is level-based: the pods not
// admitted are decided again whenever the provider's reservations change
// (recheck).
type admission struct {
	h     *podHandler
	queue workqueue.TypedRateLimitingInterface[types.NamespacedName]

	mu sync.Mutex
	// refused: the pods refused, by UID, with the message written and
	// their requests (they still count on the node: see refusedResources).
	refused map[types.UID]refusal
}

type refusal struct {
	message  string
	requests corev1.ResourceList
}

// admission starts the pod handler's admission, once.
func (h *podHandler) admission() *admission {
	h.admitOnce.Do(func() {
		h.admit = &admission{h: h, refused: map[types.UID]refusal{},
			queue: workqueue.NewTypedRateLimitingQueueWithConfig(
				workqueue.NewTypedItemExponentialFailureRateLimiter[types.NamespacedName](100*time.Millisecond, 30*time.Second),
				workqueue.TypedRateLimitingQueueConfig[types.NamespacedName]{Name: "rb-admission-" + h.n.provider})}
		h.n.goRun(h.admit.run)
	})
	return h.admit
}

// admissionEvents is the handler of the node's local pods that feeds the
// admission.
func (h *podHandler) admissionEvents() cache.ResourceEventHandler {
	a := h.admission()
	return cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { a.consider(obj.(*corev1.Pod)) },
		UpdateFunc: func(_, obj any) { a.consider(obj.(*corev1.Pod)) },
		DeleteFunc: func(obj any) {
			if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = d.Obj
			}
			if p, ok := obj.(*corev1.Pod); ok {
				a.forget(p.UID)
			}
		},
	}
}

func (a *admission) consider(p *corev1.Pod) {
	if p.DeletionTimestamp != nil || admitted(p) || finished(p) {
		a.forget(p.UID)
		return
	}
	a.queue.Add(types.NamespacedName{Namespace: p.Namespace, Name: p.Name})
}

// recheck decides again on every pod of the node not admitted: the
// provider's reservations changed (the bridge's controller calls it).
func (h *podHandler) recheck() {
	a := h.admission()
	pods, err := h.n.localPods.List(everything)
	if err != nil {
		return
	}
	for _, p := range pods {
		if p.DeletionTimestamp == nil && !admitted(p) && !finished(p) {
			a.queue.Add(types.NamespacedName{Namespace: p.Namespace, Name: p.Name})
		}
	}
}

// forget drops a pod from the refused ones; the node's capacity follows.
func (a *admission) forget(uid types.UID) {
	a.mu.Lock()
	_, was := a.refused[uid]
	delete(a.refused, uid)
	a.mu.Unlock()
	if was {
		a.h.n.b.enqueue(a.h.n.provider)
	}
}

// refusedResources are what the refused pods bound to the node request, and
// how many they are. The node's capacity counts them on top of the
// reservations: the scheduler counts every pod bound to a node, so without
// them a refused pod would take room reserved for another pod.
func (h *podHandler) refusedResources() (corev1.ResourceList, int64) {
	if h == nil { // a node without pods yet (tests build one so)
		return corev1.ResourceList{}, 0
	}
	a := h.admission()
	a.mu.Lock()
	defer a.mu.Unlock()
	sum := corev1.ResourceList{}
	for _, r := range a.refused {
		addResources(sum, r.requests)
	}
	return sum, int64(len(a.refused))
}

func (a *admission) run() {
	ctx := a.h.n.ctx
	go func() {
		<-ctx.Done()
		a.queue.ShutDown()
	}()
	for {
		key, quit := a.queue.Get()
		if quit {
			return
		}
		if err := a.sync(ctx, key); err != nil && ctx.Err() == nil {
			a.h.n.log.V(1).Info("admission, retrying", "pod", key.String(), "error", err.Error())
			a.queue.AddRateLimited(key)
		} else {
			a.queue.Forget(key)
		}
		a.queue.Done(key)
	}
}

// sync decides on one pod and writes the verdict.
func (a *admission) sync(ctx context.Context, key types.NamespacedName) error {
	n := a.h.n
	pod, err := n.localPods.Pods(key.Namespace).Get(key.Name)
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return err
	}
	if pod.DeletionTimestamp != nil || admitted(pod) || finished(pod) {
		a.forget(pod.UID)
		return nil
	}
	var list rbv1.ReservationList
	if err := n.b.client.List(ctx, &list, client.InNamespace(pod.Namespace)); err != nil {
		return err
	}
	v := decide(pod, list.Items, n.provider, n.name)
	if !v.admit && a.hasCopy(pod) {
		// A copy runs already (made before the pod's status said so):
		// the pod is not taken from under it.
		v = verdict{admit: true, message: fmt.Sprintf("a copy of this pod runs at %s", n.provider)}
	}
	pods := n.b.local.CoreV1().Pods(pod.Namespace)
	if v.admit {
		a.mu.Lock()
		_, wasRefused := a.refused[pod.UID]
		a.mu.Unlock()
		wasRefused = wasRefused || pod.Status.Reason == ReasonNotReserved
		updated := pod.DeepCopy()
		updated.Status = admittedStatus(pod, v.message)
		if _, err := pods.UpdateStatus(ctx, updated, metav1.UpdateOptions{FieldManager: FieldManager}); err != nil {
			return client.IgnoreNotFound(err)
		}
		a.forget(pod.UID)
		if wasRefused {
			n.b.recorder.Eventf(pod, nil, corev1.EventTypeNormal, ReasonReserved, "Admit", "Admitted on %s: %s", n.name, v.message)
		}
		n.log.V(1).Info("pod admitted", "pod", key.String(), "reservation", v.message)
		return nil
	}

	a.mu.Lock()
	was, known := a.refused[pod.UID]
	a.refused[pod.UID] = refusal{message: v.message, requests: resourcehelper.PodRequests(pod, resourcehelper.PodResourcesOptions{})}
	a.mu.Unlock()
	if !known {
		n.b.enqueue(n.provider) // the node's capacity counts it
	}
	cond := podCondition(pod, PodConditionReserved)
	if (known && was.message == v.message) || (cond != nil && cond.Status == corev1.ConditionFalse && cond.Message == v.message && pod.Status.Reason == ReasonNotReserved) {
		return nil // written already (the cache may not show it yet)
	}
	updated := pod.DeepCopy()
	updated.Status = refusedStatus(pod, v.message)
	if _, err := pods.UpdateStatus(ctx, updated, metav1.UpdateOptions{FieldManager: FieldManager}); err != nil {
		a.mu.Lock()
		delete(a.refused, pod.UID) // written again on the retry
		a.mu.Unlock()
		return client.IgnoreNotFound(err)
	}
	// One Event per refusal, not one per decision: a pod refused already
	// (its status says so, whatever this process remembers) gets none.
	if cond == nil || cond.Status != corev1.ConditionFalse {
		n.b.recorder.Eventf(pod, nil, corev1.EventTypeWarning, ReasonNotReserved, "Admit", "%s", v.message)
	}
	n.log.Info("pod not admitted", "pod", key.String(), "reason", v.message)
	return nil
}

// hasCopy: a copy of this very pod is at the provider.
func (a *admission) hasCopy(pod *corev1.Pod) bool {
	rc := a.h.n.currentRemote()
	if rc == nil {
		return false
	}
	remote, ok := rc.pod(pod.Namespace, pod.Name)
	if !ok {
		return false
	}
	_, uid, ok := originOf(remote)
	return ok && uid == pod.UID
}

// holdsNode: the pod keeps its virtual node: it has not finished and was
// admitted (a refused pod does not keep a node whose reservations have all
// ended; once the node is gone, the pod garbage collector deletes it).
func holdsNode(p *corev1.Pod) bool {
	return !finished(p) && (admitted(p) || p.DeletionTimestamp != nil)
}

// addResources adds b to a.
func addResources(a, b corev1.ResourceList) {
	for name, q := range b {
		s, ok := a[name]
		if !ok {
			s = resource.Quantity{Format: q.Format}
		}
		s.Add(q)
		a[name] = s
	}
}
