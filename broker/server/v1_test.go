package server_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fluidos-project/resource-broker/broker/api"
	"github.com/fluidos-project/resource-broker/broker/store"
	"github.com/fluidos-project/resource-broker/internal/brokertest"
)

// seedAdvertisement is what a seed agent posts: it copies a "reserved" it read
// before and computes "available" itself; the broker must ignore both.
func seedAdvertisement(id, cpu, mem, gpu string) string {
	return `{"clusterID":"` + id + `","clusterName":"` + id + `",
	  "resources":{
	    "capacity":{"cpu":"` + cpu + `","memory":"` + mem + `","gpu":"` + gpu + `"},
	    "allocatable":{"cpu":"` + cpu + `","memory":"` + mem + `","gpu":"` + gpu + `"},
	    "allocated":{"cpu":"500m","memory":"1Gi"},
	    "reserved":{"cpu":"0","memory":"0"},
	    "available":{"cpu":"999","memory":"999Ti"}},
	  "timestamp":"` + time.Now().UTC().Format(time.RFC3339) + `"}`
}

// TestSeedProtocol plays a seed agent that speaks only v1 (raw JSON, field
// names from the seed protocol), as provider paris and requester rome.
func TestSeedProtocol(t *testing.T) {
	b := brokertest.Start(t, brokertest.Options{})
	obj := func(data []byte) map[string]any {
		var m map[string]any
		require.NoError(t, json.Unmarshal(data, &m), "%s", data)
		return m
	}

	// A cluster advertising GPUs with no GPU allocated (crashed the seed broker).
	code, data := b.Do("paris", http.MethodPost, "/api/v1/advertisements", seedAdvertisement("paris", "8", "32Gi", "2"))
	require.Equal(t, http.StatusOK, code, "%s", data)
	resp := obj(data)
	assert.NotContains(t, resp, "providerInstructions", "omitted when empty")
	ad := resp["advertisement"].(map[string]any)
	assert.Equal(t, "paris", ad["clusterID"])
	res := ad["resources"].(map[string]any)
	assert.Equal(t, map[string]any{"cpu": "7500m", "memory": "31Gi", "gpu": "2"}, res["available"], "recomputed, not the agent's")

	code, data = b.Do("rome", http.MethodPost, "/api/v1/advertisements", seedAdvertisement("rome", "2", "4Gi", "0"))
	require.Equal(t, http.StatusOK, code, "%s", data)

	code, data = b.Do("paris", http.MethodGet, "/api/v1/instructions", nil)
	require.Equal(t, http.StatusOK, code)
	assert.JSONEq(t, `[]`, string(data), "an empty JSON array, not null")

	code, data = b.Do("rome", http.MethodPost, "/api/v1/reservations", `{"requestedResources":{"cpu":"2","memory":"4Gi"},"priority":5,"duration":"30m"}`)
	require.Equal(t, http.StatusCreated, code, "%s", data)
	r := obj(data)
	assert.Regexp(t, regexp.MustCompile(`^rsv-rome-\d+-[0-9a-f]+$`), r["id"])
	assert.Equal(t, "rome", r["requesterID"])
	assert.Equal(t, "paris", r["targetClusterID"])
	assert.Equal(t, map[string]any{"cpu": "2", "memory": "4Gi"}, r["requestedResources"])
	status := r["status"].(map[string]any)
	assert.Equal(t, "Reserved", status["phase"])
	expires, err := time.Parse(time.RFC3339, status["expiresAt"].(string))
	require.NoError(t, err)
	assert.WithinDuration(t, time.Now().Add(30*time.Minute), expires, time.Minute)
	_, err = time.Parse(time.RFC3339, r["createdAt"].(string))
	require.NoError(t, err)
	id := r["id"].(string)

	// The provider learns of it by polling and by the piggyback on its next advertisement.
	code, data = b.Do("paris", http.MethodGet, "/api/v1/instructions", nil)
	require.Equal(t, http.StatusOK, code)
	var instructions []map[string]any
	require.NoError(t, json.Unmarshal(data, &instructions))
	require.Len(t, instructions, 1)
	assert.Equal(t, id, instructions[0]["id"])
	code, data = b.Do("paris", http.MethodPost, "/api/v1/advertisements", seedAdvertisement("paris", "8", "32Gi", "2"))
	require.Equal(t, http.StatusOK, code, "%s", data)
	resp = obj(data)
	piggy := resp["providerInstructions"].([]any)
	require.Len(t, piggy, 1)
	assert.Equal(t, id, piggy[0].(map[string]any)["id"])
	assert.Equal(t, map[string]any{"cpu": "2", "memory": "4Gi"},
		resp["advertisement"].(map[string]any)["resources"].(map[string]any)["reserved"], "the broker's reserved, not the agent's 0")

	code, data = b.Do("rome", http.MethodGet, "/api/v1/advertisements/paris", nil)
	require.Equal(t, http.StatusOK, code)
	res = obj(data)["resources"].(map[string]any)
	assert.Equal(t, map[string]any{"cpu": "5500m", "memory": "27Gi", "gpu": "2"}, res["available"])
	code, _ = b.Do("rome", http.MethodGet, "/api/v1/advertisements/nowhere", nil)
	assert.Equal(t, http.StatusNotFound, code)

	// 409 when nothing fits; the seed's status codes.
	code, data = b.Do("rome", http.MethodPost, "/api/v1/reservations", `{"requestedResources":{"cpu":"64","memory":"4Gi"}}`)
	assert.Equal(t, http.StatusConflict, code, "%s", data)

	// The seed agent releases nothing over v1, but a v2 release of its id works and the instruction disappears.
	code, _ = b.Do("paris", http.MethodDelete, "/api/v2/reservations/"+id+"?requester=rome", nil)
	require.Equal(t, http.StatusOK, code)
	_, data = b.Do("paris", http.MethodGet, "/api/v1/instructions", nil)
	assert.JSONEq(t, `[]`, string(data))
}

// TestSeedRefusalDoesNotWait: a seed agent never retries an id (every POST
// makes a new one), so a refused v1 request takes no place on the priority
// waiting list: when capacity appears, a fitting request of another cluster
// with lower or equal priority is granted at once, not deferred behind it
// (409 waiting_higher_priority) until the entry expired.
func TestSeedRefusalDoesNotWait(t *testing.T) {
	for _, priority := range []int32{0, 5} {
		b := brokertest.Start(t, brokertest.Options{Store: store.Config{WaitTTL: time.Minute}})
		code, data := b.Do("paris", http.MethodPost, "/api/v1/advertisements", seedAdvertisement("paris", "2", "8Gi", "0"))
		require.Equal(t, http.StatusOK, code, "%s", data)

		code, data = b.Do("rome", http.MethodPost, "/api/v1/reservations", `{"requestedResources":{"cpu":"4","memory":"4Gi"},"priority":10}`)
		require.Equal(t, http.StatusConflict, code, "%s", data)
		n, err := b.Store.Client().ZCard(context.Background(), b.Store.Key("waiting")).Result()
		require.NoError(t, err)
		assert.Zero(t, n, "a refused v1 request does not wait")

		// paris grows: rome's refused request would fit now, but rome never asks for that id again.
		code, data = b.Do("paris", http.MethodPost, "/api/v1/advertisements", seedAdvertisement("paris", "8", "32Gi", "0"))
		require.Equal(t, http.StatusOK, code, "%s", data)
		req := reservation("lyon-1", "1", "1Gi")
		req.Priority = priority
		code, data = b.Do("lyon", http.MethodPost, "/api/v2/reservations", req)
		assert.Equal(t, http.StatusCreated, code, "priority %d: %s", priority, data)
	}
}

// TestSeedOverAllocatedStaysLive: a seed agent counts Pending pods in
// allocated and GPUs of Ready nodes only, so an unschedulable pod asking for
// a GPU puts allocated above allocatable. Over v1 the broker caps it (no GPU
// free, a warning, a metric) rather than refuse the advertisement, which
// would leave the provider stale with its CPU and memory unreservable; v2
// still refuses it.
func TestSeedOverAllocatedStaysLive(t *testing.T) {
	b := brokertest.Start(t, brokertest.Options{})
	ad := `{"clusterID":"paris","clusterName":"paris","resources":{
	    "capacity":{"cpu":"8","memory":"32Gi","gpu":"1"},
	    "allocatable":{"cpu":"8","memory":"32Gi","gpu":"1"},
	    "allocated":{"cpu":"500m","memory":"1Gi","gpu":"2"}},
	  "timestamp":"` + time.Now().UTC().Format(time.RFC3339) + `"}`
	code, data := b.Do("paris", http.MethodPost, "/api/v1/advertisements", ad)
	require.Equal(t, http.StatusOK, code, "%s", data)
	var resp struct {
		Advertisement struct {
			Resources struct{ Allocated, Available map[string]string }
		}
	}
	require.NoError(t, json.Unmarshal(data, &resp))
	assert.Equal(t, "1", resp.Advertisement.Resources.Allocated["gpu"], "capped at allocatable")
	assert.Empty(t, resp.Advertisement.Resources.Available["gpu"], "none free (a zero quantity is left out)")
	assert.Equal(t, "7500m", resp.Advertisement.Resources.Available["cpu"])

	c, err := b.Store.Cluster(context.Background(), "paris")
	require.NoError(t, err)
	assert.True(t, c.Live)
	code, data = b.Do("rome", http.MethodPost, "/api/v1/reservations", `{"requestedResources":{"cpu":"4","memory":"8Gi"}}`)
	require.Equal(t, http.StatusCreated, code, "its CPU stays reservable: %s", data)
	assert.Contains(t, string(data), `"targetClusterID":"paris"`)
	code, data = b.Do("rome", http.MethodPost, "/api/v1/reservations", `{"requestedResources":{"cpu":"1","memory":"1Gi","gpu":"1"}}`)
	assert.Equal(t, http.StatusConflict, code, "no GPU free: %s", data)

	resp2, err := http.Get(b.Health + "/metrics")
	require.NoError(t, err)
	metrics, _ := io.ReadAll(resp2.Body)
	resp2.Body.Close()
	assert.Contains(t, string(metrics), `rb_broker_v1_allocated_capped_total{resource="gpu"} 1`)
	assert.NotContains(t, string(metrics), `rb_broker_v1_allocated_capped_total{resource="cpu"}`)

	q := brokertest.Quantities("8", "32Gi", "1")
	code, data = b.Do("paris", http.MethodPut, "/api/v2/clusters/paris/advertisement", api.Advertisement{ClusterName: "paris",
		Resources: api.ClusterResources{Capacity: q, Allocatable: q, Allocated: brokertest.Quantities("500m", "1Gi", "2")}})
	assert.Equal(t, http.StatusBadRequest, code, "v2 refuses it: %s", data)
	assert.Contains(t, string(data), "allocated gpu 2 exceeds allocatable 1")
}

// TestSeedInstructionsAllPages: a seed provider never grants, so every
// reservation it holds stays Reserved, and the seed protocol has no pages:
// GET /api/v1/instructions and the advertisement's piggyback carry all of
// them, past the 1,000 of one page.
func TestSeedInstructionsAllPages(t *testing.T) {
	b := brokertest.Start(t, brokertest.Options{})
	code, data := b.Do("paris", http.MethodPost, "/api/v1/advertisements", seedAdvertisement("paris", "2000", "4Ti", "0"))
	require.Equal(t, http.StatusOK, code, "%s", data)
	const n = 1500
	ids := make(chan string, n)
	var wg sync.WaitGroup
	for w := range 10 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			requester := fmt.Sprintf("rome-%d", w)
			for range n / 10 {
				code, data := b.Do(requester, http.MethodPost, "/api/v1/reservations", `{"requestedResources":{"cpu":"1","memory":"1Gi"}}`)
				if !assert.Equal(t, http.StatusCreated, code, "%s", data) {
					return
				}
				var r struct{ ID string }
				if assert.NoError(t, json.Unmarshal(data, &r)) {
					ids <- r.ID
				}
			}
		}()
	}
	wg.Wait()
	close(ids)
	want := map[string]bool{}
	for id := range ids {
		want[id] = true
	}
	require.Len(t, want, n)

	got := func(data []byte) map[string]bool {
		var instructions []struct{ ID, RequesterID string }
		require.NoError(t, json.Unmarshal(data, &instructions))
		out := map[string]bool{}
		for _, in := range instructions {
			assert.False(t, out[in.ID], "%s twice", in.ID)
			out[in.ID] = true
		}
		return out
	}
	code, data = b.Do("paris", http.MethodGet, "/api/v1/instructions", nil)
	require.Equal(t, http.StatusOK, code, "%s", data)
	assert.Equal(t, want, got(data))
	code, data = b.Do("paris", http.MethodPost, "/api/v1/advertisements", seedAdvertisement("paris", "2000", "4Ti", "0"))
	require.Equal(t, http.StatusOK, code, "%s", data)
	var resp struct {
		ProviderInstructions json.RawMessage `json:"providerInstructions"`
	}
	require.NoError(t, json.Unmarshal(data, &resp))
	assert.Equal(t, want, got(resp.ProviderInstructions))
}
