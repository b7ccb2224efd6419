package store_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fluidos-project/resource-broker/broker/model"
	"github.com/fluidos-project/resource-broker/broker/store"
)

// TestAbuseSoakLeavesNoOrphanKey runs thousands of reserve / grant / renew /
// release / expire cycles from several requesters at once (one of them at
// its limits, requests that wait and are abandoned, providers listing
// reservations on their nodes), with the expiry loop running as a broker
// runs it; once everything has ended and every retention and TTL has
// passed, the administrator's SCAN finds no key but the clusters' and the
// candidate index's: nothing of a reservation, a waiting request, a
// requester's usage or rate, or an event stream is left, and every
// reservation placed ended exactly once.
func TestAbuseSoakLeavesNoOrphanKey(t *testing.T) {
	ctx := context.Background()
	const (
		workers   = 8
		cycles    = 250 // per worker
		retention = 300 * time.Millisecond
		waitTTL   = 300 * time.Millisecond
		eventsTTL = 800 * time.Millisecond
		longest   = 400 * time.Millisecond // the longest reservation
	)
	s := newStore(t, store.Config{Retention: retention, WaitTTL: waitTTL, EventsTTL: eventsTTL, AuditRetention: 500 * time.Millisecond,
		ExpireBatch: 64, Policy: mustPolicy(t, `
requesters:
  default: {maxReservations: 40, reservesPerSecond: 5000, reserveBurst: 500}
  clusters:
    mallory: {maxReservations: 3, reservesPerSecond: 50, reserveBurst: 5}
`)})
	providers := map[string]model.Advertisement{"paris": cluster(64, 256, 2, 30_000, nil), "berlin": cluster(48, 192, 4, 50_000, nil),
		"lyon": cluster(32, 128, 0, 20_000, nil)}
	for _, id := range []string{"paris", "berlin"} { // nodes: the per-node debits and listings
		ad := providers[id]
		ad.Nodes = []model.NodeCapacity{
			{Name: "n1", Allocatable: model.Resources{CPU: ad.Allocatable.CPU / 2, Memory: ad.Allocatable.Memory / 2, GPU: ad.Allocatable.GPU, Storage: 50 * gi}},
			{Name: "n2", Allocatable: model.Resources{CPU: ad.Allocatable.CPU / 2, Memory: ad.Allocatable.Memory / 2, Storage: 50 * gi}},
		}
		providers[id] = ad
	}
	for id, ad := range providers {
		_, err := s.Advertise(ctx, id, ad)
		require.NoError(t, err)
	}

	// The expiry loop of a broker replica.
	var expired atomic.Int64
	stop := make(chan struct{})
	loopDone := make(chan struct{})
	stopLoop := sync.OnceFunc(func() {
		close(stop)
		<-loopDone
	})
	defer stopLoop()
	go func() {
		defer close(loopDone)
		tick := time.NewTicker(50 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
				n, clamped, err := s.Expire(ctx)
				assert.NoError(t, err)
				assert.Zero(t, clamped, "no counter clamped: the invariant held")
				expired.Add(n)
			}
		}
	}()

	requesters := []string{"rome", "madrid", "oslo", "mallory"}
	var placed, released, limited, nofit, conflicts atomic.Int64
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 18))
			for c := range cycles {
				requester := requesters[rng.IntN(len(requesters))]
				req := model.ReserveRequest{ID: fmt.Sprintf("w%d-c%d", w, c), Requester: requester,
					Duration:  time.Duration(100+rng.IntN(int(longest/time.Millisecond)-100)) * time.Millisecond,
					Resources: model.Resources{CPU: int64(100 + rng.IntN(4000)), Memory: int64(1+rng.IntN(8)) * gi}}
				switch rng.IntN(10) {
				case 0: // nothing can hold it: it waits, and its requester never retries
					req.Resources.CPU = 200_000
				case 1:
					req.Resources.GPU = 1
				case 2:
					req.Lease = req.Duration
				}
				d, err := s.Reserve(ctx, req)
				var le *store.LimitError
				var nf *store.NoFitError
				switch {
				case errors.As(err, &le):
					limited.Add(1)
					continue
				case errors.As(err, &nf):
					nofit.Add(1)
					continue
				case errors.Is(err, store.ErrConflict):
					conflicts.Add(1)
					continue
				}
				require.NoError(t, err)
				placed.Add(1)
				r := d.Reservation
				if rng.IntN(2) == 0 {
					grant, _ := json.Marshal(map[string]string{"token": "t-" + r.QID(), "namespace": "rb-" + requester})
					_, err := s.Grant(ctx, requester, r.ID, r.Target, grant)
					if err != nil && !strings.Contains(err.Error(), "is Expired") && !errors.Is(err, store.ErrNotFound) {
						require.NoError(t, err)
					}
				}
				if r.Lease > 0 {
					_, err := s.Renew(ctx, requester, []string{r.ID})
					require.NoError(t, err)
				}
				if rng.IntN(8) == 0 { // its provider lists pods of reservations on its nodes, in their figures
					ad := providers[r.Target]
					ad.Nodes = append([]model.NodeCapacity(nil), ad.Nodes...)
					live, err := s.LiveReservations(ctx, "by-target", r.Target)
					require.NoError(t, err)
					for _, l := range live {
						if l.Node != "" && rng.IntN(2) == 0 {
							ad.ReservationsOnNodes = append(ad.ReservationsOnNodes, l.QID())
							for i := range ad.Nodes {
								if ad.Nodes[i].Name == l.Node {
									ad.Nodes[i].Allocated = ad.Nodes[i].Allocated.Add(l.Resources)
								}
							}
						}
					}
					_, err = s.Advertise(ctx, r.Target, ad)
					require.NoError(t, err)
				}
				if rng.IntN(3) > 0 { // released by one party or the other; the rest expire
					caller := requester
					if rng.IntN(2) == 0 {
						caller = r.Target
					}
					res, err := s.Release(ctx, requester, r.ID, caller)
					if errors.Is(err, store.ErrNotFound) {
						continue // ended and forgotten (the short retention) before a loaded machine got here
					}
					require.NoError(t, err)
					if res.Released {
						released.Add(1)
					}
				}
			}
		}()
	}
	wg.Wait()
	stopLoop()
	// A worker builds its provider's advertisement from live reservations
	// read before it advertises: a reservation released meanwhile, whose
	// room a newer one took, is still listed with its pod in the node's
	// figures beside the newer one's debit, as a real agent's advertisement
	// measured before a pod ended would be. The provider's next
	// advertisement, from what is live now, is what the invariant holds
	// against.
	rng := rand.New(rand.NewPCG(99, 18))
	for _, id := range []string{"paris", "berlin"} {
		ad := providers[id]
		ad.Nodes = append([]model.NodeCapacity(nil), ad.Nodes...)
		live, err := s.LiveReservations(ctx, "by-target", id)
		require.NoError(t, err)
		for _, l := range live {
			if l.Node != "" && rng.IntN(2) == 0 {
				ad.ReservationsOnNodes = append(ad.ReservationsOnNodes, l.QID())
				for i := range ad.Nodes {
					if ad.Nodes[i].Name == l.Node {
						ad.Nodes[i].Allocated = ad.Nodes[i].Allocated.Add(l.Resources)
					}
				}
			}
		}
		_, err = s.Advertise(ctx, id, ad)
		require.NoError(t, err)
	}
	require.NoError(t, s.CheckInvariant(ctx), "quiet, reservations still live")

	// Everything ends, then every retention and TTL passes.
	time.Sleep(longest + 100*time.Millisecond)
	n, _, err := s.Expire(ctx)
	require.NoError(t, err)
	expired.Add(n)
	for _, id := range []string{"paris", "berlin"} { // a last advertisement lists nothing
		_, err := s.Advertise(ctx, id, providers[id])
		require.NoError(t, err)
	}
	require.NoError(t, s.CheckInvariant(ctx))
	time.Sleep(eventsTTL + 100*time.Millisecond) // > retention, wait TTL and the audit's retention too
	// As many runs of the loop: each sweeps up to ExpireBatch waiting members.
	for range 30 {
		n, _, err = s.Expire(ctx)
		require.NoError(t, err)
		expired.Add(n)
	}

	t.Logf("%d reserve calls: %d placed (%d released, %d expired), %d refused by limits, %d waited, %d conflicts",
		workers*cycles, placed.Load(), released.Load(), expired.Load(), limited.Load(), nofit.Load(), conflicts.Load())
	assert.Equal(t, placed.Load(), released.Load()+expired.Load(), "each reservation ended exactly once")
	assert.Positive(t, limited.Load(), "mallory met its limits")
	assert.Positive(t, nofit.Load(), "some requests waited")

	var orphans []string
	kept := 0
	for _, k := range allKeys(t, s) {
		name := strings.TrimPrefix(k, s.Key())
		id, isCluster := strings.CutPrefix(name, "cluster:")
		if !isCluster {
			id, isCluster = strings.CutPrefix(name, "nodes:")
		}
		switch {
		case isCluster && providers[id].Allocatable.CPU > 0, name == "clusters", strings.HasPrefix(name, "idx:"):
			kept++ // the advertised clusters and the candidate index: the federation, not what it did
		case name == "clock":
			kept++ // the expiry runs' clock (one small hash, scripts/lib/clock.lua last_outage)
		case name == "audit":
			l, err := admin(t, s).XLen(ctx, k).Result()
			require.NoError(t, err)
			assert.Zero(t, l, "every decision older than the audit's retention")
		default:
			orphans = append(orphans, k)
		}
	}
	assert.Empty(t, orphans, "keys left after every reservation and request ended")
	assert.Positive(t, kept)
}
