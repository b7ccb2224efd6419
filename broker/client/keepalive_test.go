package client_test

import (
	"context"
	"crypto/tls"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fluidos-project/resource-broker/broker/client"
	"github.com/fluidos-project/resource-broker/internal/brokertest"
)

// Calls reuse their connections: successes and API errors alike leave the
// connection ready for the next call, so a client pays one TLS handshake per
// connection it keeps, not one per call.
func TestConnectionsAreReused(t *testing.T) {
	ctx := context.Background()
	var handshakes atomic.Int64
	_, c := romeWatchingHandshakes(t, func(tls.ConnectionState) { handshakes.Add(1) })

	calls := func(prefix string, n int) {
		for i := range n {
			_, err := c.Reserve(ctx, request(fmt.Sprintf("%s-%d", prefix, i), "10m", "16Mi"))
			require.NoError(t, err)
			_, err = c.Reservation(ctx, "no-such-reservation") // a 404 answer
			require.True(t, client.IsNotFound(err), "%v", err)
			_, err = c.Clusters(ctx)
			require.NoError(t, err)
		}
	}
	calls("serial", 30)
	assert.EqualValues(t, 1, handshakes.Load(), "one connection for 90 sequential calls")

	const parallel = 8 // within the transport's idle connections per host
	burst := func(round int) {
		var wg sync.WaitGroup
		for g := range parallel {
			wg.Add(1)
			go func() { defer wg.Done(); calls(fmt.Sprintf("parallel-%d-%d", round, g), 10) }()
		}
		wg.Wait()
	}
	burst(1)
	// The first burst opens up to one connection per caller (a few more when
	// a dial loses the race to a freed connection); they are all kept.
	assert.LessOrEqual(t, handshakes.Load(), int64(1+2*parallel))
	warm := handshakes.Load()
	burst(2)
	assert.Equal(t, warm, handshakes.Load(), "a second burst opens no connection")
}

// A connection opened after the idle ones were closed resumes the TLS
// session of the one before (no certificate signed or verified), and the
// broker still knows its caller: the client's certificate, restored from the
// ticket, names rome.
func TestReconnectResumesSession(t *testing.T) {
	ctx := context.Background()
	var mu sync.Mutex
	var resumed []bool
	b, c := romeWatchingHandshakes(t, func(cs tls.ConnectionState) {
		mu.Lock()
		defer mu.Unlock()
		resumed = append(resumed, cs.DidResume)
	})

	for i := range 3 {
		id := fmt.Sprintf("resumed-%d", i)
		_, err := c.Reserve(ctx, request(id, "10m", "16Mi"))
		require.NoError(t, err)
		r, err := c.Reservation(ctx, id)
		require.NoError(t, err)
		assert.Equal(t, "rome", r.Requester)
		assert.Equal(t, "paris", r.Provider)
		c.CloseIdleConnections()
	}
	mu.Lock()
	defer mu.Unlock()
	assert.Equal(t, []bool{false, true, true}, resumed, "a full handshake, then resumptions")

	// A client of its own, another session cache: a full handshake.
	other := romeClient(t, b, func(cs tls.ConnectionState) { assert.False(t, cs.DidResume) })
	_, err := other.Reservation(ctx, "resumed-0")
	require.NoError(t, err)
}

// romeWatchingHandshakes starts a broker where paris offers capacity and
// returns it with a client of rome's whose every TLS handshake, full or
// resumed, is shown to watch.
func romeWatchingHandshakes(t *testing.T, watch func(tls.ConnectionState)) (*brokertest.Broker, *client.Client) {
	t.Helper()
	b := brokertest.Start(t, brokertest.Options{})
	_, err := newClient(t, b, "paris").Advertise(context.Background(), "paris", advertisement("1000", "4000Gi", "0.03"))
	require.NoError(t, err)
	return b, romeClient(t, b, watch)
}

// romeClient is a client of rome's, with a TLS configuration of the test's.
func romeClient(t *testing.T, b *brokertest.Broker, watch func(tls.ConnectionState)) *client.Client {
	t.Helper()
	pair, err := b.CA.IssueClient("rome")
	require.NoError(t, err)
	cert, err := pair.TLSCertificate()
	require.NoError(t, err)
	c, err := client.NewWithTLS(b.URL, &tls.Config{
		RootCAs: b.CA.Pool(), Certificates: []tls.Certificate{cert},
		VerifyConnection: func(cs tls.ConnectionState) error { watch(cs); return nil },
	})
	require.NoError(t, err)
	t.Cleanup(c.CloseIdleConnections)
	return c
}
