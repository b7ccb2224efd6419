package store_test

import (
	"context"
	"encoding/json"
	"fmt"
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
	// renewal moves only the score.
	before := rdb.HGetAll(ctx, key).Val()
	rn, err = s.Renew(ctx, "rome", []string{"web-0"})
	require.NoError(t, err)
	require.Equal(t, model.Renewed, rn[0].Outcome)
	assert.Equal(t, before, rdb.HGetAll(ctx, key).Val(), "the record is not written")
	end := int64(rdb.ZScore(ctx, s.Key("expiry"), "rome/web-0").Val())
	assert.GreaterOrEqual(t, end, written)
	assert.Greater(t, end, first.Reservation.ExpiresAt.UnixMilli()+50*60*1000, "renewed by the hour's lease")

	got, err := s.Reservation(ctx, "rome", "web-0")
	require.NoError(t, err)
	assert.Equal(t, end, got.ExpiresAt.UnixMilli(), "read back")
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
