package provider

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/client-go/tools/events"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	agentmetrics "github.com/fluidos-project/resource-broker/agent/metrics"
	rbv1 "github.com/fluidos-project/resource-broker/api/v1alpha1"
)

// TestEvictionHeldInStatus: a held eviction is the instruction's condition
// EvictionHeld, counted and reported once per hold however often it is
// looked at, by this agent or by one started afresh; once the requester is
// no longer heard, the pod is evicted and the instruction goes.
func TestEvictionHeldInStatus(t *testing.T) {
	ctx := context.Background()
	ended := instruction("rome", "a", true, time.Now().Add(-time.Hour), EndedLeaseLapsed)
	lease := heartbeatLease("rome", time.Now(), 60)
	c := fake.NewClientBuilder().WithScheme(fakeClient().Scheme()).
		WithObjects(lease, ended, tenantPod("rome", "a", "", corev1.PodRunning)).
		WithStatusSubresource(&rbv1.ProviderInstruction{}).
		WithIndex(&rbv1.ProviderInstruction{}, RequesterIndex, func(o client.Object) []string {
			return []string{o.(*rbv1.ProviderInstruction).Spec.Requester}
		}).Build()
	rec := events.NewFakeRecorder(100)
	agent := func() *evictionReconciler { // a new one is a restarted agent: nothing in memory
		return &evictionReconciler{&TenantReconciler{Client: c, Namespace: "resource-broker", EvictionGrace: time.Second,
			Requesters: &Requesters{Client: c, Reader: c}, Recorder: rec}}
	}
	req := ctrl.Request{NamespacedName: client.ObjectKeyFromObject(ended)}
	counted := func() float64 {
		return testutil.ToFloat64(agentmetrics.EvictionsHeld.WithLabelValues("requester_heard"))
	}
	before := counted()

	r := agent()
	for _, a := range []*evictionReconciler{r, r, agent()} {
		res, err := a.Reconcile(ctx, req)
		require.NoError(t, err)
		assert.Equal(t, heardRecheck, res.RequeueAfter, "held while the requester is heard")
	}
	var pi rbv1.ProviderInstruction
	require.NoError(t, c.Get(ctx, req.NamespacedName, &pi))
	held := meta.FindStatusCondition(pi.Status.Conditions, rbv1.ConditionEvictionHeld)
	require.NotNil(t, held)
	assert.Equal(t, "RequesterHeard", held.Reason)
	assert.Contains(t, held.Message, "still renews its heartbeat")
	assert.Equal(t, before+1, counted(), "one hold, counted once")
	require.Len(t, rec.Events, 1)
	assert.Contains(t, <-rec.Events, "Warning EvictionHeld")

	require.NoError(t, c.Delete(ctx, lease))
	res, err := agent().Reconcile(ctx, req)
	require.NoError(t, err)
	assert.Zero(t, res.RequeueAfter)
	err = c.Get(ctx, req.NamespacedName, &pi)
	assert.True(t, apierrors.IsNotFound(err), "the instruction goes once its pod is evicted: %v", err)
	var pod corev1.Pod
	err = c.Get(ctx, client.ObjectKey{Namespace: "rb-rome", Name: "a-"}, &pod)
	assert.True(t, apierrors.IsNotFound(err), "the pod is evicted: %v", err)
	require.NotEmpty(t, rec.Events)
	assert.Contains(t, <-rec.Events, "Warning Evicted")
}
