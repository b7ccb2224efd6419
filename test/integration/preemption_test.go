package integration

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	schedulingv1 "k8s.io/api/scheduling/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	rbv1 "github.com/fluidos-project/resource-broker/api/v1alpha1"
	"github.com/fluidos-project/resource-broker/internal/testbed"
)

// preemptParis holds two 3Gi pods on its one node; rome's node (2Gi) none.
var preemptParis = testbed.ClusterSpec{Name: "paris", Nodes: []corev1.ResourceList{testbed.Resources("2", "8Gi")},
	PriceCPU: "0.02", PriceMemory: "0.003"}

// TestPreemption runs the preemption scenarios on a real-node bed (eviction
// grace 2 s, so that a victim's copy goes quickly).
func TestPreemption(t *testing.T) {
	bed := testbed.Start(t, testbed.Options{RealNodes: true, Clusters: []testbed.ClusterSpec{testbed.RealRome, preemptParis},
		AgentArgs: func(string) []string { return []string{"--eviction-grace=2s"} }})
	runScenarios(t, bed, []scenario{
		{"lowest-priority-victim", func(t *testing.T, bed *testbed.Bed) { testPreemptionVictim(t, bed, "batch", false) }},
		{"disruption-budget", func(t *testing.T, bed *testbed.Bed) { testPreemptionVictim(t, bed, "budget", true) }},
	})
}

// testPreemptionVictim: paris holds a priority-5 and a priority-10
// replica, each of its own Deployment, and nothing else fits. A
// priority-1000 pod fits nowhere: the broker takes exactly the priority-5
// reservation; its pod ends Failed (Preempted), its copy is evicted at
// paris, its ReplicaSet's replacement comes back Pending, waiting (it may
// not preempt the priority-10 one, nor the urgent one); the urgent pod runs
// on paris; the priority-10 replica runs on, untouched. With budget, a
// PodDisruptionBudget (minAvailable 1) covers the priority-5 replica, which
// rome's agent reports to the broker: the priority-10 one is taken instead.
func testPreemptionVictim(t *testing.T, bed *testbed.Bed, ns string, budget bool) {
	ctx := context.Background()
	rome := bed.Cluster("rome")
	baseline(t, bed)
	newNamespace(t, rome, ns)
	for name, value := range map[string]int32{"rb-test-low": 5, "rb-test-mid": 10, "rb-test-urgent": 1000} {
		pc := &schedulingv1.PriorityClass{ObjectMeta: metav1.ObjectMeta{Name: name}, Value: value}
		require.NoError(t, rome.Client.Create(ctx, pc))
		t.Cleanup(func() { _ = rome.Client.Delete(context.Background(), pc) })
	}
	deployment := func(name, class string) *appsv1.Deployment {
		labels := map[string]string{"app": name}
		tmpl := brokerPod(ns, "", requests("250m", "3Gi"))
		tmpl.Spec.PriorityClassName = class
		return &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
			Spec: appsv1.DeploymentSpec{Replicas: ptr.To[int32](1), Selector: &metav1.LabelSelector{MatchLabels: labels},
				Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels}, Spec: tmpl.Spec}}}
	}
	podsOf := func(app string) []corev1.Pod {
		var pods corev1.PodList
		require.NoError(t, rome.Client.List(ctx, &pods, client.InNamespace(ns), client.MatchingLabels{"app": app}))
		return pods.Items
	}
	runningOne := func(app string) corev1.Pod {
		var got corev1.Pod
		eventually(t, 120*time.Second, app+" running", func() (bool, string) {
			for _, p := range podsOf(app) {
				if p.Status.Phase == corev1.PodRunning {
					got = p
					return true, ""
				}
			}
			return false, fmt.Sprintf("%d pods", len(podsOf(app)))
		})
		return got
	}
	require.NoError(t, rome.Client.Create(ctx, deployment("low", "rb-test-low")))
	low := runningOne("low")
	require.NoError(t, rome.Client.Create(ctx, deployment("mid", "rb-test-mid")))
	mid := runningOne("mid")
	if budget {
		pdb := &policyv1.PodDisruptionBudget{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "low"},
			Spec: policyv1.PodDisruptionBudgetSpec{MinAvailable: ptr.To(intstr.FromInt32(1)),
				Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "low"}}}}
		require.NoError(t, rome.Client.Create(ctx, pdb))
		var rsvs rbv1.ReservationList
		require.NoError(t, rome.Client.List(ctx, &rsvs, client.InNamespace(ns)))
		var lowID string
		for _, r := range rsvs.Items {
			if r.Spec.PodName == low.Name {
				lowID = string(r.UID)
			}
		}
		require.NotEmpty(t, lowID)
		eventually(t, 30*time.Second, "rome's agent reports the low replica protected", func() (bool, string) {
			ids, err := bed.RDB.SMembers(ctx, bed.Store.Key("protected:rome")).Result()
			return err == nil && slices.Contains(ids, lowID), fmt.Sprint(ids, err)
		})
		low, mid = mid, low // the victim is the priority-10 replica, the priority-5 one is spared
	}

	urgent := brokerPod(ns, "urgent", requests("250m", "3Gi"))
	urgent.Spec.PriorityClassName = "rb-test-urgent"
	require.NoError(t, rome.Client.Create(ctx, urgent))
	waitRunning(t, rome, urgent)

	// The victim: exactly the lowest-priority pod not protected, Failed with the reason.
	var victim corev1.Pod
	require.NoError(t, rome.Client.Get(ctx, client.ObjectKeyFromObject(&low), &victim))
	assert.Equal(t, corev1.PodFailed, victim.Status.Phase)
	assert.Equal(t, "Preempted", victim.Status.Reason)
	assert.Contains(t, victim.Status.Message, "rome/")
	var still corev1.Pod
	require.NoError(t, rome.Client.Get(ctx, client.ObjectKeyFromObject(&mid), &still))
	assert.Equal(t, corev1.PodRunning, still.Status.Phase, "the other replica is spared")

	// Its replacement asks again and waits: nothing lower to preempt.
	victimApp := victim.Labels["app"]
	eventually(t, 60*time.Second, "the victim's replacement Pending, waiting for capacity", func() (bool, string) {
		for _, p := range podsOf(victimApp) {
			if p.Name == low.Name {
				continue
			}
			var list rbv1.ReservationList
			require.NoError(t, rome.Client.List(ctx, &list, client.InNamespace(ns)))
			for _, r := range list.Items {
				if r.Spec.PodName == p.Name {
					return p.Spec.NodeName == "" && waiting(&r), fmt.Sprintf("%s: node %q, reservation %s %s", p.Name, p.Spec.NodeName, r.Status.Phase, r.Status.Reason)
				}
			}
			return false, p.Name + ": no reservation yet"
		}
		return false, "no replacement yet"
	})

	// The audit names the victim and why.
	entries, err := bed.Audit(ctx)
	require.NoError(t, err)
	var preempted []map[string]string
	for _, a := range entries {
		if a.Fields["outcome"] == "preempted" {
			preempted = append(preempted, a.Fields)
		}
	}
	require.NotEmpty(t, preempted)
	last := preempted[len(preempted)-1]
	victimPriority, sparedPriority := `"priority":5`, `"priority":10`
	if budget {
		victimPriority, sparedPriority = sparedPriority, victimPriority
	}
	assert.Contains(t, last["victims"], victimPriority)
	assert.NotContains(t, last["victims"], sparedPriority)
	assert.Contains(t, last["reason"], "took 1 reservation(s) of priority below 1000 on paris")
	eventually(t, 30*time.Second, "the invariants", func() (bool, string) {
		err := bed.Store.CheckInvariant(ctx)
		return err == nil, fmt.Sprint(err)
	})
}
