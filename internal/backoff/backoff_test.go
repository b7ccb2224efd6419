package backoff

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

func TestExponential(t *testing.T) {
	for range 100 {
		b := Exponential(100*time.Millisecond, time.Second)
		for i, base := range []time.Duration{100, 200, 400, 800, 1000, 1000, 1000} {
			d := b.Step()
			assert.GreaterOrEqual(t, d, base*time.Millisecond, "step %d", i+1)
			assert.LessOrEqual(t, d, base*time.Millisecond*3/2, "step %d", i+1)
		}
	}
}

func TestNth(t *testing.T) {
	b := Exponential(time.Second, time.Minute)
	b.Jitter = 0
	for n, want := range map[int]time.Duration{0: time.Second, 1: time.Second, 2: 2 * time.Second, 3: 4 * time.Second, 6: 32 * time.Second,
		7: time.Minute, 1 << 30: time.Minute} {
		assert.Equal(t, want, Nth(b, n), "n=%d", n)
	}
	assert.Equal(t, time.Second, b.Duration, "b itself is not stepped")
}
