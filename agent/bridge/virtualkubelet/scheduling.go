package virtualkubelet

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/fluidos-project/resource-broker/agent/bridge/internal/rsvstatus"
	rbv1 "github.com/fluidos-project/resource-broker/api/v1alpha1"
)

// ConditionProviderScheduled, on a Reservation, says whether the provider's
// scheduler has placed the copy of the reservation's pod: False (reason
// Unschedulable, the provider scheduler's message) once it has not for
// Config.UnschedulableAfter, True again once it has.
const ConditionProviderScheduled = "ProviderScheduled"

// Event reasons on the local pod.
const (
	EventProviderUnschedulable = "ProviderUnschedulable"
	EventProviderScheduled     = "ProviderScheduled"
)

// reservationOf is the live reservation at this node's provider that the pod
// was opened with: the one naming it in spec.podName (set by the plugin and
// by hand alike); nil if none is known.
func (n *providerNode) reservationOf(ctx context.Context, pod *corev1.Pod) *rbv1.Reservation {
	var list rbv1.ReservationList
	if err := n.b.client.List(ctx, &list, client.InNamespace(pod.Namespace)); err != nil {
		n.log.V(1).Info("reservations of a pod", "pod", pod.Namespace+"/"+pod.Name, "error", err.Error())
		return nil
	}
	for i := range list.Items {
		if r := &list.Items[i]; r.Spec.PodName == pod.Name && r.Status.Provider == n.provider && rsvstatus.Live(r) {
			return r
		}
	}
	return nil
}

// watchScheduling follows whether the provider's scheduler places a copy.
// A copy Unschedulable since longer than UnschedulableAfter is reported on
// its pod (a Warning Event) and its reservation (ProviderScheduled=False),
// instead of leaving the pod silently Pending; a copy placed after such a
// report clears it. The copy's status only changes when the provider's
// scheduler changes its condition, so the report is due on a timer.
func (h *podHandler) watchScheduling(local, remote *corev1.Pod) {
	cond := podCondition(remote, corev1.PodScheduled)
	if cond == nil {
		return
	}
	id := remote.UID
	h.mu.Lock()
	defer h.mu.Unlock()
	switch {
	case cond.Status == corev1.ConditionFalse && cond.Reason == corev1.PodReasonUnschedulable:
		if _, ok := h.unscheduled[id]; ok {
			return
		}
		h.unscheduled[id] = false
		key := types.NamespacedName{Namespace: local.Namespace, Name: local.Name}
		wait := time.Until(cond.LastTransitionTime.Add(h.n.b.cfg.UnschedulableAfter))
		time.AfterFunc(max(wait, 0), func() { h.reportUnschedulable(key, remote.Name, id) })
	case cond.Status == corev1.ConditionTrue:
		reported, ok := h.unscheduled[id]
		delete(h.unscheduled, id)
		if ok && reported {
			go h.report(local, remote.Name, corev1.EventTypeNormal, EventProviderScheduled, metav1.Condition{
				Type: ConditionProviderScheduled, Status: metav1.ConditionTrue, Reason: "Scheduled",
				Message: fmt.Sprintf("%s placed the copy %s on node %s", h.n.provider, remote.Name, remote.Spec.NodeName)})
		}
	}
}

// reportUnschedulable reports the copy if it is still unplaced.
func (h *podHandler) reportUnschedulable(key types.NamespacedName, remoteName string, id types.UID) {
	rc := h.n.currentRemote()
	if rc == nil || h.n.ctx.Err() != nil {
		return
	}
	remote, err := rc.pods.Get(remoteName)
	if err != nil || remote.UID != id {
		h.forget(id)
		return
	}
	cond := podCondition(remote, corev1.PodScheduled)
	if cond == nil || cond.Status != corev1.ConditionFalse {
		h.forget(id)
		return
	}
	local, err := h.n.localPods.Pods(key.Namespace).Get(key.Name)
	if err != nil {
		h.forget(id)
		return
	}
	h.mu.Lock()
	if _, ok := h.unscheduled[id]; ok {
		h.unscheduled[id] = true
	}
	h.mu.Unlock()
	h.report(local, remoteName, corev1.EventTypeWarning, EventProviderUnschedulable, metav1.Condition{
		Type: ConditionProviderScheduled, Status: metav1.ConditionFalse, Reason: corev1.PodReasonUnschedulable,
		Message: fmt.Sprintf("%s's scheduler has not placed the copy %s for %s: %s", h.n.provider, remoteName,
			time.Since(cond.LastTransitionTime.Time).Round(time.Second), cond.Message)})
}

func (h *podHandler) forget(id types.UID) {
	h.mu.Lock()
	delete(h.unscheduled, id)
	h.mu.Unlock()
}

// report records an Event on the pod and the condition on its reservation.
func (h *podHandler) report(local *corev1.Pod, remoteName, eventType, reason string, cond metav1.Condition) {
	h.n.b.recorder.Eventf(local, nil, eventType, reason, "Schedule", "%s", cond.Message)
	ctx, cancel := context.WithTimeout(h.n.ctx, 10*time.Second)
	defer cancel()
	if r := h.n.reservationOf(ctx, local); r != nil {
		if err := rsvstatus.Report(ctx, h.n.b.client, r, cond, false); err != nil {
			h.n.log.Info("could not write the reservation's condition", "reservation", r.Namespace+"/"+r.Name,
				"condition", cond.Type, "error", err.Error())
		}
	}
	h.n.log.Info("copy scheduling", "pod", local.Namespace+"/"+local.Name, "copy", remoteName, "reason", reason)
}

func podCondition(p *corev1.Pod, t corev1.PodConditionType) *corev1.PodCondition {
	for i := range p.Status.Conditions {
		if p.Status.Conditions[i].Type == t {
			return &p.Status.Conditions[i]
		}
	}
	return nil
}
