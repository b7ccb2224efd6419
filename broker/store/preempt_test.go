package store_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fluidos-project/resource-broker/broker/model"
	"github.com/fluidos-project/resource-broker/broker/store"
)

func prioritized(id, requester string, milli int64, priority int32) model.ReserveRequest {
	r := request(id, requester, milli, 1, 0)
	r.Priority = priority
	return r
}

// TestPreemptFewestLowestPriority: paris's node p1 (4 CPUs) is full with
// a (priority 1, 1 CPU), b (5, 1 CPU) and c (1, 2 CPUs); p2 (2 CPUs) holds
// one reservation of priority 100. A 2-CPU request of priority 8 takes
// exactly c (one victim of the lowest priority, rather than a and b), which
// ends Released with preempted_by, its requester and provider get a
// Preempted event naming who took it; the request is reserved on p1 in the
// same step; the audit says why; the invariants hold.
func TestPreemptFewestLowestPriority(t *testing.T) {
	ctx := context.Background()
	s := newStore(t, store.Config{})
	advertise(t, s, "paris", withNodes(30_000, node("p1", 4000, 4000, 0), node("p2", 2000, 2000, 0)))
	for _, r := range []model.ReserveRequest{prioritized("a", "rome", 1000, 1), prioritized("b", "lyon", 1000, 5),
		prioritized("c", "lyon", 2000, 1), prioritized("d", "rome", 2000, 100)} {
		_, err := s.Reserve(ctx, r)
		require.NoError(t, err)
	}
	cursor, err := s.EventCursor(ctx, "lyon", "$")
	require.NoError(t, err)

	urgent := prioritized("urgent", "milan", 2000, 8)
	_, err = s.Reserve(ctx, urgent)
	var nf *store.NoFitError
	require.ErrorAs(t, err, &nf, "fits nowhere without preemption")
	d, err := s.Preempt(ctx, urgent)
	require.NoError(t, err)
	require.Len(t, d.Victims, 1)
	assert.Equal(t, "c", d.Victims[0].Reservation)
	assert.Equal(t, "lyon", d.Victims[0].Requester)
	assert.Equal(t, int32(1), d.Victims[0].Priority)
	assert.Equal(t, "paris", d.Reservation.Target)
	assert.Equal(t, "p1", d.Reservation.Node)
	assert.Contains(t, d.Reason, "took 1 reservation(s) of priority below 8 on paris/p1")

	c, err := s.Reservation(ctx, "lyon", "c")
	require.NoError(t, err)
	assert.Equal(t, model.PhaseReleased, c.Phase)
	for _, id := range []string{"a", "b"} {
		requester := map[string]string{"a": "rome", "b": "lyon"}[id]
		r, err := s.Reservation(ctx, requester, id)
		require.NoError(t, err)
		assert.True(t, r.Live(), "%s is spared", id)
	}
	events, err := s.ReadEvents(ctx, "lyon", cursor, 10, 0)
	require.NoError(t, err)
	var types []string
	for _, e := range events {
		types = append(types, e.Type)
	}
	assert.Equal(t, []string{"Released", "Preempted"}, types)
	a := lastAudit(t, s)
	assert.Equal(t, "preempted", a["outcome"])
	assert.Contains(t, a["victims"], `"reservation":"c"`)
	require.NoError(t, s.CheckInvariant(ctx))

	again, err := s.Preempt(ctx, urgent)
	require.NoError(t, err)
	assert.True(t, again.Replayed)
	assert.Empty(t, again.Victims)
}

// TestPreemptRefusals: nothing is preempted for a request that fits as it
// is, nor for one that capacity expiring within the grace period would
// hold (it waits), nor when no lower-priority reservations make room.
func TestPreemptRefusals(t *testing.T) {
	ctx := context.Background()
	s := newStore(t, store.Config{})
	advertise(t, s, "paris", withNodes(30_000, node("p1", 4000, 4000, 0)))
	_, err := s.Preempt(ctx, prioritized("x", "milan", 1000, 10))
	assert.ErrorIs(t, err, store.ErrFitsWithoutPreemption)

	_, err = s.Reserve(ctx, prioritized("high", "rome", 3000, 50))
	require.NoError(t, err)
	short := prioritized("short", "rome", 1000, 1)
	short.Duration = 10 * time.Second // ends within the grace
	_, err = s.Reserve(ctx, short)
	require.NoError(t, err)
	_, err = s.Preempt(ctx, prioritized("y", "milan", 1000, 10))
	assert.ErrorIs(t, err, store.ErrCapacityComing)

	_, err = s.Preempt(ctx, prioritized("z", "milan", 2000, 10))
	var nf *store.NoFitError
	require.ErrorAs(t, err, &nf, "high (priority 50) is not a victim of priority 10")
	assert.Equal(t, int64(1), nf.Rejected["lower_priority_reservations"])
	require.NoError(t, s.CheckInvariant(ctx))
}

// TestPreemptListedVictim: the victim's pod runs on the node (the provider
// listed it, so the node's used figures count it): preempting it lowers
// those figures with it, and the broker's debit for the new reservation
// stays within the node's advertised free capacity.
func TestPreemptListedVictim(t *testing.T) {
	ctx := context.Background()
	s := newStore(t, store.Config{})
	p1 := node("p1", 2000, 2000, 0)
	advertise(t, s, "paris", withNodes(30_000, p1))
	_, err := s.Reserve(ctx, prioritized("low", "rome", 2000, 1))
	require.NoError(t, err)
	running := p1
	running.Allocated.CPU += 2000
	ad := withNodes(30_000, running)
	ad.Allocated = withNodes(30_000, p1).Allocated
	ad.ReservationsOnNodes = []string{"rome/low"}
	advertise(t, s, "paris", ad)
	require.NoError(t, s.CheckInvariant(ctx))

	d, err := s.Preempt(ctx, prioritized("high", "milan", 2000, 9))
	require.NoError(t, err)
	require.Len(t, d.Victims, 1)
	assert.Equal(t, "low", d.Victims[0].Reservation)
	c, err := s.Cluster(ctx, "paris")
	require.NoError(t, err)
	assert.Equal(t, int64(0), c.StoredNodes()[0].Free().CPU, "the new reservation holds what the victim's pod held")
	require.NoError(t, s.CheckInvariant(ctx))
}

// TestReservePreempts: Reserve with Preempt set preempts when the request
// fits nowhere (the decision names the victims); without it, it waits.
func TestReservePreempts(t *testing.T) {
	ctx := context.Background()
	s := newStore(t, store.Config{})
	advertise(t, s, "paris", withNodes(30_000, node("p1", 2000, 2000, 0)))
	_, err := s.Reserve(ctx, prioritized("low", "rome", 2000, 1))
	require.NoError(t, err)
	_, err = s.Reserve(ctx, prioritized("polite", "milan", 2000, 9))
	var nf *store.NoFitError
	require.ErrorAs(t, err, &nf, "no preemption unless asked")
	req := prioritized("urgent", "milan", 2000, 9)
	req.Preempt = true
	d, err := s.Reserve(ctx, req)
	require.NoError(t, err)
	require.Len(t, d.Victims, 1)
	assert.Equal(t, "low", d.Victims[0].Reservation)
	require.NoError(t, s.CheckInvariant(ctx))
}

// TestPreemptSparesProtected: the lowest-priority reservation is protected
// by its pod's disruption budget (its requester reported it): the next one
// up is taken instead; with both protected, nothing is, and the refusal
// says why.
func TestPreemptSparesProtected(t *testing.T) {
	ctx := context.Background()
	s := newStore(t, store.Config{})
	advertise(t, s, "paris", withNodes(30_000, node("p1", 2000, 2000, 0), node("p2", 2000, 2000, 0)))
	_, err := s.Reserve(ctx, prioritized("lowest", "rome", 2000, 1))
	require.NoError(t, err)
	_, err = s.Reserve(ctx, prioritized("low", "lyon", 2000, 2))
	require.NoError(t, err)
	n, err := s.Protect(ctx, "rome", []string{"lowest"})
	require.NoError(t, err)
	assert.Equal(t, int64(1), n)

	d, err := s.Preempt(ctx, prioritized("urgent", "milan", 2000, 9))
	require.NoError(t, err)
	require.Len(t, d.Victims, 1)
	assert.Equal(t, "low", d.Victims[0].Reservation, "lowest is protected")

	_, err = s.Protect(ctx, "milan", []string{"urgent"})
	require.NoError(t, err)
	_, err = s.Preempt(ctx, prioritized("more", "milan", 2000, 50))
	var nf *store.NoFitError
	require.ErrorAs(t, err, &nf)
	assert.Equal(t, int64(2), nf.Rejected["protected_by_disruption_budget"])
	require.NoError(t, s.CheckInvariant(ctx))
}
