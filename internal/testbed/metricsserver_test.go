package testbed

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestMetricsServerOptionsRefused(t *testing.T) {
	for name, tc := range map[string]struct {
		o    Options
		want string
	}{
		"without real nodes": {Options{MetricsServer: true}, "MetricsServer needs RealNodes"},
		"resolution too short": {Options{RealNodes: true, MetricsServer: true, MetricResolution: 10 * time.Second},
			"MetricResolution 10s: metrics-server needs at least 15s"},
	} {
		t.Run(name, func(t *testing.T) {
			tc.o.Dir = t.TempDir()
			b, err := New(context.Background(), tc.o)
			require.Nil(t, b)
			require.ErrorContains(t, err, tc.want)
		})
	}
}

func TestCheckMetricsServerSaysHowToBuildIt(t *testing.T) {
	t.Setenv(MetricsServerBinEnv, t.TempDir())
	require.ErrorContains(t, CheckMetricsServer("/nowhere"), `run "make metrics-server-bin"`)
}
