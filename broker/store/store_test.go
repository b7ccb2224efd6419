package store_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/fluidos-project/resource-broker/broker/model"
	"github.com/fluidos-project/resource-broker/broker/store"
	"github.com/fluidos-project/resource-broker/internal/redistest"
)

const gi = int64(1) << 30

func newStore(t *testing.T, cfg store.Config) *store.Store {
	t.Helper()
	s := store.New(startRedis(t), cfg)
	require.NoError(t, s.LoadScripts(context.Background()))
	return s
}

// storeOn returns a store over rdb that decides by the candidate index or,
// with fullScan, by the full-scan reference (store.NewFullScan).
func storeOn(rdb redis.UniversalClient, cfg store.Config, fullScan bool) *store.Store {
	if fullScan {
		return store.NewFullScan(rdb, cfg)
	}
	return store.New(rdb, cfg)
}

// admins maps the broker's client of each test Redis (the ACL's limited user)
// to an administrator's client of the same Redis, for what the tests do and
// the broker never does (FLUSHALL, KEYS, XRANGE, MULTI).
var admins sync.Map // *redis.Client -> *redis.Client

// startRedis starts a redis-server for tb and returns the broker's client.
func startRedis(tb testing.TB) *redis.Client {
	srv := redistest.Start(tb)
	c := srv.Client()
	admins.Store(c, srv.AdminClient())
	tb.Cleanup(func() { admins.Delete(c) })
	return c
}

// admin returns the administrator's client of s's Redis.
func admin(tb testing.TB, s *store.Store) *redis.Client {
	tb.Helper()
	return adminOf(tb, s.Client().(*redis.Client))
}

// adminOf returns the administrator's client of the Redis of rdb, the broker's client.
func adminOf(tb testing.TB, rdb *redis.Client) *redis.Client {
	tb.Helper()
	a, ok := admins.Load(rdb)
	if !ok {
		tb.Fatal("this Redis was not started by startRedis")
	}
	return a.(*redis.Client)
}

// cluster builds an advertisement: cpu in cores, memory in GiB, gpus, price per core-hour in micro-units.
func cluster(cores, memGi, gpus, pricePerCore int64, labels map[string]string) model.Advertisement {
	r := model.Resources{CPU: cores * 1000, Memory: memGi * gi, GPU: gpus, Storage: 100 * gi}
	return model.Advertisement{
		Capacity: r, Allocatable: r, Labels: labels,
		Prices: model.Prices{CPU: pricePerCore, Memory: pricePerCore / 8, GPU: 1_000_000, Currency: "EUR"},
	}
}

func request(id, requester string, milli, memGi, gpus int64) model.ReserveRequest {
	return model.ReserveRequest{ID: id, Requester: requester, Duration: time.Hour,
		Resources: model.Resources{CPU: milli, Memory: memGi * gi, GPU: gpus}}
}

func assertInvariant(t *testing.T, s *store.Store) {
	t.Helper()
	require.NoError(t, s.CheckInvariant(context.Background()))
}

// eventTypes lists the types of the events on a cluster's stream, oldest first.
func eventTypes(t *testing.T, s *store.Store, cluster string) []string {
	t.Helper()
	entries, err := admin(t, s).XRange(context.Background(), s.Key("events:", cluster), "-", "+").Result()
	require.NoError(t, err)
	types := make([]string, 0, len(entries))
	for _, e := range entries {
		types = append(types, e.Values["type"].(string)+":"+e.Values["reservation"].(string))
	}
	return types
}
