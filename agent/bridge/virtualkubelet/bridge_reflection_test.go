package virtualkubelet_test

import (
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
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/fluidos-project/resource-broker/agent/bridge/virtualkubelet"
	rbv1 "github.com/fluidos-project/resource-broker/api/v1alpha1"
)

// reflection: the copies of a pod's ConfigMaps and Secrets at paris are
// kept as rome's objects are, whatever happens to them at paris: deleted or
// edited there, they are put back; where server-side apply cannot bring
// them there (immutable data, a Secret's type) they are made anew; an
// object at paris that is not a copy is left alone; a copy no pod uses goes.
func (vk *vkLifecycle) reflection(t *testing.T) {
	ctx, rome, paris := vk.ctx, vk.rome, vk.paris
	settings := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "reflect-settings"},
		Data: map[string]string{"level": "info"}}
	frozen := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "reflect-frozen"},
		Data: map[string]string{"release": "1"}, Immutable: ptr.To(true)}
	creds := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "reflect-creds"},
		Type: corev1.SecretTypeOpaque, Data: map[string][]byte{"password": []byte("s3cret")}}
	for _, o := range []client.Object{settings, frozen, creds} {
		require.NoError(t, rome.Client.Create(ctx, o))
	}
	pod := boundPod("shop", "reflect-0", corev1.RestartPolicyAlways)
	for _, v := range []corev1.Volume{
		{Name: "settings", VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{LocalObjectReference: corev1.LocalObjectReference{Name: settings.Name}}}},
		{Name: "frozen", VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{LocalObjectReference: corev1.LocalObjectReference{Name: frozen.Name}}}},
		{Name: "creds", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: creds.Name}}},
	} {
		pod.Spec.Volumes = append(pod.Spec.Volumes, v)
		pod.Spec.Containers[0].VolumeMounts = append(pod.Spec.Containers[0].VolumeMounts, corev1.VolumeMount{Name: v.Name, MountPath: "/etc/" + v.Name})
	}
	rome.reserve(t, pod.Name)
	require.NoError(t, rome.Client.Create(ctx, pod))
	atParis := func(name string) types.NamespacedName {
		return types.NamespacedName{Namespace: "rb-rome", Name: "shop." + name}
	}
	copyOf := func(c require.TestingT, name string) *corev1.ConfigMap {
		var cm corev1.ConfigMap
		require.NoError(c, paris.Client.Get(ctx, atParis(name), &cm))
		return &cm
	}
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		require.NoError(c, paris.Client.Get(ctx, atParis(pod.Name), &corev1.Pod{}))
		assert.Equal(c, map[string]string{"level": "info"}, copyOf(c, settings.Name).Data)
	}, 15*time.Second, 20*time.Millisecond)
	cm := copyOf(t, settings.Name)
	assert.Equal(t, "rome", cm.Labels[rbv1.RequesterLabel])
	assert.Equal(t, "reflect-settings", cm.Annotations[virtualkubelet.OriginNameAnnotation])
	assert.True(t, appliedBy(cm.ManagedFields, virtualkubelet.FieldManager), "written by server-side apply: %+v", cm.ManagedFields)

	// Deleted at paris: made again.
	start := time.Now()
	require.NoError(t, paris.Client.Delete(ctx, cm))
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		again := copyOf(c, settings.Name)
		assert.NotEqual(c, cm.UID, again.UID)
		assert.Equal(c, map[string]string{"level": "info"}, again.Data)
	}, 10*time.Second, 20*time.Millisecond)
	t.Logf("copy deleted at paris -> back in %s", time.Since(start).Round(time.Millisecond))

	// Edited at paris: its data put back by apply, in place.
	cm = copyOf(t, settings.Name)
	cm.Data["level"] = "debug"
	require.NoError(t, paris.Client.Update(ctx, cm))
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		again := copyOf(c, settings.Name)
		assert.Equal(c, cm.UID, again.UID, "applied, not replaced")
		assert.Equal(c, map[string]string{"level": "info"}, again.Data)
	}, 10*time.Second, 20*time.Millisecond)
	// A key added at paris, which apply leaves to its manager: made anew without it.
	cm = copyOf(t, settings.Name)
	cm.Data["extra"] = "injected"
	require.NoError(t, paris.Client.Update(ctx, cm))
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		assert.Equal(c, map[string]string{"level": "info"}, copyOf(c, settings.Name).Data)
	}, 10*time.Second, 20*time.Millisecond)

	// The immutable ConfigMap made again at rome with other data: its copy,
	// immutable too, is replaced.
	old := copyOf(t, frozen.Name)
	require.Equal(t, ptr.To(true), old.Immutable)
	require.NoError(t, rome.Client.Delete(ctx, frozen))
	frozen = &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "reflect-frozen"},
		Data: map[string]string{"release": "2"}, Immutable: ptr.To(true)}
	require.NoError(t, rome.Client.Create(ctx, frozen))
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		again := copyOf(c, frozen.Name)
		assert.NotEqual(c, old.UID, again.UID)
		assert.Equal(c, map[string]string{"release": "2"}, again.Data)
		assert.Equal(c, ptr.To(true), again.Immutable)
		assert.Equal(c, string(frozen.UID), again.Annotations[virtualkubelet.OriginUIDAnnotation])
	}, 10*time.Second, 20*time.Millisecond)

	// The Secret made again at rome of another type: its copy is replaced.
	var oldSecret corev1.Secret
	require.NoError(t, paris.Client.Get(ctx, atParis(creds.Name), &oldSecret))
	require.Equal(t, corev1.SecretTypeOpaque, oldSecret.Type)
	require.NoError(t, rome.Client.Delete(ctx, creds))
	creds = &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "reflect-creds"},
		Type: corev1.SecretTypeBasicAuth, Data: map[string][]byte{"username": []byte("shop"), "password": []byte("s3cret")}}
	require.NoError(t, rome.Client.Create(ctx, creds))
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		var s corev1.Secret
		require.NoError(c, paris.Client.Get(ctx, atParis(creds.Name), &s))
		assert.NotEqual(c, oldSecret.UID, s.UID)
		assert.Equal(c, corev1.SecretTypeBasicAuth, s.Type)
		assert.Equal(c, "shop", string(s.Data["username"]))
	}, 10*time.Second, 20*time.Millisecond)

	// Someone at paris takes the copy's name for an object of its own (no
	// longer marked as the copy of reflect-settings): it is not overwritten,
	// even when rome's object changes, and the failure is counted.
	failedBefore := reflectionCount(t, "ConfigMap", "failed")
	cm = copyOf(t, settings.Name)
	cm.Annotations[virtualkubelet.OriginNameAnnotation] = "someone-else"
	cm.Data["level"] = "theirs"
	require.NoError(t, paris.Client.Update(ctx, cm))
	require.NoError(t, rome.Client.Get(ctx, types.NamespacedName{Namespace: "shop", Name: settings.Name}, settings))
	settings.Data["level"] = "warn"
	require.NoError(t, rome.Client.Update(ctx, settings))
	require.Eventually(t, func() bool { return reflectionCount(t, "ConfigMap", "failed") > failedBefore }, 10*time.Second, 20*time.Millisecond)
	time.Sleep(500 * time.Millisecond)
	theirs := copyOf(t, settings.Name)
	assert.Equal(t, map[string]string{"level": "theirs"}, theirs.Data, "not ours: left as it is")
	assert.Equal(t, "someone-else", theirs.Annotations[virtualkubelet.OriginNameAnnotation])
	// Once it is gone, the copy comes back, with rome's data.
	require.NoError(t, paris.Client.Delete(ctx, theirs))
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		again := copyOf(c, settings.Name)
		assert.Equal(c, map[string]string{"level": "warn"}, again.Data)
		assert.Equal(c, settings.Name, again.Annotations[virtualkubelet.OriginNameAnnotation])
	}, 10*time.Second, 20*time.Millisecond)

	// A copy no pod uses (left behind, say, by an agent that was down when
	// its pod went) is deleted.
	orphan := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "rb-rome", Name: "shop.reflect-orphan",
		Labels:      map[string]string{rbv1.RequesterLabel: "rome"},
		Annotations: map[string]string{virtualkubelet.OriginNamespaceAnnotation: "shop", virtualkubelet.OriginNameAnnotation: "reflect-orphan"}},
		Data: map[string]string{"left": "behind"}}
	require.NoError(t, paris.Client.Create(ctx, orphan))
	require.Eventually(t, func() bool {
		return apierrors.IsNotFound(paris.Client.Get(ctx, atParis("reflect-orphan"), &corev1.ConfigMap{}))
	}, 10*time.Second, 20*time.Millisecond, "a copy nobody uses is deleted")

	// The pod gone, so are its objects' copies.
	require.NoError(t, rome.Client.Delete(ctx, pod))
	require.Eventually(t, func() bool {
		for _, name := range []string{settings.Name, frozen.Name} {
			if !apierrors.IsNotFound(paris.Client.Get(ctx, atParis(name), &corev1.ConfigMap{})) {
				return false
			}
		}
		return apierrors.IsNotFound(paris.Client.Get(ctx, atParis(creds.Name), &corev1.Secret{}))
	}, 15*time.Second, 20*time.Millisecond, "copies no pod uses are deleted")
}

// appliedBy: manager wrote the object by server-side apply.
func appliedBy(fields []metav1.ManagedFieldsEntry, manager string) bool {
	for _, f := range fields {
		if f.Manager == manager && f.Operation == metav1.ManagedFieldsOperationApply {
			return true
		}
	}
	return false
}

// reflectionCount reads rb_agent_reflections_total{kind,outcome} of the
// agents running in this process (rome's alone has a bridge).
func reflectionCount(t testing.TB, kind, outcome string) float64 {
	t.Helper()
	families, err := ctrlmetrics.Registry.Gather()
	require.NoError(t, err)
	for _, f := range families {
		if f.GetName() != "rb_agent_reflections_total" {
			continue
		}
		for _, m := range f.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["kind"] == kind && labels["outcome"] == outcome {
				return m.GetCounter().GetValue()
			}
		}
	}
	return 0
}
