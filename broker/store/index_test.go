package store_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"sort"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sync/errgroup"

	"github.com/fluidos-project/resource-broker/broker/model"
	"github.com/fluidos-project/resource-broker/broker/store"
)

// randomAdvertisement draws a cluster from small value domains, so that equal
// free fractions, equal prices and exact score ties happen, next to GPU-less
// clusters and full clusters (whose free capacity still goes below zero when
// a re-advertisement shrinks under what is reserved: the broker refuses only
// more allocated than allocatable, store.Advertisement.Validate).
func randomAdvertisement(rng *rand.Rand) model.Advertisement {
	cores := int64(1 + rng.IntN(64))
	if rng.IntN(4) == 0 {
		cores = 16 // many equal sizes
	}
	alloc := model.Resources{
		CPU: cores * 1000, Memory: cores * int64(1+rng.IntN(8)) * gi,
		GPU: []int64{0, 0, 0, 1, 2, 4}[rng.IntN(6)], Storage: int64(rng.IntN(200)) * gi,
	}
	pct := []int64{0, 0, 25, 50, 90, 100, 100}[rng.IntN(7)]
	used := model.Resources{CPU: alloc.CPU * pct / 100, Memory: alloc.Memory * int64(rng.IntN(100)) / 100, GPU: alloc.GPU / 2}
	regions := []string{"eu", "us", "ap"}
	labels := map[string]string{"region": regions[rng.IntN(len(regions))]}
	if rng.IntN(3) == 0 {
		labels["tier"] = "edge"
	}
	return model.Advertisement{
		Capacity: alloc, Allocatable: alloc, Allocated: used, Labels: labels,
		Prices: model.Prices{
			CPU: []int64{10_000, 20_000, 30_000, 40_000}[rng.IntN(4)], Memory: int64(rng.IntN(4)) * 1_000,
			GPU: []int64{500_000, 1_000_000}[rng.IntN(2)], Currency: "EUR",
		},
		Nodes: randomNodes(rng),
	}
}

// randomNodes draws the nodes of half the clusters (the others advertise
// none: the cluster-level rule), from small value domains so that equal
// free capacities (ties of the best fit) happen, with full and GPU nodes.
func randomNodes(rng *rand.Rand) []model.NodeCapacity {
	if rng.IntN(2) == 0 {
		return nil
	}
	nodes := make([]model.NodeCapacity, 1+rng.IntN(12))
	for i := range nodes {
		cores := []int64{1, 2, 4, 8, 16, 32}[rng.IntN(6)]
		alloc := model.Resources{
			CPU: cores * 1000, Memory: cores * []int64{1, 2, 4, 8}[rng.IntN(4)] * gi,
			GPU: []int64{0, 0, 0, 1, 2, 4}[rng.IntN(6)], Storage: []int64{0, 50, 100, 200}[rng.IntN(4)] * gi,
		}
		pct := []int64{0, 0, 25, 50, 90, 100}[rng.IntN(6)]
		used := model.Resources{CPU: alloc.CPU * pct / 100, Memory: alloc.Memory * int64(rng.IntN(4)) / 4,
			GPU: alloc.GPU / 2, Storage: alloc.Storage * int64(rng.IntN(3)) / 4}
		nodes[i] = model.NodeCapacity{Name: fmt.Sprintf("n%02d", i), Allocatable: alloc, Allocated: used}
	}
	return nodes
}

// listSome lists about half of the live reservations placed on cluster id
// as running there, as its agent would once their pods run.
func listSome(t *testing.T, rng *rand.Rand, s *store.Store, id string) []string {
	t.Helper()
	live, err := s.LiveReservations(context.Background(), "by-target", id)
	require.NoError(t, err)
	sort.Slice(live, func(i, j int) bool { return live[i].ID < live[j].ID })
	var ids []string
	for _, r := range live {
		if rng.IntN(2) == 0 {
			ids = append(ids, r.ID)
		}
	}
	return ids
}

func randomRequest(rng *rand.Rand, id, requester string) model.ReserveRequest {
	req := model.ReserveRequest{ID: id, Requester: requester, Duration: time.Hour,
		Resources: model.Resources{CPU: int64(1+rng.IntN(16)) * 250, Memory: int64(1+rng.IntN(8)) * gi / 2}}
	switch rng.IntN(8) {
	case 0:
		req.Resources.GPU = int64(1 + rng.IntN(2))
	case 1:
		req.Resources.Storage = int64(1+rng.IntN(50)) * gi
	case 2:
		req.Resources = model.Resources{CPU: 24_000, Memory: 96 * gi} // fits few or none
	}
	switch rng.IntN(6) {
	case 0:
		req.Selector = map[string]string{"region": "eu"}
	case 1:
		req.Selector = map[string]string{"tier": "edge", "region": "us"}
	case 2:
		req.Selector = map[string]string{"region": "mars"}
	}
	return req
}

// randomPreferences draws 1-3 preference terms over the clusters ids: weights
// that tie, labels of the random advertisements (some no cluster carries,
// some conflicting with randomRequest's selectors), clusters named (some
// stale, or the requester), or both.
func randomPreferences(rng *rand.Rand, ids []string) []model.Preference {
	prefs := make([]model.Preference, 1+rng.IntN(3))
	for i := range prefs {
		p := model.Preference{Weight: []int32{10, 50, 50, 100}[rng.IntN(4)]}
		kind := rng.IntN(3) // 0: labels, 1: clusters, 2: both
		if kind != 1 {
			switch rng.IntN(4) {
			case 0:
				p.Labels = map[string]string{"region": "eu"}
			case 1:
				p.Labels = map[string]string{"region": "us", "tier": "edge"}
			case 2:
				p.Labels = map[string]string{"region": "ap"}
			case 3:
				p.Labels = map[string]string{"tier": "edge"}
			}
		}
		if kind != 0 {
			for range 1 + rng.IntN(6) {
				p.Clusters = append(p.Clusters, ids[rng.IntN(len(ids))])
			}
		}
		prefs[i] = p
	}
	return prefs
}

// preferenceOutcome names how a decision used its preferences, for the tallies of the property tests.
func preferenceOutcome(r model.Reservation) string {
	switch {
	case r.Preference == nil:
		return "none asked"
	case r.Preference.Term < 0:
		return "none fitting"
	case r.Preference.Term == r.Preference.Tried[0]:
		return "first term"
	}
	return "later term"
}

// TestIndexMatchesFullScan is the property test of the candidate index: on
// random states (sizes on both sides of the direct-evaluation limit, stale
// clusters, re-advertisements, releases), every decision through the index
// equals the full scan's: same winner, same score, same candidates in the same
// order, and the same rejection counts when nothing fits. Each request is
// decided by the full scan, released (which restores the exact counters),
// then decided through the index on the same state.
func TestIndexMatchesFullScan(t *testing.T) {
	ctx := context.Background()
	rdb := startRedis(t)
	const stale = 3 * time.Second
	indexed := store.New(rdb, store.Config{StaleThreshold: stale})
	scan := store.NewFullScan(rdb, store.Config{StaleThreshold: stale})
	require.NoError(t, indexed.LoadScripts(ctx))

	methods, prefs := map[string]int{}, map[string]int{}
	decided, nofit, onNodes, nodeNofit := 0, 0, 0, 0
	for round, n := range []int{12, 60, 300, 700} {
		require.NoError(t, admin(t, indexed).FlushAll(ctx).Err())
		require.NoError(t, indexed.LoadScripts(ctx))
		rng := rand.New(rand.NewPCG(uint64(round), propertySeed(t)))
		fed := newRandomFederation(t, indexed, rng, n, stale)
		ids := fed.ids

		var kept []string
		requesterOf := map[string]string{}
		for i := range 150 {
			fed.beatIfDue(t)
			requester := ids[rng.IntN(n)]
			req := randomRequest(rng, fmt.Sprintf("r%d-%d", round, i), requester)
			if rng.IntN(3) == 0 {
				req.Preferences = randomPreferences(rng, ids)
			}
			ref := req
			ref.ID += "-scan"
			want, wantErr := scan.Reserve(ctx, ref)
			if wantErr == nil {
				_, err := scan.Release(ctx, requester, ref.ID, requester)
				require.NoError(t, err)
			}
			got, gotErr := indexed.Reserve(ctx, req)
			var wantNF, gotNF *store.NoFitError
			if errors.As(wantErr, &wantNF) {
				require.ErrorAs(t, gotErr, &gotNF, "round %d request %d: the scan finds nothing, the index found %+v", round, i, got.Reservation.Target)
				require.Equal(t, wantNF.Rejected, gotNF.Rejected, "round %d request %d: rejections", round, i)
				nofit++
				if gotNF.Rejected["insufficient_node_fit"] > 0 {
					nodeNofit++
				}
				continue
			}
			require.NoError(t, wantErr)
			require.NoError(t, gotErr, "round %d request %d: the scan chose %s", round, i, want.Reservation.Target)
			requireSameDecision(t, want.Reservation, got.Reservation, round, i)
			prefs[preferenceOutcome(got.Reservation)]++
			decided++
			methods[lastAuditMethod(t, indexed)]++
			if got.Reservation.Node != "" {
				onNodes++
			}

			// Evolve the state: keep most decisions, release some, re-advertise some.
			kept = append(kept, req.ID)
			requesterOf[req.ID] = req.Requester
			if rng.IntN(4) == 0 {
				j := rng.IntN(len(kept))
				r, err := indexed.Reservation(ctx, requesterOf[kept[j]], kept[j])
				require.NoError(t, err)
				_, err = indexed.Release(ctx, r.Requester, kept[j], r.Requester)
				require.NoError(t, err)
			}
			if rng.IntN(5) == 0 {
				fed.readvertise(t, rng)
			}
		}
		// The index still agrees with the hashes. (CheckInvariant would also
		// flag the clusters whose local pods overrun allocatable on purpose.)
		require.NoError(t, indexed.CheckIndex(ctx), "round %d", round)
	}
	t.Logf("decisions compared: %d placed (%d on a node), %d nofit (%d with clusters no node of which holds it); index methods %v; preferences %v",
		decided, onNodes, nofit, nodeNofit, methods, prefs)
	require.Greater(t, prefs["first term"], 20, "placements by a first preference term must be exercised")
	require.Greater(t, prefs["later term"], 5, "placements by a later term must be exercised")
	require.Greater(t, prefs["none fitting"], 5, "preferences none of which fits must be exercised")
	require.Greater(t, decided, 300)
	require.Greater(t, nofit, 20)
	require.Greater(t, onNodes, 100, "per-node fit must be exercised")
	require.Greater(t, nodeNofit, 10, "refusals for node fit must be exercised")
	require.Greater(t, methods["threshold"], 100, "the threshold walk must be exercised")
	require.Greater(t, methods["direct"], 20, "direct evaluation must be exercised")
}

// requireSameDecision: got was decided as want (the full scan's): the same
// winner, score, candidates in order, node and preference outcome.
func requireSameDecision(t *testing.T, want, got model.Reservation, round, i int) {
	t.Helper()
	require.Equal(t, want.Target, got.Target, "round %d request %d", round, i)
	require.Equal(t, want.Score, got.Score, "round %d request %d", round, i)
	require.Equal(t, want.Candidates, got.Candidates, "round %d request %d", round, i)
	require.Equal(t, want.Node, got.Node, "round %d request %d", round, i)
	require.Equal(t, want.Preference, got.Preference, "round %d request %d", round, i)
}

// randomFederation is a random state for the decision property tests, on
// s's flushed Redis: clusters c000..., the first fifth advertised once and
// left to go stale (stale: s's threshold), the others live, each with its
// latest advertisement in ads.
type randomFederation struct {
	s        *store.Store
	stale    time.Duration
	ids      []string
	ads      map[string]model.Advertisement
	lastBeat time.Time
}

func newRandomFederation(t *testing.T, s *store.Store, rng *rand.Rand, n int, stale time.Duration) *randomFederation {
	t.Helper()
	f := &randomFederation{s: s, stale: stale, ids: make([]string, n), ads: map[string]model.Advertisement{}}
	for i := range f.ids {
		f.ids[i] = fmt.Sprintf("c%03d", i)
	}
	for _, id := range f.ids[:n/5] {
		_, err := s.Advertise(context.Background(), id, randomAdvertisement(rng))
		require.NoError(t, err)
	}
	time.Sleep(stale + 100*time.Millisecond)
	for _, id := range f.live() {
		f.ads[id] = randomAdvertisement(rng)
	}
	f.beat(t)
	return f
}

func (f *randomFederation) live() []string { return f.ids[len(f.ids)/5:] }

// beat publishes every live cluster's advertisement again (a heartbeat),
// concurrently, so that a loaded machine stays well within the threshold;
// lastBeat is taken before it starts: its first cluster is seen then.
func (f *randomFederation) beat(t *testing.T) {
	t.Helper()
	f.lastBeat = time.Now()
	var g errgroup.Group
	g.SetLimit(16)
	for _, id := range f.live() {
		g.Go(func() error {
			_, err := f.s.Advertise(context.Background(), id, f.ads[id])
			return err
		})
	}
	require.NoError(t, g.Wait())
}

// beatIfDue beats every sixth of the threshold, as agents publish: no live
// cluster goes stale between two decisions compared.
func (f *randomFederation) beatIfDue(t *testing.T) {
	if time.Since(f.lastBeat) > f.stale/6 {
		f.beat(t)
	}
}

// readvertise gives a random live cluster new figures, listing about half
// of the reservations placed on it as running there.
func (f *randomFederation) readvertise(t *testing.T, rng *rand.Rand) {
	t.Helper()
	live := f.live()
	id := live[rng.IntN(len(live))]
	ad := randomAdvertisement(rng)
	ad.ReservationsOnNodes = listSome(t, rng, f.s, id)
	f.ads[id] = ad
	_, err := f.s.Advertise(context.Background(), id, ad)
	require.NoError(t, err)
}

// propertySeed is 7, or RB_PROPERTY_SEED to explore other random states.
func propertySeed(t *testing.T) uint64 {
	if v := os.Getenv("RB_PROPERTY_SEED"); v != "" {
		seed, err := strconv.ParseUint(v, 10, 64)
		require.NoError(t, err)
		return seed
	}
	return 7
}

func lastAuditMethod(t *testing.T, s *store.Store) string {
	t.Helper()
	entries, err := s.Client().XRevRangeN(context.Background(), s.Key("audit"), "+", "-", 1).Result()
	require.NoError(t, err)
	require.Len(t, entries, 1)
	m, _ := entries[0].Values["method"].(string)
	return m
}

// TestRebuildIndex: a Redis written without the index (an older broker) is
// indexed at start-up, and a forced rebuild leaves decisions unchanged.
func TestRebuildIndex(t *testing.T) {
	ctx := context.Background()
	rdb := startRedis(t)
	s := store.New(rdb, store.Config{})
	require.NoError(t, s.LoadScripts(ctx))
	rng := rand.New(rand.NewPCG(3, 4))
	for i := range 80 {
		_, err := s.Advertise(ctx, fmt.Sprintf("c%02d", i), randomAdvertisement(rng))
		require.NoError(t, err)
	}
	before, err := s.Reserve(ctx, request("before", "c00", 500, 1, 0))
	require.NoError(t, err)
	_, err = s.Release(ctx, "c00", "before", "c00")
	require.NoError(t, err)

	keys, err := admin(t, s).Keys(ctx, s.Key("idx:*")).Result()
	require.NoError(t, err)
	require.NotEmpty(t, keys)
	require.NoError(t, rdb.Del(ctx, keys...).Err())
	require.NoError(t, s.LoadScripts(ctx), "start-up rebuilds the missing index")
	require.NoError(t, s.CheckIndex(ctx))
	after, err := s.Reserve(ctx, request("after", "c00", 500, 1, 0))
	require.NoError(t, err)
	require.Equal(t, before.Reservation.Target, after.Reservation.Target)
	require.Equal(t, before.Reservation.Candidates, after.Reservation.Candidates)

	n, err := s.RebuildIndex(ctx)
	require.NoError(t, err)
	require.EqualValues(t, 80, n)
	require.NoError(t, s.CheckIndex(ctx))
}
