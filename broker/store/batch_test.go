package store_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/fluidos-project/resource-broker/broker/model"
	"github.com/fluidos-project/resource-broker/broker/scripts"
	"github.com/fluidos-project/resource-broker/broker/store"
)

// TestBatchMatchesSequential: a batch of requests decided in one reserve.lua
// call gives, request by request, the same answers as one call each in the
// same order, and leaves the same state: two redis-servers get the same
// advertisements, one decides batches, the other the same requests one by
// one. The batches mix fitting and unfitting requests, selectors, GPUs,
// priorities (the waiting list's gate reads the index mid-batch), replays and
// conflicts of ids decided earlier in the same batch, at federation sizes on
// both sides of the direct-evaluation limit.
func TestBatchMatchesSequential(t *testing.T) {
	seqRdb := startRedis(t)
	batRdb := startRedis(t)
	for _, fullScan := range []bool{false, true} {
		t.Run(fmt.Sprintf("fullScan=%v", fullScan), func(t *testing.T) {
			// WaitTTL: no waiting request may expire between the two sides' calls.
			cfg := store.Config{StaleThreshold: time.Hour, WaitTTL: time.Hour}
			testBatchMatchesSequential(t, storeOn(seqRdb, cfg, fullScan), storeOn(batRdb, cfg, fullScan))
		})
	}
}

func testBatchMatchesSequential(t *testing.T, seq, bat *store.Store) {
	ctx := context.Background()
	seqRdb, batRdb := seq.Client(), bat.Client()

	decided, nofit, replays, conflicts, onNodes := 0, 0, 0, 0, 0
	prefs := map[string]int{}
	for round, n := range []int{12, 60, 300} {
		for _, s := range []*store.Store{seq, bat} {
			require.NoError(t, admin(t, s).FlushAll(ctx).Err())
			require.NoError(t, s.LoadScripts(ctx))
		}
		rng := rand.New(rand.NewPCG(uint64(round), propertySeed(t)))
		ids := make([]string, n)
		for i := range ids {
			ids[i] = fmt.Sprintf("c%03d", i)
			ad := randomAdvertisement(rng)
			for _, s := range []*store.Store{seq, bat} {
				_, err := s.Advertise(ctx, ids[i], ad)
				require.NoError(t, err)
			}
		}
		var kept []model.ReserveRequest
		for b := range 4 {
			reqs := make([]model.ReserveRequest, 48)
			for i := range reqs {
				reqs[i] = randomRequest(rng, fmt.Sprintf("r%d-%d-%d", round, b, i), ids[rng.IntN(n)])
				reqs[i].Priority = int32(rng.IntN(3))
				if rng.IntN(3) == 0 {
					reqs[i].Preferences = randomPreferences(rng, ids)
				}
				switch {
				case i > 0 && rng.IntN(12) == 0: // the same request again: a replay
					reqs[i] = reqs[rng.IntN(i)]
				case i > 0 && rng.IntN(12) == 0: // an id of this batch, other amounts: a conflict
					j := rng.IntN(i) // of its requester: ids are scoped per requester
					reqs[i].ID, reqs[i].Requester = reqs[j].ID, reqs[j].Requester
				}
			}
			got, gotErrs := bat.ReserveBatch(ctx, reqs)
			for i, req := range reqs {
				want, wantErr := seq.Reserve(ctx, req)
				where := fmt.Sprintf("round %d batch %d request %d (%s)", round, b, i, req.ID)
				var wantNF, gotNF *store.NoFitError
				switch {
				case errors.As(wantErr, &wantNF):
					require.ErrorAs(t, gotErrs[i], &gotNF, where)
					require.Equal(t, wantNF.Rejected, gotNF.Rejected, where)
					nofit++
				case errors.Is(wantErr, store.ErrConflict):
					require.ErrorIs(t, gotErrs[i], store.ErrConflict, where)
					conflicts++
				default:
					require.NoError(t, wantErr, where)
					require.NoError(t, gotErrs[i], where)
					require.Equal(t, want.Replayed, got[i].Replayed, where)
					require.Equal(t, want.Reservation.Target, got[i].Reservation.Target, where)
					require.Equal(t, want.Reservation.Score, got[i].Reservation.Score, where)
					require.Equal(t, want.Reservation.Candidates, got[i].Reservation.Candidates, where)
					require.Equal(t, want.Reservation.Node, got[i].Reservation.Node, where)
					require.Equal(t, want.Reservation.Preference, got[i].Reservation.Preference, where)
					if want.Reservation.Preference != nil && !want.Replayed {
						prefs[preferenceOutcome(want.Reservation)]++
					}
					if want.Reservation.Node != "" && !want.Replayed {
						onNodes++
					}
					if want.Replayed {
						replays++
					} else {
						decided++
						kept = append(kept, req)
					}
				}
			}
			// Between batches, release some reservations on both sides.
			for range 8 {
				if len(kept) == 0 {
					break
				}
				j := rng.IntN(len(kept))
				for _, s := range []*store.Store{seq, bat} {
					_, err := s.Release(ctx, kept[j].Requester, kept[j].ID, kept[j].Requester)
					require.NoError(t, err)
				}
				kept = append(kept[:j], kept[j+1:]...)
			}
			// And some providers report the reservations' pods running on their nodes.
			for range 6 {
				id := ids[rng.IntN(n)]
				ad := randomAdvertisement(rng)
				ad.ReservationsOnNodes = listSome(t, rng, seq, id)
				for _, s := range []*store.Store{seq, bat} {
					_, err := s.Advertise(ctx, id, ad)
					require.NoError(t, err)
				}
			}
		}
		// The same state: capacity counters, index records and sorted sets,
		// reservations per target, the waiting list.
		require.NoError(t, bat.CheckIndex(ctx), "round %d", round)
		for _, id := range ids {
			key := "cluster:" + id
			fields := []string{"resv_cpu", "resv_mem", "resv_gpu", "resv_sto"}
			require.Equal(t, seqRdb.HMGet(ctx, seq.Key(key), fields...).Val(), batRdb.HMGet(ctx, bat.Key(key), fields...).Val(), "round %d %s", round, id)
			require.ElementsMatch(t, seqRdb.SMembers(ctx, seq.Key("by-target:", id)).Val(), batRdb.SMembers(ctx, bat.Key("by-target:", id)).Val(), "round %d %s", round, id)
			require.Equal(t, seqRdb.HGetAll(ctx, seq.Key("node-resv:", id)).Val(), batRdb.HGetAll(ctx, bat.Key("node-resv:", id)).Val(), "round %d %s", round, id)
			require.ElementsMatch(t, seqRdb.SMembers(ctx, seq.Key("node-listed:", id)).Val(), batRdb.SMembers(ctx, bat.Key("node-listed:", id)).Val(), "round %d %s", round, id)
		}
		require.Equal(t, seqRdb.HGetAll(ctx, seq.Key("idx:rec")).Val(), batRdb.HGetAll(ctx, bat.Key("idx:rec")).Val(), "round %d", round)
		require.Equal(t, seqRdb.HGetAll(ctx, seq.Key("idx:nrec")).Val(), batRdb.HGetAll(ctx, bat.Key("idx:nrec")).Val(), "round %d", round)
		for _, set := range []string{"idx:free:cpu", "idx:free:mem", "idx:free:gpu", "idx:hfree:cm", "idx:hfree:gpu"} {
			require.Equal(t, zsetOf(ctx, seqRdb, seq.Key(set)), zsetOf(ctx, batRdb, bat.Key(set)), "round %d %s", round, set)
		}
		require.Equal(t, seqRdb.ZCard(ctx, seq.Key("expiry")).Val(), batRdb.ZCard(ctx, bat.Key("expiry")).Val(), "round %d", round)
		require.Equal(t, seqRdb.ZCard(ctx, seq.Key("waiting")).Val(), batRdb.ZCard(ctx, bat.Key("waiting")).Val(), "round %d", round)
	}
	t.Logf("batched requests compared: %d placed (%d on a node), %d nofit, %d replays, %d conflicts; preferences %v",
		decided, onNodes, nofit, replays, conflicts, prefs)
	require.Greater(t, prefs["first term"]+prefs["later term"], 10, "placements by preference terms must be exercised in batches")
	require.Greater(t, prefs["none fitting"], 2, "preferences none of which fits must be exercised in batches")
	require.Greater(t, decided, 150)
	require.Greater(t, onNodes, 50)
	require.Greater(t, nofit, 20)
	require.Greater(t, replays, 5)
	require.Greater(t, conflicts, 5)
}

func zsetOf(ctx context.Context, rdb redis.UniversalClient, key string) []redis.Z {
	return rdb.ZRangeWithScores(ctx, key, 0, -1).Val()
}

// TestConcurrentReserveBatches: many callers at once (so the batcher forms
// batches) over little capacity: every request gets an answer, nothing is
// overbooked, and each cluster's reserved counters equal the sum of its live
// reservations.
func TestConcurrentReserveBatches(t *testing.T) {
	ctx := context.Background()
	rdb := startRedis(t)
	s := store.New(rdb, store.Config{StaleThreshold: time.Hour, ReserveBatch: 16})
	require.NoError(t, s.LoadScripts(ctx))
	for i := range 20 {
		_, err := s.Advertise(ctx, fmt.Sprintf("p%02d", i), model.Advertisement{
			Capacity:    model.Resources{CPU: 4000, Memory: 8 * gi},
			Allocatable: model.Resources{CPU: 4000, Memory: 8 * gi},
			Prices:      model.Prices{CPU: int64(10_000 + 1000*i), Memory: 1000, Currency: "EUR"},
		})
		require.NoError(t, err)
	}
	// 20 clusters of 4 CPUs take 80 requests of 1 CPU; 200 ask.
	const callers, each = 20, 10
	var (
		mu     sync.Mutex
		placed int
		wg     sync.WaitGroup
	)
	for c := range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				_, err := s.Reserve(ctx, model.ReserveRequest{
					ID: fmt.Sprintf("q%d-%d", c, i), Requester: "home", Duration: time.Hour,
					Resources: model.Resources{CPU: 1000, Memory: gi},
				})
				var nf *store.NoFitError
				if err != nil && !errors.As(err, &nf) {
					t.Error(err)
					return
				}
				if err == nil {
					mu.Lock()
					placed++
					mu.Unlock()
				}
			}
		}()
	}
	wg.Wait()
	require.Equal(t, 80, placed)
	require.NoError(t, s.CheckInvariant(ctx))
	require.NoError(t, s.CheckIndex(ctx))
}

// TestBatchIsolatesABadRequest: a request that makes the script raise (a
// malformed selector, which the broker never sends) gets the error as its
// reply; the requests around it in the batch are decided and accounted.
func TestBatchIsolatesABadRequest(t *testing.T) {
	ctx := context.Background()
	rdb := startRedis(t)
	s := store.New(rdb, store.Config{StaleThreshold: time.Hour})
	require.NoError(t, s.LoadScripts(ctx))
	for _, id := range []string{"paris", "berlin"} {
		_, err := s.Advertise(ctx, id, model.Advertisement{
			Capacity: model.Resources{CPU: 8000, Memory: 16 * gi}, Allocatable: model.Resources{CPU: 8000, Memory: 16 * gi},
			Prices: model.Prices{CPU: 20_000, Memory: 2_000, Currency: "EUR"},
		})
		require.NoError(t, err)
	}
	cfg := s.Config()
	args := []any{cfg.StaleThreshold.Milliseconds(), cfg.WeightResources, cfg.WeightCost, cfg.TopCandidates,
		cfg.EventsMaxLen, cfg.AuditMaxLen, cfg.WaitTTL.Milliseconds(), cfg.EventsTTL.Milliseconds()}
	for i, selector := range []string{"", "{not json", ""} {
		args = append(args, fmt.Sprintf(`{"id":"x%d","requester":"rome","cpu":"1000","mem":"%d","gpu":"0","sto":"0",`+
			`"duration":"3600000","lease":"0","priority":"0","selector":%q,"owner":"","wait":true,"limits":{}}`, i, gi, selector))
	}
	replies, err := scripts.Reserve.Run(ctx, rdb, []string{cfg.Prefix}, args...).Slice()
	require.NoError(t, err)
	require.Len(t, replies, 3)
	outcomes := make([]string, len(replies))
	for i, r := range replies {
		outcomes[i] = r.([]any)[0].(string)
	}
	require.Equal(t, []string{"reserved", "error", "reserved"}, outcomes)
	require.Contains(t, replies[1].([]any)[3], "Expected object key")
	for _, id := range []string{"x0", "x2"} {
		_, err := s.Reservation(ctx, "rome", id)
		require.NoError(t, err)
	}
	_, err = s.Reservation(ctx, "rome", "x1")
	require.Error(t, err)
	require.NoError(t, s.CheckInvariant(ctx))
	require.NoError(t, s.CheckIndex(ctx))
}
