package virtualkubelet

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
)

// An update of a pod's status made from an older snapshot of the pod keeps
// the labels and annotations of the version it is conditioned on.
func TestStatusClientKeepsMetadata(t *testing.T) {
	current := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "web", UID: "u1", ResourceVersion: "7",
		Labels: map[string]string{"app": "web"}, Annotations: map[string]string{"controller.kubernetes.io/pod-deletion-cost": "-31"}}}
	cs := fake.NewClientset(current.DeepCopy())
	idx := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{})
	require.NoError(t, idx.Add(current))
	c := statusClient{CoreV1Interface: cs.CoreV1(), pods: corelisters.NewPodLister(idx)}

	snapshot := current.DeepCopy() // as the provider reported it, before the annotation
	snapshot.Annotations = nil
	snapshot.Status.Phase = corev1.PodRunning
	out, err := c.Pods("shop").UpdateStatus(context.Background(), snapshot, metav1.UpdateOptions{})
	require.NoError(t, err)
	assert.Equal(t, corev1.PodRunning, out.Status.Phase)
	assert.Equal(t, "-31", out.Annotations["controller.kubernetes.io/pod-deletion-cost"], "the annotation written after the snapshot stays")
	assert.Nil(t, snapshot.Annotations, "the caller's object is not changed")

	// Conditioned on another version: sent as it is (the API server refuses a stale one).
	other := snapshot.DeepCopy()
	other.ResourceVersion = "6"
	other.Labels = map[string]string{"app": "old"}
	out, err = c.Pods("shop").UpdateStatus(context.Background(), other, metav1.UpdateOptions{})
	require.NoError(t, err)
	assert.Equal(t, "old", out.Labels["app"])
}
