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

// expireEvery runs Expire every step for d, as the replicas' loops do while
// the broker is up; it returns how many reservations ended.
func expireEvery(t *testing.T, s *store.Store, step, d time.Duration) int64 {
	t.Helper()
	var ended int64
	for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(step) {
		n, _, err := s.Expire(context.Background())
		require.NoError(t, err)
		ended += n
	}
	return ended
}

// TestOutageDoesNotCountAgainstLeases: while no expire run happens for longer
// than OutageGap (every replica down, Redis frozen), leases are not heard and
// must not lapse for it. A lease live when the outage began ends no earlier
// than a whole lease after the broker came back, whether expire or a renewal
// comes first; a fixed-duration reservation is not credited; a lease that is
// then not renewed ends after that lease; a lease that ended before the
// outage stays ended.
func TestOutageDoesNotCountAgainstLeases(t *testing.T) {
	ctx := context.Background()
	const gap, length = 500 * time.Millisecond, 1500 * time.Millisecond
	s := newStore(t, store.Config{OutageGap: gap})
	_, err := s.Advertise(ctx, "paris", cluster(8, 32, 0, 1_000, nil))
	require.NoError(t, err)
	for _, id := range []string{"quiet", "renewer"} {
		_, err = s.Reserve(ctx, lease(id, "rome", 500, length, length))
		require.NoError(t, err)
	}
	fixed := request("fixed", "rome", 500, 1, 0)
	fixed.Duration = length
	_, err = s.Reserve(ctx, fixed)
	require.NoError(t, err)
	_, err = s.Reserve(ctx, lease("before", "rome", 500, 200*time.Millisecond, length))
	require.NoError(t, err)

	// The broker runs: "before" lapses at its hold time, as it should.
	assert.Equal(t, int64(1), expireEvery(t, s, 100*time.Millisecond, 400*time.Millisecond), "before ended while the broker ran")

	// The outage: nothing runs for longer than every lease.
	time.Sleep(2 * length)

	// A renewal comes before any expire run: the outage is still pending in
	// the clock, and the lease is renewed, not refused as ended.
	rn, err := s.Renew(ctx, "rome", []string{"renewer"})
	require.NoError(t, err)
	assert.Equal(t, model.Renewed, rn[0].Outcome, "a lease live when the outage began is renewable after it")
	assert.InDelta(t, length, rn[0].Remaining, float64(100*time.Millisecond))

	res, err := s.ExpireRun(ctx)
	require.NoError(t, err)
	assert.Equal(t, int64(1), res.Expired, "only the fixed-duration reservation ends")
	assert.Equal(t, int64(1), res.Credited, "the quiet lease is credited")
	assert.Greater(t, res.Outage, 2*length, "the outage found is as long as the pause")
	for id, want := range map[string]string{"quiet": model.PhaseReserved, "renewer": model.PhaseReserved, "fixed": model.PhaseExpired, "before": model.PhaseExpired} {
		r, err := s.Reservation(ctx, "rome", id)
		require.NoError(t, err)
		assert.Equal(t, want, r.Phase, id)
	}
	q, err := s.Reservation(ctx, "rome", "quiet")
	require.NoError(t, err)
	// A whole lease from the broker's return, less the time the calls since
	// took (a loaded machine stretches them); uncredited, it would be ended.
	assert.InDelta(t, length, q.Remaining, float64(400*time.Millisecond), "a whole lease from the broker's return")
	assertInvariant(t, s)

	// The broker runs again: a lease nobody renews ends a lease later; the
	// one renewed goes on while renewed.
	stop := time.Now().Add(length + 500*time.Millisecond)
	var ended int64
	for time.Now().Before(stop) {
		ended += expireEvery(t, s, 100*time.Millisecond, 300*time.Millisecond)
		_, err := s.Renew(ctx, "rome", []string{"renewer"})
		require.NoError(t, err)
	}
	assert.Equal(t, int64(1), ended, "the quiet lease ends a lease after the outage")
	q, err = s.Reservation(ctx, "rome", "quiet")
	require.NoError(t, err)
	assert.Equal(t, model.PhaseExpired, q.Phase)
	r, err := s.Reservation(ctx, "rome", "renewer")
	require.NoError(t, err)
	assert.True(t, r.Live(), "renewed after the outage: live")
	assertInvariant(t, s)
}

// TestRenewForProvider: a provider renews a requester's leases placed on it
// (it still hears the requester); another provider, or ids of reservations
// placed elsewhere, are refused as not found and change nothing; while the
// requester renews them itself, the provider's renewal is not needed.
func TestRenewForProvider(t *testing.T) {
	ctx := context.Background()
	s := newStore(t, store.Config{})
	_, err := s.Advertise(ctx, "paris", cluster(8, 32, 0, 1_000, nil))
	require.NoError(t, err)
	// A hold time long enough for the refused calls and snapshots below on
	// a loaded machine: the renewal must find the lease still live.
	d, err := s.Reserve(ctx, lease("web", "rome", 500, 1500*time.Millisecond, 4*time.Second))
	require.NoError(t, err)
	require.Equal(t, "paris", d.Reservation.Target)
	// The reservation vouches for the lease for a third of it, as a renewal
	// does: as if rome had reserved long ago and gone quiet since.
	rn, err := s.RenewFor(ctx, "paris", "rome", []string{"web"})
	require.NoError(t, err)
	assert.Equal(t, model.RenewByRequester, rn[0].Outcome, "rome reserved it just now")
	quiet(t, s, "rome")
	_, err = s.RenewFor(ctx, "", "rome", []string{"web"})
	require.Error(t, err, "a provider must be named")

	before := snapshot(t, s)
	rn, err = s.RenewFor(ctx, "berlin", "rome", []string{"web"})
	require.NoError(t, err)
	assert.Equal(t, model.RenewNotFound, rn[0].Outcome, "berlin does not provide it")
	assert.Equal(t, before, snapshot(t, s), "a refused renewal changes nothing")

	rn, err = s.RenewFor(ctx, "paris", "rome", []string{"web", "nope"})
	require.NoError(t, err)
	assert.Equal(t, model.Renewed, rn[0].Outcome)
	assert.InDelta(t, 4*time.Second, rn[0].Remaining, float64(300*time.Millisecond))
	assert.Equal(t, model.RenewNotFound, rn[1].Outcome)

	time.Sleep(1700 * time.Millisecond) // past the hold time: the renewal carried it
	n, _, err := s.Expire(ctx)
	require.NoError(t, err)
	assert.Zero(t, n)
	r, err := s.Reservation(ctx, "rome", "web")
	require.NoError(t, err)
	assert.True(t, r.Live())
	assertInvariant(t, s)

	// While rome renews its leases itself, a provider's renewal is not
	// needed: nothing is read or written. Once rome has been quiet for a
	// third of a lease (1.3 s), paris renews again.
	rn, err = s.Renew(ctx, "rome", []string{"web"})
	require.NoError(t, err)
	require.Equal(t, model.Renewed, rn[0].Outcome)
	before = snapshot(t, s)
	rn, err = s.RenewFor(ctx, "paris", "rome", []string{"web", "nope"})
	require.NoError(t, err)
	assert.Equal(t, []model.RenewOutcome{model.RenewByRequester, model.RenewByRequester}, []model.RenewOutcome{rn[0].Outcome, rn[1].Outcome})
	assert.Equal(t, before, snapshot(t, s), "nothing changed")
	time.Sleep(1500 * time.Millisecond)
	rn, err = s.RenewFor(ctx, "paris", "rome", []string{"web"})
	require.NoError(t, err)
	assert.Equal(t, model.Renewed, rn[0].Outcome, "rome quiet for a third of a lease")
	assert.InDelta(t, 4*time.Second, rn[0].Remaining, float64(300*time.Millisecond))
	assertInvariant(t, s)
}
