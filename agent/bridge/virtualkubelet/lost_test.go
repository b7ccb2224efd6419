package virtualkubelet

import (
	"context"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/utils/ptr"

	rbv1 "github.com/fluidos-project/resource-broker/api/v1alpha1"
)

func TestNeverTwice(t *testing.T) {
	owned := func(kind string) *corev1.Pod {
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", OwnerReferences: []metav1.OwnerReference{
			{APIVersion: "apps/v1", Kind: kind, Name: "db", Controller: ptr.To(true)}}}}
	}
	assert.Equal(t, "owned by StatefulSet db", neverTwice(owned("StatefulSet")))
	assert.Empty(t, neverTwice(owned("ReplicaSet")))
	assert.Empty(t, neverTwice(&corev1.Pod{}), "a bare pod is replaced, as the pod garbage collector deletes it")
	opted := owned("ReplicaSet")
	opted.Annotations = map[string]string{AnnotationReplaceOnLoss: "false"}
	assert.Contains(t, neverTwice(opted), AnnotationReplaceOnLoss)
	opted.Annotations[AnnotationReplaceOnLoss] = "true"
	assert.Empty(t, neverTwice(opted))
}

// The unreachable taints go on and off beside the others, written once.
func TestUnreachableTaints(t *testing.T) {
	ctx := context.Background()
	ours := corev1.Taint{Key: rbv1.VirtualNodeTaint, Value: "true", Effect: corev1.TaintEffectNoSchedule}
	other := corev1.Taint{Key: "example.com/maintenance", Effect: corev1.TaintEffectNoSchedule}
	cs := fake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "rb-paris"}, Spec: corev1.NodeSpec{Taints: []corev1.Taint{ours, other}}})
	n := &providerNode{b: &Bridge{local: cs}, name: "rb-paris", provider: "paris", log: logr.Discard()}

	node, changed, err := n.setUnreachableTaints(ctx, true)
	require.NoError(t, err)
	assert.True(t, changed)
	require.Len(t, node.Spec.Taints, 4)
	assert.Equal(t, []corev1.Taint{ours, other}, node.Spec.Taints[:2], "the other taints kept")
	assert.Equal(t, corev1.TaintNodeUnreachable, node.Spec.Taints[2].Key)
	assert.Equal(t, corev1.TaintEffectNoSchedule, node.Spec.Taints[2].Effect)
	assert.Nil(t, node.Spec.Taints[2].TimeAdded)
	assert.Equal(t, corev1.TaintEffectNoExecute, node.Spec.Taints[3].Effect)
	require.NotNil(t, node.Spec.Taints[3].TimeAdded, "a NoExecute taint says when, as the node lifecycle controller's")
	assert.WithinDuration(t, time.Now(), node.Spec.Taints[3].TimeAdded.Time, 5*time.Second)

	_, changed, err = n.setUnreachableTaints(ctx, true)
	require.NoError(t, err)
	assert.False(t, changed, "already tainted: nothing written")

	node, changed, err = n.setUnreachableTaints(ctx, false)
	require.NoError(t, err)
	assert.True(t, changed)
	assert.Equal(t, []corev1.Taint{ours, other}, node.Spec.Taints)
}
