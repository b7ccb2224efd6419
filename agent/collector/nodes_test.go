package collector

import (
	"cmp"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// randomFleet draws n nodes from a few shapes (cpu cores, GiB per core,
// GPUs, storage) with random use, so that equal and anti-correlated free
// capacities both happen.
func randomFleet(rng *rand.Rand, n int) []nodeFree {
	nodes := make([]nodeFree, n)
	for i := range nodes {
		cores := []int64{2, 4, 8, 16, 32, 64}[rng.IntN(6)]
		alloc := amounts{cores * 1000, cores * []int64{1, 2, 4, 8}[rng.IntN(4)] << 30,
			[]int64{0, 0, 0, 0, 1, 4}[rng.IntN(6)], []int64{50, 100, 200}[rng.IntN(3)] << 30}
		nf := nodeFree{name: fmt.Sprintf("node-%05d", i), alloc: alloc}
		for r := range alloc {
			nf.used[r] = alloc[r] * int64(rng.IntN(5)) / 4 // 0 to 100 %
			nf.free[r] = alloc[r] - nf.used[r]
		}
		nodes[i] = nf
	}
	return nodes
}

// holds: some node of nodes has req free.
func holds(nodes []nodeFree, req amounts) bool {
	return slices.ContainsFunc(nodes, func(n nodeFree) bool { return dominates(n.free, req) })
}

// TestSummaryIsExactWhenTheSkylineFits: the summary is bounded, in name
// order, holds the largest nodes by each resource, and when it says it is
// exact, every request some node of the cluster can hold, a listed node can
// hold (checked by brute force over random fleets and requests).
func TestSummaryIsExactWhenTheSkylineFits(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	exact, inexact := 0, 0
	for round := range 200 {
		n := []int{1, 3, 20, 100, 400}[round%5]
		nodes := randomFleet(rng, n)
		perResource, maxNodes := SummaryPerResource, SummaryMax
		if round%3 == 0 { // smaller bounds, so that the skyline often does not fit
			perResource, maxNodes = 2, 6
		}
		summary, isExact := summarize(nodes, perResource, maxNodes)
		require.NotEmpty(t, summary)
		require.LessOrEqual(t, len(summary), maxNodes)
		require.True(t, slices.IsSortedFunc(summary, func(a, b nodeFree) int { return strings.Compare(a.name, b.name) }))
		listed := map[string]bool{}
		for _, s := range summary {
			require.False(t, listed[s.name], "listed twice")
			listed[s.name] = true
		}
		// The node with the most free of each resource is listed (there is
		// room for the largest of each when 4 × perResource <= maxNodes).
		for r := range len(amounts{}) {
			best := slices.MaxFunc(nodes, func(a, b nodeFree) int {
				if c := cmp.Compare(a.free[r], b.free[r]); c != 0 {
					return c
				}
				return strings.Compare(b.name, a.name)
			})
			if best.free[r] > 0 && 4*perResource <= maxNodes {
				require.True(t, listed[best.name], "round %d: the node with the most free of resource %d", round, r)
			}
		}
		if !isExact {
			inexact++
			continue
		}
		exact++
		for range 200 {
			req := amounts{int64(1+rng.IntN(64)) * 500, int64(1+rng.IntN(128)) << 29, int64(rng.IntN(3)) * int64(rng.IntN(2)), int64(rng.IntN(4)) * 25 << 30}
			require.Equal(t, holds(nodes, req), holds(summary, req), "round %d, request %v", round, req)
		}
	}
	t.Logf("%d exact summaries checked by brute force, %d inexact", exact, inexact)
	require.Greater(t, exact, 100)
	require.Greater(t, inexact, 10)
}

// TestSummaryOfFullNodes: a cluster whose nodes are all full still lists
// some (with nothing free), so the broker keeps judging it per node.
func TestSummaryOfFullNodes(t *testing.T) {
	nodes := make([]nodeFree, 40)
	for i := range nodes {
		nodes[i] = nodeFree{name: fmt.Sprintf("n%02d", i), alloc: amounts{4000, 8 << 30}, used: amounts{4000, 8 << 30}}
	}
	summary, exact := summarize(nodes, SummaryPerResource, SummaryMax)
	require.Len(t, summary, SummaryPerResource, "the first by cpu and by memory (the same, by name)")
	require.True(t, exact)
}

// TestSummaryAt5000Nodes: the summary stays bounded (and quick) at 5,000
// nodes, and an identical fleet lists only the largest nodes.
func TestSummaryAt5000Nodes(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	nodes := randomFleet(rng, 5000)
	began := time.Now()
	summary, exact := summarize(nodes, SummaryPerResource, SummaryMax)
	took := time.Since(began)
	t.Logf("5,000 nodes: %d listed (skyline complete: %v) in %s", len(summary), exact, took)
	require.LessOrEqual(t, len(summary), SummaryMax)
	require.Less(t, took, time.Second)

	same := make([]nodeFree, 5000)
	for i := range same {
		same[i] = nodeFree{name: fmt.Sprintf("n%04d", i), alloc: amounts{32000, 128 << 30}, free: amounts{32000, 128 << 30}}
	}
	summary, exact = summarize(same, SummaryPerResource, SummaryMax)
	require.Len(t, summary, SummaryPerResource)
	require.True(t, exact)
}

// TestListedReservationsBounded: the ids listed are sorted, at most
// MaxListedReservations and within the byte budget; always the same subset.
func TestListedReservationsBounded(t *testing.T) {
	ty := newTally()
	for i := range 3000 {
		ty.reservations[fmt.Sprintf("6f1c2a3e-0000-4000-8000-%012d", i)] = 1
	}
	ids := ty.listedReservations()
	require.True(t, slices.IsSorted(ids))
	size := 0
	for _, id := range ids {
		size += len(id) + 3
	}
	require.LessOrEqual(t, size, listedBytes)
	require.LessOrEqual(t, len(ids), MaxListedReservations)
	require.Greater(t, len(ids), 300)
	require.Equal(t, ids, ty.listedReservations())
}
