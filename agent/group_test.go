package agent_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/fluidos-project/resource-broker/agent/reservation"
	rbv1 "github.com/fluidos-project/resource-broker/api/v1alpha1"
	"github.com/fluidos-project/resource-broker/internal/brokertest"
)

// TestGangReservedTogether: the 8 members of a gang (minMember 8), on the
// real broker. While 5 exist they wait for the others (WaitingForGroup);
// with 8 and room for 6 they all stay Pending with the broker's reason and
// nothing is reserved; once berlin brings room, all 8 are reserved at once
// and each names the group.
func TestGangReservedTogether(t *testing.T) {
	ctx := context.Background()
	b := brokertest.Start(t, brokertest.Options{})
	rome := newCluster(t, b, "rome")
	b.Advertise("paris", "6", "64Gi", "", "0.03", nil)
	rome.startAgent()

	member := func(i int) *rbv1.Reservation {
		rsv := reservationObj(fmt.Sprintf("train-%d", i), "1", "1Gi")
		rsv.Spec.Group = &rbv1.ReservationGroup{Name: "train", MinMember: 8}
		return rsv
	}
	pendingWith := func(reason, msg string) {
		t.Helper()
		require.EventuallyWithT(t, func(c *assert.CollectT) {
			var list rbv1.ReservationList
			require.NoError(c, rome.client.List(ctx, &list, client.InNamespace("default")))
			for _, rsv := range list.Items {
				assert.Equal(c, rbv1.ReservationPending, rsv.Status.Phase, rsv.Name)
				assert.Equal(c, reason, rsv.Status.Reason, rsv.Name)
				assert.Contains(c, rsv.Status.Message, msg, rsv.Name)
			}
		}, 15*time.Second, 50*time.Millisecond)
	}
	for i := range 5 {
		require.NoError(t, rome.client.Create(ctx, member(i)))
	}
	pendingWith(reservation.ReasonWaitingForGroup, "group default/train has 5 of the 8 members it needs")
	for i := 5; i < 8; i++ {
		require.NoError(t, rome.client.Create(ctx, member(i)))
	}
	pendingWith("NoCapacity", "room for 6 of the 8 members together, 8 needed")
	paris, err := b.Store.Cluster(ctx, "paris")
	require.NoError(t, err)
	assert.Zero(t, paris.Reserved.CPU, "nothing reserved while the group does not fit")

	b.Advertise("berlin", "4", "64Gi", "", "0.05", nil)
	providers := map[string]int{}
	for i := range 8 {
		rsv := rome.waitPhase(fmt.Sprintf("train-%d", i), rbv1.ReservationReserved, 15*time.Second)
		providers[rsv.Status.Provider]++
		at, err := b.Store.Reservation(ctx, "rome", string(rsv.UID))
		require.NoError(t, err)
		assert.Equal(t, "default/train", at.Group)
	}
	assert.Equal(t, map[string]int{"paris": 6, "berlin": 2}, providers)
	require.NoError(t, b.Store.CheckInvariant(ctx))
}
