package virtualkubelet_test

import (
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/version"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/fluidos-project/resource-broker/agent/bridge/virtualkubelet"
	"github.com/fluidos-project/resource-broker/agent/provider"
	rbv1 "github.com/fluidos-project/resource-broker/api/v1alpha1"
)

// Steps of TestVirtualKubelet (bridge_test.go) about the virtual node itself:
// its capacity and taint, its Ready condition as the provider's access and API
// server come and go, its registration and removal.

func (vk *vkLifecycle) virtualNodeForReservations(t *testing.T) {
	ctx, rome := vk.ctx, vk.rome
	start := time.Now()
	require.NoError(t, rome.Client.Create(ctx, reservation("web", "2", "4Gi")))
	vk.rsv = rome.waitReservation(t, "web", func(r *rbv1.Reservation) bool { return r.Status.Phase == rbv1.ReservationActive }, 15*time.Second)
	rome.waitReady(t, "rb-paris", corev1.ConditionTrue, virtualkubelet.ReasonReachable, 15*time.Second)
	t.Logf("reservation created -> rb-paris Ready: %s", time.Since(start).Round(time.Millisecond))
	// Named once the node is schedulable (Ready, and the API server's
	// node.kubernetes.io/not-ready taint lifted by the node lifecycle
	// controller, which bridgetest plays) and its capacity counts the
	// reservation: read right after, the node has it.
	rome.waitReservation(t, "web", func(r *rbv1.Reservation) bool { return r.Status.VirtualNode == "rb-paris" }, 5*time.Second)
	n, err := rome.node("rb-paris")
	require.NoError(t, err)
	assert.Equal(t, "paris", n.Labels[rbv1.ProviderLabel])
	assert.Equal(t, "virtual-kubelet", n.Labels["type"])
	kv, err := version.ParseSemantic(n.Status.NodeInfo.KubeletVersion)
	require.NoError(t, err, "kubeletVersion is semver: %q", n.Status.NodeInfo.KubeletVersion)
	assert.Equal(t, uint(1), kv.Major())
	assert.Equal(t, []corev1.Taint{{Key: rbv1.VirtualNodeTaint, Value: "true", Effect: corev1.TaintEffectNoSchedule}}, n.Spec.Taints)
	for _, list := range []corev1.ResourceList{n.Status.Capacity, n.Status.Allocatable} {
		assert.Equal(t, "2", ptr.To(list[corev1.ResourceCPU]).String())
		assert.Equal(t, "4Gi", ptr.To(list[corev1.ResourceMemory]).String())
		assert.Equal(t, "110", ptr.To(list[corev1.ResourcePods]).String())
	}
	var lease coordinationv1.Lease
	require.NoError(t, rome.Client.Get(ctx, types.NamespacedName{Namespace: corev1.NamespaceNodeLease, Name: "rb-paris"}, &lease))
	assert.Equal(t, int32(leaseDuration/time.Second), ptr.Deref(lease.Spec.LeaseDurationSeconds, 0))

	require.NoError(t, rome.Client.Create(ctx, reservation("web-1", "1", "1Gi")))
	rome.waitReservation(t, "web-1", func(r *rbv1.Reservation) bool { return r.Status.VirtualNode == "rb-paris" }, 15*time.Second)
	n, err = rome.node("rb-paris")
	require.NoError(t, err)
	assert.Equal(t, "3", ptr.To(n.Status.Capacity[corev1.ResourceCPU]).String(), "the sum of the active reservations, written before web-1 names the node")
	assert.Equal(t, "5Gi", ptr.To(n.Status.Capacity[corev1.ResourceMemory]).String())
	assert.Equal(t, "220", ptr.To(n.Status.Allocatable[corev1.ResourcePods]).String())
	vk.rsv = rome.waitReservation(t, "web", func(r *rbv1.Reservation) bool { return r.Status.Phase == rbv1.ReservationActive }, time.Second)
	assert.Equal(t, "rb-paris", vk.rsv.Status.VirtualNode, "the reconciler's updates keep the bridge's field")
}

func (vk *vkLifecycle) accessRevoked(t *testing.T) {
	ctx, rome, paris := vk.ctx, vk.rome, vk.paris
	var binding rbacv1.RoleBinding
	require.NoError(t, paris.Client.Get(ctx, types.NamespacedName{Namespace: "rb-rome", Name: provider.TenantRoleBinding}, &binding))
	require.NoError(t, paris.Client.Delete(ctx, &binding))
	took := rome.waitReady(t, "rb-paris", corev1.ConditionFalse, virtualkubelet.ReasonAccessRevoked, 10*time.Second)
	t.Logf("access revoked -> rb-paris NotReady (AccessRevoked): %s", took.Round(time.Millisecond))
	n, err := rome.node("rb-paris")
	require.NoError(t, err)
	assert.Contains(t, readyCondition(n).Message, "paris revoked access to namespace rb-rome")
	binding.ResourceVersion, binding.UID = "", ""
	require.NoError(t, paris.Client.Create(ctx, &binding))
	rome.waitReady(t, "rb-paris", corev1.ConditionTrue, virtualkubelet.ReasonReachable, 10*time.Second)
}

func (vk *vkLifecycle) nodeDeleted(t *testing.T) {
	ctx, rome := vk.ctx, vk.rome
	before, err := rome.node("rb-paris")
	require.NoError(t, err)
	require.NoError(t, rome.Client.Delete(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "rb-paris"}}))
	rome.waitReady(t, "rb-paris", corev1.ConditionTrue, virtualkubelet.ReasonReachable, 10*time.Second)
	n, err := rome.node("rb-paris")
	require.NoError(t, err)
	assert.Contains(t, n.Spec.Taints, corev1.Taint{Key: rbv1.VirtualNodeTaint, Value: "true", Effect: corev1.TaintEffectNoSchedule})
	assert.Equal(t, ptr.To(before.Status.Capacity[corev1.ResourceCPU]).String(), ptr.To(n.Status.Capacity[corev1.ResourceCPU]).String(),
		"registered again with its capacity")
}

func (vk *vkLifecycle) providerAPIServerStopped(t *testing.T) {
	ctx, rome, paris := vk.ctx, vk.rome, vk.paris
	var lease coordinationv1.Lease
	require.NoError(t, rome.Client.Get(ctx, types.NamespacedName{Namespace: corev1.NamespaceNodeLease, Name: "rb-paris"}, &lease))
	renewed := lease.Spec.RenewTime.Time
	stopping := time.Now()
	paris.StopAPIServer(t)
	stopped := time.Now()
	rome.waitReady(t, "rb-paris", corev1.ConditionUnknown, virtualkubelet.ReasonUnreachable, lostGrace+leaseDuration)
	n, err := rome.node("rb-paris")
	require.NoError(t, err)
	lost := readyCondition(n).LastTransitionTime.Time
	t.Logf("paris API server stopping (SIGTERM, SIGKILL after 5s) -> port closed %s; rb-paris Unknown %s after the stop began (grace %s, probe 1s; the condition's time has second precision)",
		stopped.Sub(stopping).Round(time.Millisecond), lost.Sub(stopping.Truncate(time.Second)).Round(time.Second), lostGrace)
	assert.GreaterOrEqual(t, lost.Sub(stopping.Truncate(time.Second)), lostGrace-time.Second, "Ready for the grace after the last answer")
	assert.Contains(t, readyCondition(n).Message, "has not answered since")
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		n, err := rome.node("rb-paris")
		require.NoError(c, err)
		for _, effect := range []corev1.TaintEffect{corev1.TaintEffectNoSchedule, corev1.TaintEffectNoExecute} {
			assert.True(c, slices.ContainsFunc(n.Spec.Taints, func(t corev1.Taint) bool {
				return t.Key == corev1.TaintNodeUnreachable && t.Effect == effect
			}), "unreachable:%s in %v", effect, n.Spec.Taints)
		}
		assert.Contains(c, n.Spec.Taints, corev1.Taint{Key: rbv1.VirtualNodeTaint, Value: "true", Effect: corev1.TaintEffectNoSchedule})
	}, 5*time.Second, 20*time.Millisecond, "tainted unreachable, our taint kept")
	require.Eventually(t, func() bool {
		_ = rome.Client.Get(ctx, types.NamespacedName{Namespace: corev1.NamespaceNodeLease, Name: "rb-paris"}, &lease)
		return lease.Spec.RenewTime.After(renewed) && lease.Spec.RenewTime.After(stopped)
	}, leaseDuration, 50*time.Millisecond, "the virtual kubelet renews its lease meanwhile")

	starting := time.Now()
	paris.StartAPIServer(t)
	serving := time.Now()
	rome.waitReady(t, "rb-paris", corev1.ConditionTrue, virtualkubelet.ReasonReachable, 30*time.Second)
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		n, err := rome.node("rb-paris")
		require.NoError(c, err)
		assert.Equal(c, []corev1.Taint{{Key: rbv1.VirtualNodeTaint, Value: "true", Effect: corev1.TaintEffectNoSchedule}}, n.Spec.Taints)
	}, 5*time.Second, 20*time.Millisecond, "untainted")
	t.Logf("paris API server down %s; started again -> serving %s -> rb-paris Ready %s later",
		starting.Sub(stopped).Round(time.Millisecond), serving.Sub(starting).Round(time.Millisecond), time.Since(serving).Round(time.Millisecond))
	running, err := rome.pod("shop", "always")
	require.NoError(t, err)
	assert.Equal(t, corev1.PodRunning, running.Status.Phase)

	// The bridge hears of paris's pods again at once: a fresh watch, not after the old one's
	// back-off (up to 30 s).
	var before corev1.Pod
	require.NoError(t, paris.Client.Get(ctx, types.NamespacedName{Namespace: "rb-rome", Name: "shop.always"}, &before))
	require.NoError(t, paris.Client.Delete(ctx, &before, client.GracePeriodSeconds(0))) // not waiting for the fake kubelet's own watch
	deleted := time.Now()
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		var after corev1.Pod
		require.NoError(c, paris.Client.Get(ctx, types.NamespacedName{Namespace: "rb-rome", Name: "shop.always"}, &after))
		assert.NotEqual(c, before.UID, after.UID)
	}, 10*time.Second, 10*time.Millisecond)
	t.Logf("after the restart, a copy deleted at paris is recreated in %s", time.Since(deleted).Round(time.Millisecond))
}

func (vk *vkLifecycle) nodeRemoved(t *testing.T) {
	ctx, rome := vk.ctx, vk.rome
	for _, ns := range []string{"default", "shop"} {
		require.NoError(t, rome.Client.DeleteAllOf(ctx, &rbv1.Reservation{}, client.InNamespace(ns)))
	}
	require.Eventually(t, func() bool {
		var list rbv1.ReservationList
		require.NoError(t, rome.Client.List(ctx, &list))
		return len(list.Items) == 0
	}, 15*time.Second, 20*time.Millisecond)
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		n, err := rome.node("rb-paris")
		require.NoError(c, err)
		assert.Equal(c, "0", ptr.To(n.Status.Capacity[corev1.ResourceCPU]).String())
	}, 10*time.Second, 20*time.Millisecond)
	time.Sleep(time.Second)
	_, err := rome.node("rb-paris")
	require.NoError(t, err, "a pod is still on it")

	require.NoError(t, rome.Client.Delete(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "always"}}))
	require.Eventually(t, func() bool {
		_, err := rome.node("rb-paris")
		return apierrors.IsNotFound(err)
	}, 15*time.Second, 20*time.Millisecond)
	err = rome.Client.Get(ctx, types.NamespacedName{Namespace: corev1.NamespaceNodeLease, Name: "rb-paris"}, &coordinationv1.Lease{})
	assert.True(t, apierrors.IsNotFound(err), "the lease goes first: %v", err)
}
