package virtualkubelet

import (
	"fmt"
	"slices"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

// How a copy's end reaches its pod. A kubelet reports a pod it stops
// (deleted, evicted, preempted) Succeeded when its containers exit 0 on
// SIGTERM, and a pod's terminal phase is final: reflected blindly, such a
// copy left its pod Succeeded for good, so a Job counted a completion for
// work that was killed and a Deployment's pod was never replaced. So a
// copy's terminal phase reaches its pod only when the copy completed on
// its own and the pod's restart policy lets it end; a copy the provider
// stopped is made anew (restart policy Always or OnFailure, while the
// reservation is live) or fails its pod with the provider's reason.

// Reasons of a pod whose copy the provider stopped: the pod's status.reason
// when it fails, its Ready condition's while a new copy is made.
const (
	ReasonEvicted           = "Evicted"
	ReasonPreempted         = "Preempted"
	ReasonDeletedAtProvider = "DeletedAtProvider"
	// ReasonCopyEnded: the copy ended without completing in a way the
	// pod's restart policy allows (an Always pod's copy Succeeded, a copy
	// its kubelet refused), the provider's own reason unknown.
	ReasonCopyEnded = "ProviderPodEnded"
)

var stoppedReasons = map[string]bool{ReasonEvicted: true, ReasonPreempted: true, ReasonDeletedAtProvider: true, ReasonCopyEnded: true}

// DisruptionTarget reasons that have no constant in k8s.io/api.
const (
	disruptionEvictionAPI  = "EvictionByEvictionAPI"
	disruptionTaintManager = "DeletionByTaintManager"
	// The kubelet's status.reason of a pod it preempts for a critical pod.
	kubeletPreempting = "Preempting"
	// The kubelet's status.reason of a pod that ran past activeDeadlineSeconds.
	reasonDeadlineExceeded = "DeadlineExceeded"
)

// copyEnd is how a copy ended, or is ending.
type copyEnd struct {
	// stopped: the provider stopped the copy, or it ended in a way its
	// pod's restart policy does not end a pod; reason and message say how.
	stopped         bool
	reason, message string
}

// endOf tells whether remote, the copy of local, is stopped or ending
// without having completed: being deleted, evicted or preempted (whatever
// phase its kubelet gives it), or in a terminal phase that local's restart
// policy does not let a pod reach on its own.
func endOf(local, remote *corev1.Pod, provider string) copyEnd {
	loc := localizer(local, remote)
	detail := func(msgs ...string) string {
		for _, m := range msgs {
			if m != "" {
				return ": " + loc.Replace(m)
			}
		}
		return ""
	}
	if c := podCondition(remote, corev1.DisruptionTarget); c != nil && c.Status == corev1.ConditionTrue {
		switch {
		case c.Reason == corev1.PodReasonPreemptionByScheduler || remote.Status.Reason == kubeletPreempting:
			return copyEnd{true, ReasonPreempted, fmt.Sprintf("the copy of this pod was preempted on %s%s", provider, detail(c.Message, remote.Status.Message))}
		case c.Reason == corev1.PodReasonTerminationByKubelet || c.Reason == disruptionEvictionAPI || c.Reason == disruptionTaintManager:
			return copyEnd{true, ReasonEvicted, fmt.Sprintf("the copy of this pod was evicted on %s%s", provider, detail(remote.Status.Message, c.Message))}
		}
		return copyEnd{true, ReasonDeletedAtProvider, fmt.Sprintf("the copy of this pod was deleted on %s%s", provider, detail(c.Message))}
	}
	switch remote.Status.Reason {
	case ReasonEvicted:
		return copyEnd{true, ReasonEvicted, fmt.Sprintf("the copy of this pod was evicted on %s%s", provider, detail(remote.Status.Message))}
	case kubeletPreempting:
		return copyEnd{true, ReasonPreempted, fmt.Sprintf("the copy of this pod was preempted on %s%s", provider, detail(remote.Status.Message))}
	}
	if remote.DeletionTimestamp != nil {
		return copyEnd{true, ReasonDeletedAtProvider, fmt.Sprintf("the copy of this pod was deleted on %s", provider)}
	}
	if terminal(remote) && !endsPod(local, remote) {
		return copyEnd{true, ReasonCopyEnded, fmt.Sprintf("the copy of this pod ended on %s without completing (%s%s)",
			provider, remote.Status.Phase, detail(remote.Status.Reason))}
	}
	return copyEnd{}
}

// endsPod: the copy's terminal phase, reached on its own, is one local's
// restart policy ends a pod in. Never: any. OnFailure: Succeeded once every
// container exited 0. Always: none; of either, Failed past the pod's
// activeDeadlineSeconds (a new copy would start its deadline anew).
func endsPod(local, remote *corev1.Pod) bool {
	if remote.Status.Phase == corev1.PodFailed && remote.Status.Reason == reasonDeadlineExceeded {
		return true
	}
	switch local.Spec.RestartPolicy {
	case corev1.RestartPolicyNever:
		return true
	case corev1.RestartPolicyOnFailure:
		return remote.Status.Phase == corev1.PodSucceeded && len(remote.Status.ContainerStatuses) > 0 &&
			!slices.ContainsFunc(remote.Status.ContainerStatuses, func(c corev1.ContainerStatus) bool {
				return c.State.Terminated == nil || c.State.Terminated.ExitCode != 0
			})
	}
	return false
}

func terminal(p *corev1.Pod) bool {
	return p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed
}

// copyStatus is local's status for its copy remote, and whether the copy
// is to be replaced by a new one once it is gone (the caller deletes a
// terminal copy that is not being deleted). replaceable tells whether a new
// copy may be made (local's restart policy is not Never and its reservation
// is live); it is asked only of a stopped copy.
//   - A pod being deleted here shows what its copy shows, as a kubelet does.
//   - A copy running, or ended the way the pod's policy allows: reflected.
//   - A copy stopped, replaceable: the pod stays in its phase, not ready
//     (the reason on its Ready condition), until the new copy reports.
//   - A copy stopped, not replaceable: the pod is not ready until the copy
//     is terminal, then Failed with the reason; never Succeeded.
func copyStatus(local, remote *corev1.Pod, provider string, replaceable func() bool) (out *corev1.Pod, replace bool) {
	out = localStatus(local, remote, provider)
	if local.DeletionTimestamp != nil {
		return out, false
	}
	end := endOf(local, remote, provider)
	switch {
	case !end.stopped:
		return out, false
	case replaceable():
		return replacingStatus(out, local, end), true
	case terminal(remote):
		return failedStatus(out, end.reason, end.message), false
	}
	s := &out.Status
	s.Phase = activePhase(local)
	s.Reason, s.Message = "", end.message
	notReady(s, end.reason, end.message)
	return out, false
}

// replacingStatus is pod (local with its copy's status) while the copy,
// ended as end says, is replaced: local's phase, not ready, without the
// copy's DisruptionTarget (the pod is not disrupted, only its copy).
func replacingStatus(pod, local *corev1.Pod, end copyEnd) *corev1.Pod {
	out := pod.DeepCopy()
	s := &out.Status
	s.Phase = activePhase(local)
	s.Reason, s.Message = "", end.message+"; a new copy is being made"
	s.Conditions = slices.DeleteFunc(s.Conditions, func(c corev1.PodCondition) bool { return c.Type == corev1.DisruptionTarget })
	notReady(s, end.reason, s.Message)
	return out
}

// activePhase is local's phase while its copy is stopped and not terminal
// yet, or replaced: never a terminal one (final), which the copy has not
// reached on its own.
func activePhase(local *corev1.Pod) corev1.PodPhase {
	if local.Status.Phase == corev1.PodRunning {
		return corev1.PodRunning
	}
	return corev1.PodPending
}

// notReady marks the pod and its containers not ready.
func notReady(s *corev1.PodStatus, reason, message string) {
	now := metav1.Now()
	for _, t := range []corev1.PodConditionType{corev1.PodReady, corev1.ContainersReady} {
		c := corev1.PodCondition{Type: t, Status: corev1.ConditionFalse, Reason: reason, Message: message, LastTransitionTime: now}
		if i := slices.IndexFunc(s.Conditions, func(c corev1.PodCondition) bool { return c.Type == t }); i >= 0 {
			if s.Conditions[i].Status == corev1.ConditionFalse {
				c.LastTransitionTime = s.Conditions[i].LastTransitionTime
			}
			s.Conditions[i] = c
		} else {
			s.Conditions = append(s.Conditions, c)
		}
	}
	for _, cs := range [][]corev1.ContainerStatus{s.ContainerStatuses, s.InitContainerStatuses} {
		for i := range cs {
			cs[i].Ready = false
		}
	}
}

// failedStatus is pod marked Failed with reason and message: containers
// that have not terminated are shown terminated (exit code 137, as killed),
// the pod and its containers not ready.
func failedStatus(pod *corev1.Pod, reason, message string) *corev1.Pod {
	out := pod.DeepCopy()
	now := metav1.Now()
	s := &out.Status
	s.Phase, s.Reason, s.Message = corev1.PodFailed, reason, message
	terminate := func(cs []corev1.ContainerStatus) {
		for i := range cs {
			if cs[i].State.Terminated != nil {
				continue
			}
			started := now
			if cs[i].State.Running != nil {
				started = cs[i].State.Running.StartedAt
			}
			cs[i].State = corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{
				ExitCode: 137, Reason: reason, Message: message, StartedAt: started, FinishedAt: now}}
			cs[i].Started = ptr.To(false)
		}
	}
	terminate(s.ContainerStatuses)
	terminate(s.InitContainerStatuses)
	notReady(s, "PodFailed", "")
	return out
}
