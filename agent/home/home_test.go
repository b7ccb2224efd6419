package home

import (
	"math"
	"testing"

	"github.com/stretchr/testify/assert"
	appsv1 "k8s.io/api/apps/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/fluidos-project/resource-broker/agent/reservation"
)

func TestDeletionCost(t *testing.T) {
	for _, tc := range []struct {
		micros int64
		want   int32
	}{
		{0, -1},                            // free: still below a local pod
		{31000, -31001},                    // 0.031 per hour
		{-5, -1},                           // never above a local pod
		{math.MaxInt64, math.MinInt32 + 1}, // clamped to what the annotation holds
		{math.MaxInt32 - 1, math.MinInt32 + 1},
	} {
		assert.Equal(t, tc.want, DeletionCost(tc.micros), "%d micro-units", tc.micros)
	}
	assert.Less(t, DeletionCost(80000), DeletionCost(31000), "the dearer provider's pod goes first")
}

func TestPriceRoundTrip(t *testing.T) {
	for _, micros := range []int64{0, 1, 31000, 1234567890, 99999999999999} {
		s := reservation.PricePerHour(micros)
		got, ok := reservation.PriceMicros(s)
		assert.True(t, ok, s)
		assert.Equal(t, micros, got, s)
	}
	_, ok := reservation.PriceMicros("")
	assert.False(t, ok)
	_, ok = reservation.PriceMicros("cheap")
	assert.False(t, ok)
}

func TestSettled(t *testing.T) {
	dep := func(gen, observed int64, replicas, updated, available int32) *appsv1.Deployment {
		return &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Generation: gen}, Spec: appsv1.DeploymentSpec{Replicas: ptr.To(replicas)},
			Status: appsv1.DeploymentStatus{ObservedGeneration: observed, Replicas: replicas, UpdatedReplicas: updated, AvailableReplicas: available}}
	}
	assert.True(t, settled(dep(2, 2, 3, 3, 3)))
	assert.False(t, settled(dep(3, 2, 3, 3, 3)), "a change not yet observed")
	assert.False(t, settled(dep(2, 2, 3, 2, 3)), "rolling out")
	assert.False(t, settled(dep(2, 2, 3, 3, 2)), "a replica unavailable")
}
