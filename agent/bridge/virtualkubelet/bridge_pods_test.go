package virtualkubelet_test

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/fluidos-project/resource-broker/agent/bridge/virtualkubelet"
	rbv1 "github.com/fluidos-project/resource-broker/api/v1alpha1"
)

// Steps of TestVirtualKubelet (bridge_test.go) about the pods bound to the
// virtual node: their copies at the provider, admission on a reservation,
// the provider's Events, deletion on either side.

func (vk *vkLifecycle) podRunsAtProvider(t *testing.T) {
	ctx, rome, paris, kubelet := vk.ctx, vk.rome, vk.paris, vk.kubelet
	require.NoError(t, rome.Client.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "web-config", Namespace: "shop"},
		Data: map[string]string{"index.html": "hello"}}))
	require.NoError(t, rome.Client.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "web-creds", Namespace: "shop"},
		StringData: map[string]string{"password": "s3cret"}}))
	pod := boundPod("shop", "web-0", corev1.RestartPolicyAlways)
	pod.Spec.Volumes = append(pod.Spec.Volumes,
		corev1.Volume{Name: "config", VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{LocalObjectReference: corev1.LocalObjectReference{Name: "web-config"}}}},
		corev1.Volume{Name: "creds", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: "web-creds"}}})
	pod.Spec.Containers[0].VolumeMounts = append(pod.Spec.Containers[0].VolumeMounts,
		corev1.VolumeMount{Name: "config", MountPath: "/usr/share/nginx/html"}, corev1.VolumeMount{Name: "creds", MountPath: "/etc/creds"})
	rome.reserve(t, "web-0")
	t0 := time.Now()
	require.NoError(t, rome.Client.Create(ctx, pod))

	var remote corev1.Pod
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		require.NoError(c, paris.Client.Get(ctx, types.NamespacedName{Namespace: "rb-rome", Name: "shop.web-0"}, &remote))
	}, 15*time.Second, 5*time.Millisecond)
	var local *corev1.Pod
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		var err error
		local, err = rome.pod("shop", "web-0")
		require.NoError(c, err)
		assert.Equal(c, corev1.PodRunning, local.Status.Phase)
		assert.NotEmpty(c, local.Status.ContainerStatuses)
	}, 15*time.Second, 5*time.Millisecond)
	t3 := time.Now()
	ev := kubelet.Event("shop.web-0")
	t.Logf("latency: pod bound in rome -> copy seen by paris's kubelet %s -> copy Running %s -> rome's pod Running %s (total %s)",
		ev.Seen.Sub(t0).Round(time.Millisecond), ev.Running.Sub(ev.Seen).Round(time.Millisecond), t3.Sub(ev.Running).Round(time.Millisecond), t3.Sub(t0).Round(time.Millisecond))

	require.NoError(t, paris.Client.Get(ctx, types.NamespacedName{Namespace: "rb-rome", Name: "shop.web-0"}, &remote))
	// The copy: no token of paris (its token of rome: homeAPIToken), none
	// of rome's placement, marked with its origin.
	for _, v := range remote.Spec.Volumes {
		assert.Nil(t, v.Projected, "no service account token volume: %s", v.Name)
	}
	assert.Equal(t, ptr.To(false), remote.Spec.AutomountServiceAccountToken)
	assert.NotEqual(t, "web-sa", remote.Spec.ServiceAccountName)
	assert.Equal(t, "paris-node-1", remote.Spec.NodeName, "placed by paris, not bound to rome's node")
	assert.Equal(t, corev1.DefaultSchedulerName, remote.Spec.SchedulerName)
	assert.NotContains(t, remote.Spec.NodeSelector, rbv1.ProviderLabel)
	for _, tol := range remote.Spec.Tolerations {
		assert.NotEqual(t, rbv1.VirtualNodeTaint, tol.Key)
	}
	assert.Empty(t, remote.OwnerReferences)
	assert.Equal(t, "web-0", remote.Labels["app"])
	assert.Equal(t, "rome", remote.Labels[rbv1.RequesterLabel])
	assert.Equal(t, "blue", remote.Annotations["team"])
	assert.Equal(t, string(local.UID), remote.Annotations[virtualkubelet.OriginUIDAnnotation])
	// Its ConfigMap and Secret came along.
	var cm corev1.ConfigMap
	require.NoError(t, paris.Client.Get(ctx, types.NamespacedName{Namespace: "rb-rome", Name: "shop.web-config"}, &cm))
	assert.Equal(t, "hello", cm.Data["index.html"])
	var secret corev1.Secret
	require.NoError(t, paris.Client.Get(ctx, types.NamespacedName{Namespace: "rb-rome", Name: "shop.web-creds"}, &secret))
	assert.Equal(t, "s3cret", string(secret.Data["password"]))
	assert.True(t, slices.ContainsFunc(remote.Spec.Volumes, func(v corev1.Volume) bool { return v.ConfigMap != nil && v.ConfigMap.Name == "shop.web-config" }))
	// Rome's pod shows paris's status.
	assert.Equal(t, "rb-paris", local.Spec.NodeName)
	assert.Equal(t, remote.Status.PodIP, local.Status.PodIP)
	assert.Equal(t, remote.Status.ContainerStatuses, local.Status.ContainerStatuses)
	assert.True(t, slices.ContainsFunc(local.Status.Conditions, func(c corev1.PodCondition) bool {
		return c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue
	}))
	assert.True(t, slices.ContainsFunc(local.Status.Conditions, func(c corev1.PodCondition) bool {
		return c.Type == virtualkubelet.PodConditionReserved && c.Status == corev1.ConditionTrue &&
			strings.Contains(c.Message, "reservation web-0 (broker id ") && strings.Contains(c.Message, "at paris")
	}), "admitted on its reservation: %+v", local.Status.Conditions)

	// The copies follow their originals.
	cmLocal := &corev1.ConfigMap{}
	require.NoError(t, rome.Client.Get(ctx, types.NamespacedName{Namespace: "shop", Name: "web-config"}, cmLocal))
	cmLocal.Data["index.html"] = "hello again"
	require.NoError(t, rome.Client.Update(ctx, cmLocal))
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		require.NoError(c, paris.Client.Get(ctx, types.NamespacedName{Namespace: "rb-rome", Name: "shop.web-config"}, &cm))
		assert.Equal(c, "hello again", cm.Data["index.html"])
	}, 10*time.Second, 20*time.Millisecond)
}

func (vk *vkLifecycle) providerEvents(t *testing.T) {
	ctx, rome, paris := vk.ctx, vk.rome, vk.paris
	var remote corev1.Pod
	require.NoError(t, paris.Client.Get(ctx, types.NamespacedName{Namespace: "rb-rome", Name: "shop.web-0"}, &remote))
	local, err := rome.pod("shop", "web-0")
	require.NoError(t, err)
	now := metav1.Now()
	// As paris's kubelet and scheduler record them about the copy.
	providerEvent := func(name, reason, typ, component, msg string) *corev1.Event {
		return &corev1.Event{ObjectMeta: metav1.ObjectMeta{Namespace: "rb-rome", Name: name},
			InvolvedObject: corev1.ObjectReference{Kind: "Pod", APIVersion: "v1", Namespace: "rb-rome", Name: remote.Name, UID: remote.UID,
				FieldPath: "spec.containers{main}"},
			Reason: reason, Type: typ, Message: msg, Source: corev1.EventSource{Component: component, Host: "paris-node-1"},
			Count: 1, FirstTimestamp: now, LastTimestamp: now}
	}
	backOff := providerEvent("shop.web-0.backoff", "BackOff", corev1.EventTypeWarning, "kubelet",
		fmt.Sprintf("Back-off restarting failed container main in pod shop.web-0_rb-rome(%s)", remote.UID))
	for _, e := range []*corev1.Event{
		providerEvent("shop.web-0.scheduled", "Scheduled", corev1.EventTypeNormal, "default-scheduler", "Successfully assigned rb-rome/shop.web-0 to paris-node-1"),
		backOff,
		providerEvent("shop.web-0.failed", "Failed", corev1.EventTypeWarning, "kubelet", `Error: configmap "shop.web-config" not found`),
	} {
		require.NoError(t, paris.Client.Create(ctx, e))
	}
	recorded := func(c require.TestingT) map[string]corev1.Event {
		var list corev1.EventList
		require.NoError(c, rome.Client.List(ctx, &list, client.InNamespace("shop")))
		out := map[string]corev1.Event{}
		for _, e := range list.Items {
			if e.InvolvedObject.UID == local.UID && strings.HasPrefix(e.Message, "(on paris) ") {
				_, dup := out[e.Reason]
				assert.False(t, dup, "one local Event per provider Event: %s", e.Reason)
				out[e.Reason] = e
			}
		}
		return out
	}
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		got := recorded(c)
		assert.Len(c, got, 2, "BackOff and Failed, not the provider scheduler's Scheduled: %v", got)
		assert.Equal(c, fmt.Sprintf("(on paris) Back-off restarting failed container main in pod web-0_shop(%s)", local.UID), got["BackOff"].Message)
		assert.Equal(c, `(on paris) Error: configmap "web-config" not found`, got["Failed"].Message)
		assert.Equal(c, corev1.EventTypeWarning, got["Failed"].Type)
		assert.Equal(c, "spec.containers{main}", got["BackOff"].InvolvedObject.FieldPath)
		assert.Equal(c, corev1.EventSource{Component: "kubelet", Host: "rb-paris"}, got["BackOff"].Source)
	}, 10*time.Second, 20*time.Millisecond)

	// The kubelet counts the back-off again: the same local Event counts too.
	require.NoError(t, paris.Client.Get(ctx, client.ObjectKeyFromObject(backOff), backOff))
	backOff.Count, backOff.LastTimestamp = 5, metav1.NewTime(now.Add(time.Minute))
	require.NoError(t, paris.Client.Update(ctx, backOff))
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		got := recorded(c)
		assert.Len(c, got, 2)
		assert.Equal(c, int32(5), got["BackOff"].Count)
		assert.True(c, got["BackOff"].LastTimestamp.After(now.Time))
	}, 10*time.Second, 20*time.Millisecond)
}

func (vk *vkLifecycle) unreservedPod(t *testing.T) {
	ctx, rome, paris := vk.ctx, vk.rome, vk.paris
	node, err := rome.node("rb-paris")
	require.NoError(t, err)
	cpu, pods := node.Status.Capacity.Cpu().MilliValue(), node.Status.Capacity.Pods().Value()
	// Restart policy Never: a kubelet's rejection would fail it; the bridge keeps it Pending.
	pinned := boundPod("shop", "pinned", corev1.RestartPolicyNever)
	pinned.Annotations[virtualkubelet.HomeAPIAnnotation] = "false" // its copy: no token at all
	bare := boundPod("shop", "bare", corev1.RestartPolicyAlways)
	bare.Spec.Containers[0].Resources = corev1.ResourceRequirements{}
	require.NoError(t, rome.Client.Create(ctx, pinned))
	require.NoError(t, rome.Client.Create(ctx, bare))
	notReserved := func(name string, parts ...string) *corev1.Pod {
		var p *corev1.Pod
		require.EventuallyWithT(t, func(c *assert.CollectT) {
			var err error
			p, err = rome.pod("shop", name)
			require.NoError(c, err)
			assert.Equal(c, corev1.PodPending, p.Status.Phase)
			assert.Equal(c, virtualkubelet.ReasonNotReserved, p.Status.Reason)
			for _, part := range parts {
				assert.Contains(c, p.Status.Message, part)
			}
			require.Len(c, p.Status.ContainerStatuses, 1)
			assert.Equal(c, virtualkubelet.ReasonNotReserved, p.Status.ContainerStatuses[0].State.Waiting.Reason)
			cond := podCondition(p, virtualkubelet.PodConditionReserved)
			require.NotNil(c, cond)
			assert.Equal(c, corev1.ConditionFalse, cond.Status)
		}, 10*time.Second, 20*time.Millisecond)
		return p
	}
	notReserved("pinned", "no live broker reservation at paris names this pod", "schedulerName: resource-broker")
	notReserved("bare", "container main requests no cpu and no memory")
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		n, err := rome.node("rb-paris")
		require.NoError(c, err)
		assert.Equal(c, cpu+100, n.Status.Capacity.Cpu().MilliValue(), "the refused pod's requests are added: it takes no reserved room")
		assert.Equal(c, pods+2, n.Status.Capacity.Pods().Value())
	}, 10*time.Second, 20*time.Millisecond)

	// Touched and decided again: still one Event, no copy.
	require.NoError(t, rome.Client.Patch(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "pinned"}},
		client.RawPatch(types.MergePatchType, []byte(`{"metadata":{"labels":{"touched":"yes"}}}`))))
	require.NoError(t, rome.Client.Create(ctx, reservation("elsewhere", "100m", "64Mi"))) // the provider's reservations change
	time.Sleep(2 * time.Second)
	warnings := func(pod string) []corev1.Event {
		var list corev1.EventList
		require.NoError(t, rome.Client.List(ctx, &list, client.InNamespace("shop")))
		var out []corev1.Event
		for _, e := range list.Items {
			if e.InvolvedObject.Name == pod && e.Reason == virtualkubelet.ReasonNotReserved {
				out = append(out, e)
			}
		}
		return out
	}
	if ev := warnings("pinned"); assert.Len(t, ev, 1) {
		// events.k8s.io: a repeated Event would be a series.
		assert.Nil(t, ev[0].Series, "one Warning, not one per decision")
		assert.Equal(t, corev1.EventTypeWarning, ev[0].Type)
	}
	for _, name := range []string{"shop.pinned", "shop.bare"} {
		err := paris.Client.Get(ctx, types.NamespacedName{Namespace: "rb-rome", Name: name}, &corev1.Pod{})
		assert.True(t, apierrors.IsNotFound(err), "no copy of %s at paris: %v", name, err)
	}
	p, err := rome.pod("shop", "pinned")
	require.NoError(t, err)
	assert.Equal(t, corev1.PodPending, p.Status.Phase, "Pending, not Failed, although its restart policy is Never")

	// A reservation naming it, at paris: admitted, copied, running.
	rome.reserve(t, "pinned")
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		p, err := rome.pod("shop", "pinned")
		require.NoError(c, err)
		assert.Equal(c, corev1.PodRunning, p.Status.Phase)
		cond := podCondition(p, virtualkubelet.PodConditionReserved)
		require.NotNil(c, cond)
		assert.Equal(c, corev1.ConditionTrue, cond.Status)
	}, 15*time.Second, 20*time.Millisecond, "admitted once a reservation names it")
	require.NoError(t, paris.Client.Get(ctx, types.NamespacedName{Namespace: "rb-rome", Name: "shop.pinned"}, &corev1.Pod{}))
	noHomeToken(t, paris, "pinned")
	var admittedEvents corev1.EventList
	require.NoError(t, rome.Client.List(ctx, &admittedEvents, client.InNamespace("shop"), client.MatchingFields{"involvedObject.kind": "Pod", "involvedObject.name": "pinned", "reason": virtualkubelet.ReasonReserved}))
	assert.Len(t, admittedEvents.Items, 1, "a Normal Event says it is admitted now")

	// A refused pod deleted goes at once: nothing runs for it.
	start := time.Now()
	require.NoError(t, rome.Client.Delete(ctx, bare))
	require.Eventually(t, func() bool {
		_, err := rome.pod("shop", "bare")
		return apierrors.IsNotFound(err)
	}, 10*time.Second, 20*time.Millisecond)
	t.Logf("refused pod deleted -> gone in %s", time.Since(start).Round(time.Millisecond))
	require.NoError(t, rome.Client.Delete(ctx, pinned))
	require.NoError(t, rome.Client.Delete(ctx, reservation("elsewhere", "100m", "64Mi")))
	require.Eventually(t, func() bool {
		_, err := rome.pod("shop", "pinned")
		return apierrors.IsNotFound(err)
	}, 15*time.Second, 20*time.Millisecond)
}

func (vk *vkLifecycle) podDeleted(t *testing.T) {
	ctx, rome, paris, kubelet := vk.ctx, vk.rome, vk.paris, vk.kubelet
	t0 := time.Now()
	require.NoError(t, rome.Client.Delete(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "web-0"}}, client.GracePeriodSeconds(7)))
	require.Eventually(t, func() bool {
		_, err := rome.pod("shop", "web-0")
		return apierrors.IsNotFound(err)
	}, 15*time.Second, 5*time.Millisecond, "rome's pod goes once the copy is gone, not after the grace period")
	ev := kubelet.Event("shop.web-0")
	assert.Equal(t, ptr.To(int64(7)), ev.DeleteGrace, "paris deleted the copy with rome's grace period")
	t.Logf("latency: delete in rome -> copy deleted at paris %s -> rome's pod gone %s", ev.Deleted.Sub(t0).Round(time.Millisecond), time.Since(ev.Deleted).Round(time.Millisecond))
	require.Eventually(t, func() bool {
		err1 := paris.Client.Get(ctx, types.NamespacedName{Namespace: "rb-rome", Name: "shop.web-config"}, &corev1.ConfigMap{})
		err2 := paris.Client.Get(ctx, types.NamespacedName{Namespace: "rb-rome", Name: "shop.web-creds"}, &corev1.Secret{})
		return apierrors.IsNotFound(err1) && apierrors.IsNotFound(err2)
	}, 10*time.Second, 20*time.Millisecond, "copies no pod uses are deleted")
	require.Eventually(t, func() bool {
		err := paris.Client.Get(ctx, types.NamespacedName{Namespace: "rb-rome", Name: "shop.web-0.kube-api-access"}, &corev1.Secret{})
		return apierrors.IsNotFound(err)
	}, 10*time.Second, 20*time.Millisecond, "its home API token goes with it")
}

func (vk *vkLifecycle) copyDeletedAtProvider(t *testing.T) {
	ctx, rome, paris := vk.ctx, vk.rome, vk.paris
	rome.reserve(t, "always")
	rome.reserve(t, "never")
	require.NoError(t, rome.Client.Create(ctx, boundPod("shop", "always", corev1.RestartPolicyAlways)))
	require.NoError(t, rome.Client.Create(ctx, boundPod("shop", "never", corev1.RestartPolicyNever)))
	running := func(name string) {
		require.EventuallyWithT(t, func(c *assert.CollectT) {
			p, err := rome.pod("shop", name)
			require.NoError(c, err)
			assert.Equal(c, corev1.PodRunning, p.Status.Phase)
		}, 15*time.Second, 10*time.Millisecond)
	}
	running("always")
	running("never")
	var before corev1.Pod
	require.NoError(t, paris.Client.Get(ctx, types.NamespacedName{Namespace: "rb-rome", Name: "shop.always"}, &before))
	for _, name := range []string{"shop.always", "shop.never"} {
		require.NoError(t, paris.Client.Delete(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "rb-rome", Name: name}}))
	}
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		var after corev1.Pod
		require.NoError(c, paris.Client.Get(ctx, types.NamespacedName{Namespace: "rb-rome", Name: "shop.always"}, &after))
		assert.NotEqual(c, before.UID, after.UID, "a new copy")
		assert.Equal(c, corev1.PodRunning, after.Status.Phase)
	}, 15*time.Second, 10*time.Millisecond, "restart policy Always: recreated")
	running("always")
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		p, err := rome.pod("shop", "never")
		require.NoError(c, err)
		assert.Equal(c, corev1.PodFailed, p.Status.Phase)
		assert.Equal(c, virtualkubelet.ReasonDeletedAtProvider, p.Status.Reason)
	}, 15*time.Second, 10*time.Millisecond, "restart policy Never: failed")
	time.Sleep(time.Second)
	err := paris.Client.Get(ctx, types.NamespacedName{Namespace: "rb-rome", Name: "shop.never"}, &corev1.Pod{})
	assert.True(t, apierrors.IsNotFound(err), "not recreated: %v", err)
	require.NoError(t, rome.Client.Delete(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "never"}}))
}

func podCondition(p *corev1.Pod, t corev1.PodConditionType) *corev1.PodCondition {
	for i := range p.Status.Conditions {
		if p.Status.Conditions[i].Type == t {
			return &p.Status.Conditions[i]
		}
	}
	return nil
}
