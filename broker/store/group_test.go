package store_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fluidos-project/resource-broker/broker/model"
	"github.com/fluidos-project/resource-broker/broker/store"
)

// gang is a group request of n members of milli CPUs and 1 GiB each, ids <name>-0 ...
func gang(name, requester string, n, minMember int, milli int64) model.GroupRequest {
	g := model.GroupRequest{Group: name, Requester: requester, MinMember: minMember, Duration: time.Hour, Priority: 10}
	for i := range n {
		g.Members = append(g.Members, model.GroupMember{ID: fmt.Sprintf("%s-%d", name, i),
			Resources: model.Resources{CPU: milli, Memory: gi}})
	}
	return g
}

// TestGroupAllOrNothing: 8 members of 1 CPU, and the providers' nodes have
// room for 6 (paris two nodes of 2 free CPUs, rome one): nothing is
// reserved, the error and the audit say 6 of 8; once rome advertises a
// second node, all 8 are reserved in one call, each on a node with room,
// and the accounting invariants hold. The same call again replays them.
func TestGroupAllOrNothing(t *testing.T) {
	ctx := context.Background()
	s := newStore(t, store.Config{})
	advertise(t, s, "paris", withNodes(30_000, node("p1", 4000, 2000, 0), node("p2", 4000, 2000, 0)))
	advertise(t, s, "rome", withNodes(20_000, node("r1", 4000, 2000, 0)))

	req := gang("default/train", "lyon", 8, 8, 1000)
	_, err := s.ReserveGroup(ctx, req)
	var nf *store.GroupNoFitError
	require.ErrorAs(t, err, &nf)
	assert.Equal(t, 6, nf.Placeable)
	assert.Equal(t, 8, nf.MinMember)
	assert.Contains(t, err.Error(), "room for 6 of the 8 members together, 8 needed")
	a := lastAudit(t, s)
	assert.Equal(t, "nofit", a["outcome"])
	assert.Equal(t, "default/train", a["group"])
	for _, id := range []string{"paris", "rome"} {
		c, err := s.Cluster(ctx, id)
		require.NoError(t, err)
		assert.Zero(t, c.Reserved, "nothing reserved on %s", id)
		live, err := s.LiveReservations(ctx, "by-target", id)
		require.NoError(t, err)
		assert.Empty(t, live)
	}
	require.NoError(t, s.CheckInvariant(ctx))

	advertise(t, s, "rome", withNodes(20_000, node("r1", 4000, 2000, 0), node("r2", 4000, 2000, 0)))
	d, err := s.ReserveGroup(ctx, req)
	require.NoError(t, err)
	require.Len(t, d.Reservations, 8)
	assert.Empty(t, d.Unplaced)
	perNode := map[string]int{}
	for i, r := range d.Reservations {
		assert.Equal(t, req.Members[i].ID, r.ID)
		assert.Equal(t, "default/train", r.Group)
		assert.Equal(t, model.PhaseReserved, r.Phase)
		assert.NotEmpty(t, r.Node)
		perNode[r.Target+"/"+r.Node]++
	}
	assert.Equal(t, map[string]int{"paris/p1": 2, "paris/p2": 2, "rome/r1": 2, "rome/r2": 2}, perNode)
	a = lastAudit(t, s)
	assert.Equal(t, "reserved", a["outcome"])
	assert.Contains(t, a["placement"], `"node":"r2"`)
	require.NoError(t, s.CheckInvariant(ctx))
	u, err := s.Usage(ctx)
	require.NoError(t, err)
	assert.Equal(t, int64(8), u["lyon"].Reservations)

	again, err := s.ReserveGroup(ctx, req)
	require.NoError(t, err)
	assert.True(t, again.Replayed)
	assert.Len(t, again.Reservations, 8)

	// Members end one by one like any reservation.
	res, err := s.Release(ctx, "lyon", "default/train-0", "lyon")
	require.NoError(t, err)
	assert.True(t, res.Released)
	require.NoError(t, s.CheckInvariant(ctx))
}

// TestGroupKeepsToFewProviders: 6 members of 2 CPUs on providers with 10,
// 8 and 6 CPUs free: the one with the most takes 5 and the next the last
// one; the third is not used.
func TestGroupKeepsToFewProviders(t *testing.T) {
	ctx := context.Background()
	s := newStore(t, store.Config{})
	advertise(t, s, "paris", withNodes(30_000, node("p1", 16000, 10000, 0)))
	advertise(t, s, "rome", withNodes(30_000, node("r1", 8000, 4000, 0), node("r2", 8000, 4000, 0)))
	advertise(t, s, "berlin", withNodes(30_000, node("b1", 8000, 6000, 0)))
	d, err := s.ReserveGroup(ctx, gang("g", "lyon", 6, 6, 2000))
	require.NoError(t, err)
	targets := map[string]int{}
	for _, r := range d.Reservations {
		targets[r.Target]++
	}
	assert.Equal(t, map[string]int{"paris": 5, "rome": 1}, targets)
	require.NoError(t, s.CheckInvariant(ctx))
}

// TestGroupPerNodeFit: 3 CPUs free on each of two providers, but no node
// holds a 2-CPU member (1.5 free each): the totals would hold the group,
// the nodes do not.
func TestGroupPerNodeFit(t *testing.T) {
	ctx := context.Background()
	s := newStore(t, store.Config{})
	advertise(t, s, "paris", withNodes(30_000, node("p1", 4000, 1500, 0), node("p2", 4000, 1500, 0)))
	advertise(t, s, "rome", withNodes(30_000, node("r1", 4000, 1500, 0), node("r2", 4000, 1500, 0)))
	_, err := s.ReserveGroup(ctx, gang("g", "lyon", 2, 2, 2000))
	var nf *store.GroupNoFitError
	require.ErrorAs(t, err, &nf)
	assert.Zero(t, nf.Placeable)
	require.NoError(t, s.CheckInvariant(ctx))
}

// TestGroupMinMember: 5 members, 3 needed, room for 4: the 4 are reserved,
// the fifth is reported unplaced and has no reservation.
func TestGroupMinMember(t *testing.T) {
	ctx := context.Background()
	s := newStore(t, store.Config{})
	advertise(t, s, "paris", withNodes(30_000, node("p1", 8000, 4000, 0)))
	d, err := s.ReserveGroup(ctx, gang("g", "lyon", 5, 3, 1000))
	require.NoError(t, err)
	assert.Len(t, d.Reservations, 4)
	assert.Equal(t, []string{"g-4"}, d.Unplaced)
	_, err = s.Reservation(ctx, "lyon", "g-4")
	assert.ErrorIs(t, err, store.ErrNotFound)
	require.NoError(t, s.CheckInvariant(ctx))
}

// TestGroupRefusals: bad input, a member id already used alone, the
// requester's limits, a selector nothing matches.
func TestGroupRefusals(t *testing.T) {
	ctx := context.Background()
	s := newStore(t, store.Config{Policy: mustPolicy(t, `
requesters:
  clusters:
    lyon: {maxReservations: 3}
`)})
	advertise(t, s, "paris", withNodes(30_000, node("p1", 16000, 16000, 0)))

	bad := gang("g", "rome", 2, 3, 1000)
	_, err := s.ReserveGroup(ctx, bad)
	assert.ErrorIs(t, err, model.ErrInvalidRequest)
	assert.Contains(t, err.Error(), "minMember 3 must be between 1 and the 2 members")
	bad = gang("g", "rome", 2, 2, 1000)
	bad.Members[1].ID = bad.Members[0].ID
	_, err = s.ReserveGroup(ctx, bad)
	assert.ErrorIs(t, err, model.ErrInvalidRequest)

	_, err = s.Reserve(ctx, request("g-1", "rome", 1000, 1, 0))
	require.NoError(t, err)
	_, err = s.ReserveGroup(ctx, gang("g", "rome", 2, 2, 1000))
	assert.ErrorIs(t, err, store.ErrConflict, "g-1 is rome's single reservation")

	_, err = s.ReserveGroup(ctx, gang("g", "lyon", 4, 4, 1000))
	var le *store.LimitError
	require.ErrorAs(t, err, &le)
	assert.Equal(t, "reservations", le.Limit)
	assert.Equal(t, int64(4), le.Asked)

	sel := gang("h", "rome", 2, 2, 1000)
	sel.Selector = map[string]string{"topology.kubernetes.io/zone": "nowhere"}
	_, err = s.ReserveGroup(ctx, sel)
	var nf *store.GroupNoFitError
	require.ErrorAs(t, err, &nf)
	assert.Equal(t, int64(1), nf.Rejected["selector"])
	require.NoError(t, s.CheckInvariant(ctx))
}

// TestGroupInvariantUnderConcurrentMixedRequests: 1,000 concurrent requests
// of every kind, single reservations (some of low priority), groups, spread
// replicas over two zones, preempting requests and releases, on 20 providers
// of 4 nodes: no node and no provider is overbooked, every counter (spread
// counts included) equals its live reservations, and every group is whole
// or absent.
func TestGroupInvariantUnderConcurrentMixedRequests(t *testing.T) {
	ctx := context.Background()
	s := newStore(t, store.Config{})
	for c := range 20 {
		advertise(t, s, fmt.Sprintf("p%02d", c), inZone(withNodes(30_000,
			node("n1", 8000, 8000, 0), node("n2", 8000, 6000, 0), node("n3", 4000, 4000, 0), node("n4", 4000, 1000, 0)),
			[]string{"a", "b"}[c%2]))
	}
	var wg sync.WaitGroup
	errs := make(chan error, 1000)
	var mu sync.Mutex
	groups, refused := map[string]model.GroupRequest{}, map[string]model.GroupRequest{}
	spread := &model.Spread{Group: "shop/app=web", TopologyKey: zoneKey, MaxSkew: 2, WhenUnsatisfiable: model.DoNotSchedule}
	var preemptions, spreads atomic.Int32
	for i := range 1000 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(i), 7))
			requester := fmt.Sprintf("r%d", i%5)
			single := func(req model.ReserveRequest) {
				d, err := s.Reserve(ctx, req)
				var nf *store.NoFitError
				switch {
				case err == nil && len(d.Victims) > 0:
					preemptions.Add(1)
				case err == nil && d.Reservation.Spread != "":
					spreads.Add(1)
				case err != nil && !errors.As(err, &nf):
					errs <- err
				}
			}
			id := fmt.Sprintf("s%d", i)
			size := int64(500 + rng.IntN(4)*500)
			switch i % 8 {
			case 0, 1:
				single(request(id, requester, size, 1, 0))
			case 6:
				single(prioritized(id, requester, size, 1))
			case 4:
				req := request(id, requester, size, 1, 0)
				req.Spread = spread
				single(req)
			case 5:
				req := prioritized(id, requester, size, 100)
				req.Preempt = true
				single(req)
			case 2:
				g := gang(fmt.Sprintf("g%d", i), requester, 2+rng.IntN(7), 2, int64(500+rng.IntN(3)*1000))
				g.MinMember = len(g.Members)
				_, err := s.ReserveGroup(ctx, g)
				var nf *store.GroupNoFitError
				switch {
				case err == nil:
					mu.Lock()
					groups[g.Requester+"/"+g.Group] = g
					mu.Unlock()
				case errors.As(err, &nf):
					mu.Lock()
					refused[g.Requester+"/"+g.Group] = g
					mu.Unlock()
				default:
					errs <- err
				}
			case 3, 7: // the single (3) or spread (7) request made 3 before
				owner := fmt.Sprintf("r%d", (i-3)%5)
				if _, err := s.Release(ctx, owner, fmt.Sprintf("s%d", i-3), owner); err != nil && !errors.Is(err, store.ErrNotFound) {
					errs <- err
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	require.NoError(t, s.CheckInvariant(ctx))
	require.NotEmpty(t, groups, "some groups fit")
	assert.Positive(t, preemptions.Load(), "some requests preempted")
	assert.Positive(t, spreads.Load(), "some replicas were spread")
	for _, g := range groups {
		for _, m := range g.Members {
			r, err := s.Reservation(ctx, g.Requester, m.ID)
			require.NoError(t, err, "member %s of a reserved group", m.ID)
			assert.True(t, r.Live() || r.PreemptedBy != "", "member %s live, or taken by a preemption", m.ID)
			assert.Equal(t, g.Group, r.Group)
		}
	}
	for _, g := range refused {
		for _, m := range g.Members {
			_, err := s.Reservation(ctx, g.Requester, m.ID)
			require.ErrorIs(t, err, store.ErrNotFound, "member %s of a refused group", m.ID)
		}
	}
}
