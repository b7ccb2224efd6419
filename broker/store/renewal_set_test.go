package store_test

import (
	"context"
	"math"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fluidos-project/resource-broker/broker/model"
	"github.com/fluidos-project/resource-broker/broker/store"
)

// renewalSetFixture: three leases of rome on paris, lease length L, and
// helpers to read what renewals write.
type renewalSetFixture struct {
	t *testing.T
	s *store.Store
}

func newRenewalSetFixture(t *testing.T, length time.Duration, ids ...string) renewalSetFixture {
	return newRenewalSetFixtureWith(t, store.Config{}, length, ids...)
}

func newRenewalSetFixtureWith(t *testing.T, cfg store.Config, length time.Duration, ids ...string) renewalSetFixture {
	ctx := context.Background()
	s := newStore(t, cfg)
	_, err := s.Advertise(ctx, "paris", cluster(8, 32, 0, 1_000, nil))
	require.NoError(t, err)
	for _, id := range ids {
		_, err := s.Reserve(ctx, lease(id, "rome", 100, length, length))
		require.NoError(t, err)
	}
	return renewalSetFixture{t, s}
}

func (f renewalSetFixture) renew(ids ...string) []model.RenewOutcome {
	f.t.Helper()
	rn, err := f.s.Renew(context.Background(), "rome", ids)
	require.NoError(f.t, err)
	out := make([]model.RenewOutcome, len(rn))
	for i, r := range rn {
		out[i] = r.Outcome
	}
	return out
}

// parked is what scores reads for a parked lease (+inf: scripts/expire.lua).
const parked = -1

func (f renewalSetFixture) scores(ids ...string) []int64 {
	f.t.Helper()
	out := make([]int64, len(ids))
	for i, id := range ids {
		score := admin(f.t, f.s).ZScore(context.Background(), f.s.Key("expiry"), "rome/"+id).Val()
		out[i] = int64(score)
		if math.IsInf(score, 1) {
			out[i] = parked
		}
	}
	return out
}

// setEnd is rome's entry in set-ends (0: none).
func (f renewalSetFixture) setEnd() int64 {
	f.t.Helper()
	return int64(admin(f.t, f.s).ZScore(context.Background(), f.s.Key("set-ends"), "rome").Val())
}

func (f renewalSetFixture) end(id string) int64 {
	f.t.Helper()
	r, err := f.s.Reservation(context.Background(), "rome", id)
	require.NoError(f.t, err)
	return r.ExpiresAt.UnixMilli()
}

func (f renewalSetFixture) set() map[string]string {
	return admin(f.t, f.s).HGetAll(context.Background(), f.s.Key("renewal:", "rome")).Val()
}

func renewed(n int) []model.RenewOutcome {
	out := make([]model.RenewOutcome, n)
	for i := range out {
		out[i] = model.Renewed
	}
	return out
}

// TestRenewalSetRenewsTheSameIdsAtOnce: once two renewals in a row named
// the same ids, a renewal naming them, in any order, renews them all at
// once (scripts/lib/renew_set.lua):
// no score moves, every read end does; expiry parks a covered lease before
// its score is due, and ends the set's leases a lease after its last
// renewal once the requester stops.
func TestRenewalSetRenewsTheSameIdsAtOnce(t *testing.T) {
	ctx := context.Background()
	const length = 3 * time.Second
	f := newRenewalSetFixture(t, length, "a", "b", "c")

	require.Equal(t, renewed(3), f.renew("a", "b", "c"), "the first renewal: one by one")
	assert.Empty(t, f.set()["digest"], "ids named once: no set yet")
	assert.Empty(t, f.set()["gen"], "nothing tagged")
	require.Equal(t, renewed(3), f.renew("b", "c", "a"), "the same ids again: one by one, tagged")
	set := f.set()
	require.NotEmpty(t, set["digest"], "every id renewed: the set is committed")
	assert.Equal(t, "3000", set["lease_ms"])
	assert.Empty(t, set["pending"])
	scores := f.scores("a", "b", "c")
	assertInvariant(t, f.s)

	time.Sleep(100 * time.Millisecond)
	rn, err := f.s.Renew(ctx, "rome", []string{"c", "a", "b"})
	require.NoError(t, err)
	for _, r := range rn {
		assert.Equal(t, model.Renewed, r.Outcome)
		assert.Equal(t, length, r.Remaining, "the set's shortest lease")
	}
	assert.Equal(t, scores, f.scores("a", "b", "c"), "the same ids in another order: the set, no score written")
	at := mustInt(t, f.set()["at_ms"])
	for _, id := range []string{"a", "b", "c"} {
		assert.Equal(t, at+length.Milliseconds(), f.end(id), "each lease lives a lease after the set's renewal")
	}
	assertInvariant(t, f.s)

	// Expiry parks the covered leases ahead of their scores, and ends nothing.
	res, err := f.s.ExpireRun(ctx)
	require.NoError(t, err)
	assert.Zero(t, res.Expired)
	assert.EqualValues(t, 3, res.Parked)
	assert.Zero(t, res.Moved)
	want := at + length.Milliseconds()
	assert.Equal(t, []int64{parked, parked, parked}, f.scores("a", "b", "c"))
	assert.Equal(t, want, f.setEnd(), "the set's end stands for them")
	for _, id := range []string{"a", "b", "c"} {
		assert.Equal(t, want, f.end(id), "a parked lease's end is the set's")
	}
	assertInvariant(t, f.s)

	// The requester stops: its leases end a lease after the set's last renewal.
	time.Sleep(time.Until(time.UnixMilli(want)) + 50*time.Millisecond)
	res, err = f.s.ExpireRun(ctx)
	require.NoError(t, err)
	assert.EqualValues(t, 3, res.Unparked)
	assert.EqualValues(t, 3, res.Expired)
	assert.Zero(t, f.setEnd())
	for _, id := range []string{"a", "b", "c"} {
		assert.Equal(t, want, f.end(id), "ended at the set's end")
	}
	assert.Empty(t, f.set(), "the set goes with the last lease")
	assert.Equal(t, []model.RenewOutcome{model.RenewEnded, model.RenewEnded}, f.renew("a", "b"))
	assertInvariant(t, f.s)
}

// parkedSet renews ids until they are rome's set, renews the set at once
// (its ends past the scores) and lets expiry park them.
func (f renewalSetFixture) parkedSet(ids ...string) {
	f.t.Helper()
	for range 2 {
		require.Equal(f.t, renewed(len(ids)), f.renew(ids...))
	}
	time.Sleep(5 * time.Millisecond)
	require.Equal(f.t, renewed(len(ids)), f.renew(ids...))
	res, err := f.s.ExpireRun(context.Background())
	require.NoError(f.t, err)
	require.EqualValues(f.t, len(ids), res.Parked)
	assertInvariant(f.t, f.s)
}

// TestRenewalSetParkedLeases: a parked lease's end is its set's, moved by
// the set's renewals (set-ends with it, no score written); a provider
// renewing for a requester that went quiet gives the lease its own end past
// the set's, so that when the requester stops for good the set's other
// leases end at the set's end and that one at its own.
func TestRenewalSetParkedLeases(t *testing.T) {
	ctx := context.Background()
	const length = 2 * time.Second
	f := newRenewalSetFixture(t, length, "a", "b", "c") // expiry looks 10 s ahead: every lease
	f.parkedSet("a", "b", "c")

	time.Sleep(50 * time.Millisecond)
	require.Equal(t, renewed(3), f.renew("c", "b", "a"))
	at := mustInt(t, f.set()["at_ms"])
	assert.Equal(t, []int64{parked, parked, parked}, f.scores("a", "b", "c"), "no score written")
	assert.Equal(t, at+length.Milliseconds(), f.setEnd(), "the set's end moved with its renewal")
	assert.Equal(t, at+length.Milliseconds(), f.end("a"))
	res, err := f.s.ExpireRun(ctx)
	require.NoError(t, err)
	assert.Zero(t, res.Expired+res.Parked+res.Unparked+res.Moved, "nothing for expiry to read")

	// rome goes quiet (a third of a lease): paris renews b for it.
	time.Sleep(time.Until(time.UnixMilli(at+length.Milliseconds()/3)) + 50*time.Millisecond)
	rn, err := f.s.RenewFor(ctx, "paris", "rome", []string{"b"})
	require.NoError(t, err)
	require.Equal(t, model.Renewed, rn[0].Outcome)
	endB := f.scores("b")[0]
	assert.Greater(t, endB, at+length.Milliseconds(), "its own end again, past the set's")
	assert.Equal(t, endB, f.end("b"))
	assertInvariant(t, f.s)

	// rome stops: a and c end at the set's end, b at its own.
	time.Sleep(time.Until(time.UnixMilli(at+length.Milliseconds())) + 50*time.Millisecond)
	res, err = f.s.ExpireRun(ctx)
	require.NoError(t, err)
	assert.EqualValues(t, 2, res.Unparked)
	assert.EqualValues(t, 2, res.Expired)
	assert.Zero(t, f.setEnd())
	for _, id := range []string{"a", "c"} {
		assert.Equal(t, at+length.Milliseconds(), f.end(id), "%s ended at the set's end", id)
	}
	r, err := f.s.Reservation(ctx, "rome", "b")
	require.NoError(t, err)
	assert.True(t, r.Live(), "b lives on the provider's renewal")
	assertInvariant(t, f.s)
	time.Sleep(time.Until(time.UnixMilli(endB)) + 50*time.Millisecond)
	res, err = f.s.ExpireRun(ctx)
	require.NoError(t, err)
	assert.EqualValues(t, 1, res.Expired)
	assert.Equal(t, endB, f.end("b"))
	assertInvariant(t, f.s)
}

// TestRenewalSetParkedLeasesGetTheirEndsBack: a renewal naming a parked
// lease alone gives it its own end; a new generation of the set writes the
// ends the old one gave its parked leases into their scores (set-ends goes).
func TestRenewalSetParkedLeasesGetTheirEndsBack(t *testing.T) {
	const length = time.Hour // expiry looks two hours ahead: every lease
	f := newRenewalSetFixtureWith(t, store.Config{OutageGap: time.Hour}, length, "a", "b", "c")
	f.parkedSet("a", "b", "c")
	at := mustInt(t, f.set()["at_ms"])
	digest := f.set()["digest"]

	require.Equal(t, renewed(1), f.renew("c"))
	assert.Equal(t, digest, f.set()["digest"], "the set stays")
	assert.Equal(t, []int64{parked, parked}, f.scores("a", "b"))
	assert.Greater(t, f.scores("c")[0], at+length.Milliseconds(), "named alone: its own end")
	assertInvariant(t, f.s)

	require.Equal(t, renewed(1), f.renew("a"))
	require.Equal(t, renewed(1), f.renew("a")) // a new generation: the set of a
	assert.NotEqual(t, digest, f.set()["digest"])
	assert.Equal(t, at+length.Milliseconds(), f.scores("b")[0], "b keeps the end the old set gave it, written back")
	assert.Equal(t, at+length.Milliseconds(), f.end("b"))
	assert.Zero(t, f.setEnd(), "nothing parked")
	assertInvariant(t, f.s)
}

// TestInvariantFindsBrokenParkedLeases: CheckInvariant reports a parked
// lease its requester's set does not cover, one whose set has no end in
// set-ends, and a set-ends entry without its set.
func TestInvariantFindsBrokenParkedLeases(t *testing.T) {
	ctx := context.Background()
	f := newRenewalSetFixtureWith(t, store.Config{OutageGap: time.Hour}, time.Hour, "a", "b")
	f.parkedSet("a", "b")
	rdb := admin(t, f.s)
	entry := strings.Fields(rdb.HGet(ctx, f.s.Key("leases:", "rome"), "rome/a").Val())
	require.Len(t, entry, 3)
	entry[2] = "1" // an older generation's
	require.NoError(t, rdb.HSet(ctx, f.s.Key("leases:", "rome"), "rome/a", strings.Join(entry, " ")).Err())
	err := f.s.CheckInvariant(ctx)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "lease rome/a parked, but its entry")

	require.NoError(t, rdb.ZRem(ctx, f.s.Key("set-ends"), "rome").Err())
	require.NoError(t, rdb.ZAdd(ctx, f.s.Key("set-ends"), redis.Z{Score: 1, Member: "oslo"}).Err())
	err = f.s.CheckInvariant(ctx)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "lease rome/b parked until")
	assert.Contains(t, err.Error(), "requester oslo: set-ends entry 1 without a renewal set")
}

// TestRenewalSetChanges: a lease of the set that ends leaves it, so a
// renewal still naming it is full and tells the requester, and one without
// it is the set's; a renewal of fewer ids leaves the set covering the rest
// until those ids are named again and open a new set, and the lease left
// out keeps the end the old set gave it; a provider renewing for the
// requester keeps the set.
func TestRenewalSetChanges(t *testing.T) {
	ctx := context.Background()
	const length = time.Hour
	f := newRenewalSetFixture(t, length, "a", "b", "c")
	for range 3 {
		require.Equal(t, renewed(3), f.renew("a", "b", "c"))
	}
	require.NotEmpty(t, f.set()["digest"])

	_, err := f.s.Release(ctx, "rome", "c", "paris")
	require.NoError(t, err)
	assert.Equal(t, store.RenewalDigest([]string{"a", "b"}), f.set()["digest"], "c left the set")
	assert.Equal(t, []model.RenewOutcome{model.Renewed, model.Renewed, model.RenewEnded}, f.renew("a", "b", "c"),
		"a renewal still naming c judges every id")
	assertInvariant(t, f.s)
	before := f.scores("a", "b")
	time.Sleep(20 * time.Millisecond)
	require.Equal(t, renewed(2), f.renew("a", "b"))
	assert.Equal(t, before, f.scores("a", "b"), "the set's ids: renewed at once, no score written")

	// The set renews a and b at once; then the renewals name only a.
	time.Sleep(20 * time.Millisecond)
	require.Equal(t, renewed(2), f.renew("b", "a"))
	endB := f.end("b")
	assert.Greater(t, endB, f.scores("b")[0], "renewed by the set alone")
	time.Sleep(20 * time.Millisecond)
	require.Equal(t, renewed(1), f.renew("a"))
	assert.Equal(t, endB, f.end("b"), "left out, b is still the set's")
	assert.Less(t, f.scores("b")[0], endB, "and its score is left behind")
	assert.Greater(t, f.end("a"), endB)
	time.Sleep(20 * time.Millisecond)
	require.Equal(t, renewed(1), f.renew("a"))
	assert.Equal(t, endB, f.end("b"), "not in the new set: b keeps the end the old one gave it")
	assert.Equal(t, endB, f.scores("b")[0], "written to its score")
	assertInvariant(t, f.s)

	// A provider renewing for rome keeps rome's set.
	require.Equal(t, renewed(1), f.renew("a"))
	digest := f.set()["digest"]
	require.NotEmpty(t, digest)
	quiet(t, f.s, "rome")
	rn, err := f.s.RenewFor(ctx, "paris", "rome", []string{"a"})
	require.NoError(t, err)
	assert.Equal(t, model.Renewed, rn[0].Outcome)
	assert.Equal(t, digest, f.set()["digest"])
	require.Equal(t, renewed(1), f.renew("a"))
	assertInvariant(t, f.s)
}

// TestRenewalSetThroughChurn: a lease reserved while its requester holds a
// set joins it, and one that ends leaves it: the requester's next renewal,
// naming the leases it then holds, is still the set's (no score written),
// however its pods come and go.
func TestRenewalSetThroughChurn(t *testing.T) {
	ctx := context.Background()
	f := newRenewalSetFixture(t, time.Hour, "a", "b")
	for range 3 {
		require.Equal(t, renewed(2), f.renew("a", "b"))
	}
	time.Sleep(20 * time.Millisecond)
	require.Equal(t, renewed(2), f.renew("a", "b")) // the set's ends now past the scores
	gen := f.set()["gen"]
	require.NotEmpty(t, gen)

	_, err := f.s.Reserve(ctx, lease("c", "rome", 100, 30*time.Minute, 30*time.Minute))
	require.NoError(t, err)
	assert.Equal(t, store.RenewalDigest([]string{"a", "b", "c"}), f.set()["digest"], "c joined the set")
	assert.Equal(t, strconv.FormatInt((30*time.Minute).Milliseconds(), 10), f.set()["lease_ms"], "the set's shortest lease")
	entry := admin(t, f.s).HGet(ctx, f.s.Key("leases:", "rome"), "rome/c").Val()
	assert.Regexp(t, "^[0-9]+ [0-9]+ "+gen+"$", entry, "tagged with the set's generation")
	assertInvariant(t, f.s)

	// The agent renews a pod just bound at once, alone: the set stays.
	aBefore := f.scores("a")
	require.Equal(t, renewed(1), f.renew("c"))
	assert.Equal(t, store.RenewalDigest([]string{"a", "b", "c"}), f.set()["digest"])
	assert.Equal(t, aBefore, f.scores("a"), "the set's ends not written")

	before, endC := f.scores("a", "b", "c"), f.end("c")
	time.Sleep(20 * time.Millisecond)
	require.Equal(t, renewed(3), f.renew("c", "a", "b"))
	assert.Equal(t, before, f.scores("a", "b", "c"), "renewed by the set alone")
	assert.Greater(t, f.end("c"), endC)

	_, err = f.s.Release(ctx, "rome", "a", "paris")
	require.NoError(t, err)
	assert.Equal(t, store.RenewalDigest([]string{"b", "c"}), f.set()["digest"], "a left the set")
	before = f.scores("b", "c")
	time.Sleep(20 * time.Millisecond)
	require.Equal(t, renewed(2), f.renew("b", "c"))
	assert.Equal(t, before, f.scores("b", "c"), "renewed by the set alone")
	assertInvariant(t, f.s)

	// A lease of a requester with no set, or while a full renewal is
	// pending, joins nothing.
	_, err = f.s.Reserve(ctx, lease("x", "oslo", 100, time.Hour, time.Hour))
	require.NoError(t, err)
	oslo := admin(t, f.s).HGetAll(ctx, f.s.Key("renewal:", "oslo")).Val()
	assert.Empty(t, oslo["digest"], "no set to join")
	assert.Empty(t, oslo["gen"])
	assert.NotEmpty(t, oslo["called_ms"], "the reservation vouches for its lease")
	pending, err := f.s.OpenRenewalSet(ctx, "rome", []string{"b"})
	require.NoError(t, err)
	require.Zero(t, pending)
	pending, err = f.s.OpenRenewalSet(ctx, "rome", []string{"b"})
	require.NoError(t, err)
	require.Positive(t, pending)
	_, err = f.s.Reserve(ctx, lease("d", "rome", 100, time.Hour, time.Hour))
	require.NoError(t, err)
	entry = admin(t, f.s).HGet(ctx, f.s.Key("leases:", "rome"), "rome/d").Val()
	assert.Regexp(t, "^[0-9]+ [0-9]+$", entry, "no generation while a full renewal is pending")
	assertInvariant(t, f.s)
}

// TestRenewalSetCommitRefusedWhenALeaseEnded: a full renewal under way does
// not become the set if a lease it renewed ended before its commit, nor if a
// newer full renewal opened another generation; the leases it renewed keep
// their ends.
func TestRenewalSetCommitRefusedWhenALeaseEnded(t *testing.T) {
	ctx := context.Background()
	f := newRenewalSetFixture(t, time.Hour, "a", "b")
	ids := []string{"a", "b"}

	gen, err := f.s.OpenRenewalSet(ctx, "rome", ids)
	require.NoError(t, err)
	require.Zero(t, gen, "named once: no set opened")
	gen, err = f.s.OpenRenewalSet(ctx, "rome", ids)
	require.NoError(t, err)
	require.Positive(t, gen, "named twice in a row: a set opened")
	require.NoError(t, f.s.RenewTagged(ctx, "rome", gen, ids))
	_, err = f.s.Release(ctx, "rome", "b", "paris")
	require.NoError(t, err)
	ok, err := f.s.CommitRenewalSet(ctx, "rome", ids, gen, time.Hour.Milliseconds())
	require.NoError(t, err)
	assert.False(t, ok, "b ended between the renewal and its commit")
	assert.Equal(t, []model.RenewOutcome{model.Renewed, model.RenewEnded}, f.renew("a", "b"))

	_, err = f.s.OpenRenewalSet(ctx, "rome", []string{"a"})
	require.NoError(t, err)
	first, err := f.s.OpenRenewalSet(ctx, "rome", []string{"a"})
	require.NoError(t, err)
	require.Positive(t, first)
	var second int64
	for second == 0 { // a set of the same ids opened again, by another pass
		second, err = f.s.OpenRenewalSet(ctx, "rome", []string{"a"})
		require.NoError(t, err)
	}
	assert.Greater(t, second, first)
	require.NoError(t, f.s.RenewTagged(ctx, "rome", first, []string{"a"}))
	ok, err = f.s.CommitRenewalSet(ctx, "rome", []string{"a"}, first, time.Hour.Milliseconds())
	require.NoError(t, err)
	assert.False(t, ok, "a newer generation was opened")
	assert.Empty(t, f.set()["digest"])
	assertInvariant(t, f.s)
}

// quiet makes requester's last renewal as old as if it had stopped renewing
// for a lease, so that a provider's renewal for it is made
// (store.RenewFor); its leases keep their ends.
func quiet(t *testing.T, s *store.Store, requester string) {
	t.Helper()
	require.NoError(t, admin(t, s).HSet(context.Background(), s.Key("renewal:", requester), "at_ms", 0, "called_ms", 0).Err())
}

func mustInt(t *testing.T, s string) int64 {
	t.Helper()
	n, err := strconv.ParseInt(s, 10, 64)
	require.NoError(t, err)
	return n
}

// TestRenewalSetThroughAnOutage: leases a renewal set covers, live when a
// broker outage began (no expire run for longer than the outage gap, and
// longer than a lease), get a whole lease after the broker's return like
// any other lease, and their next renewal renews them.
func TestRenewalSetThroughAnOutage(t *testing.T) {
	ctx := context.Background()
	const gap, length = 500 * time.Millisecond, 1500 * time.Millisecond
	s := newStore(t, store.Config{OutageGap: gap})
	_, err := s.Advertise(ctx, "paris", cluster(8, 32, 0, 1_000, nil))
	require.NoError(t, err)
	for _, id := range []string{"a", "b"} {
		_, err := s.Reserve(ctx, lease(id, "rome", 100, length, length))
		require.NoError(t, err)
	}
	f := renewalSetFixture{t, s}
	for range 3 {
		require.Equal(t, renewed(2), f.renew("a", "b"))
	}
	require.Equal(t, "1", f.set()["renewed"], "renewed at once")
	_, err = s.ExpireRun(ctx) // stamps the clock: the broker runs
	require.NoError(t, err)

	time.Sleep(2 * length) // the outage: nothing runs

	res, err := s.ExpireRun(ctx)
	require.NoError(t, err)
	assert.Zero(t, res.Expired, "covered leases live when the outage began are not ended")
	assert.EqualValues(t, 2, res.Credited)
	for _, id := range []string{"a", "b"} {
		r, err := s.Reservation(ctx, "rome", id)
		require.NoError(t, err)
		assert.True(t, r.Live(), id)
		assert.InDelta(t, length, r.Remaining, float64(400*time.Millisecond), "a whole lease from the broker's return: %s", id)
	}
	assert.Equal(t, renewed(2), f.renew("b", "a"), "renewed after the outage")
	assert.Equal(t, renewed(2), f.renew("a", "b"))
	assertInvariant(t, s)
}

// TestInvariantFindsBrokenLeaseEntries: CheckInvariant reports a leases
// entry that disagrees with its record, one that names no live lease, a live
// lease without one, and a set's digest that is not its leases'.
func TestInvariantFindsBrokenLeaseEntries(t *testing.T) {
	ctx := context.Background()
	f := newRenewalSetFixture(t, time.Hour, "a", "b", "c")
	for range 3 {
		require.Equal(t, renewed(3), f.renew("a", "b", "c"))
	}
	assertInvariant(t, f.s)
	rdb, lk := admin(t, f.s), f.s.Key("leases:", "rome")
	require.NoError(t, rdb.HSet(ctx, lk, "rome/a", "120000 1 "+f.set()["gen"]).Err())
	require.NoError(t, rdb.HDel(ctx, lk, "rome/b").Err())
	require.NoError(t, rdb.HSet(ctx, lk, "rome/ghost", "120000 1").Err())
	require.NoError(t, rdb.HSet(ctx, f.s.Key("renewal:", "rome"), "digest", store.RenewalDigest([]string{"a", "b"})).Err())
	err := f.s.CheckInvariant(ctx)
	require.Error(t, err)
	for _, want := range []string{
		`leases entry rome/a = "120000 1 `, "its record says",
		"live lease rome/b has no leases entry",
		`leases entry rome/ghost = "120000 1" names no live lease`,
		"renewal set digest",
	} {
		assert.Contains(t, err.Error(), want)
	}
}
