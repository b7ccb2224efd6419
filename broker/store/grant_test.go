package store_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fluidos-project/resource-broker/broker/model"
	"github.com/fluidos-project/resource-broker/broker/store"
	"github.com/fluidos-project/resource-broker/internal/redistest"
)

// grantOf is a provider's grant as the API posts it: the access (the same
// for all of a requester's reservations at the provider) and, when node is
// not empty, a placement of the reservation's own.
func grantOf(t *testing.T, token string, expires time.Time, node string) json.RawMessage {
	t.Helper()
	g := map[string]any{"endpoint": "https://paris:6443", "caBundle": []byte(strings.Repeat("C", 1100)),
		"token": token, "namespace": "rb-rome", "expiresAt": expires.UTC().Format(time.RFC3339Nano)}
	if node != "" {
		g["placement"] = map[string]string{"node": node, "priorityClassName": "rb-hold"}
	}
	data, err := json.Marshal(g)
	require.NoError(t, err)
	return data
}

// grantedStore is a store with paris (and berlin) advertised and
// reservations of rome, ids, placed on paris.
func grantedStore(t *testing.T, ids ...string) (*store.Store, *redistest.Server) {
	t.Helper()
	ctx := context.Background()
	srv := redistest.Start(t, redistest.WithAppendOnly())
	rdb := srv.Client()
	admins.Store(rdb, srv.AdminClient())
	t.Cleanup(func() { admins.Delete(rdb) })
	s := store.New(rdb, store.Config{})
	require.NoError(t, s.LoadScripts(ctx))
	_, err := s.Advertise(ctx, "paris", cluster(64, 256, 0, 30_000, map[string]string{"city": "paris"}))
	require.NoError(t, err)
	_, err = s.Advertise(ctx, "berlin", cluster(64, 256, 0, 30_000, map[string]string{"city": "berlin"}))
	require.NoError(t, err)
	for _, id := range ids {
		req := request(id, "rome", 1000, 1, 0)
		req.Selector = map[string]string{"city": "paris"}
		d, err := s.Reserve(ctx, req)
		require.NoError(t, err)
		require.Equal(t, "paris", d.Reservation.Target)
	}
	return s, srv
}

// TestGrantAccessSharedPerPair: the grants of two reservations of one
// requester at one provider store their access once, counted twice; each
// record keeps its own placement and stays a listpack; the first end leaves
// the access to the second, the second's end deletes it.
func TestGrantAccessSharedPerPair(t *testing.T) {
	ctx := context.Background()
	s, srv := grantedStore(t, "a", "b")
	a := admin(t, s)
	exp := time.Now().Add(time.Hour)
	token := "tok-" + strings.Repeat("x", 900)
	for _, id := range []string{"a", "b"} {
		granted, err := s.Grant(ctx, "rome", id, "paris", grantOf(t, token, exp, "node-"+id))
		require.NoError(t, err)
		assert.Equal(t, model.PhaseActive, granted.Phase)
		assert.JSONEq(t, string(grantOf(t, token, exp, "node-"+id)), string(granted.Grant), "the grant's answer composes it")
	}
	pair := s.Key("grant:paris:rome")
	assert.Equal(t, "2", a.HGet(ctx, pair, "n").Val(), "one access, two shares")
	assert.Equal(t, 1, len(keysLike(t, s, "grant:")), "one key for the pair")
	for _, id := range []string{"a", "b"} {
		rk := s.Key("resv:rome/" + id)
		assert.Equal(t, "listpack", a.ObjectEncoding(ctx, rk).Val(), "a granted record stays a listpack")
		rec := a.HGetAll(ctx, rk).Val()
		assert.NotContains(t, rec, "grant", "no grant of its own")
		assert.Equal(t, "node-"+id, rec["place_node"])
		assert.Equal(t, "rb-hold", rec["place_class"])
		assert.Equal(t, a.HGet(ctx, pair, "gen").Val(), rec["grant_gen"])
	}
	assertNowhere(t, srv, token)

	both, err := s.LiveReservations(ctx, store.ByRequester, "rome")
	require.NoError(t, err)
	require.Len(t, both, 2)
	for _, r := range both {
		assert.JSONEq(t, string(grantOf(t, token, exp, "node-"+r.ID)), string(r.Grant), "listed: the access with its own placement")
	}
	replay := request("a", "rome", 1000, 1, 0)
	replay.Selector = map[string]string{"city": "paris"}
	d, err := s.Reserve(ctx, replay)
	require.NoError(t, err)
	require.True(t, d.Replayed)
	assert.JSONEq(t, string(grantOf(t, token, exp, "node-a")), string(d.Reservation.Grant), "a replay: the script adds the access")
	assertInvariant(t, s)

	_, err = s.Release(ctx, "rome", "a", "rome")
	require.NoError(t, err)
	assert.Equal(t, "1", a.HGet(ctx, pair, "n").Val(), "the first end leaves the access")
	assert.False(t, a.HExists(ctx, s.Key("resv:rome/a"), "grant_gen").Val(), "its share went")
	ended, err := s.Reservation(ctx, "rome", "a")
	require.NoError(t, err)
	assert.Empty(t, ended.Grant, "an ended reservation shows no grant")
	still, err := s.Reservation(ctx, "rome", "b")
	require.NoError(t, err)
	assert.JSONEq(t, string(grantOf(t, token, exp, "node-b")), string(still.Grant))
	assertInvariant(t, s)

	// The last end, here by expiry, deletes the access.
	require.NoError(t, a.ZAdd(ctx, s.Key("expiry"), redis.Z{Score: 1, Member: "rome/b"}).Err())
	n, _, err := s.Expire(ctx)
	require.NoError(t, err)
	assert.Equal(t, int64(1), n)
	assert.Zero(t, a.Exists(ctx, pair).Val(), "the last share deletes the access")
	assertInvariant(t, s)
}

// TestGrantOlderAccessKeepsTheNewer: the pair keeps the access that expires
// last; a grant carrying an older one still makes its reservation Active
// with its own placement, and reads the pair's newer access.
func TestGrantOlderAccessKeepsTheNewer(t *testing.T) {
	ctx := context.Background()
	s, _ := grantedStore(t, "a", "b")
	now := time.Now()
	newer, older := grantOf(t, "newer-token-of-paris", now.Add(2*time.Hour), "n1"), grantOf(t, "older-token-of-paris", now.Add(time.Hour), "n2")
	_, err := s.Grant(ctx, "rome", "a", "paris", newer)
	require.NoError(t, err)
	pair := s.Key("grant:paris:rome")
	pttl := admin(t, s).PTTL(ctx, pair).Val()
	assert.InDelta(t, (2*time.Hour + 5*time.Minute).Seconds(), pttl.Seconds(), 60, "expires a little after the newer access")
	got, err := s.Grant(ctx, "rome", "b", "paris", older)
	require.NoError(t, err)
	assert.Equal(t, model.PhaseActive, got.Phase, "an older access still grants")
	var g struct {
		Token     string `json:"token"`
		Placement struct {
			Node string `json:"node"`
		} `json:"placement"`
	}
	require.NoError(t, json.Unmarshal(got.Grant, &g))
	assert.Equal(t, "newer-token-of-paris", g.Token, "the pair keeps the newer access")
	assert.Equal(t, "n2", g.Placement.Node, "with the reservation's own placement")
	assert.Equal(t, "2", admin(t, s).HGet(ctx, pair, "n").Val())
	assert.Equal(t, pttl.Round(time.Minute), admin(t, s).PTTL(ctx, pair).Val().Round(time.Minute), "its expiry unchanged")

	// A grant again without a placement takes the old one away; a newer
	// access replaces the pair's.
	latest := grantOf(t, "latest-token-of-paris", now.Add(3*time.Hour), "")
	again, err := s.Grant(ctx, "rome", "b", "paris", latest)
	require.NoError(t, err)
	assert.JSONEq(t, string(latest), string(again.Grant))
	a, err := s.Reservation(ctx, "rome", "a")
	require.NoError(t, err)
	assert.JSONEq(t, string(grantOf(t, "latest-token-of-paris", now.Add(3*time.Hour), "n1")), string(a.Grant), "every share reads the newest")
	assert.Equal(t, "2", admin(t, s).HGet(ctx, pair, "n").Val(), "a grant again counts no new share")
	assertInvariant(t, s)
}

// TestGrantAccessCopiedToAnotherPair: a sealed access is bound to its pair:
// copied to another pair's key, it does not open, and the error says why.
func TestGrantAccessCopiedToAnotherPair(t *testing.T) {
	ctx := context.Background()
	s, _ := grantedStore(t, "a")
	req := request("b", "rome", 1000, 1, 0)
	req.Selector = map[string]string{"city": "berlin"}
	_, err := s.Reserve(ctx, req)
	require.NoError(t, err)
	_, err = s.Grant(ctx, "rome", "a", "paris", grantOf(t, "token-at-paris", time.Now().Add(time.Hour), ""))
	require.NoError(t, err)
	_, err = s.Grant(ctx, "rome", "b", "berlin", grantOf(t, "token-at-berlin", time.Now().Add(time.Hour), ""))
	require.NoError(t, err)

	a := admin(t, s)
	sealed := a.HGet(ctx, s.Key("grant:paris:rome"), "sealed").Val()
	require.True(t, strings.HasPrefix(sealed, "v1."), "sealed: %.40s", sealed)
	require.NoError(t, a.HSet(ctx, s.Key("grant:berlin:rome"), "sealed", sealed).Err())
	_, err = s.Reservation(ctx, "rome", "b")
	assert.ErrorContains(t, err, "access of berlin to rome does not open")
	assert.ErrorContains(t, err, "copied from another pair's key")

	// Nor does a grant a broker of the previous release sealed for a record.
	require.NoError(t, a.HSet(ctx, s.Key("grant:berlin:rome"), "sealed", s.SealGrantOfRecord("rome/b", []byte(`{"token":"t"}`))).Err())
	_, err = s.Reservation(ctx, "rome", "b")
	assert.ErrorContains(t, err, "copied from another pair's key")
}

// TestGrantRecordOfThePreviousRelease: a record granted by a broker of the
// previous release holds its own sealed grant: it reads as before, its
// grant goes when it ends, and a grant again moves it to its pair's access.
func TestGrantRecordOfThePreviousRelease(t *testing.T) {
	ctx := context.Background()
	s, _ := grantedStore(t, "old", "regranted")
	a := admin(t, s)
	legacy := grantOf(t, "token-of-the-previous-release", time.Now().Add(time.Hour), "n1")
	for _, id := range []string{"old", "regranted"} {
		require.NoError(t, a.HSet(ctx, s.Key("resv:rome/"+id), "phase", "Active", "granted_ms", "1",
			"grant", s.SealGrantOfRecord("rome/"+id, legacy)).Err())
	}
	r, err := s.Reservation(ctx, "rome", "old")
	require.NoError(t, err)
	assert.JSONEq(t, string(legacy), string(r.Grant), "reads as before")
	assertInvariant(t, s)

	fresh := grantOf(t, "token-of-this-release", time.Now().Add(time.Hour), "n2")
	_, err = s.Grant(ctx, "rome", "regranted", "paris", fresh)
	require.NoError(t, err)
	rec := a.HGetAll(ctx, s.Key("resv:rome/regranted")).Val()
	assert.NotContains(t, rec, "grant", "its own grant replaced by a share")
	// (It stays a hash table: Redis never converts a hash back to a listpack.)
	r, err = s.Reservation(ctx, "rome", "regranted")
	require.NoError(t, err)
	assert.JSONEq(t, string(fresh), string(r.Grant))

	// A replica of the previous release grants it again during a rolling
	// update: its own grant, the newer, is what reads.
	rolled := grantOf(t, "token-through-an-old-replica", time.Now().Add(time.Hour), "n3")
	require.NoError(t, a.HSet(ctx, s.Key("resv:rome/regranted"), "grant", s.SealGrantOfRecord("rome/regranted", rolled)).Err())
	r, err = s.Reservation(ctx, "rome", "regranted")
	require.NoError(t, err)
	assert.JSONEq(t, string(rolled), string(r.Grant))

	_, err = s.Release(ctx, "rome", "old", "paris")
	require.NoError(t, err)
	assert.False(t, a.HExists(ctx, s.Key("resv:rome/old"), "grant").Val(), "its grant goes when it ends")
	assert.Equal(t, "1", a.HGet(ctx, s.Key("grant:paris:rome"), "n").Val(), "it held no share")
	assertInvariant(t, s)
}

// TestGrantAccessKeyGoneAndMadeAgain: a pair key that expired (its access
// dead) while reservations still held shares is made again by the next
// grant with a new generation: the shares of the old one are not counted,
// read no access, and their ends leave the new count alone.
func TestGrantAccessKeyGoneAndMadeAgain(t *testing.T) {
	ctx := context.Background()
	s, _ := grantedStore(t, "a", "b")
	a := admin(t, s)
	for _, id := range []string{"a", "b"} {
		_, err := s.Grant(ctx, "rome", id, "paris", grantOf(t, "first-token", time.Now().Add(time.Hour), ""))
		require.NoError(t, err)
	}
	pair := s.Key("grant:paris:rome")
	require.NoError(t, a.Del(ctx, pair).Err(), "as its PEXPIREAT would")
	time.Sleep(2 * time.Millisecond) // a new generation is another millisecond
	_, err := s.Grant(ctx, "rome", "b", "paris", grantOf(t, "second-token", time.Now().Add(time.Hour), ""))
	require.NoError(t, err)
	assert.Equal(t, "1", a.HGet(ctx, pair, "n").Val(), "only b's new share")
	stale, err := s.Reservation(ctx, "rome", "a")
	require.NoError(t, err)
	assert.Equal(t, model.PhaseActive, stale.Phase)
	assert.Empty(t, stale.Grant, "a share of the gone key reads no access")
	assertInvariant(t, s)
	_, err = s.Release(ctx, "rome", "a", "rome")
	require.NoError(t, err)
	assert.Equal(t, "1", a.HGet(ctx, pair, "n").Val(), "a's end leaves b's count")
	assertInvariant(t, s)
}

// TestCheckInvariantCountsShares: CheckInvariant catches a pair's count
// that differs from the live reservations holding a share of it.
func TestCheckInvariantCountsShares(t *testing.T) {
	ctx := context.Background()
	s, _ := grantedStore(t, "a")
	_, err := s.Grant(ctx, "rome", "a", "paris", grantOf(t, "token", time.Now().Add(time.Hour), ""))
	require.NoError(t, err)
	assertInvariant(t, s)
	pair := s.Key("grant:paris:rome")
	require.NoError(t, admin(t, s).HSet(ctx, pair, "n", "3").Err())
	err = s.CheckInvariant(ctx)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "access "+pair+": counts 3 shares, 1 live reservations hold one")
	require.NoError(t, admin(t, s).HSet(ctx, pair, "n", "1").Err())
	assertInvariant(t, s)
	// A key left behind its last share, for a pair an ended reservation names.
	_, err = s.Release(ctx, "rome", "a", "rome")
	require.NoError(t, err)
	assertInvariant(t, s)
	require.NoError(t, admin(t, s).HSet(ctx, pair, "n", "1", "gen", "1", "sealed", "v1.x").Err())
	assert.ErrorContains(t, s.CheckInvariant(ctx), "access "+pair+": counts 1 shares, 0 live reservations hold one")
}

// TestGrantReplayedByGroupAndPreempt: a group's replay and a preemption's
// replay answer each granted member with its pair's access and its own
// placement, as a reserve replay does.
func TestGrantReplayedByGroupAndPreempt(t *testing.T) {
	ctx := context.Background()
	s, _ := grantedStore(t, "solo")
	exp := time.Now().Add(time.Hour)
	token := "tok-" + strings.Repeat("y", 900)

	g := gang("default/g", "rome", 2, 2, 1000)
	g.Selector = map[string]string{"city": "paris"}
	d, err := s.ReserveGroup(ctx, g)
	require.NoError(t, err)
	for _, r := range append(d.Reservations, model.Reservation{ID: "solo"}) {
		_, err := s.Grant(ctx, "rome", r.ID, "paris", grantOf(t, token, exp, "node-"+r.ID))
		require.NoError(t, err)
	}

	again, err := s.ReserveGroup(ctx, g)
	require.NoError(t, err)
	require.True(t, again.Replayed)
	require.Len(t, again.Reservations, 2)
	for _, r := range again.Reservations {
		assert.JSONEq(t, string(grantOf(t, token, exp, "node-"+r.ID)), string(r.Grant), "a group replay: %s", r.ID)
	}

	solo := request("solo", "rome", 1000, 1, 0)
	solo.Selector = map[string]string{"city": "paris"}
	p, err := s.Preempt(ctx, solo)
	require.NoError(t, err)
	require.True(t, p.Replayed)
	assert.JSONEq(t, string(grantOf(t, token, exp, "node-solo")), string(p.Reservation.Grant), "a preemption's replay")
	assertInvariant(t, s)
}
