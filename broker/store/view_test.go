package store_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fluidos-project/resource-broker/broker/model"
	"github.com/fluidos-project/resource-broker/broker/store"
	"github.com/fluidos-project/resource-broker/internal/redistest"
)

// TestHintedDecisionsMatchFullScan: with its view of the index current (no
// other replica writing between its catch-up and its call), a replica that
// proposes each decision's candidates from its view (Config.DecideFromView)
// decides exactly as the full scan does: the same winner, score, node and
// candidates, and the same refusals. Random states as in
// TestIndexMatchesFullScan: stale clusters, selectors, GPUs, nodes whose
// summary cannot decide, releases and re-advertisements; each round starts
// on a flushed Redis, which the view notices (a new numbering) and reads whole.
func TestHintedDecisionsMatchFullScan(t *testing.T) {
	ctx := context.Background()
	rdb := startRedis(t)
	const stale = 3 * time.Second
	hinted := store.New(rdb, store.Config{StaleThreshold: stale, DecideFromView: true})
	scan := store.NewFullScan(rdb, store.Config{StaleThreshold: stale})

	methods := map[string]int{}
	decided, nofit := 0, 0
	for round, n := range []int{40, 300, 700} {
		require.NoError(t, admin(t, hinted).FlushAll(ctx).Err())
		require.NoError(t, hinted.LoadScripts(ctx))
		rng := rand.New(rand.NewPCG(uint64(round), propertySeed(t)))
		fed := newRandomFederation(t, hinted, rng, n, stale)
		ids := fed.ids

		var kept []model.ReserveRequest
		for i := range 150 {
			fed.beatIfDue(t)
			req := randomRequest(rng, fmt.Sprintf("r%d-%d", round, i), ids[rng.IntN(n)])
			ref := req
			ref.ID += "-scan"
			want, wantErr := scan.Reserve(ctx, ref)
			if wantErr == nil {
				_, err := scan.Release(ctx, req.Requester, ref.ID, req.Requester)
				require.NoError(t, err)
			}
			got, gotErr := hinted.Reserve(ctx, req)
			var wantNF, gotNF *store.NoFitError
			if errors.As(wantErr, &wantNF) {
				require.ErrorAs(t, gotErr, &gotNF, "round %d request %d: the scan finds nothing, the hinted decision %+v", round, i, got.Reservation.Target)
				require.Equal(t, wantNF.Rejected, gotNF.Rejected, "round %d request %d: rejections", round, i)
				nofit++
				continue
			}
			require.NoError(t, wantErr)
			require.NoError(t, gotErr, "round %d request %d: the scan chose %s", round, i, want.Reservation.Target)
			requireSameDecision(t, want.Reservation, got.Reservation, round, i)
			methods[lastAuditMethod(t, hinted)]++
			decided++

			kept = append(kept, req)
			if rng.IntN(4) == 0 {
				k := kept[rng.IntN(len(kept))]
				_, err := hinted.Release(ctx, k.Requester, k.ID, k.Requester)
				require.NoError(t, err)
			}
			if rng.IntN(5) == 0 {
				fed.readvertise(t, rng)
			}
		}
		require.NoError(t, hinted.CheckView(ctx), "round %d", round)
		require.NoError(t, hinted.CheckIndex(ctx), "round %d", round)
	}
	t.Logf("decisions compared: %d placed, %d nofit; methods %v", decided, nofit, methods)
	require.Greater(t, decided, 300)
	require.Greater(t, nofit, 20)
	require.Greater(t, methods["hint"], decided/2, "most decisions must come from the hint")
}

// TestViewCatchesUp: a replica's view follows the index through changes
// read a page at a time, clusters dropped as stale and forgotten, and an
// index written by a broker without the change feed (read whole, then whole
// again once the feed starts).
func TestViewCatchesUp(t *testing.T) {
	ctx := context.Background()
	rdb := startRedis(t)
	const stale = time.Second
	s := store.New(rdb, store.Config{StaleThreshold: stale, DecideFromView: true})
	require.NoError(t, s.LoadScripts(ctx))
	advertiseAll := func(ids []string, cores int64) {
		for _, id := range ids {
			_, err := s.Advertise(ctx, id, cluster(cores, 64, 0, 10, map[string]string{"region": id[:2]}))
			require.NoError(t, err)
		}
	}
	ids := make([]string, 30)
	for i := range ids {
		ids[i] = fmt.Sprintf("eu%02d", i)
	}
	advertiseAll(ids, 16)
	require.NoError(t, s.CheckView(ctx), "read whole")

	defer store.SetViewPage(store.SetViewPage(7))
	advertiseAll(ids[:20], 32)
	require.NoError(t, s.CheckView(ctx), "20 changes, 7 at a time")
	_, err := s.Reserve(ctx, request("r1", "eu00", 1000, 1, 0))
	require.NoError(t, err)
	require.NoError(t, s.CheckView(ctx), "a decision's capacity taken")

	// Ten go stale: the next decision drops them from the index, and the view.
	time.Sleep(stale + 200*time.Millisecond)
	advertiseAll(ids[10:], 32)
	_, err = s.Reserve(ctx, request("r2", "eu10", 1000, 1, 0))
	require.NoError(t, err)
	require.NoError(t, s.CheckView(ctx), "stale clusters dropped")
	require.NoError(t, s.Forget(ctx, "eu03"))
	require.NoError(t, s.CheckView(ctx), "a forgotten cluster")

	// An index written by a broker without the feed: no numbering yet.
	require.NoError(t, admin(t, s).Del(ctx, s.Key("idx:feed"), s.Key("idx:changes")).Err())
	old := store.New(rdb, store.Config{StaleThreshold: stale, DecideFromView: true})
	require.NoError(t, old.CheckView(ctx), "read whole, no numbering")
	advertiseAll(ids[10:12], 8)
	require.NoError(t, old.CheckView(ctx), "the feed starts: read whole again")
	advertiseAll(ids[12:14], 8)
	require.NoError(t, old.CheckView(ctx), "then changes")

	// A record written without a number (a replica of an earlier release,
	// during a rolling update): the view holds it as it was until it reads
	// the whole index again.
	raw, err := admin(t, s).HGet(ctx, s.Key("idx:rec"), "eu12").Result()
	require.NoError(t, err)
	require.NoError(t, admin(t, s).HSet(ctx, s.Key("idx:rec"), "eu12", raw[:8]+strings.Repeat("\x00", 8)+raw[16:]).Err()) // free cpu := 0
	require.Error(t, old.CheckView(ctx), "not numbered: not seen")
	defer store.SetViewRereadEvery(store.SetViewRereadEvery(0))
	require.NoError(t, old.CheckView(ctx), "read whole again")
	require.Zero(t, old.ViewHolds("eu12")[1])
}

// TestViewThroughRedisRestart: with Redis away a decision fails with the
// connection's error (the view's catch-up counted as failed, the request as
// walked) and writes nothing; Redis back on its append-only file, decisions
// come from the view again, nothing acknowledged before is lost and the view
// agrees with the index.
func TestViewThroughRedisRestart(t *testing.T) {
	ctx := context.Background()
	srv := redistest.Start(t, redistest.WithAppendOnly())
	rdb := srv.Client()
	admins.Store(rdb, srv.AdminClient())
	t.Cleanup(func() { admins.Delete(rdb) })
	s := store.New(rdb, store.Config{StaleThreshold: time.Hour, DecideFromView: true})
	require.NoError(t, s.LoadScripts(ctx))
	for i := range 8 {
		_, err := s.Advertise(ctx, fmt.Sprintf("eu%02d", i), cluster(int64(8+i), 64, 0, 10, map[string]string{"region": "eu"}))
		require.NoError(t, err)
	}
	first, err := s.Reserve(ctx, request("r1", "eu00", 1000, 1, 0))
	require.NoError(t, err)
	require.Equal(t, "hint", lastAuditMethod(t, s))

	srv.Stop()
	down, cancel := context.WithTimeout(ctx, 2*time.Second)
	_, err = s.Reserve(down, request("r2", "eu00", 1000, 1, 0))
	cancel()
	require.Error(t, err, "Redis is away")
	stats := s.ViewStats()
	require.Equal(t, uint64(1), stats.CatchUpErrors)
	require.Equal(t, uint64(1), stats.Walked)

	srv.Restart()
	require.NoError(t, s.LoadScripts(ctx))
	again, err := s.Reservation(ctx, "eu00", "r1")
	require.NoError(t, err, "acknowledged before the restart")
	require.Equal(t, first.Reservation.Target, again.Target)
	second, err := s.Reserve(ctx, request("r2", "eu00", 1000, 1, 0))
	require.NoError(t, err)
	require.False(t, second.Replayed, "the attempt while Redis was away wrote nothing")
	require.Equal(t, "hint", lastAuditMethod(t, s))
	require.NoError(t, s.CheckView(ctx))
	require.NoError(t, s.CheckInvariant(ctx))
}
