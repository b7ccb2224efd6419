package store_test

import (
	"context"
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

// indexEntries is what the candidate index holds for cluster id, key by
// key, but its liveness (idx:live, which every advertisement refreshes) and
// the change feed of the replicas' views (idx:changes, idx:feed).
func indexEntries(t *testing.T, s *store.Store, id string) map[string]string {
	t.Helper()
	ctx := context.Background()
	a := admin(t, s)
	keys, err := a.Keys(ctx, s.Key("idx:*")).Result()
	require.NoError(t, err)
	out := map[string]string{}
	for _, k := range keys {
		switch k {
		case s.Key("idx:live"), s.Key("idx:version"), s.Key("idx:changes"), s.Key("idx:feed"):
			continue // liveness, the layout and the change feed number changes: not what is indexed
		}
		switch a.Type(ctx, k).Val() {
		case "zset":
			if v, err := a.ZScore(ctx, k, id).Result(); err == nil {
				out[k] = strconv.FormatFloat(v, 'g', -1, 64)
			}
		case "hash":
			if v, err := a.HGet(ctx, k, id).Result(); err == nil {
				out[k] = v
			}
		case "set":
			if a.SIsMember(ctx, k, id).Val() {
				out[k] = "member"
			}
		}
	}
	return out
}

// commandsOf counts the Redis commands advertise runs (INFO commandstats,
// which counts the commands a script calls under their own names).
func commandsOf(t *testing.T, s *store.Store, id string, ad model.Advertisement) (model.Ack, map[string]int64) {
	t.Helper()
	ctx := context.Background()
	require.NoError(t, admin(t, s).ConfigResetStat(ctx).Err())
	ack, err := s.Advertise(ctx, id, ad)
	require.NoError(t, err)
	out := map[string]int64{}
	for cmd, st := range readStats(t, s.Client().(*redis.Client)) {
		out[cmd] = st.calls
	}
	return ack, out
}

// writesOf keeps the writing commands of counts.
func writesOf(counts map[string]int64) map[string]int64 {
	out := map[string]int64{}
	for _, cmd := range []string{"hset", "hsetnx", "hdel", "del", "zadd", "zrem", "sadd", "srem", "xadd", "pexpire"} {
		if counts[cmd] > 0 {
			out[cmd] = counts[cmd]
		}
	}
	return out
}

func liveScore(t *testing.T, s *store.Store, id string) float64 {
	t.Helper()
	v, err := s.Client().ZScore(context.Background(), s.Key("idx:live"), id).Result()
	require.NoError(t, err)
	return v
}

// TestHeartbeatAdvertisement: an advertisement that changes nothing a
// decision reads (same fields, same node figures, same listed reservations)
// refreshes the cluster's liveness and writes nothing else: the index is
// not rewritten and nobody waiting is told. A changed figure, a changed
// listing and a cluster back from stale are indexed again, and tell the
// waiting requests when they add capacity.
func TestHeartbeatAdvertisement(t *testing.T) {
	ctx := context.Background()
	const stale = time.Second
	s := newStore(t, store.Config{StaleThreshold: stale, WaitTTL: time.Minute})
	nodes := []model.NodeCapacity{node("p1", 4000, 1000, 0), node("p2", 4000, 1000, 0)}
	paris := func() model.Advertisement {
		ad := withNodes(10_000, nodes...)
		ad.Labels = map[string]string{"region": "eu"}
		return ad
	}
	first, err := s.Advertise(ctx, "paris", paris())
	require.NoError(t, err)
	placed, err := s.Reserve(ctx, request("placed", "lyon", 500, 1, 0))
	require.NoError(t, err)
	var nf *store.NoFitError
	_, err = s.Reserve(ctx, request("big", "rome", 2000, 1, 0)) // no node holds 2 cores: it waits
	require.ErrorAs(t, err, &nf)
	told := func() int { return strings.Count(strings.Join(eventTypes(t, s, "rome"), " "), "CapacityAvailable:big") }
	require.Zero(t, told())
	heartbeat := map[string]int64{"hset": 1, "zadd": 2} // seen_ms in the cluster hash, clusters, idx:live

	// The same advertisement again: liveness only.
	before, seen := indexEntries(t, s, "paris"), liveScore(t, s, "paris")
	time.Sleep(5 * time.Millisecond) // a later seen_ms
	ack, counts := commandsOf(t, s, "paris", paris())
	assert.Equal(t, heartbeat, writesOf(counts), "nothing but liveness written (all commands: %v)", counts)
	assert.Equal(t, before, indexEntries(t, s, "paris"), "the index entries are those of before")
	assert.Greater(t, liveScore(t, s, "paris"), seen, "liveness refreshed")
	c, err := s.Cluster(ctx, "paris")
	require.NoError(t, err)
	assert.Equal(t, ack.SeenAt, c.SeenAt)
	assert.True(t, ack.SeenAt.After(first.SeenAt))
	assert.Equal(t, placed.Reservation.Resources, ack.Reserved, "the reply as ever: what is reserved")
	assert.Equal(t, map[string]model.Resources{placed.Reservation.Node: placed.Reservation.Resources}, ack.NodesReserved)
	assert.Zero(t, told(), "nothing changed: nobody told")
	require.NoError(t, s.CheckInvariant(ctx))

	// A figure that shrinks: indexed again; nobody told (no capacity added).
	nodes[0].Allocatable.Memory -= gi
	_, counts = commandsOf(t, s, "paris", paris())
	assert.Greater(t, counts["zadd"], heartbeat["zadd"], "the index is rewritten: %v", counts)
	assert.NotEqual(t, before, indexEntries(t, s, "paris"))
	assert.Zero(t, told())
	require.NoError(t, s.CheckInvariant(ctx))

	// A figure that grows: indexed again, and the waiting request is told.
	nodes[1].Allocated.CPU = 1000
	_, counts = commandsOf(t, s, "paris", paris())
	assert.Greater(t, counts["zadd"], heartbeat["zadd"], "the index is rewritten: %v", counts)
	assert.Equal(t, 1, told(), "p2 holds 2 cores now")
	_, counts = commandsOf(t, s, "paris", paris())
	assert.Equal(t, heartbeat, writesOf(counts), "and repeated, a heartbeat again")
	assert.Equal(t, 1, told())
	require.NoError(t, s.CheckInvariant(ctx))

	// The same figures, now listing the reservation placed there: its node's
	// debit goes, so the node has more free capacity: indexed again, told.
	// The same listing again is a heartbeat.
	withListing := func() model.Advertisement {
		ad := paris()
		ad.ReservationsOnNodes = []string{"lyon/placed"}
		return ad
	}
	before = indexEntries(t, s, "paris")
	ack, counts = commandsOf(t, s, "paris", withListing())
	assert.Greater(t, counts["zadd"], heartbeat["zadd"], "the index is rewritten: %v", counts)
	assert.NotEqual(t, before, indexEntries(t, s, "paris"), "the node record has the debit no more")
	assert.Empty(t, ack.NodesReserved)
	assert.Equal(t, 2, told())
	_, counts = commandsOf(t, s, "paris", withListing())
	assert.Equal(t, heartbeat, writesOf(counts))
	require.NoError(t, s.CheckInvariant(ctx))

	// Back from stale: a decision dropped paris from the index (it waited
	// too long), so the very same advertisement indexes it again, as it was,
	// and tells the waiting requests.
	before = indexEntries(t, s, "paris")
	time.Sleep(stale + 100*time.Millisecond)
	_, err = s.Reserve(ctx, request("probe", "lyon", 100, 1, 0))
	require.ErrorAs(t, err, &nf)
	assert.Equal(t, int64(1), nf.Rejected["stale"])
	_, err = s.Client().ZScore(ctx, s.Key("idx:live"), "paris").Result()
	require.ErrorIs(t, err, redis.Nil, "out of the index")
	_, counts = commandsOf(t, s, "paris", withListing())
	assert.Greater(t, counts["zadd"], heartbeat["zadd"], "indexed again: %v", counts)
	assert.Equal(t, before, indexEntries(t, s, "paris"), "as it was")
	assert.Equal(t, 3, told())
	assert.Contains(t, eventTypes(t, s, "lyon"), "CapacityAvailable:probe")
	live, _, err := s.CountClusters(ctx)
	require.NoError(t, err)
	assert.Equal(t, int64(1), live)
	require.NoError(t, s.CheckInvariant(ctx))
}

// TestListingAnIDTwiceCountsOnce: a reservation listed twice in one
// advertisement took its debit off its node twice (the second time off
// another reservation's share); it counts once.
func TestListingAnIDTwiceCountsOnce(t *testing.T) {
	ctx := context.Background()
	s := newStore(t, store.Config{})
	ad := withNodes(10_000, node("p1", 8000, 8000, 0))
	advertise(t, s, "paris", ad)
	for _, id := range []string{"a", "b"} {
		d, err := s.Reserve(ctx, request(id, "lyon", 1000, 1, 0))
		require.NoError(t, err)
		require.Equal(t, "p1", d.Reservation.Node)
	}
	ad.ReservationsOnNodes = []string{"lyon/a", "lyon/a"}
	ack, err := s.Advertise(ctx, "paris", ad)
	require.NoError(t, err)
	assert.Equal(t, int64(1000), ack.NodesReserved["p1"].CPU, "b is still debited")
	require.NoError(t, s.CheckInvariant(ctx))
}

// heartbeatWrites runs a heartbeat and counts the Redis commands it wrote.
func heartbeatWrites(t *testing.T, s *store.Store, id, digest string) (model.Ack, error, map[string]int64) {
	t.Helper()
	ctx := context.Background()
	require.NoError(t, admin(t, s).ConfigResetStat(ctx).Err())
	ack, err := s.Heartbeat(ctx, id, digest)
	counts := map[string]int64{}
	for cmd, st := range readStats(t, s.Client().(*redis.Client)) {
		counts[cmd] = st.calls
	}
	return ack, err, writesOf(counts)
}

// TestHeartbeatByDigest: an advertisement is answered with its digest (the
// same advertisement, the same digest); a heartbeat naming the digest stored
// refreshes the cluster's liveness and writes nothing else; one naming
// another digest, or for a cluster the broker does not hold, or for one a
// decision dropped as stale, or after Redis lost its state, writes nothing
// and asks for the full advertisement.
func TestHeartbeatByDigest(t *testing.T) {
	ctx := context.Background()
	const stale = time.Second
	s := newStore(t, store.Config{StaleThreshold: stale})
	nodes := []model.NodeCapacity{node("p1", 4000, 3000, 0), node("p2", 4000, 1000, 0)}
	ad := withNodes(10_000, nodes...)
	first, err := s.Advertise(ctx, "paris", ad)
	require.NoError(t, err)
	assert.Regexp(t, `^[0-9a-f]{16}$`, first.Digest)
	again, err := s.Advertise(ctx, "paris", ad)
	require.NoError(t, err)
	assert.Equal(t, first.Digest, again.Digest, "the same advertisement, the same digest")
	c, err := s.Cluster(ctx, "paris")
	require.NoError(t, err)
	assert.Equal(t, first.Digest, c.Digest, "stored with the cluster")
	placed, err := s.Reserve(ctx, request("placed", "lyon", 500, 1, 0))
	require.NoError(t, err)

	// The digest stored: liveness only, and the answer an advertisement gives.
	before, seen := indexEntries(t, s, "paris"), liveScore(t, s, "paris")
	time.Sleep(5 * time.Millisecond)
	ack, err, writes := heartbeatWrites(t, s, "paris", first.Digest)
	require.NoError(t, err)
	assert.Equal(t, map[string]int64{"hset": 1, "zadd": 2}, writes, "seen_ms, clusters, idx:live")
	assert.Equal(t, before, indexEntries(t, s, "paris"), "the index entries are those of before")
	assert.Greater(t, liveScore(t, s, "paris"), seen, "liveness refreshed")
	c, err = s.Cluster(ctx, "paris")
	require.NoError(t, err)
	assert.Equal(t, ack.SeenAt, c.SeenAt)
	assert.True(t, ack.SeenAt.After(again.SeenAt))
	assert.Equal(t, placed.Reservation.Resources, ack.Reserved)
	assert.Equal(t, ad.Allocatable, ack.Allocatable)
	assert.Equal(t, ad.Allocated, ack.Allocated)
	assert.Equal(t, first.Digest, ack.Digest)
	require.NoError(t, s.CheckInvariant(ctx))

	// A newer advertisement (another replica, or the agent itself after its
	// figures moved): the old digest is refused, nothing written.
	nodes[0].Allocated.CPU += 500
	changed, err := s.Advertise(ctx, "paris", withNodes(10_000, nodes...))
	require.NoError(t, err)
	assert.NotEqual(t, first.Digest, changed.Digest)
	_, err, writes = heartbeatWrites(t, s, "paris", first.Digest)
	require.ErrorIs(t, err, store.ErrAdvertisementNeeded)
	assert.Empty(t, writes)
	_, err = s.Heartbeat(ctx, "paris", changed.Digest)
	require.NoError(t, err)

	// A cluster the broker never heard of.
	_, err, writes = heartbeatWrites(t, s, "rome", changed.Digest)
	require.ErrorIs(t, err, store.ErrAdvertisementNeeded)
	assert.Empty(t, writes)
	_, err = s.Cluster(ctx, "rome")
	require.ErrorIs(t, err, store.ErrNotFound, "a heartbeat creates no cluster")

	// Stale: a decision dropped paris from the index; its heartbeats no
	// longer keep it, a full advertisement indexes it again.
	time.Sleep(stale + 100*time.Millisecond)
	var nf *store.NoFitError
	_, err = s.Reserve(ctx, request("probe", "lyon", 100, 1, 0))
	require.ErrorAs(t, err, &nf)
	assert.Equal(t, int64(1), nf.Rejected["stale"])
	_, err, writes = heartbeatWrites(t, s, "paris", changed.Digest)
	require.ErrorIs(t, err, store.ErrAdvertisementNeeded, "a stale cluster stays no candidate")
	assert.Empty(t, writes)
	_, err = s.Reserve(ctx, request("probe2", "lyon", 100, 1, 0))
	require.ErrorAs(t, err, &nf, "still stale")
	back, err := s.Advertise(ctx, "paris", withNodes(10_000, nodes...))
	require.NoError(t, err)
	assert.Equal(t, changed.Digest, back.Digest)
	_, err = s.Heartbeat(ctx, "paris", back.Digest)
	require.NoError(t, err)
	_, err = s.Reserve(ctx, request("probe3", "lyon", 100, 1, 0))
	require.NoError(t, err, "a candidate again")
	require.NoError(t, s.CheckInvariant(ctx))

	// Redis lost its state: the heartbeat asks for the advertisement, which
	// stores the cluster again.
	require.NoError(t, admin(t, s).FlushAll(ctx).Err())
	_, err = s.Heartbeat(ctx, "paris", back.Digest)
	require.ErrorIs(t, err, store.ErrAdvertisementNeeded)
	_, err = s.Advertise(ctx, "paris", withNodes(10_000, nodes...))
	require.NoError(t, err)
	_, err = s.Heartbeat(ctx, "paris", back.Digest)
	require.NoError(t, err)
}
