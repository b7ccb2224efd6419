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
