package server_test

import (
	"io"
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/fluidos-project/resource-broker/broker/api"
	"github.com/fluidos-project/resource-broker/internal/brokertest"
)

// healthGet GETs path of b's health listener (/readyz, /metrics) and
// returns the body of its 200 answer.
func healthGet(t *testing.T, b *brokertest.Broker, path string) string {
	t.Helper()
	resp, err := http.Get(b.Health + path)
	require.NoError(t, err)
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, resp.StatusCode, "%s: %s", path, data)
	return string(data)
}

func reservation(id, cpu, memory string) api.ReservationRequest {
	return api.ReservationRequest{ID: id, Resources: brokertest.Quantities(cpu, memory, "")}
}

// reservationLease is a lease: it ends hold-time (here the lease) after the decision unless renewed.
func reservationLease(id, cpu, memory, lease string) api.ReservationRequest {
	r := reservation(id, cpu, memory)
	r.Lease = lease
	return r
}
