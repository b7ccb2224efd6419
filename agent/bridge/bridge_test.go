package bridge_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fluidos-project/resource-broker/agent/bridge"
	"github.com/fluidos-project/resource-broker/agent/bridge/virtualkubelet"
	"github.com/fluidos-project/resource-broker/broker/api"
)

type noGrants struct{}

func (noGrants) Reservation(context.Context, string) (api.Reservation, error) {
	return api.Reservation{}, nil
}

func TestNew(t *testing.T) {
	for _, mode := range []string{"", bridge.ModeVirtualKubelet, bridge.ModeLiqo} {
		b, err := bridge.New(mode, bridge.Options{ClusterID: "rome", VirtualKubelet: virtualkubelet.Config{Grants: noGrants{}}})
		require.NoError(t, err, "mode %q", mode)
		assert.NotNil(t, b)
	}
	_, err := bridge.New("submariner", bridge.Options{ClusterID: "rome", VirtualKubelet: virtualkubelet.Config{Grants: noGrants{}}})
	assert.EqualError(t, err, `bridge: unknown mode "submariner" (want "virtual-kubelet" or "liqo")`)
	_, err = bridge.New(bridge.ModeVirtualKubelet, bridge.Options{ClusterID: "rome"})
	assert.ErrorContains(t, err, "needs a grant source")
	_, err = bridge.New(bridge.ModeLiqo, bridge.Options{})
	assert.ErrorContains(t, err, "cluster id is required")
	_, err = bridge.New(bridge.ModeVirtualKubelet, bridge.Options{ClusterID: "rome", VirtualKubelet: virtualkubelet.Config{Grants: noGrants{}, ProbePeriod: 1}})
	assert.ErrorContains(t, err, "probe period")
	_, err = bridge.New(bridge.ModeVirtualKubelet, bridge.Options{ClusterID: "rome", VirtualKubelet: virtualkubelet.Config{Grants: noGrants{}, KubeletServingCert: "acme"}})
	assert.ErrorContains(t, err, `kubelet serving certificate "acme"`)
	_, err = bridge.New(bridge.ModeVirtualKubelet, bridge.Options{ClusterID: "rome", VirtualKubelet: virtualkubelet.Config{Grants: noGrants{}, KubeletPorts: -1}})
	assert.ErrorContains(t, err, "kubelet ports -1: want at least 1")
	_, err = bridge.New(bridge.ModeVirtualKubelet, bridge.Options{ClusterID: "rome", VirtualKubelet: virtualkubelet.Config{Grants: noGrants{}, MetricsPeriod: 500 * time.Millisecond}})
	assert.ErrorContains(t, err, "provider metrics period 500ms: at least 1s")
}
