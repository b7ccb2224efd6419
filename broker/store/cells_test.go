package store_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sync/errgroup"

	"github.com/fluidos-project/resource-broker/broker/model"
	"github.com/fluidos-project/resource-broker/broker/store"
	"github.com/fluidos-project/resource-broker/internal/redistest"
)

// cellNames hash to slots of three different primaries of a fresh
// three-primary cluster (redis-cli --cluster create splits the slots in
// three equal ranges): b 3300, eu 6893, us 14680. TestCellsOnRedisCluster
// checks it.
var cellNames = []string{"b", "eu", "us"}

// startCells starts a three-primary Redis Cluster and the cells over it,
// split by the label region.
func startCells(t *testing.T, cfg store.Config) (*store.Cells, *redistest.Cluster) {
	t.Helper()
	rc := redistest.StartCluster(t, 3, cellNames)
	cells, err := store.NewCells(rc.Client(), cfg, cellNames, store.CellRule{Label: "region"})
	require.NoError(t, err)
	require.NoError(t, cells.LoadScripts(context.Background()))
	return cells, rc
}

func regional(region string, cores, pricePerCore int64) model.Advertisement {
	return cluster(cores, 4*cores, 0, pricePerCore, map[string]string{"region": region})
}

// TestCellsOnRedisCluster: each cell on its own primary, every key a script
// wrote in its cell's slot, and reserve, release and expire in each cell,
// with the invariant of each after a concurrent burst.
func TestCellsOnRedisCluster(t *testing.T) {
	ctx := context.Background()
	cells, rc := startCells(t, store.Config{})
	admin := rc.AdminClient()

	primaries := map[string]string{}
	for _, n := range cellNames {
		addr, err := rc.PrimaryOf(store.CellPrefix(n))
		require.NoError(t, err)
		primaries[addr] = n
	}
	require.Len(t, primaries, 3, "the three cells are on three primaries")

	// Three clusters per cell (b: no region label).
	for _, n := range cellNames {
		region := n
		if n == "b" {
			region = "elsewhere" // names no cell: the default cell
		}
		for i := range 3 {
			_, cell, err := cells.Advertise(ctx, fmt.Sprintf("%s-%d", n, i), regional(region, 16, int64(20_000+i*1000)))
			require.NoError(t, err)
			require.Equal(t, n, cell)
		}
	}

	// Requests from each cell's clusters, in their cell: a target of the same cell.
	for _, n := range cellNames {
		d, err := cells.Cell(n).Reserve(ctx, request("first", n+"-0", 1000, 1, 0))
		require.NoError(t, err)
		assert.True(t, strings.HasPrefix(d.Reservation.Target, n+"-"), "%s decided %s", n, d.Reservation.Target)
	}

	// A concurrent burst over the three cells, half released again.
	var g errgroup.Group
	var mu sync.Mutex
	var live [][2]string // requester, id
	for i := range 90 {
		n := cellNames[i%3]
		g.Go(func() error {
			requester, id := fmt.Sprintf("%s-%d", n, i%2), fmt.Sprintf("burst-%d", i)
			if _, err := cells.Cell(n).Reserve(ctx, request(id, requester, 500, 1, 0)); err != nil {
				return err
			}
			if i%2 == 0 {
				_, err := cells.Release(ctx, requester, id, requester)
				return err
			}
			mu.Lock()
			live = append(live, [2]string{requester, id})
			mu.Unlock()
			return nil
		})
	}
	require.NoError(t, g.Wait())
	require.NoError(t, cells.CheckInvariant(ctx))
	for _, n := range cellNames {
		usage, err := cells.Cell(n).Usage(ctx)
		require.NoError(t, err)
		var held int64
		for _, u := range usage {
			held += u.Reservations
		}
		assert.Equal(t, int64(1+15), held, "cell %s: its first reservation and its 15 unreleased of the burst", n)
	}

	// Expiry, in each cell.
	for _, n := range cellNames {
		req := request("short", n+"-1", 250, 1, 0)
		req.Duration = 100 * time.Millisecond
		_, err := cells.Cell(n).Reserve(ctx, req)
		require.NoError(t, err)
	}
	time.Sleep(150 * time.Millisecond)
	ran, err := cells.ExpireRun(ctx)
	require.NoError(t, err)
	for _, n := range cellNames {
		assert.Equal(t, int64(1), ran[n].Expired, "cell %s", n)
		r, err := cells.Cell(n).Reservation(ctx, n+"-1", "short")
		require.NoError(t, err)
		assert.Equal(t, model.PhaseExpired, r.Phase)
	}
	require.NoError(t, cells.CheckInvariant(ctx))

	// Every key the scripts wrote is in its cell's slot, on its cell's primary.
	keys := 0
	require.NoError(t, admin.ForEachMaster(ctx, func(ctx context.Context, node *redis.Client) error {
		addr := node.Options().Addr
		iter := node.Scan(ctx, 0, "*", 1000).Iterator()
		for iter.Next(ctx) {
			k := iter.Val()
			want, ok := primaries[addr]
			assert.True(t, ok && strings.HasPrefix(k, store.CellPrefix(want)), "key %s on the primary of cell %s", k, want)
			slot, err := node.ClusterKeySlot(ctx, k).Result()
			if assert.NoError(t, err) {
				cellSlot, _ := node.ClusterKeySlot(ctx, store.CellPrefix(want)).Result()
				assert.Equal(t, cellSlot, slot, "key %s", k)
			}
			mu.Lock()
			keys++
			mu.Unlock()
		}
		return iter.Err()
	}))
	assert.Greater(t, keys, 100)
}

// TestCellsScriptCacheLost: a primary that lost its script cache (a
// restart, a failover) runs the scripts again: EVALSHA goes to the primary
// of KEYS[1], gets NOSCRIPT, and the client sends the script with EVAL.
func TestCellsScriptCacheLost(t *testing.T) {
	ctx := context.Background()
	cells, rc := startCells(t, store.Config{})
	_, _, err := cells.Advertise(ctx, "us-0", regional("us", 8, 20_000))
	require.NoError(t, err)
	addr, err := rc.PrimaryOf(store.CellPrefix("us"))
	require.NoError(t, err)
	require.NoError(t, rc.AdminClient().ForEachMaster(ctx, func(ctx context.Context, node *redis.Client) error {
		if node.Options().Addr != addr {
			return nil
		}
		return node.ScriptFlush(ctx).Err()
	}))
	assert.ErrorIs(t, cells.Cell("us").Ready(ctx), store.ErrScriptsNotLoaded, "SCRIPT EXISTS asks every primary")
	d, err := cells.Cell("us").Reserve(ctx, request("r", "x", 1000, 1, 0))
	require.NoError(t, err)
	assert.Equal(t, "us-0", d.Reservation.Target)
	require.NoError(t, cells.LoadScripts(ctx))
	require.NoError(t, cells.Cell("us").Ready(ctx))
}

// TestCellsReserveAcross: a request asked of every cell goes to the best
// cluster of all of them, by the union's scores; retried, it is answered
// by the cell that decided it; nothing fitting anywhere, it waits at home.
func TestCellsReserveAcross(t *testing.T) {
	ctx := context.Background()
	cells, _ := startCells(t, store.Config{})
	for id, ad := range map[string]model.Advertisement{
		"eu-small": regional("eu", 4, 10_000),
		"us-big":   regional("us", 64, 20_000), // roomier and cheaper: the best
		"b-mid":    regional("", 16, 30_000),
	} {
		_, _, err := cells.Advertise(ctx, id, ad)
		require.NoError(t, err)
	}
	req := request("across", "eu-small", 2000, 2, 0)

	scored, err := cells.Score(ctx, cells.Names(), req)
	require.NoError(t, err)
	ranked := store.Rank(scored, 0.7, 0.3)
	require.Len(t, ranked, 2, "b-mid and us-big fit; the requester is no candidate of its own")
	assert.Equal(t, "us-big", ranked[0].Cluster)
	assert.Equal(t, "us", ranked[0].Cell)

	home, err := cells.Cell("eu").Score(ctx, req)
	require.NoError(t, err)
	assert.Empty(t, home.Candidates, "nothing else in eu")

	d, err := cells.ReserveAcross(ctx, "eu", req)
	require.NoError(t, err)
	assert.Equal(t, "us", d.Cell)
	assert.Equal(t, "us-big", d.Reservation.Target)

	again, err := cells.ReserveAcross(ctx, "eu", req)
	require.NoError(t, err)
	assert.True(t, again.Replayed)
	assert.Equal(t, "us", again.Cell)

	_, err = cells.ReserveAcross(ctx, "eu", request("huge", "eu-small", 1_000_000, 1, 0))
	var nf *store.NoFitError
	require.ErrorAs(t, err, &nf)
	waiting, err := waitingCount(ctx, cells.Cell("eu"))
	require.NoError(t, err)
	assert.Equal(t, int64(1), waiting, "it waits in its home cell")
	require.NoError(t, cells.CheckInvariant(ctx))
}

func waitingCount(ctx context.Context, st *store.Store) (int64, error) {
	return st.Client().ZCard(ctx, st.Key("waiting")).Result()
}

// TestScoreDecidesNothing: the scoring pass finds the candidates reserve
// then reports, and writes nothing of a decision.
func TestScoreDecidesNothing(t *testing.T) {
	ctx := context.Background()
	s := newStore(t, store.Config{})
	for i := range 6 {
		_, err := s.Advertise(ctx, fmt.Sprintf("c%d", i), cluster(int64(8+4*i), int64(32+8*i), 0, int64(20_000+3000*(i%3)), nil))
		require.NoError(t, err)
	}
	req := request("r", "c0", 3000, 6, 0)
	sc, err := s.Score(ctx, req)
	require.NoError(t, err)
	usage, err := s.Usage(ctx)
	require.NoError(t, err)
	assert.Empty(t, usage)
	n, err := admin(t, s).XLen(ctx, s.Key("audit")).Result()
	require.NoError(t, err)
	assert.Zero(t, n, "no audit entry")

	d, err := s.Reserve(ctx, req)
	require.NoError(t, err)
	assert.Equal(t, d.Reservation.Candidates, sc.Candidates)
	assert.Equal(t, d.Reservation.Price, sc.Candidates[0].Price)
	assert.LessOrEqual(t, sc.MinPrice, sc.Candidates[0].Price)
	assert.GreaterOrEqual(t, sc.MaxPrice, sc.Candidates[0].Price)
}

// TestCellsDefault: without cells, one cell of the unsplit broker's keys.
func TestCellsDefault(t *testing.T) {
	cells, err := store.NewCells(startRedis(t), store.Config{}, nil, store.CellRule{})
	require.NoError(t, err)
	assert.Equal(t, []string{store.DefaultCell}, cells.Names())
	assert.Equal(t, store.DefaultPrefix, cells.Cell(store.DefaultCell).Config().Prefix)
	assert.Equal(t, store.DefaultCell, cells.CellOf(map[string]string{"region": "eu"}))
	_, err = store.NewCells(startRedis(t), store.Config{}, []string{"eu"}, store.CellRule{})
	assert.ErrorContains(t, err, "default cell")
	_, err = store.NewCells(startRedis(t), store.Config{}, []string{"e{u}"}, store.CellRule{Default: "e{u}"})
	assert.ErrorContains(t, err, "braces")
}
