package virtualkubelet

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestCopyStatus: how each way a copy can end reaches its pod, for each
// restart policy, with and without a live reservation (a new copy possible).
// A pod is Succeeded only when its copy's containers exited 0 on their own
// and the policy ends the pod; a stopped copy is replaced or fails its pod
// with the provider's reason.
func TestCopyStatus(t *testing.T) {
	now := metav1.Now()
	exited := func(code int32, reason string) []corev1.ContainerStatus {
		return []corev1.ContainerStatus{{Name: "main", State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: code, Reason: reason}}}}
	}
	disrupted := func(reason, message string) []corev1.PodCondition {
		return []corev1.PodCondition{{Type: corev1.DisruptionTarget, Status: corev1.ConditionTrue, Reason: reason, Message: message}}
	}
	running := corev1.PodStatus{Phase: corev1.PodRunning,
		Conditions:        []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}},
		ContainerStatuses: []corev1.ContainerStatus{{Name: "main", Ready: true, State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: now}}}}}
	type copyState struct {
		status   corev1.PodStatus
		deleting bool
	}
	with := func(s corev1.PodStatus, phase corev1.PodPhase, reason, message string, cs []corev1.ContainerStatus, conds []corev1.PodCondition) corev1.PodStatus {
		s = *s.DeepCopy()
		s.Phase, s.Reason, s.Message = phase, reason, message
		if cs != nil {
			s.ContainerStatuses = cs
		}
		s.Conditions = append(conds, s.Conditions...)
		return s
	}
	copies := map[string]copyState{
		"running":             {status: running},
		"exited 0":            {status: with(running, corev1.PodSucceeded, "", "", exited(0, "Completed"), nil)},
		"exited 1":            {status: with(running, corev1.PodFailed, "", "", exited(1, "Error"), nil)},
		"past its deadline":   {status: with(running, corev1.PodFailed, reasonDeadlineExceeded, "Pod was active on the node longer than the specified deadline", exited(137, "Error"), nil)},
		"refused by kubelet":  {status: corev1.PodStatus{Phase: corev1.PodFailed, Reason: "OutOfcpu", Message: "Node didn't have enough resource: cpu"}},
		"deleting":            {status: running, deleting: true},
		"deleted, exited 0":   {status: with(running, corev1.PodSucceeded, "", "", exited(0, "Completed"), nil), deleting: true},
		"evicting (API)":      {status: with(running, corev1.PodRunning, "", "", nil, disrupted(disruptionEvictionAPI, "Eviction API: evicting")), deleting: true},
		"evicted (API), 0":    {status: with(running, corev1.PodSucceeded, "", "", exited(0, "Completed"), disrupted(disruptionEvictionAPI, "Eviction API: evicting")), deleting: true},
		"evicted (pressure)":  {status: with(running, corev1.PodFailed, "Evicted", "The node was low on resource: memory.", exited(137, "Error"), disrupted(corev1.PodReasonTerminationByKubelet, "The node was low on resource: memory."))},
		"evicted (taint)":     {status: with(running, corev1.PodSucceeded, "", "", exited(0, "Completed"), disrupted(disruptionTaintManager, "Taint manager: deleting due to NoExecute taint")), deleting: true},
		"preempted, exited 0": {status: with(running, corev1.PodSucceeded, "", "", exited(0, "Completed"), disrupted(corev1.PodReasonPreemptionByScheduler, "default-scheduler: preempting to accommodate a higher priority pod")), deleting: true},
		"preempted (kubelet)": {status: with(running, corev1.PodFailed, kubeletPreempting, "Preempted in order to admit critical pod", exited(137, "Error"), disrupted(corev1.PodReasonTerminationByKubelet, ""))},
	}
	type want struct {
		phase   corev1.PodPhase
		reason  string // status.reason
		ready   string // the Ready condition's reason when the pod is made not ready ("" reflected)
		replace bool
	}
	reflect := func(phase corev1.PodPhase, reason string) want { return want{phase: phase, reason: reason} }
	fail := func(reason string) want { return want{phase: corev1.PodFailed, reason: reason, ready: "PodFailed"} }
	replace := func(reason string) want { return want{phase: corev1.PodRunning, ready: reason, replace: true} }
	waitEnd := func(reason string) want { return want{phase: corev1.PodRunning, ready: reason} }
	// stopped: a new copy while the reservation is live (policy Always or
	// OnFailure), else the pod fails (once the copy is terminal).
	stopped := func(policy corev1.RestartPolicy, live bool, reason string, isTerminal bool) want {
		switch {
		case policy != corev1.RestartPolicyNever && live:
			return replace(reason)
		case isTerminal:
			return fail(reason)
		}
		return waitEnd(reason)
	}
	expect := func(name string, policy corev1.RestartPolicy, live bool) want {
		isTerminal := copies[name].status.Phase == corev1.PodSucceeded || copies[name].status.Phase == corev1.PodFailed
		switch name {
		case "running":
			return reflect(corev1.PodRunning, "")
		case "exited 0":
			if policy == corev1.RestartPolicyAlways {
				return stopped(policy, live, ReasonCopyEnded, true)
			}
			return reflect(corev1.PodSucceeded, "")
		case "exited 1":
			if policy == corev1.RestartPolicyNever {
				return reflect(corev1.PodFailed, "")
			}
			return stopped(policy, live, ReasonCopyEnded, true)
		case "past its deadline":
			return reflect(corev1.PodFailed, reasonDeadlineExceeded)
		case "refused by kubelet":
			if policy == corev1.RestartPolicyNever {
				return reflect(corev1.PodFailed, "OutOfcpu")
			}
			return stopped(policy, live, ReasonCopyEnded, true)
		case "deleting", "deleted, exited 0":
			return stopped(policy, live, ReasonDeletedAtProvider, isTerminal)
		case "preempted, exited 0", "preempted (kubelet)":
			return stopped(policy, live, ReasonPreempted, isTerminal)
		}
		return stopped(policy, live, ReasonEvicted, isTerminal)
	}

	for name, cp := range copies {
		for _, policy := range []corev1.RestartPolicy{corev1.RestartPolicyAlways, corev1.RestartPolicyOnFailure, corev1.RestartPolicyNever} {
			for _, live := range []bool{true, false} {
				t.Run(fmt.Sprintf("%s/%s/live=%v", name, policy, live), func(t *testing.T) {
					local := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "web-0", UID: "uid-local"},
						Spec:   corev1.PodSpec{RestartPolicy: policy, NodeName: "rb-paris"},
						Status: *running.DeepCopy()}
					remote := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "rb-rome", Name: "shop.web-0", UID: "uid-copy"}, Status: *cp.status.DeepCopy()}
					if cp.deleting {
						remote.DeletionTimestamp = &now
					}
					asked := false
					got, replaced := copyStatus(local, remote, "paris", func() bool {
						asked = true
						return policy != corev1.RestartPolicyNever && live
					})
					w := expect(name, policy, live)
					assert.Equal(t, w.phase, got.Status.Phase)
					assert.Equal(t, w.reason, got.Status.Reason)
					assert.Equal(t, w.replace, replaced)
					ready := podCondition(got, corev1.PodReady)
					if w.ready != "" {
						if assert.NotNil(t, ready) {
							assert.Equal(t, corev1.ConditionFalse, ready.Status)
							assert.Equal(t, w.ready, ready.Reason)
						}
						for _, c := range got.Status.ContainerStatuses {
							assert.False(t, c.Ready, "container %s", c.Name)
						}
						assert.NotContains(t, got.Status.Message, "rb-rome", "the provider's names are not shown")
					} else {
						assert.False(t, asked, "a copy that ended on its own, or runs, is not replaced")
					}
					if w.replace {
						assert.Nil(t, podCondition(got, corev1.DisruptionTarget), "the pod is not disrupted, its copy is replaced")
						assert.Contains(t, got.Status.Message, "a new copy is being made")
					}
					if w.phase == corev1.PodFailed && w.ready == "PodFailed" {
						assert.Contains(t, got.Status.Message, "on paris")
					}
					assert.Equal(t, "uid-local", string(got.UID))
				})
			}
		}
	}

	t.Run("a pod deleted here shows what its copy shows, as a kubelet does", func(t *testing.T) {
		local := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "web-0", UID: "uid-local", DeletionTimestamp: &now},
			Spec: corev1.PodSpec{RestartPolicy: corev1.RestartPolicyAlways}, Status: *running.DeepCopy()}
		remote := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "rb-rome", Name: "shop.web-0", DeletionTimestamp: &now},
			Status: copies["deleted, exited 0"].status}
		got, replaced := copyStatus(local, remote, "paris", func() bool { t.Fatal("not asked"); return false })
		assert.Equal(t, corev1.PodSucceeded, got.Status.Phase)
		assert.False(t, replaced)
	})

	t.Run("a pod Pending when its copy is stopped stays Pending", func(t *testing.T) {
		local := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "web-0"},
			Spec: corev1.PodSpec{RestartPolicy: corev1.RestartPolicyAlways}, Status: corev1.PodStatus{Phase: corev1.PodPending}}
		remote := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "rb-rome", Name: "shop.web-0", DeletionTimestamp: &now},
			Status: copies["evicted (API), 0"].status}
		got, replaced := copyStatus(local, remote, "paris", func() bool { return true })
		assert.Equal(t, corev1.PodPending, got.Status.Phase)
		assert.True(t, replaced)
	})

	t.Run("the provider's message, in local names", func(t *testing.T) {
		local := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "web-0", UID: "uid-local"},
			Spec: corev1.PodSpec{RestartPolicy: corev1.RestartPolicyNever}, Status: *running.DeepCopy()}
		remote := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "rb-rome", Name: "shop.web-0", UID: "uid-copy", DeletionTimestamp: &now},
			Status: with(running, corev1.PodSucceeded, "", "", exited(0, "Completed"), disrupted(corev1.PodReasonPreemptionByScheduler, "rb-rome/shop.web-0 preempted"))}
		got, _ := copyStatus(local, remote, "paris", func() bool { return false })
		assert.Equal(t, "the copy of this pod was preempted on paris: shop/web-0 preempted", got.Status.Message)
		assert.Equal(t, int32(0), got.Status.ContainerStatuses[0].State.Terminated.ExitCode, "the container's own end is kept")
		if c := podCondition(got, corev1.DisruptionTarget); assert.NotNil(t, c, "a pod that fails by its copy's disruption says so, as a kubelet's would") {
			assert.Equal(t, corev1.PodReasonPreemptionByScheduler, c.Reason)
		}
	})
}
