package store_test

import (
	"context"
	"math/rand/v2"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sync/errgroup"

	"github.com/fluidos-project/resource-broker/broker/model"
	"github.com/fluidos-project/resource-broker/broker/store"
	"github.com/fluidos-project/resource-broker/internal/redistest"
)

// benchCellClusters is the federation of BenchmarkCells: the same clusters
// whether split in cells or not.
const benchCellClusters = 300

// BenchmarkCells compares one cell on one redis-server with three cells
// (b, eu, us: one per primary) on a three-primary Redis Cluster, the same
// clusters (benchCluster, each with a label cell = its index mod 3) and the
// same requests at the same offered load (benchParallelism × GOMAXPROCS
// callers, as BenchmarkReserve's parallel leaves):
//
//	1cell-1redis     Store.Reserve on the unsplit broker's keys
//	3cells/home      the requester's cell only (Cells.Cell(home).Reserve)
//	3cells/across    Cells.ReserveAcross: a scoring pass in every cell, then
//	                 a reserve in the best one
//
// Besides decisions/s, p50-ms and p99-ms, each leaf runs 300 decisions one
// at a time (no concurrency: each judged against the state it was decided
// on) scored against a global scoring pass (Cells.Score of every cell,
// merged by store.Rank) taken just before, and reports missed-% (the share
// whose cluster is not the global best: it scores more than 0.01 below it,
// the precision of the reported scores) and gap (the mean, over all 300,
// of the score points between the global best and the cluster chosen, by
// the global scale).
func BenchmarkCells(b *testing.B) {
	ctx := context.Background()
	cfg := store.Config{StaleThreshold: time.Hour, Policy: benchLimits(b)}
	requesters := 9 // federation members, three per cell

	single, err := store.NewCells(startRedis(b), cfg, nil, store.CellRule{Label: "cell"})
	require.NoError(b, err)
	rc := redistest.StartCluster(b, 3, cellNames)
	split, err := store.NewCells(rc.Client(), cfg, cellNames, store.CellRule{Label: "cell"})
	require.NoError(b, err)
	for _, cells := range []*store.Cells{single, split} {
		require.NoError(b, cells.LoadScripts(ctx))
		advertiseCells(b, cells, benchCellClusters)
	}

	request := func(seq int64) (model.ReserveRequest, string) {
		requester := int(seq) % requesters
		return model.ReserveRequest{
			ID: "b" + strconv.FormatInt(seq, 36), Requester: benchClusterID(requester),
			Resources: benchRequests[seq%int64(len(benchRequests))], Duration: time.Hour,
		}, cellNames[requester%3]
	}
	leaves := []struct {
		name   string
		cells  *store.Cells
		decide func(ctx context.Context, seq int64) (model.Decision, error)
	}{
		{"1cell-1redis", single, func(ctx context.Context, seq int64) (model.Decision, error) {
			req, _ := request(seq)
			return single.Cell(store.DefaultCell).Reserve(ctx, req)
		}},
		{"3cells/home", split, func(ctx context.Context, seq int64) (model.Decision, error) {
			req, home := request(seq)
			return split.Cell(home).Reserve(ctx, req)
		}},
		{"3cells/across", split, func(ctx context.Context, seq int64) (model.Decision, error) {
			req, home := request(seq)
			d, err := split.ReserveAcross(ctx, home, req)
			return d.Decision, err
		}},
	}
	for _, leaf := range leaves {
		b.Run(leaf.name, func(b *testing.B) {
			all := timeParallel(b, func(ctx context.Context, seq int64) error {
				_, err := leaf.decide(ctx, seq)
				return err
			})
			reportLatencies(b, all)
			missed, gap := decisionQuality(b, leaf.cells, request, leaf.decide)
			b.ReportMetric(missed, "missed-%")
			b.ReportMetric(gap, "gap")
		})
	}
}

// advertiseCells advertises n clusters, cluster i labelled cell = the i mod 3rd of cellNames.
func advertiseCells(b *testing.B, cells *store.Cells, n int) {
	rng := rand.New(rand.NewPCG(uint64(n), 42))
	var g errgroup.Group
	g.SetLimit(32)
	for i := range n {
		ad := benchCluster(rng, benchClusterID(i))
		ad.Labels["cell"] = cellNames[i%3]
		g.Go(func() error {
			_, _, err := cells.Advertise(context.Background(), benchClusterID(i), ad)
			return err
		})
	}
	require.NoError(b, g.Wait())
}

func reportLatencies(b *testing.B, lat []time.Duration) {
	if secs := b.Elapsed().Seconds(); secs > 0 {
		b.ReportMetric(float64(b.N)/secs, "decisions/s")
	}
	if len(lat) == 0 {
		return
	}
	slices.Sort(lat)
	pct := func(p float64) float64 { return float64(lat[int(p*float64(len(lat)-1))]) / float64(time.Millisecond) }
	b.ReportMetric(pct(0.50), "p50-ms")
	b.ReportMetric(pct(0.99), "p99-ms")
}

// decisionQuality decides 300 requests one at a time, each after a global
// scoring pass over every cell of cells, and returns the share (%) whose
// cluster is not the global best and the mean score gap to it.
func decisionQuality(b *testing.B, cells *store.Cells, request func(int64) (model.ReserveRequest, string),
	decide func(context.Context, int64) (model.Decision, error)) (missedPct, meanGap float64) {
	ctx := context.Background()
	const n = 300
	missed, gap := 0, 0.0
	for range n {
		seq := benchSeq.Add(1)
		req, _ := request(seq)
		scored, err := cells.Score(ctx, cells.Names(), req)
		require.NoError(b, err)
		cfg := cells.Cell(cells.Names()[0]).Config()
		ranked := store.Rank(scored, cfg.WeightResources, cfg.WeightCost)
		require.NotEmpty(b, ranked)
		d, err := decide(ctx, seq)
		require.NoError(b, err)
		i := slices.IndexFunc(ranked, func(c store.CellCandidate) bool { return c.Cluster == d.Reservation.Target })
		require.GreaterOrEqual(b, i, 0, "the cluster chosen is its cell's best, one of the ranked")
		// Candidates carry their scores to 0.01 (reserve.lua's report):
		// a cluster that close to the best is a tie, not a miss.
		if g := ranked[0].Score - ranked[i].Score; g > 0.01 {
			missed++
			gap += g
		}
	}
	return 100 * float64(missed) / n, gap / n
}
