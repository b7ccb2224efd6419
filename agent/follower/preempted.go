package follower

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	rbv1 "github.com/fluidos-project/resource-broker/api/v1alpha1"
	"github.com/fluidos-project/resource-broker/broker/api"
)

// ReasonPreempted is the reason of the Events and of the pod status of a
// reservation whose capacity a reservation of higher priority took.
const ReasonPreempted = "Preempted"

// preempted handles the broker's Preempted event for one of this cluster's
// reservations: a Warning Event on it, and its pod, if bound to a virtual
// node, ends Failed (reason Preempted), as a pod evicted by its node, so
// that its owner replaces it and the replacement asks the broker again. The
// provider evicts the copy with its graceful termination (the reservation is
// Released there, tenant reconciler). The reservation itself goes Released
// on its next reconcile.
func (f *Follower) preempted(ctx context.Context, rsv *rbv1.Reservation, e api.Event) error {
	msg := fmt.Sprintf("the broker gave this reservation's capacity on %s to %s, of higher priority", e.Provider, e.PreemptedBy)
	if f.Recorder != nil {
		f.Recorder.Eventf(rsv, nil, corev1.EventTypeWarning, ReasonPreempted, "Preempt", "%s", msg)
	}
	if rsv.Spec.PodName == "" {
		return nil
	}
	reader := f.APIReader
	if reader == nil {
		reader = f.Client
	}
	var pod corev1.Pod
	if err := reader.Get(ctx, client.ObjectKey{Namespace: rsv.Namespace, Name: rsv.Spec.PodName}, &pod); err != nil {
		return client.IgnoreNotFound(err)
	}
	if pod.Spec.NodeName == "" || pod.DeletionTimestamp != nil || pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed {
		return nil // not running on the reservation (yet), or over
	}
	now := metav1.Now()
	pod.Status.Phase = corev1.PodFailed
	pod.Status.Reason, pod.Status.Message = ReasonPreempted, msg
	for i := range pod.Status.Conditions {
		if pod.Status.Conditions[i].Type == corev1.PodReady || pod.Status.Conditions[i].Type == corev1.ContainersReady {
			pod.Status.Conditions[i].Status, pod.Status.Conditions[i].Reason, pod.Status.Conditions[i].LastTransitionTime = corev1.ConditionFalse, ReasonPreempted, now
		}
	}
	pod.Status.Conditions = append(pod.Status.Conditions, corev1.PodCondition{Type: corev1.DisruptionTarget,
		Status: corev1.ConditionTrue, Reason: "PreemptionByScheduler", Message: msg, LastTransitionTime: now})
	if err := f.Client.Status().Update(ctx, &pod); err != nil && !apierrors.IsNotFound(err) {
		return err
	}
	if f.Recorder != nil {
		f.Recorder.Eventf(&pod, nil, corev1.EventTypeWarning, ReasonPreempted, "Preempt", "%s", msg)
	}
	log.FromContext(ctx).Info("reservation preempted: its pod failed", "reservation", rsv.Name, "pod", pod.Name, "by", e.PreemptedBy)
	return nil
}
