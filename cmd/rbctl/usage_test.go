package main

import (
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fluidos-project/resource-broker/broker/api"
	"github.com/fluidos-project/resource-broker/broker/policy"
	"github.com/fluidos-project/resource-broker/broker/store"
	"github.com/fluidos-project/resource-broker/internal/brokertest"
)

// TestUsageCommand: each member's usage against its limits, mallory at its
// limit of reserved cpu, and the ended reservations each keeps.
func TestUsageCommand(t *testing.T) {
	p, err := policy.Parse([]byte(`apiVersion: broker.fluidos.eu/v1alpha1
kind: BrokerPolicy
requesters:
  default: {maxReservations: 10, maxResources: {cpu: "4", memory: 16Gi}, maxPriority: 1000, reservesPerSecond: 20, reserveBurst: 40}
  clusters:
    rome: {maxResources: {cpu: "8", gpu: "0"}}
`))
	require.NoError(t, err)
	b := brokertest.Start(t, brokertest.Options{Store: store.Config{Policy: p}})
	b.Advertise("paris", "16", "64Gi", "", "0.03", nil)
	reserve(t, b, "rome", "r1", "2", "4Gi")
	reserve(t, b, "rome", "done", "1", "1Gi")
	code, data := b.Do("rome", http.MethodDelete, "/api/v2/reservations/done", nil)
	require.Equal(t, http.StatusOK, code, "%s", data)
	reserve(t, b, "mallory", "m1", "4", "1Gi")
	code, data = b.Do("mallory", http.MethodPost, "/api/v2/reservations",
		api.ReservationRequest{ID: "m2", Resources: brokertest.Quantities("1", "1Gi", "")})
	require.Equal(t, http.StatusTooManyRequests, code, "%s", data)

	out, err := runRbctl(t, brokerArgs(b, "rome", "usage")...)
	require.NoError(t, err, out)
	t.Logf("\n%s", out)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	require.Len(t, lines, 4, out)
	assertRow(t, lines[0], `MEMBER +RESERVATIONS +CPU +MEMORY +GPU +MAX-PRIORITY +RESERVES/S +ENDED`)
	assertRow(t, lines[1], `mallory +1/10 +4/4 +1Gi/16Gi +0/- +1000 +20 \(burst 40\) +0`)
	assertRow(t, lines[2], `paris +0/10 +0/4 +0/16Gi +0/- +1000 +20 \(burst 40\) +0`)
	assertRow(t, lines[3], `rome +1/10 +2/8 +4Gi/16Gi +0/0 +1000 +20 \(burst 40\) +1`)

	out, err = runRbctl(t, brokerArgs(b, "rome", "usage", "-o", "json")...)
	require.NoError(t, err, out)
	list := decodeList[api.MemberUsage](t, out)
	require.Len(t, list, 3)
	assert.Equal(t, "mallory", list[0].Cluster)
	assert.Equal(t, "4", list[0].Resources.CPU.String())
	assert.Equal(t, int64(1), list[2].EndedReservations, "rome's released reservation")

	// Without a policy: no limits.
	b = brokertest.Start(t, brokertest.Options{})
	b.Advertise("paris", "16", "64Gi", "", "0.03", nil)
	out, err = runRbctl(t, brokerArgs(b, "paris", "usage")...)
	require.NoError(t, err, out)
	assertRow(t, strings.Split(strings.TrimSpace(out), "\n")[1], `paris +0/- +0/- +0/- +0/- +- +- +0`)
}
