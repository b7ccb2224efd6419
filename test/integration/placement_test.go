package integration

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/fluidos-project/resource-broker/agent/bridge/virtualkubelet"
	rbv1 "github.com/fluidos-project/resource-broker/api/v1alpha1"
	"github.com/fluidos-project/resource-broker/internal/testbed"
)

// placementParis has three 1-CPU nodes: the shape that per-node fit is
// about. The scenarios' pods ask for 3Gi, which rome's one node (2Gi) cannot
// hold and each paris node (4Gi) can.
var placementParis = testbed.ClusterSpec{Name: "paris", Nodes: []corev1.ResourceList{
	testbed.Resources("1", "4Gi"), testbed.Resources("1", "4Gi"), testbed.Resources("1", "4Gi")},
	PriceCPU: "0.02", PriceMemory: "0.003", Labels: map[string]string{"region": "eu-west"}}

// TestPlacement runs the placement scenarios on one real-node bed: rome (one
// 1-CPU node) and paris (three 1-CPU nodes).
func TestPlacement(t *testing.T) {
	bed := testbed.Start(t, testbed.Options{RealNodes: true, Clusters: []testbed.ClusterSpec{testbed.RealRome, placementParis},
		AgentArgs: func(cluster string) []string {
			return []string{"--provider-unschedulable-after=3s"}
		}})
	runScenarios(t, bed, []scenario{
		{"clean-mirror", testPlacementCleanMirror},
		{"provider-unschedulable", testPlacementProviderUnschedulable},
		{"per-node-fit", testPlacementPerNodeFit},
		{"not-offloaded", testPlacementNotOffloaded},
	})
}

// runningPod creates pod in rome and waits until it is Running there.
func runningPod(t *testing.T, rome *testbed.Cluster, pod *corev1.Pod) *corev1.Pod {
	require.NoError(t, rome.Client.Create(context.Background(), pod))
	return waitRunning(t, rome, pod)
}

// waitRunning waits until pod is Running in rome.
func waitRunning(t *testing.T, rome *testbed.Cluster, pod *corev1.Pod) *corev1.Pod {
	ctx := context.Background()
	eventually(t, 120*time.Second, "pod "+pod.Name+" Running", func() (bool, string) {
		require.NoError(t, rome.Client.Get(ctx, client.ObjectKeyFromObject(pod), pod))
		return pod.Status.Phase == corev1.PodRunning, string(pod.Status.Phase) + " " + podCondition(pod)
	})
	return pod
}

// copyOf returns the copy of a rome pod in paris's tenant namespace.
func copyOf(t *testing.T, paris *testbed.Cluster, pod *corev1.Pod) *corev1.Pod {
	var cp corev1.Pod
	require.NoError(t, paris.Client.Get(context.Background(),
		client.ObjectKey{Namespace: "rb-rome", Name: virtualkubelet.RemoteName(pod.Namespace, pod.Name)}, &cp))
	return &cp
}

// testPlacementCleanMirror: the copy at the provider keeps only what belongs
// there. The pod asks for an architecture (a label every provider's nodes
// carry), a label of one of rome's nodes through preferred affinity, and
// tolerates the virtual node's taint; its copy keeps the architecture,
// requests and limits, drops the rest, names no node (paris's scheduler
// chose one of its own), and carries its reservation's id.
func testPlacementCleanMirror(t *testing.T, bed *testbed.Bed) {
	ctx := context.Background()
	rome, paris := bed.Cluster("rome"), bed.Cluster("paris")
	base := baseline(t, bed)
	const ns = "mirror"
	newNamespace(t, rome, ns)
	pod := brokerPod(ns, "clean", requests("500m", "3Gi"))
	pod.Spec.Containers[0].Resources.Limits = requests("500m", "3Gi")
	pod.Spec.NodeSelector = map[string]string{corev1.LabelArchStable: "amd64"}
	pod.Spec.Affinity = &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{PreferredDuringSchedulingIgnoredDuringExecution: []corev1.PreferredSchedulingTerm{
		{Weight: 1, Preference: corev1.NodeSelectorTerm{MatchExpressions: []corev1.NodeSelectorRequirement{
			{Key: corev1.LabelHostname, Operator: corev1.NodeSelectorOpIn, Values: []string{"rome-node-1"}}}}}}}}
	pod.Spec.Tolerations = []corev1.Toleration{{Key: rbv1.VirtualNodeTaint, Operator: corev1.TolerationOpExists}}
	pod = runningPod(t, rome, pod)
	require.Equal(t, "rb-paris", pod.Spec.NodeName)

	cp := copyOf(t, paris, pod)
	assert.Contains(t, paris.Nodes(), cp.Spec.NodeName, "placed by paris's scheduler on a paris node")
	assert.Equal(t, corev1.DefaultSchedulerName, cp.Spec.SchedulerName, "paris's own scheduler")
	assert.Equal(t, map[string]string{corev1.LabelArchStable: "amd64"}, cp.Spec.NodeSelector)
	// rome's node names mean nothing in paris: rome's preference is gone;
	// the only node term is paris's own hold (the placeholder's node).
	rsvs := reservations(t, rome, ns)
	require.Len(t, rsvs, 1)
	require.NotNil(t, rsvs[0].Status.Placement, "paris held the capacity and said where")
	require.NotNil(t, cp.Spec.Affinity)
	require.NotNil(t, cp.Spec.Affinity.NodeAffinity)
	assert.Empty(t, cp.Spec.Affinity.NodeAffinity.PreferredDuringSchedulingIgnoredDuringExecution, "rome's preference dropped")
	assert.Equal(t, &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchExpressions: []corev1.NodeSelectorRequirement{
		{Key: corev1.LabelHostname, Operator: corev1.NodeSelectorOpIn, Values: []string{rsvs[0].Status.Placement.Node}}}}}},
		cp.Spec.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution, "pinned to the placeholder's node")
	assert.Equal(t, rsvs[0].Status.Placement.Node, cp.Spec.NodeName)
	assert.Equal(t, rbv1.TenantPriorityClass, cp.Spec.PriorityClassName)
	for _, tol := range cp.Spec.Tolerations {
		assert.NotEqual(t, rbv1.VirtualNodeTaint, tol.Key, "no toleration of the virtual node's taint")
	}
	assert.True(t, cp.Spec.Containers[0].Resources.Requests.Cpu().Equal(*pod.Spec.Containers[0].Resources.Requests.Cpu()), "requests kept")
	assert.True(t, cp.Spec.Containers[0].Resources.Limits.Memory().Equal(*pod.Spec.Containers[0].Resources.Limits.Memory()), "limits kept")
	assert.Equal(t, string(rsvs[0].UID), cp.Labels[rbv1.ReservationLabel], "the copy names the reservation it consumes")

	require.NoError(t, rome.Client.Delete(ctx, pod))
	waitPlacementClean(t, bed, ns, base)
}

// testPlacementProviderUnschedulable: paris's nodes are tainted (as for a
// maintenance) so that paris's scheduler cannot place the copy. After the
// agent's --provider-unschedulable-after (3 s here) the pod in rome gets a
// Warning Event and its reservation ProviderScheduled=False with paris's
// scheduler's message; once the taint goes, the copy is placed, the pod
// runs, and the condition turns True.
func testPlacementProviderUnschedulable(t *testing.T, bed *testbed.Bed) {
	ctx := context.Background()
	rome, paris := bed.Cluster("rome"), bed.Cluster("paris")
	base := baseline(t, bed)
	const ns = "unplaced"
	newNamespace(t, rome, ns)
	taint := corev1.Taint{Key: "example.com/maintenance", Value: "true", Effect: corev1.TaintEffectNoSchedule}
	setTaint := func(on bool) {
		for _, name := range paris.Nodes() {
			var n corev1.Node
			require.NoError(t, paris.Client.Get(ctx, client.ObjectKey{Name: name}, &n))
			var taints []corev1.Taint
			for _, tt := range n.Spec.Taints {
				if tt.Key != taint.Key {
					taints = append(taints, tt)
				}
			}
			if on {
				taints = append(taints, taint)
			}
			n.Spec.Taints = taints
			require.NoError(t, paris.Client.Update(ctx, &n))
		}
	}
	setTaint(true)
	defer setTaint(false)

	pod := brokerPod(ns, "stuck", requests("500m", "3Gi"))
	require.NoError(t, rome.Client.Create(ctx, pod))
	created := time.Now()
	eventually(t, 60*time.Second, "the reservation says paris cannot place the copy", func() (bool, string) {
		rsvs := reservations(t, rome, ns)
		if len(rsvs) != 1 {
			return false, fmt.Sprintf("%d reservations", len(rsvs))
		}
		for _, c := range rsvs[0].Status.Conditions {
			if c.Type == virtualkubelet.ConditionProviderScheduled {
				return c.Status == metav1.ConditionFalse && c.Reason == string(corev1.PodReasonUnschedulable) &&
					strings.Contains(c.Message, "untolerated taint"), c.Message
			}
		}
		return false, fmt.Sprintf("phase %s, no %s condition", rsvs[0].Status.Phase, virtualkubelet.ConditionProviderScheduled)
	})
	reported := time.Since(created)
	var events corev1.EventList
	require.NoError(t, rome.Client.List(ctx, &events, client.InNamespace(ns)))
	var warned bool
	for _, e := range events.Items {
		if e.InvolvedObject.Name == pod.Name && e.Reason == virtualkubelet.EventProviderUnschedulable && e.Type == corev1.EventTypeWarning {
			warned = true
			assert.Contains(t, e.Message, "paris")
		}
	}
	assert.True(t, warned, "a Warning Event %s on the pod", virtualkubelet.EventProviderUnschedulable)

	setTaint(false)
	waitRunning(t, rome, pod)
	eventually(t, 30*time.Second, "ProviderScheduled True again", func() (bool, string) {
		rsvs := reservations(t, rome, ns)
		for _, c := range rsvs[0].Status.Conditions {
			if c.Type == virtualkubelet.ConditionProviderScheduled {
				return c.Status == metav1.ConditionTrue, c.Message
			}
		}
		return false, "no condition"
	})
	figure(t, "pod created -> provider cannot place it reported (after 3 s unplaced): %s", reported.Round(100*time.Millisecond))
	require.NoError(t, rome.Client.Delete(ctx, pod))
	waitPlacementClean(t, bed, ns, base)
}

// testPlacementPerNodeFit: paris has 3 CPU free, one on each node. A 3-CPU
// pod is refused by the broker (no single node holds it: the reason
// insufficient_node_fit reaches the pod's condition), and three 1-CPU pods
// are granted and run, one on each paris node. rome's one CPU is taken by a
// local pod first, so that rome is short of CPU and offloads.
func testPlacementPerNodeFit(t *testing.T, bed *testbed.Bed) {
	ctx := context.Background()
	rome, paris := bed.Cluster("rome"), bed.Cluster("paris")
	const ns = "fit"
	newNamespace(t, rome, ns)
	base := baseline(t, bed)
	filler := brokerPod(ns, "filler", requests("1", "64Mi"))
	filler.Spec.SchedulerName = corev1.DefaultSchedulerName
	filler = runningPod(t, rome, filler)
	require.Equal(t, "rome-node-1", filler.Spec.NodeName)

	big := brokerPod(ns, "big", requests("3", "256Mi"))
	require.NoError(t, rome.Client.Create(ctx, big))
	eventually(t, 60*time.Second, "the 3-CPU pod refused: no paris node holds it", func() (bool, string) {
		require.NoError(t, rome.Client.Get(ctx, client.ObjectKeyFromObject(big), big))
		c := podCondition(big)
		return strings.Contains(c, "insufficient_node_fit"), c
	})
	require.NoError(t, rome.Client.Delete(ctx, big))

	var pods []*corev1.Pod
	for i := range 3 {
		pods = append(pods, brokerPod(ns, fmt.Sprintf("small-%d", i), requests("1", "256Mi")))
		require.NoError(t, rome.Client.Create(ctx, pods[i]))
	}
	onNode := map[string]string{}
	for _, p := range pods {
		waitRunning(t, rome, p)
		assert.Equal(t, "rb-paris", p.Spec.NodeName)
		cp := copyOf(t, paris, p)
		assert.Equal(t, corev1.PodRunning, cp.Status.Phase, "the copy runs in a real container at paris")
		onNode[cp.Spec.NodeName] = p.Name
	}
	assert.Len(t, onNode, 3, "one pod on each paris node: %v", onNode)
	require.NoError(t, bed.Store.CheckInvariant(ctx), "per node: debits within what each node has free")

	for _, p := range pods {
		require.NoError(t, rome.Client.Delete(ctx, p))
	}
	require.NoError(t, rome.Client.Delete(ctx, filler))
	waitPlacementClean(t, bed, ns, base)
}

// testPlacementNotOffloaded: a pod that needs rome (a hostPath volume) and
// fits no rome node stays Pending in rome with the reason in its condition
// and a Warning Event NotOffloaded; no reservation is opened.
func testPlacementNotOffloaded(t *testing.T, bed *testbed.Bed) {
	ctx := context.Background()
	rome := bed.Cluster("rome")
	const ns = "local"
	newNamespace(t, rome, ns)
	pod := brokerPod(ns, "hostpath", requests("500m", "3Gi"))
	pod.Spec.Volumes = []corev1.Volume{{Name: "logs", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/var/log"}}}}
	require.NoError(t, rome.Client.Create(ctx, pod))
	eventually(t, 30*time.Second, "Pending with the reason it is not offloaded", func() (bool, string) {
		require.NoError(t, rome.Client.Get(ctx, client.ObjectKeyFromObject(pod), pod))
		c := podCondition(pod)
		return strings.Contains(c, "not offloaded: uses hostPath /var/log"), c
	})
	eventually(t, 30*time.Second, "a Warning Event NotOffloaded", func() (bool, string) {
		var events corev1.EventList
		require.NoError(t, rome.Client.List(ctx, &events, client.InNamespace(ns)))
		for _, e := range events.Items {
			if e.InvolvedObject.Name == pod.Name && e.Reason == "NotOffloaded" && e.Type == corev1.EventTypeWarning {
				return strings.Contains(e.Message, "hostPath"), e.Message
			}
		}
		return false, fmt.Sprintf("%d events", len(events.Items))
	})
	assert.Empty(t, reservations(t, rome, ns), "no reservation for a pod that cannot leave rome")
	assert.Equal(t, corev1.PodPending, pod.Status.Phase)
	require.NoError(t, rome.Client.Delete(ctx, pod))
}

// waitPlacementClean waits until ns has no pod and no reservation and the
// broker is back at base.
func waitPlacementClean(t *testing.T, bed *testbed.Bed, ns string, base testbed.Capacity) {
	rome := bed.Cluster("rome")
	eventually(t, 60*time.Second, "no pod and no Reservation left in "+ns, func() (bool, string) {
		var left corev1.PodList
		require.NoError(t, rome.Client.List(context.Background(), &left, client.InNamespace(ns)))
		n := len(reservations(t, rome, ns))
		return len(left.Items) == 0 && n == 0, fmt.Sprintf("%d pods, %d reservations", len(left.Items), n)
	})
	waitNoLive(t, bed, 30*time.Second)
	backToBaseline(t, bed, base, 30*time.Second)
}
