package store

import (
	"testing"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
)

// TestCoveredEnd: a live lease's end as the broker's reads compute it, the
// same rule as scripts/lib/core.lua covered_end: a lease after its renewal
// set's last renewal when the set covers it (same generation), else its
// score; never earlier than the score.
func TestCoveredEnd(t *testing.T) {
	set := func(gen, at any) *redis.SliceCmd {
		c := redis.NewSliceCmd(t.Context())
		c.SetVal([]any{gen, at})
		return c
	}
	const score = 10_000
	for _, tc := range []struct {
		name  string
		entry string
		set   *redis.SliceCmd
		want  int64
	}{
		{"covered", "120000 9000 7", set("7", "5000"), 125_000},
		{"covered, the score later", "100 9000 7", set("7", "5000"), score},
		{"another generation", "120000 9000 6", set("7", "5000"), score},
		{"no generation", "120000 9000", set("7", "5000"), score},
		{"no set", "120000 9000 7", set(nil, nil), score},
		{"set not read", "120000 9000 7", nil, score},
		{"no entry", "", set("7", "5000"), score},
		{"garbage", "x y 7", set("7", "5000"), score},
	} {
		assert.Equal(t, tc.want, coveredEnd(score, tc.entry, tc.set), tc.name)
	}
}
