package client_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fluidos-project/resource-broker/broker/api"
	"github.com/fluidos-project/resource-broker/broker/client"
	"github.com/fluidos-project/resource-broker/internal/brokertest"
)

type received struct {
	id string
	e  api.Event
}

// collect runs Events until ctx ends and returns what arrived and the error.
func collect(ctx context.Context, c *client.Client, since string, until func([]received) bool) ([]received, error) {
	var got []received
	stop := errors.New("enough")
	err := c.Events(ctx, since, func(id string, e api.Event) error {
		got = append(got, received{id, e})
		if until != nil && until(got) {
			return stop
		}
		return nil
	})
	if errors.Is(err, stop) {
		err = nil
	}
	return got, err
}

func TestEventsResume(t *testing.T) {
	ctx := context.Background()
	b := brokertest.Start(t, brokertest.Options{})
	b.Advertise("paris", "8", "32Gi", "", "0.03", nil)
	paris, rome := newClient(t, b, "paris"), newClient(t, b, "rome")

	// An event from before the stream opens is not delivered without since.
	_, err := rome.Reserve(ctx, request("old", "1", "1Gi"))
	require.NoError(t, err)

	s, err := paris.OpenEvents(ctx, "")
	require.NoError(t, err)
	_, err = rome.Reserve(ctx, request("r1", "2", "2Gi"))
	require.NoError(t, err)
	id, e, err := s.Next()
	require.NoError(t, err)
	assert.NotEmpty(t, id)
	assert.Equal(t, id, s.LastEventID())
	assert.Equal(t, "Reserved", e.Type)
	assert.Equal(t, "r1", e.Reservation)
	assert.Equal(t, "rome", e.Requester)
	assert.Equal(t, "paris", e.Provider)
	assert.Equal(t, "2", e.Resources.CPU.String())
	assert.WithinDuration(t, time.Now().Add(time.Hour), e.ExpiresAt, time.Minute)
	require.NoError(t, s.Close())
	_, _, err = s.Next()
	require.Error(t, err, "closed")

	_, err = rome.Release(ctx, "r1")
	require.NoError(t, err)

	// Resume after the last id seen: exactly the release, not the old events.
	// Wait a little past it (the broker's read blocks 500ms) for anything extra.
	wctx, cancel := context.WithCancel(ctx)
	var once sync.Once
	got, err := collect(wctx, paris, id, func(got []received) bool {
		once.Do(func() { time.AfterFunc(time.Second, cancel) })
		return false
	})
	assert.ErrorIs(t, err, context.Canceled)
	require.Len(t, got, 1, "%+v", got)
	assert.Equal(t, "Released", got[0].e.Type)
	assert.Equal(t, "r1", got[0].e.Reservation)
	assert.Equal(t, "Released", got[0].e.Phase)
	assert.Greater(t, got[0].id, id)

	// since=0 replays everything retained: old (reserved, seen by the
	// provider too), r1 reserved, r1 released.
	got, err = collect(ctx, paris, "0", func(got []received) bool { return len(got) == 3 })
	require.NoError(t, err)
	var kinds []string
	for _, r := range got {
		kinds = append(kinds, r.e.Reservation+":"+r.e.Type)
	}
	assert.Equal(t, []string{"old:Reserved", "r1:Reserved", "r1:Released"}, kinds)

	// The handler's error ends the stream and is returned as is.
	boom := errors.New("boom")
	err = rome.Events(ctx, "0", func(string, api.Event) error { return boom })
	assert.Same(t, boom, err)

	// A malformed since is the broker's 400.
	err = rome.Events(ctx, "yesterday", func(string, api.Event) error { return nil })
	var ae *client.APIError
	require.ErrorAs(t, err, &ae)
	assert.Equal(t, http.StatusBadRequest, ae.StatusCode)
}

// TestEventsIdleAndCursor: a stream on which nothing arrives within the idle
// timeout ends with a retryable StreamError whose LastEventID is the broker's
// starting position, so resuming from it misses nothing that happened since.
func TestEventsIdleAndCursor(t *testing.T) {
	ctx := context.Background()
	b := brokertest.Start(t, brokertest.Options{EventKeepAlive: 2 * time.Second})
	b.Advertise("paris", "8", "32Gi", "", "0.03", nil)
	paris := newClient(t, b, "paris", client.WithStreamIdleTimeout(300*time.Millisecond))
	rome := newClient(t, b, "rome")

	err := paris.Events(ctx, "", func(string, api.Event) error { return nil })
	var se *client.StreamError
	require.ErrorAs(t, err, &se)
	assert.ErrorIs(t, err, client.ErrStreamIdle)
	assert.True(t, client.IsRetryable(err))
	assert.Equal(t, "0-0", se.LastEventID, "the broker's cursor of an empty stream")
	assert.Equal(t, time.Second, se.Retry, "the broker's retry: field")

	// Something happens while we are away; resuming from the cursor gets it.
	_, err = rome.Reserve(ctx, request("while-away", "1", "1Gi"))
	require.NoError(t, err)
	got, err := collect(ctx, paris, se.LastEventID, func([]received) bool { return true })
	require.NoError(t, err)
	require.Len(t, got, 1)
	assert.Equal(t, "while-away", got[0].e.Reservation)
}

// TestEventsBrokerError: when the broker loses Redis it ends the stream with
// an error event, which the client reports as a retryable StreamError.
func TestEventsBrokerError(t *testing.T) {
	ctx := context.Background()
	b := brokertest.Start(t, brokertest.Options{})
	b.Advertise("paris", "8", "32Gi", "", "0.03", nil)
	paris, rome := newClient(t, b, "paris"), newClient(t, b, "rome")
	_, err := rome.Reserve(ctx, request("r1", "1", "1Gi"))
	require.NoError(t, err)
	var last string
	err = paris.Events(ctx, "0", func(id string, e api.Event) error {
		last = id
		b.Redis.Stop()
		return nil
	})
	var se *client.StreamError
	require.ErrorAs(t, err, &se)
	assert.True(t, client.IsRetryable(err))
	assert.Equal(t, last, se.LastEventID)
	var be *client.BrokerStreamError
	if !errors.As(err, &be) {
		// The broker may also drop the connection without an error event.
		t.Logf("stream ended without an error event: %v", err)
	}
}

// TestSSEParsing feeds the parser the corners of the text/event-stream format
// from a plain TLS server.
func TestSSEParsing(t *testing.T) {
	stream := "retry: 2500\r\n" +
		": cursor 5-0\r\n" +
		"\r\n" +
		"id: 6-0\rdata: {\"type\":\"Reserved\",\rdata: \"reservation\":\"a\"}\r\r" + // CR line ends, two data lines
		": a comment\n" +
		"event: Granted\n" +
		"data:{\"reservation\":\"b\"}\n" + // no space after the colon; the type comes from event:
		"id: 7-0\n" +
		"\n" +
		"id: 8-0\n\n" + // an id without data dispatches nothing but moves the last id
		"data: {\"type\":\"Released\",\"reservation\":\"c\"}\r\n" +
		"unknown: field\r\n" +
		"retry: soon\r\n" + // ignored: not digits
		"\r\n" +
		"data: {\"type\":\"Expired\",\"reservation\":\"d\"}\n" // not ended by a blank line: discarded at EOF
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		assert.Equal(t, "/prefix/api/v2/events", r.URL.Path)
		assert.Equal(t, "4-0", r.URL.Query().Get("since"))
		w.Header().Set("Content-Type", "text/event-stream; charset=utf-8")
		for i := 0; i < len(stream); i += 7 { // in small pieces
			_, _ = io.WriteString(w, stream[i:min(i+7, len(stream))])
			w.(http.Flusher).Flush()
		}
	}))
	t.Cleanup(srv.Close)
	c, err := client.NewWithTLS(srv.URL+"/prefix", srv.Client().Transport.(*http.Transport).TLSClientConfig)
	require.NoError(t, err)

	got, err := collect(context.Background(), c, "4-0", nil)
	want := []received{
		{"6-0", api.Event{Type: "Reserved", Reservation: "a"}},
		{"7-0", api.Event{Type: "Granted", Reservation: "b"}},
		{"8-0", api.Event{Type: "Released", Reservation: "c"}},
	}
	assert.Equal(t, want, got)
	var se *client.StreamError
	require.ErrorAs(t, err, &se, "the server closed the stream")
	assert.ErrorIs(t, err, io.ErrUnexpectedEOF)
	assert.Equal(t, "8-0", se.LastEventID)
	assert.Equal(t, 2500*time.Millisecond, se.Retry)
	assert.True(t, client.IsRetryable(err))
}

// TestRetryOnTransportError: an idempotent call whose connection breaks is
// retried; a grant is not.
func TestRetryOnTransportError(t *testing.T) {
	var calls atomic.Int32
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := calls.Add(1)
		if n <= 2 || r.Method == http.MethodPost {
			conn, _, err := http.NewResponseController(w).Hijack()
			require.NoError(t, err)
			conn.Close() // no answer at all
			return
		}
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, `{"items":[{"clusterID":"paris","live":true}]}`)
	}))
	t.Cleanup(srv.Close)
	tlsCfg := srv.Client().Transport.(*http.Transport).TLSClientConfig
	c, err := client.NewWithTLS(srv.URL, tlsCfg, client.WithRetries(3, time.Millisecond))
	require.NoError(t, err)

	clusters, err := c.Clusters(context.Background())
	require.NoError(t, err)
	require.Len(t, clusters, 1)
	assert.Equal(t, "paris", clusters[0].ClusterID)
	assert.Equal(t, int32(3), calls.Load(), "two broken connections, then an answer")

	calls.Store(10)
	_, err = c.Grant(context.Background(), "r1", api.Grant{})
	require.Error(t, err)
	assert.True(t, client.IsRetryable(err), "a transport error: %v", err)
	assert.Equal(t, int32(11), calls.Load(), "a grant is sent once")
}
