package output

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"k8s.io/apimachinery/pkg/api/resource"
)

func q(s string) *resource.Quantity {
	v := resource.MustParse(s)
	return &v
}

func TestFormatting(t *testing.T) {
	for in, want := range map[string]string{"64Gi": "64Gi", "1536Mi": "1.5Gi", "100": "100", "2048": "2Ki", "1Ti": "1Ti", "0": "0"} {
		assert.Equal(t, want, Bytes(q(in)), in)
	}
	for in, want := range map[string]string{"16": "16", "13500m": "13.5", "250m": "0.25"} {
		assert.Equal(t, want, Cores(q(in)), in)
	}
	assert.Equal(t, "0.03", Decimal(q("30m")))
	assert.Equal(t, "0.076 EUR", Money(76000, "EUR"))
	now := time.Now()
	assert.Equal(t, "in 59m", Until(now, now.Add(59*time.Minute+10*time.Second)))
	assert.Equal(t, "3m ago", Until(now, now.Add(-3*time.Minute)))
	assert.Equal(t, "0s", Ago(now, now.Add(time.Second)), "a broker clock ahead of ours")
}
