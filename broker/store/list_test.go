package store_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/fluidos-project/resource-broker/broker/store"
)

// TestScanLiveMissesNothing pages through sets of every size while other
// ids come and go between the pages (which makes Redis grow and shrink the
// set's table): every id in the set from the first page to the last is
// returned and no page holds more than its limit.
func TestScanLiveMissesNothing(t *testing.T) {
	ctx := context.Background()
	s := newStore(t, store.Config{})
	rdb := admin(t, s)
	rng := rand.New(rand.NewPCG(18, 1))
	for round := range 40 {
		key := s.Key(store.ByTarget, ":", fmt.Sprintf("c%d", round))
		stable := rng.IntN(3000)
		add := func(prefix string, from, to int) {
			pipe := rdb.Pipeline()
			for i := from; i < to; i++ {
				pipe.SAdd(ctx, key, fmt.Sprintf("rome/%s-%d", prefix, i))
			}
			_, err := pipe.Exec(ctx)
			require.NoError(t, err)
		}
		add("stable", 0, stable)
		churn := 0
		limit := 1 + rng.IntN(300)
		seen := map[string]int{}
		var pos store.ScanPos
		for pages := 0; ; pages++ {
			require.Less(t, pages, 100_000, "the listing ends")
			ids, next, more, err := s.ScanLive(ctx, store.ByTarget, fmt.Sprintf("c%d", round), pos, limit)
			require.NoError(t, err)
			require.LessOrEqual(t, len(ids), limit)
			for _, id := range ids {
				seen[id]++
			}
			if !more {
				break
			}
			pos = next
			// Others come and go: sometimes many at once, to resize the table.
			switch n := rng.IntN(10); {
			case n < 6:
			case n < 8:
				n := rng.IntN(2000)
				add("churn", churn, churn+n)
				churn += n
			default:
				pipe := rdb.Pipeline()
				for i := range churn {
					pipe.SRem(ctx, key, fmt.Sprintf("rome/churn-%d", i))
				}
				_, err := pipe.Exec(ctx)
				require.NoError(t, err)
			}
		}
		for i := range stable {
			require.NotZero(t, seen[fmt.Sprintf("rome/stable-%d", i)], "round %d (%d stable, limit %d): stable-%d missed", round, stable, limit, i)
		}
	}
}
