package server_test

import (
	"context"
	"io"
	"net/http"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fluidos-project/resource-broker/broker/api"
	"github.com/fluidos-project/resource-broker/internal/brokertest"
)

// TestHeartbeatThroughTheAPI (real broker, real Redis, mutual TLS): the
// answer to an advertisement names it by its digest; a heartbeat naming it
// keeps the cluster live and answers what is reserved and available; the
// edge refuses a malformed digest (400) and another cluster's heartbeat
// (403); a digest the broker does not hold, and any heartbeat after Redis
// lost its state, is answered 409 AdvertisementNeeded, and the metrics
// count both outcomes.
func TestHeartbeatThroughTheAPI(t *testing.T) {
	ctx := context.Background()
	b := brokertest.Start(t, brokertest.Options{})
	const route = "/api/v2/clusters/paris/heartbeat"
	ack := advertiseNodes(t, b)
	require.Regexp(t, `^[0-9a-f]{16}$`, ack.Digest)
	code, data := b.Do("rome", http.MethodGet, "/api/v2/clusters/paris", nil)
	require.Equal(t, http.StatusOK, code, "%s", data)
	assert.Equal(t, ack.Digest, brokertest.Decode[api.Cluster](t, data).Digest, "a read shows the digest stored")
	code, data = b.Do("rome", http.MethodPost, "/api/v2/reservations", reservation("r1", "1", "1Gi"))
	require.Equal(t, http.StatusCreated, code, "%s", data)

	before := b.Snapshot()
	code, data = b.Do("paris", http.MethodPut, route, api.HeartbeatRequest{Digest: ack.Digest})
	require.Equal(t, http.StatusOK, code, "%s", data)
	hb := brokertest.Decode[api.Heartbeat](t, data)
	assert.Equal(t, "paris", hb.ClusterID)
	assert.Equal(t, ack.Digest, hb.Digest)
	assert.True(t, hb.SeenAt.After(ack.SeenAt), "liveness refreshed: %v after %v", hb.SeenAt, ack.SeenAt)
	assert.Equal(t, "1", hb.Reserved.CPU.String())
	assert.Equal(t, "2", hb.Available.CPU.String(), "6 allocatable - 3 allocated - 1 reserved")
	after := b.Snapshot()
	for k, v := range before {
		switch k {
		case "rb:{b}:cluster:paris", "rb:{b}:clusters", "rb:{b}:idx:live", "rb:{b}:clock", "rb:{b}:rate:paris:advertisements":
		default:
			assert.Equal(t, v, after[k], "%s: a heartbeat writes liveness only", k)
		}
	}
	require.NoError(t, b.Store.CheckInvariant(ctx))

	for _, bad := range []any{
		map[string]any{},
		map[string]any{"digest": "ABCDEF0123456789"},
		map[string]any{"digest": "abc"},
		map[string]any{"digest": ack.Digest, "nodes": []string{}},
	} {
		code, data = b.Do("paris", http.MethodPut, route, bad)
		require.Equal(t, http.StatusBadRequest, code, "%v: %s", bad, data)
		assert.Equal(t, api.ReasonBadRequest, brokertest.Decode[api.Error](t, data).Reason)
	}
	code, data = b.Do("rome", http.MethodPut, route, api.HeartbeatRequest{Digest: ack.Digest})
	require.Equal(t, http.StatusForbidden, code, "%s", data)

	needed := func(cn, digest string) {
		t.Helper()
		code, data := b.Do(cn, http.MethodPut, "/api/v2/clusters/"+cn+"/heartbeat", api.HeartbeatRequest{Digest: digest})
		require.Equal(t, http.StatusConflict, code, "%s", data)
		assert.Equal(t, api.ReasonAdvertisementNeeded, brokertest.Decode[api.Error](t, data).Reason)
	}
	needed("paris", "0123456789abcdef")
	needed("lyon", ack.Digest) // never advertised
	require.NoError(t, b.RDB.FlushAll(ctx).Err())
	needed("paris", ack.Digest)
	again := advertiseNodes(t, b)
	assert.Equal(t, ack.Digest, again.Digest, "the same advertisement, the same name")
	code, data = b.Do("paris", http.MethodPut, route, api.HeartbeatRequest{Digest: again.Digest})
	require.Equal(t, http.StatusOK, code, "%s", data)

	resp, err := http.Get(b.Health + "/metrics")
	require.NoError(t, err)
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	assert.Contains(t, string(body), `rb_broker_heartbeats_total{outcome="accepted"} 2`)
	assert.Contains(t, string(body), `rb_broker_heartbeats_total{outcome="advertisement_needed"} 3`)
}
