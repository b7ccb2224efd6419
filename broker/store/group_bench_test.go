package store_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sync/errgroup"

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
	members := func(seq int64) []store.GroupMember {
		out := make([]store.GroupMember, size)
		for i := range out {
			out[i] = store.GroupMember{ID: "g" + strconv.FormatInt(seq, 36) + "-" + strconv.Itoa(i),
				Resources: benchRequests[(seq+int64(i))%int64(len(benchRequests))]}
		}
		return out
	}
	single := func(ctx context.Context, seq int64, m store.GroupMember) error {
		_, err := st.Reserve(ctx, store.ReserveRequest{ID: m.ID, Requester: benchClusterID(int(seq) % 8),
			Resources: m.Resources, Duration: time.Hour})
		return err
	}
	b.Run(fmt.Sprintf("clusters=%d/group=%d", n, size), func(b *testing.B) {
		runSerialAndParallel(b, rdb, "groups/s", "evalsha", func(ctx context.Context, seq int64) error {
			d, err := st.ReserveGroup(ctx, store.GroupRequest{Group: "g" + strconv.FormatInt(seq, 36),
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
