package integration

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"
	schedv1alpha1 "sigs.k8s.io/scheduler-plugins/apis/scheduling/v1alpha1"

	rbv1 "github.com/fluidos-project/resource-broker/api/v1alpha1"
	"github.com/fluidos-project/resource-broker/internal/testbed"
	"github.com/fluidos-project/resource-broker/internal/testimages"
)

// The gang bed: members ask for 3Gi, which rome's node (2Gi) cannot hold and
// each provider node holds twice (8Gi) or four times (14Gi) over.
var (
	gangParis = testbed.ClusterSpec{Name: "paris", Nodes: []corev1.ResourceList{
		testbed.Resources("2", "8Gi"), testbed.Resources("2", "8Gi")}, PriceCPU: "0.02", PriceMemory: "0.003"}
	gangBerlin = testbed.ClusterSpec{Name: "berlin", Nodes: []corev1.ResourceList{
		testbed.Resources("2", "14Gi")}, PriceCPU: "0.035", PriceMemory: "0.004"}
)

// TestGang runs the gang scenarios on a real-node bed whose rb-scheduler
// runs Coscheduling with ResourceBroker (testbed.Options.Gangs).
func TestGang(t *testing.T) {
	bed := testbed.Start(t, testbed.Options{RealNodes: true, Gangs: true,
		Clusters: []testbed.ClusterSpec{testbed.RealRome, gangParis, gangBerlin}})
	runScenarios(t, bed, []scenario{
		{"all-or-nothing", testGangAllOrNothing},
	})
}

// testGangAllOrNothing: a PodGroup of 8 workers (minMember 8) in rome, none
// of which fits there. With room for 6 on the providers (paris's two nodes
// hold 2 each, berlin's node 2 beside berlin's own 7.5Gi workload), the
// broker reserves nothing: every worker stays Pending, unbound, saying that
// only 6 of the 8 fit together, and so do their Reservations. Once berlin's
// workload ends, the 8 land whole (4 on each provider), bound together, and
// run in real containers.
func testGangAllOrNothing(t *testing.T, bed *testbed.Bed) {
	ctx := context.Background()
	rome, berlin := bed.Cluster("rome"), bed.Cluster("berlin")
	baseline(t, bed)
	const ns, group, size = "train", "train", 8

	local := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "local-work"},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "main", Image: testimages.Pause,
			ImagePullPolicy: corev1.PullIfNotPresent, Resources: corev1.ResourceRequirements{Requests: requests("100m", "7500Mi")}}}}}
	require.NoError(t, berlin.Client.Create(ctx, local))
	waitRunning(t, berlin, local)
	eventually(t, 30*time.Second, "berlin advertises its own workload", func() (bool, string) {
		c, err := bed.Store.Cluster(ctx, "berlin")
		if err != nil {
			return false, err.Error()
		}
		return c.Allocated.Memory >= 7500<<20, fmt.Sprintf("allocated %+v", c.Allocated)
	})

	newNamespace(t, rome, ns)
	pg := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": schedv1alpha1.SchemeGroupVersion.String(), "kind": "PodGroup",
		"metadata": map[string]any{"namespace": ns, "name": group},
		"spec":     map[string]any{"minMember": int64(size)},
	}}
	require.NoError(t, rome.Client.Create(ctx, pg))
	names := make([]string, size)
	for i := range names {
		names[i] = fmt.Sprintf("worker-%d", i)
		pod := brokerPod(ns, names[i], requests("250m", "3Gi"))
		pod.Labels[schedv1alpha1.PodGroupLabel] = group
		require.NoError(t, rome.Client.Create(ctx, pod))
	}

	const why = "room for 6 of the 8 members together, 8 needed"
	waitingTogether := func(timeout time.Duration) {
		t.Helper()
		eventually(t, timeout, "8 reservations waiting for the group to fit", func() (bool, string) {
			var list rbv1.ReservationList
			require.NoError(t, rome.Client.List(ctx, &list, client.InNamespace(ns)))
			if len(list.Items) != size {
				return false, fmt.Sprintf("%d reservations", len(list.Items))
			}
			for _, r := range list.Items {
				if !waiting(&r) || !assert.ObjectsAreEqual(&rbv1.ReservationGroup{Name: group, MinMember: size}, r.Spec.Group) {
					return false, fmt.Sprintf("%s: %s %s: %s (group %+v)", r.Name, r.Status.Phase, r.Status.Reason, r.Status.Message, r.Spec.Group)
				}
				if !strings.Contains(r.Status.Message, why) {
					return false, r.Name + ": " + r.Status.Message
				}
			}
			return true, ""
		})
		for _, name := range names {
			waitPodCondition(t, rome, ns, name, timeout, "NoCapacity", why)
		}
		live, err := bed.Store.LiveReservations(ctx, "by-requester", "rome")
		require.NoError(t, err)
		assert.Empty(t, live, "nothing reserved while the group does not fit")
	}
	waitingTogether(90 * time.Second)
	time.Sleep(3 * time.Second) // the agent keeps asking; still nothing
	waitingTogether(time.Second)
	require.NoError(t, bed.Store.CheckInvariant(ctx))

	require.NoError(t, berlin.Client.Delete(ctx, local, client.GracePeriodSeconds(0)))
	var scheduled []time.Time
	for _, name := range names {
		pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
		waitRunning(t, rome, pod)
		for _, c := range pod.Status.Conditions {
			if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionTrue {
				scheduled = append(scheduled, c.LastTransitionTime.Time)
			}
		}
	}
	require.Len(t, scheduled, size)
	sort.Slice(scheduled, func(i, j int) bool { return scheduled[i].Before(scheduled[j]) })
	assert.LessOrEqual(t, scheduled[size-1].Sub(scheduled[0]), 5*time.Second,
		"bound together (Coscheduling's Permit held the first until the last was placed)")

	var list rbv1.ReservationList
	require.NoError(t, rome.Client.List(ctx, &list, client.InNamespace(ns)))
	providers := map[string]int{}
	for _, r := range list.Items {
		providers[r.Status.Provider]++
		at, err := bed.Store.Reservation(ctx, "rome", string(r.UID))
		require.NoError(t, err)
		assert.Equal(t, ns+"/"+group, at.Group)
	}
	assert.Equal(t, map[string]int{"paris": 4, "berlin": 4}, providers)
	require.NoError(t, bed.Store.CheckInvariant(ctx))

	for _, name := range names {
		require.NoError(t, rome.Client.Delete(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}))
	}
	waitNoLive(t, bed, 60*time.Second)
	require.NoError(t, bed.Store.CheckInvariant(ctx))
}
