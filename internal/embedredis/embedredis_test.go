package embedredis_test

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fluidos-project/resource-broker/broker/model"
	"github.com/fluidos-project/resource-broker/broker/policy"
	"github.com/fluidos-project/resource-broker/broker/store"
	"github.com/fluidos-project/resource-broker/internal/embedredis"
	"github.com/fluidos-project/resource-broker/internal/redistest"
)

const gi = int64(1) << 30

// TestBrokerStoreOnEmbeddedRedis drives the broker's store (its Lua scripts)
// through the embedded server, and through a real redis-server when one is
// installed, with the same expectations: the demo's fallback must behave as
// the broker expects, and the expectations themselves are Redis'.
func TestBrokerStoreOnEmbeddedRedis(t *testing.T) {
	t.Run("embedded", func(t *testing.T) {
		srv, err := embedredis.Start()
		require.NoError(t, err)
		t.Cleanup(srv.Close)
		rdb := redis.NewClient(&redis.Options{Addr: srv.Addr, PoolSize: 32})
		t.Cleanup(func() { _ = rdb.Close() })
		exerciseStore(t, rdb)
	})
	t.Run("redis-server", func(t *testing.T) {
		if _, err := redistest.Binary(); err != nil {
			t.Skip(err)
		}
		exerciseStore(t, redistest.Start(t).Client())
	})
}

func TestCloseStopsServing(t *testing.T) {
	ctx := context.Background()
	srv, err := embedredis.Start()
	require.NoError(t, err)
	assert.Regexp(t, `^127\.0\.0\.1:\d+$`, srv.Addr)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr, MaxRetries: -1})
	defer rdb.Close()
	require.NoError(t, rdb.Ping(ctx).Err())
	srv.Close()
	srv.Close()
	require.Error(t, rdb.Ping(ctx).Err())
}

func advert(cores, memGi, gpus, pricePerCore int64, labels map[string]string) model.Advertisement {
	r := model.Resources{CPU: cores * 1000, Memory: memGi * gi, GPU: gpus, Storage: 100 * gi}
	return model.Advertisement{Capacity: r, Allocatable: r, Labels: labels,
		Prices: model.Prices{CPU: pricePerCore, Memory: pricePerCore / 8, GPU: 1_000_000, Currency: "EUR"}}
}

func request(id, requester string, milli, memGi, gpus int64) model.ReserveRequest {
	return model.ReserveRequest{ID: id, Requester: requester, Duration: time.Hour,
		Resources: model.Resources{CPU: milli, Memory: memGi * gi, GPU: gpus}}
}

func eventsOf(t *testing.T, s *store.Store, cluster string) []string {
	t.Helper()
	evs, err := s.ReadEvents(context.Background(), cluster, "0", 100, 0)
	require.NoError(t, err)
	var out []string
	for _, e := range evs {
		out = append(out, e.Type+" "+e.Reservation)
	}
	return out
}

// exerciseStore runs advertise, reserve (fit, replay, conflict, selector,
// no fit, concurrent), grant, release, expire, retention and the event
// streams through the store's public API, checking the invariant on the way.
func exerciseStore(t *testing.T, rdb *redis.Client) {
	ctx := context.Background()
	retention := 500 * time.Millisecond
	// rb-broker's policy without --policy-file: a rate and a priority ceiling.
	s := store.New(rdb, store.Config{Retention: retention, Policy: policy.Default()})
	require.NoError(t, s.LoadScripts(ctx))
	require.NoError(t, s.Ready(ctx), "SCRIPT EXISTS finds every script")

	// Advertise.
	began := time.Now()
	ack, err := s.Advertise(ctx, "paris", advert(8, 32, 0, 30_000, nil))
	require.NoError(t, err)
	assert.Equal(t, model.Resources{}, ack.Reserved)
	assert.WithinDuration(t, began, ack.SeenAt, 5*time.Second, "the server clock (TIME)")
	_, err = s.Advertise(ctx, "berlin", advert(16, 64, 2, 60_000, map[string]string{"gpu": "nvidia"}))
	require.NoError(t, err)
	_, err = s.Advertise(ctx, "rome", advert(2, 8, 0, 1_000, nil))
	require.NoError(t, err)
	clusters, err := s.Clusters(ctx)
	require.NoError(t, err)
	require.Len(t, clusters, 3)
	assert.Equal(t, []string{"berlin", "paris", "rome"}, []string{clusters[0].ID, clusters[1].ID, clusters[2].ID})
	assert.Equal(t, map[string]string{"gpu": "nvidia"}, clusters[0].Labels)
	assert.Equal(t, "EUR", clusters[0].Prices.Currency)
	live, stale, err := s.CountClusters(ctx)
	require.NoError(t, err)
	assert.Equal(t, [2]int64{3, 0}, [2]int64{live, stale})

	// Reserve: fits on paris (cheaper; rome is the requester).
	d, err := s.Reserve(ctx, request("r1", "rome", 3000, 2, 0))
	require.NoError(t, err)
	assert.False(t, d.Replayed)
	r1 := d.Reservation
	assert.Equal(t, "paris", r1.Target)
	assert.Equal(t, model.PhaseReserved, r1.Phase)
	assert.InDelta(t, 84.69, r1.Score, 0.001)
	require.Len(t, r1.Candidates, 2)
	assert.Equal(t, []string{"paris", "berlin"}, []string{r1.Candidates[0].Cluster, r1.Candidates[1].Cluster})
	assert.InDelta(t, 62.34, r1.Candidates[1].Score, 0.001)
	assert.WithinDuration(t, r1.CreatedAt.Add(time.Hour), r1.ExpiresAt, time.Millisecond)

	again, err := s.Reserve(ctx, request("r1", "rome", 3000, 2, 0))
	require.NoError(t, err)
	assert.True(t, again.Replayed)
	again.Reservation.Remaining = r1.Remaining // measured at each answer
	assert.Equal(t, r1, again.Reservation)
	_, err = s.Reserve(ctx, request("r1", "rome", 3000, 4, 0))
	require.ErrorIs(t, err, store.ErrConflict, "same id, other amounts")

	// A label selector and a GPU: only berlin.
	sel := request("r2", "rome", 1000, 1, 1)
	sel.Selector = map[string]string{"gpu": "nvidia"}
	d, err = s.Reserve(ctx, sel)
	require.NoError(t, err)
	assert.Equal(t, "berlin", d.Reservation.Target)
	assert.Equal(t, sel.Selector, d.Reservation.Selector)

	// No fit: nothing written, the reasons counted.
	_, err = s.Reserve(ctx, request("r3", "rome", 64_000, 1, 0))
	var nf *store.NoFitError
	require.ErrorAs(t, err, &nf)
	assert.Equal(t, int64(2), nf.Rejected["insufficient_cpu"], "paris and berlin")
	assert.Equal(t, int64(1), nf.Rejected["requester"])
	_, err = s.Reservation(ctx, "rome", "r3")
	require.ErrorIs(t, err, store.ErrNotFound)

	paris, err := s.Cluster(ctx, "paris")
	require.NoError(t, err)
	assert.Equal(t, model.Resources{CPU: 3000, Memory: 2 * gi}, paris.Reserved)
	require.NoError(t, s.CheckInvariant(ctx))

	// Grant: only the provider; the reservation becomes Active.
	_, err = s.Grant(ctx, "rome", "r1", "berlin", json.RawMessage(`{"token":"t"}`))
	require.ErrorIs(t, err, store.ErrForbidden)
	got, err := s.Grant(ctx, "rome", "r1", "paris", json.RawMessage(`{"endpoint":"https://paris","token":"t"}`))
	require.NoError(t, err)
	assert.Equal(t, model.PhaseActive, got.Phase)
	assert.JSONEq(t, `{"endpoint":"https://paris","token":"t"}`, string(got.Grant))
	byTarget, err := s.LiveReservations(ctx, "by-target", "paris")
	require.NoError(t, err)
	require.Len(t, byTarget, 1)
	assert.Equal(t, "r1", byTarget[0].ID)
	byRequester, err := s.LiveReservations(ctx, "by-requester", "rome")
	require.NoError(t, err)
	assert.Len(t, byRequester, 2)

	// Release: once.
	_, err = s.Release(ctx, "rome", "r1", "milan")
	require.ErrorIs(t, err, store.ErrForbidden)
	rel, err := s.Release(ctx, "rome", "r1", "rome")
	require.NoError(t, err)
	assert.True(t, rel.Released)
	assert.False(t, rel.Clamped)
	assert.Equal(t, model.PhaseReleased, rel.Reservation.Phase)
	rel, err = s.Release(ctx, "rome", "r1", "paris")
	require.NoError(t, err)
	assert.False(t, rel.Released, "the second release changes nothing")
	paris, err = s.Cluster(ctx, "paris")
	require.NoError(t, err)
	assert.Equal(t, model.Resources{}, paris.Reserved)
	require.NoError(t, s.CheckInvariant(ctx))

	// Expire: only what is due.
	short := request("r4", "rome", 2000, 2, 0)
	short.Duration = 150 * time.Millisecond
	d, err = s.Reserve(ctx, short)
	require.NoError(t, err)
	assert.Equal(t, "paris", d.Reservation.Target)
	n, _, err := s.Expire(ctx)
	require.NoError(t, err)
	assert.Zero(t, n, "nothing is due yet")
	time.Sleep(250 * time.Millisecond)
	n, clamped, err := s.Expire(ctx)
	require.NoError(t, err)
	assert.Equal(t, int64(1), n)
	assert.Zero(t, clamped)
	r4, err := s.Reservation(ctx, "rome", "r4")
	require.NoError(t, err)
	assert.Equal(t, model.PhaseExpired, r4.Phase)
	paris, err = s.Cluster(ctx, "paris")
	require.NoError(t, err)
	assert.Equal(t, model.Resources{}, paris.Reserved, "the expired capacity came back")
	require.NoError(t, s.CheckInvariant(ctx))

	// The event streams: the provider is told of its reservations, the
	// requester also of grants, and of freed capacity while its request r3
	// (refused above) waits.
	assert.Equal(t, []string{"Reserved r1", "Released r1", "Reserved r4", "Expired r4"}, eventsOf(t, s, "paris"))
	assert.Equal(t, []string{"Reserved r1", "Reserved r2", "Granted r1", "Released r1", "CapacityAvailable r3",
		"Reserved r4", "Expired r4", "CapacityAvailable r3"}, eventsOf(t, s, "rome"))
	// A blocking read (XREAD BLOCK, as the broker's event stream does) wakes on a new event.
	cursor, err := s.EventCursor(ctx, "paris", "$")
	require.NoError(t, err)
	woke := make(chan []model.Event, 1)
	go func() {
		evs, _ := s.ReadEvents(ctx, "paris", cursor, 10, 5*time.Second)
		woke <- evs
	}()
	time.Sleep(100 * time.Millisecond)
	_, err = s.Reserve(ctx, request("r5", "rome", 1000, 1, 0))
	require.NoError(t, err)
	select {
	case evs := <-woke:
		require.Len(t, evs, 1)
		assert.Equal(t, "Reserved r5", evs[0].Type+" "+evs[0].Reservation)
	case <-time.After(5 * time.Second):
		t.Fatal("the blocking read did not wake up")
	}
	_, err = s.Release(ctx, "rome", "r5", "rome")
	require.NoError(t, err)

	// Concurrent requests never overbook: lyon has room for exactly 4.
	_, err = s.Advertise(ctx, "lyon", advert(4, 64, 0, 10_000, map[string]string{"zone": "lyon"}))
	require.NoError(t, err)
	var wg sync.WaitGroup
	var mu sync.Mutex
	outcomes := map[string]int{}
	for i := range 12 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			req := request(fmt.Sprintf("c%d", i), "rome", 1000, 1, 0)
			req.Selector = map[string]string{"zone": "lyon"}
			d, err := s.Reserve(ctx, req)
			mu.Lock()
			defer mu.Unlock()
			var nf *store.NoFitError
			switch {
			case err == nil:
				outcomes[d.Reservation.Target]++
			case assert.ErrorAs(t, err, &nf):
				outcomes["nofit"]++
			}
		}()
	}
	wg.Wait()
	assert.Equal(t, map[string]int{"lyon": 4, "nofit": 8}, outcomes)
	require.NoError(t, s.CheckInvariant(ctx))

	// Ended reservations stay readable for the retention only (PEXPIRE).
	time.Sleep(retention + 200*time.Millisecond)
	for _, id := range []string{"r1", "r4"} {
		_, err = s.Reservation(ctx, "rome", id)
		assert.ErrorIs(t, err, store.ErrNotFound, id)
	}
	_, err = s.Reservation(ctx, "rome", "r2")
	require.NoError(t, err, "a live reservation does not expire with the retention")
	require.NoError(t, s.CheckInvariant(ctx))
}
