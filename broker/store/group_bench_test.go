package store_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sync/errgroup"

	"github.com/fluidos-project/resource-broker/broker/model"
	"github.com/fluidos-project/resource-broker/broker/store"
)

// BenchmarkReserveGroup measures a gang of 8 members at 1,000 clusters of 10
// nodes each (docs/benchmarks.md): one reserve_group.lua call for the 8
// (group=8), against the baseline of the same 8 members as single
// reservations in the same run, one after the other (singles=8-sequential)
// and all at once (singles=8-concurrent, which the store batches into
// reserve.lua calls). One op is the whole gang in every leaf.
func BenchmarkReserveGroup(b *testing.B) {
	st, rdb := benchStore(b)
	ctx := context.Background()
	const n = 1000
	rng := rand.New(rand.NewPCG(n, 42))
	var g errgroup.Group
	g.SetLimit(32)
	for i := range n {
		ad := benchCluster(rng, benchClusterID(i))
		ad.Nodes = benchNodes(rng, ad, false)
		g.Go(func() error {
			_, err := st.Advertise(ctx, benchClusterID(i), ad)
			return err
		})
	}
	require.NoError(b, g.Wait())
	const size = 8
	members := func(seq int64) []model.GroupMember {
		out := make([]model.GroupMember, size)
		for i := range out {
			out[i] = model.GroupMember{ID: "g" + strconv.FormatInt(seq, 36) + "-" + strconv.Itoa(i),
				Resources: benchRequests[(seq+int64(i))%int64(len(benchRequests))]}
		}
		return out
	}
	single := func(ctx context.Context, seq int64, m model.GroupMember) error {
		_, err := st.Reserve(ctx, model.ReserveRequest{ID: m.ID, Requester: benchClusterID(int(seq) % 8),
			Resources: m.Resources, Duration: time.Hour})
		return err
	}
	b.Run(fmt.Sprintf("clusters=%d/group=%d", n, size), func(b *testing.B) {
		runSerialAndParallel(b, rdb, "groups/s", "evalsha", func(ctx context.Context, seq int64) error {
			d, err := st.ReserveGroup(ctx, model.GroupRequest{Group: "g" + strconv.FormatInt(seq, 36),
				Requester: benchClusterID(int(seq) % 8), MinMember: size, Members: members(seq), Duration: time.Hour})
			if err == nil && len(d.Reservations) != size {
				err = fmt.Errorf("%d members reserved", len(d.Reservations))
			}
			return err
		})
	})
	b.Run(fmt.Sprintf("clusters=%d/singles=%d-sequential", n, size), func(b *testing.B) {
		runSerialAndParallel(b, rdb, "groups/s", "evalsha", func(ctx context.Context, seq int64) error {
			for _, m := range members(seq) {
				if err := single(ctx, seq, m); err != nil {
					return err
				}
			}
			return nil
		})
	})
	b.Run(fmt.Sprintf("clusters=%d/singles=%d-concurrent", n, size), func(b *testing.B) {
		runSerialAndParallel(b, rdb, "groups/s", "evalsha", func(ctx context.Context, seq int64) error {
			var g errgroup.Group
			for _, m := range members(seq) {
				g.Go(func() error { return single(ctx, seq, m) })
			}
			return g.Wait()
		})
	})
}

// BenchmarkPreempt measures the preemption decision (preempt.lua) at 1,000
// clusters of 2 nodes, every node full: 6 of its 8 CPUs used by local pods
// and 2 held by one reservation of priority 1 to 10 (2,000 live
// reservations). Each op is a 2-CPU request of priority 100 that fits
// nowhere and takes one victim. Baseline in the same run: the single
// reservation's decision that refuses the same request (reserve.lua, nofit),
// which comes before a preemption.
func BenchmarkPreempt(b *testing.B) {
	st, rdb := benchStore(b)
	ctx := context.Background()
	const n = 1000
	full := func(name string) model.NodeCapacity {
		return model.NodeCapacity{Name: name, Allocatable: model.Resources{CPU: 8000, Memory: 32 * gi},
			Allocated: model.Resources{CPU: 6000, Memory: 8 * gi}}
	}
	var g errgroup.Group
	g.SetLimit(32)
	for i := range n {
		g.Go(func() error {
			ad := model.Advertisement{Nodes: []model.NodeCapacity{full("n1"), full("n2")}}
			for _, nd := range ad.Nodes {
				ad.Allocatable, ad.Allocated = ad.Allocatable.Add(nd.Allocatable), ad.Allocated.Add(nd.Allocated)
			}
			ad.Capacity = ad.Allocatable
			ad.Prices = model.Prices{CPU: 30_000, Memory: 3_000, Currency: "EUR"}
			_, err := st.Advertise(ctx, benchClusterID(i), ad)
			return err
		})
	}
	require.NoError(b, g.Wait())
	rng := rand.New(rand.NewPCG(n, 7))
	for i := range 2 * n {
		prio := int32(1 + rng.IntN(10))
		g.Go(func() error {
			_, err := st.Reserve(ctx, model.ReserveRequest{ID: "low-" + strconv.Itoa(i), Requester: "requester-" + strconv.Itoa(i%8),
				Resources: model.Resources{CPU: 2000, Memory: gi}, Duration: time.Hour, Priority: prio})
			return err
		})
	}
	require.NoError(b, g.Wait())
	urgent := func(seq int64) model.ReserveRequest {
		return model.ReserveRequest{ID: "u" + strconv.FormatInt(seq, 36), Requester: "urgent",
			Resources: model.Resources{CPU: 2000, Memory: gi}, Duration: time.Hour, Priority: 100}
	}
	b.Run(fmt.Sprintf("clusters=%d/reserve-nofit", n), func(b *testing.B) {
		runSerialAndParallel(b, rdb, "decisions/s", "evalsha", func(ctx context.Context, seq int64) error {
			req := urgent(seq)
			req.NoWait = true
			_, err := st.Reserve(ctx, req)
			var nf *store.NoFitError
			if !errors.As(err, &nf) {
				return fmt.Errorf("want no fit, got %v", err)
			}
			return nil
		})
	})
	b.Run(fmt.Sprintf("clusters=%d/preempt", n), func(b *testing.B) {
		runSerialAndParallel(b, rdb, "decisions/s", "evalsha", func(ctx context.Context, seq int64) error {
			d, err := st.Preempt(ctx, urgent(seq))
			if err == nil && len(d.Victims) != 1 {
				err = fmt.Errorf("%d victims", len(d.Victims))
			}
			return err
		})
	})
}
