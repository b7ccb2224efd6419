package testbed

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

// TestCapacityDiffWithinBand: the used figures an agent has not sent again
// because they stayed within its band compare equal; anything else, the
// broker-owned counters first, compares exactly.
func TestCapacityDiffWithinBand(t *testing.T) {
	base := Capacity{"rome": {"alloc_cpu": "1000", "alloc_mem": "2000000000", "used_cpu": "0", "used_mem": "0", "used_gpu": "0", "resv_cpu": "0"}}
	with := func(f, v string) Capacity {
		c := Capacity{"rome": map[string]string{}}
		for k, x := range base["rome"] {
			c["rome"][k] = x
		}
		c["rome"][f] = v
		return c
	}
	assert.Empty(t, with("used_cpu", "10").Diff(base), "10m of 1 CPU is within 5 %")
	assert.Empty(t, with("used_mem", "100000000").Diff(base), "100 MB of 2 GB is the band's edge")
	assert.Equal(t, `rome.used_cpu="51", want "0"`, with("used_cpu", "51").Diff(base))
	assert.Equal(t, `rome.used_gpu="1", want "0"`, with("used_gpu", "1").Diff(base), "GPUs are whole: no band")
	assert.Equal(t, `rome.resv_cpu="10", want "0"`, with("resv_cpu", "10").Diff(base), "the broker's own counters are exact")
	assert.Equal(t, `rome.alloc_cpu="990", want "1000"`, with("alloc_cpu", "990").Diff(base))
}
