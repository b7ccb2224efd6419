package store_test

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"sort"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fluidos-project/resource-broker/broker/model"
	"github.com/fluidos-project/resource-broker/broker/store"
)

func TestReserveScoring(t *testing.T) {
	ctx := context.Background()
	cases := []struct {
		name     string
		clusters map[string]model.Advertisement
		used     map[string]model.Resources
		req      model.ReserveRequest
		want     string
	}{
		{
			name: "cost decides between equal clusters",
			clusters: map[string]model.Advertisement{
				"berlin": cluster(16, 64, 0, 40_000, nil),
				"paris":  cluster(16, 64, 0, 30_000, nil),
			},
			req:  request("r1", "rome", 2000, 4, 0),
			want: "paris",
		},
		{
			name: "availability decides at equal price",
			clusters: map[string]model.Advertisement{
				"berlin": cluster(64, 256, 0, 30_000, nil),
				"paris":  cluster(8, 32, 0, 30_000, nil),
			},
			req:  request("r1", "rome", 2000, 4, 0),
			want: "berlin",
		},
		{
			name: "much more room outweighs a slightly higher price (70/30)",
			clusters: map[string]model.Advertisement{
				"berlin": cluster(64, 256, 0, 31_000, nil),
				"paris":  cluster(4, 8, 0, 30_000, nil),
			},
			req:  request("r1", "rome", 2000, 4, 0),
			want: "berlin",
		},
		{
			name: "ties go to the smallest cluster id",
			clusters: map[string]model.Advertisement{
				"lyon":  cluster(16, 64, 0, 30_000, nil),
				"paris": cluster(16, 64, 0, 30_000, nil),
				"milan": cluster(16, 64, 0, 30_000, nil),
			},
			req:  request("r1", "rome", 1000, 1, 0),
			want: "lyon",
		},
		{
			name: "a GPU request goes only where GPUs are free",
			clusters: map[string]model.Advertisement{
				"berlin": cluster(64, 256, 0, 10_000, nil),
				"paris":  cluster(8, 32, 2, 90_000, nil),
			},
			req:  request("r1", "rome", 1000, 1, 1),
			want: "paris",
		},
		{
			name: "the requester is never its own provider",
			clusters: map[string]model.Advertisement{
				"rome":  cluster(128, 512, 0, 1_000, nil),
				"paris": cluster(8, 32, 0, 90_000, nil),
			},
			req:  request("r1", "rome", 1000, 1, 0),
			want: "paris",
		},
		{
			name: "allocated capacity is not free",
			clusters: map[string]model.Advertisement{
				"berlin": cluster(16, 64, 0, 30_000, nil),
				"paris":  cluster(16, 64, 0, 20_000, nil),
			},
			used: map[string]model.Resources{"paris": {CPU: 15_500, Memory: 10 * gi}},
			req:  request("r1", "rome", 1000, 1, 0),
			want: "berlin",
		},
		{
			name: "label selector",
			clusters: map[string]model.Advertisement{
				"berlin": cluster(16, 64, 0, 30_000, map[string]string{"region": "eu-central"}),
				"paris":  cluster(16, 64, 0, 20_000, map[string]string{"region": "eu-west"}),
			},
			req: func() model.ReserveRequest {
				r := request("r1", "rome", 1000, 1, 0)
				r.Selector = map[string]string{"region": "eu-central"}
				return r
			}(),
			want: "berlin",
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s := newStore(t, store.Config{})
			for id, ad := range tc.clusters {
				ad.Allocated = tc.used[id]
				_, err := s.Advertise(ctx, id, ad)
				require.NoError(t, err)
			}
			before, err := s.Clusters(ctx)
			require.NoError(t, err)
			d, err := s.Reserve(ctx, tc.req)
			require.NoError(t, err)
			assert.Equal(t, tc.want, d.Reservation.Target)
			assert.Equal(t, model.PhaseReserved, d.Reservation.Phase)
			require.NotEmpty(t, d.Reservation.Candidates)
			assert.Equal(t, tc.want, d.Reservation.Candidates[0].Cluster)
			assert.InDelta(t, d.Reservation.Candidates[0].Score, d.Reservation.Score, 0.01)
			// The independent reference scorer agrees on the winner and the score.
			refWinner, refScore := referenceDecision(before, tc.req, 0.7, 0.3, map[string]bool{})
			assert.Equal(t, refWinner, d.Reservation.Target)
			assert.InDelta(t, refScore, d.Reservation.Score, 0.01)
			assertInvariant(t, s)
		})
	}
}

func TestReserveNothingFits(t *testing.T) {
	ctx := context.Background()
	s := newStore(t, store.Config{})
	for id, ad := range map[string]model.Advertisement{
		"rome":   cluster(64, 256, 0, 1, nil),
		"paris":  cluster(2, 64, 0, 1, nil),
		"berlin": cluster(16, 2, 0, 1, nil),
		"lyon":   cluster(16, 64, 0, 1, nil),
	} {
		_, err := s.Advertise(ctx, id, ad)
		require.NoError(t, err)
	}
	// Each reason counts every live cluster other than the requester that fails
	// it (a cluster may fail several); the full scan counts the same.
	req := request("r1", "rome", 4000, 4, 1)
	for _, st := range []*store.Store{s, store.NewFullScan(s.Client(), store.Config{})} {
		_, err := st.Reserve(ctx, req)
		var nf *store.NoFitError
		require.ErrorAs(t, err, &nf)
		assert.Equal(t, int64(1), nf.Rejected["requester"])
		assert.Equal(t, int64(1), nf.Rejected["insufficient_cpu"], "paris")
		assert.Equal(t, int64(1), nf.Rejected["insufficient_mem"], "berlin")
		assert.Equal(t, int64(3), nf.Rejected["insufficient_gpu"], "paris, berlin, lyon")
		assert.Contains(t, err.Error(), "insufficient_gpu=3")
	}
	_, err := s.Reservation(ctx, "rome", "r1")
	assert.ErrorIs(t, err, store.ErrNotFound, "a failed decision stores no reservation, so a retry with the same id can succeed later")
	assertInvariant(t, s)
}

func TestStaleClustersExcluded(t *testing.T) {
	ctx := context.Background()
	s := newStore(t, store.Config{StaleThreshold: 300 * time.Millisecond})
	_, err := s.Advertise(ctx, "berlin", cluster(64, 256, 0, 1_000, nil)) // cheaper and bigger, but goes stale
	require.NoError(t, err)
	time.Sleep(400 * time.Millisecond)
	_, err = s.Advertise(ctx, "paris", cluster(8, 32, 0, 50_000, nil))
	require.NoError(t, err)
	d, err := s.Reserve(ctx, request("r1", "rome", 1000, 1, 0))
	require.NoError(t, err)
	assert.Equal(t, "paris", d.Reservation.Target)
	clusters, err := s.Clusters(ctx)
	require.NoError(t, err)
	require.Len(t, clusters, 2)
	assert.Equal(t, []string{"berlin", "paris"}, []string{clusters[0].ID, clusters[1].ID}, "id order, not last-seen order")
	live, stale, err := s.CountClusters(ctx)
	require.NoError(t, err)
	assert.Equal(t, [2]int64{1, 1}, [2]int64{live, stale})

	_, err = s.Reserve(ctx, request("r2", "rome", 64000, 1, 0))
	var nf *store.NoFitError
	require.ErrorAs(t, err, &nf)
	assert.Equal(t, int64(1), nf.Rejected["stale"])
}

// TestReserveMatchesReference runs random states through the script and an
// independent Go implementation of the same rules; every decision must agree.
func TestReserveMatchesReference(t *testing.T) {
	ctx := context.Background()
	s := newStore(t, store.Config{})
	rng := rand.New(rand.NewPCG(1, 2))
	ids := make([]string, 30)
	for i := range ids {
		ids[i] = fmt.Sprintf("c%02d", i)
		ad := cluster(int64(2+rng.IntN(64)), int64(4+rng.IntN(256)), int64(rng.IntN(3)), int64(10_000+rng.IntN(5)*5_000), nil)
		ad.Allocated = model.Resources{CPU: int64(rng.IntN(2000)), Memory: int64(rng.IntN(4)) * gi}
		ad.Nodes = randomNodes(rng)
		_, err := s.Advertise(ctx, ids[i], ad)
		require.NoError(t, err)
	}
	decided, onNodes := 0, 0
	for i := 0; i < 300; i++ {
		req := request(fmt.Sprintf("r%d", i), ids[rng.IntN(len(ids))], int64(100+rng.IntN(8000)), int64(1+rng.IntN(16)), int64(rng.IntN(2)))
		clusters, err := s.Clusters(ctx)
		require.NoError(t, err)
		want, wantScore := referenceDecision(clusters, req, 0.7, 0.3, map[string]bool{})
		d, err := s.Reserve(ctx, req)
		if want == "" {
			var nf *store.NoFitError
			require.ErrorAs(t, err, &nf, "request %d", i)
			continue
		}
		require.NoError(t, err, "request %d", i)
		require.Equal(t, want, d.Reservation.Target, "request %d", i)
		require.InDelta(t, wantScore, d.Reservation.Score, 0.01)
		for _, c := range clusters {
			if c.ID == want {
				require.Equal(t, referenceNode(c, req), d.Reservation.Node, "request %d", i)
			}
		}
		if d.Reservation.Node != "" {
			onNodes++
		}
		decided++
	}
	assert.Greater(t, decided, 50)
	assert.Greater(t, onNodes, 20)
	assertInvariant(t, s)
}

// referenceDecision is the scoring rule of ARCHITECTURE.md written plainly in Go.
func referenceDecision(clusters []model.Cluster, req model.ReserveRequest, wRes, wCost float64, stale map[string]bool) (string, float64) {
	type cand struct {
		id           string
		rs, price, s float64
	}
	get := func(r model.Resources, i int) int64 { return [4]int64{r.CPU, r.Memory, r.GPU, r.Storage}[i] }
	var fits []cand
	for _, c := range clusters {
		if c.ID == req.Requester || stale[c.ID] {
			continue
		}
		ok, sum, n := true, 0.0, 0
		for i := 0; i < 4; i++ {
			want := get(req.Resources, i)
			if want == 0 {
				continue
			}
			free := get(c.Free(), i)
			if free < want {
				ok = false
				break
			}
			sum += float64(free-want) / float64(get(c.Allocatable, i))
			n++
		}
		for k, v := range req.Selector {
			if c.Labels[k] != v {
				ok = false
			}
		}
		if len(c.Nodes) > 0 && referenceNode(c, req) == "" {
			ok = false // no node holds it
		}
		if ok {
			price := float64(req.Resources.CPU)/1000*float64(c.Prices.CPU) +
				float64(req.Resources.Memory)/float64(gi)*float64(c.Prices.Memory) +
				float64(req.Resources.GPU)*float64(c.Prices.GPU)
			fits = append(fits, cand{id: c.ID, rs: 100 * sum / float64(n), price: price})
		}
	}
	if len(fits) == 0 {
		return "", 0
	}
	lo, hi := math.Inf(1), math.Inf(-1)
	for _, c := range fits {
		lo, hi = math.Min(lo, c.price), math.Max(hi, c.price)
	}
	for i := range fits {
		cs := 100.0
		if hi > lo {
			cs = 100 * (hi - fits[i].price) / (hi - lo)
		}
		fits[i].s = wRes*fits[i].rs + wCost*cs
	}
	sort.Slice(fits, func(i, j int) bool {
		if fits[i].s != fits[j].s {
			return fits[i].s > fits[j].s
		}
		return fits[i].id < fits[j].id
	})
	return fits[0].id, fits[0].s
}

// referenceNode is the node a reservation takes on cluster c, written
// plainly: among the nodes whose free capacity holds every requested amount,
// the least free GPU, then CPU, memory, storage, then name ("" if none).
func referenceNode(c model.Cluster, req model.ReserveRequest) string {
	get := func(r model.Resources) [4]int64 { return [4]int64{r.CPU, r.Memory, r.GPU, r.Storage} }
	want := get(req.Resources)
	var best *model.Node
	for _, n := range c.StoredNodes() {
		free := get(n.Free())
		holds := true
		for i := range want {
			if want[i] > 0 && free[i] < want[i] {
				holds = false
			}
		}
		if !holds {
			continue
		}
		if best == nil {
			best = &n
			continue
		}
		b := get(best.Free())
		key, bkey := [4]int64{free[2], free[0], free[1], free[3]}, [4]int64{b[2], b[0], b[1], b[3]}
		if key != bkey {
			for i := range key {
				if key[i] != bkey[i] {
					if key[i] < bkey[i] {
						best = &n
					}
					break
				}
			}
		} else if n.Name < best.Name {
			best = &n
		}
	}
	if best == nil {
		return ""
	}
	return best.Name
}
