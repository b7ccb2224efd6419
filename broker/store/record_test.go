package store_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fluidos-project/resource-broker/broker/model"
	"github.com/fluidos-project/resource-broker/broker/store"
)

// TestReservationRecordIsListpack: a reservation's hash keeps every value
// within hash-max-listpack-value (each candidate a field of its own), so
// Redis stores it as a listpack; its candidates read back as the decision's
// audit entry names them, and a record of the earlier layout (one JSON field)
// still reads.
func TestReservationRecordIsListpack(t *testing.T) {
	ctx := context.Background()
	s := newStore(t, store.Config{})
	for i := range 5 {
		_, err := s.Advertise(ctx, fmt.Sprintf("provider-with-a-longer-name-%d", i), cluster(8+int64(i), 32, 0, 1_000+int64(i)*37, nil))
		require.NoError(t, err)
	}
	d, err := s.Reserve(ctx, lease("web-1", "rome", 500, time.Hour, time.Minute))
	require.NoError(t, err)

	rdb := admin(t, s)
	key := s.Key("resv:", "rome/web-1")
	assert.Equal(t, "listpack", rdb.ObjectEncoding(ctx, key).Val())
	fields := rdb.HGetAll(ctx, key).Val()
	assert.NotContains(t, fields, "candidates")
	assert.Contains(t, fields, "cand_3")

	audit := rdb.XRevRangeN(ctx, s.Key("audit"), "+", "-", 1).Val()
	require.Len(t, audit, 1)
	var audited []model.Candidate
	require.NoError(t, json.Unmarshal([]byte(audit[0].Values["candidates"].(string)), &audited))
	require.Len(t, audited, 3)
	got, err := s.Reservation(ctx, "rome", "web-1")
	require.NoError(t, err)
	assert.Equal(t, audited, got.Candidates, "read back")
	assert.Equal(t, audited, d.Reservation.Candidates, "the decision's answer")

	// The earlier layout: the candidates as one JSON array.
	require.NoError(t, rdb.HDel(ctx, key, "cand_1", "cand_2", "cand_3").Err())
	require.NoError(t, rdb.HSet(ctx, key, "candidates", audit[0].Values["candidates"]).Err())
	got, err = s.Reservation(ctx, "rome", "web-1")
	require.NoError(t, err)
	assert.Equal(t, audited, got.Candidates, "earlier layout")
	assertInvariant(t, s)
}

// TestRenewMovesTheEndAndTheRecordTrails: a renewal writes the lease's
// expiry score, and its record's end only when that would come within half
// a lease of now; every read shows the renewed end: the store's, a replay's,
// the Granted event's; and the reservation ends with it written to its
// record and its Released event.
func TestRenewMovesTheEndAndTheRecordTrails(t *testing.T) {
	ctx := context.Background()
	s := newStore(t, store.Config{})
	_, err := s.Advertise(ctx, "paris", cluster(8, 32, 0, 1_000, nil))
	require.NoError(t, err)
	req := lease("web-0", "rome", 500, 200*time.Millisecond, time.Hour)
	first, err := s.Reserve(ctx, req)
	require.NoError(t, err)
	rdb := admin(t, s)
	key := s.Key("resv:", "rome/web-0")

	// The hold time's end is within half a lease: the first renewal writes
	// the record's end too, so that a broker of an earlier release (which
	// judges renewals by the record) would renew it as well.
	rn, err := s.Renew(ctx, "rome", []string{"web-0"})
	require.NoError(t, err)
	require.Equal(t, model.Renewed, rn[0].Outcome)
	written := int64(rdb.ZScore(ctx, s.Key("expiry"), "rome/web-0").Val())
	assert.Equal(t, fmt.Sprint(written), rdb.HGet(ctx, key, "expires_ms").Val(), "the record's end, written with the score")
	// Now the record's end is more than half a lease ahead: the next
	// renewal moves only the score (and makes the id its requester's
	// renewal set, named twice in a row).
	before := rdb.HGetAll(ctx, key).Val()
	rn, err = s.Renew(ctx, "rome", []string{"web-0"})
	require.NoError(t, err)
	require.Equal(t, model.Renewed, rn[0].Outcome)
	assert.Equal(t, before, rdb.HGetAll(ctx, key).Val(), "the record is not written")
	moved := int64(rdb.ZScore(ctx, s.Key("expiry"), "rome/web-0").Val())
	assert.GreaterOrEqual(t, moved, written)
	// Named again, the set renews it (scripts/lib/renew_set.lua), writing
	// neither the record nor the score.
	rn, err = s.Renew(ctx, "rome", []string{"web-0"})
	require.NoError(t, err)
	require.Equal(t, model.Renewed, rn[0].Outcome)
	assert.Equal(t, before, rdb.HGetAll(ctx, key).Val(), "the record is not written")
	assert.Equal(t, moved, int64(rdb.ZScore(ctx, s.Key("expiry"), "rome/web-0").Val()), "nor the score")

	got, err := s.Reservation(ctx, "rome", "web-0")
	require.NoError(t, err)
	end := got.ExpiresAt.UnixMilli()
	assert.GreaterOrEqual(t, end, written, "read back")
	assert.Greater(t, end, first.Reservation.ExpiresAt.UnixMilli()+50*60*1000, "renewed by the hour's lease")
	assert.Greater(t, got.Remaining, 59*time.Minute)
	replay, err := s.Reserve(ctx, req)
	require.NoError(t, err)
	assert.True(t, replay.Replayed)
	assert.Equal(t, end, replay.Reservation.ExpiresAt.UnixMilli(), "a replay")
	granted, err := s.Grant(ctx, "rome", "web-0", "paris", json.RawMessage(`{"token":"t"}`))
	require.NoError(t, err)
	assert.Equal(t, end, granted.ExpiresAt.UnixMilli(), "the grant's answer")

	// Past the hold time, the renewed lease is still live.
	time.Sleep(300 * time.Millisecond)
	n, _, err := s.Expire(ctx)
	require.NoError(t, err)
	assert.Zero(t, n)
	released, err := s.Release(ctx, "rome", "web-0", "rome")
	require.NoError(t, err)
	assert.Equal(t, end, released.Reservation.ExpiresAt.UnixMilli(), "the release's answer")
	assert.Equal(t, fmt.Sprint(end), rdb.HGet(ctx, key, "expires_ms").Val(), "written when it ends")
	events, err := s.ReadEvents(ctx, "rome", "0", 10, 0)
	require.NoError(t, err)
	ends := map[string]int64{}
	for _, e := range events {
		ends[e.Type] = e.ExpiresAt.UnixMilli()
	}
	assert.Equal(t, map[string]int64{"Reserved": first.Reservation.ExpiresAt.UnixMilli(), "Granted": end, "Released": end}, ends)
	assertInvariant(t, s)
}

// TestRenewReadsTheLeasesHash: a lease is entered in its requester's leases
// hash with its lease and its record's end, which a renewal reads instead
// of the record and keeps equal to it; the entry goes with the lease. A
// lease without an entry (made by an earlier release) is renewed from its
// record and entered; an entry whose lease an earlier release ended is
// removed by the next renewal naming it; a provider's renewal leaves the
// entries of other providers' leases alone; a fixed reservation has none.
func TestRenewReadsTheLeasesHash(t *testing.T) {
	ctx := context.Background()
	s := newStore(t, store.Config{})
	for _, p := range []string{"paris", "berlin"} {
		_, err := s.Advertise(ctx, p, cluster(8, 32, 0, 1_000, nil))
		require.NoError(t, err)
	}
	rdb := admin(t, s)
	leases := s.Key("leases:", "rome")
	entry := func(id string) string { // its lease and its record's end, without its renewal set's generation
		f := strings.Fields(rdb.HGet(ctx, leases, "rome/"+id).Val())
		return strings.Join(f[:min(2, len(f))], " ")
	}
	record := func(id string) string {
		v := rdb.HMGet(ctx, s.Key("resv:", "rome/"+id), "lease_ms", "expires_ms").Val()
		return fmt.Sprintf("%v %v", v[0], v[1])
	}
	for _, id := range []string{"a", "b", "c"} {
		_, err := s.Reserve(ctx, lease(id, "rome", 500, time.Hour, 2*time.Minute))
		require.NoError(t, err)
		assert.Equal(t, record(id), entry(id), "entered with its reservation")
	}
	fixed := request("fixed", "rome", 500, 1, 0)
	fixed.Duration = time.Hour
	_, err := s.Reserve(ctx, fixed)
	require.NoError(t, err)
	assert.Empty(t, entry("fixed"), "not a lease")
	assertInvariant(t, s)

	// An earlier release made b (no entry) and ended c (entry left).
	require.NoError(t, rdb.HDel(ctx, leases, "rome/b").Err())
	stale := entry("c")
	_, err = s.Release(ctx, "rome", "c", "rome")
	require.NoError(t, err)
	require.NoError(t, rdb.HSet(ctx, leases, "rome/c", stale).Err())

	rn, err := s.Renew(ctx, "rome", []string{"a", "b", "c", "fixed"})
	require.NoError(t, err)
	outcomes := []model.RenewOutcome{rn[0].Outcome, rn[1].Outcome, rn[2].Outcome, rn[3].Outcome}
	assert.Equal(t, []model.RenewOutcome{model.Renewed, model.Renewed, model.RenewEnded, model.RenewNotALease}, outcomes)
	assert.Equal(t, record("a"), entry("a"), "the record's end and the entry move together")
	assert.Equal(t, record("b"), entry("b"), "entered by its first renewal")
	assert.False(t, rdb.HExists(ctx, leases, "rome/c").Val(), "the ended lease's entry goes")
	assertInvariant(t, s)

	// A provider renewing for the requester: another provider's lease is
	// not found, and its entry stays.
	var onParis, other string
	for _, id := range []string{"a", "b"} {
		r, err := s.Reservation(ctx, "rome", id)
		require.NoError(t, err)
		if r.Target == "paris" {
			onParis = id
		} else {
			other = id
		}
	}
	require.NotEmpty(t, onParis, "the two leases went to paris and berlin, as the cost decides")
	require.NotEmpty(t, other)
	quiet(t, s, "rome")
	rn, err = s.RenewFor(ctx, "paris", "rome", []string{onParis, other})
	require.NoError(t, err)
	assert.Equal(t, model.Renewed, rn[0].Outcome)
	assert.Equal(t, model.RenewNotFound, rn[1].Outcome)
	assert.Equal(t, record(other), entry(other), "another provider's lease keeps its entry")
	assertInvariant(t, s)

	for _, id := range []string{"a", "b"} {
		_, err := s.Release(ctx, "rome", id, "rome")
		require.NoError(t, err)
	}
	assert.Zero(t, rdb.Exists(ctx, leases).Val(), "no lease, no hash")
	assertInvariant(t, s)
}
