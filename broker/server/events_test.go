package server_test

import (
	"bufio"
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fluidos-project/resource-broker/broker/api"
	"github.com/fluidos-project/resource-broker/internal/brokertest"
)

type sseEvent struct {
	id, kind string
	data     api.Event
}

// openStream opens GET /api/v2/events as cn and returns a channel of its events.
func openStream(t *testing.T, b *brokertest.Broker, cn, query string, header http.Header) <-chan sseEvent {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, b.URL+"/api/v2/events"+query, nil)
	require.NoError(t, err)
	for k, v := range header {
		req.Header[k] = v
	}
	tr := b.Client(cn).Transport
	resp, err := (&http.Client{Transport: tr}).Do(req)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Equal(t, "text/event-stream", resp.Header.Get("Content-Type"))
	out := make(chan sseEvent, 64)
	go func() {
		defer resp.Body.Close()
		defer close(out)
		sc := bufio.NewScanner(resp.Body)
		var ev sseEvent
		for sc.Scan() {
			line := sc.Text()
			switch {
			case line == "":
				if ev.kind != "" {
					out <- ev
				}
				ev = sseEvent{}
			case strings.HasPrefix(line, "id: "):
				ev.id = line[4:]
			case strings.HasPrefix(line, "event: "):
				ev.kind = line[7:]
			case strings.HasPrefix(line, "data: "):
				_ = json.Unmarshal([]byte(line[6:]), &ev.data)
			}
		}
	}()
	return out
}

func next(t *testing.T, ch <-chan sseEvent) sseEvent {
	t.Helper()
	select {
	case ev, ok := <-ch:
		require.True(t, ok, "stream closed")
		return ev
	case <-time.After(5 * time.Second):
		t.Fatal("no event within 5s")
	}
	return sseEvent{}
}

func TestEventStreamResumes(t *testing.T) {
	b := brokertest.Start(t, brokertest.Options{})
	b.Advertise("paris", "8", "32Gi", "", "0.03", nil)
	provider := openStream(t, b, "paris", "", nil)
	requester := openStream(t, b, "rome", "", nil)

	code, data := b.Do("rome", http.MethodPost, "/api/v2/reservations", reservation("e1", "1", "1Gi"))
	require.Equal(t, http.StatusCreated, code, "%s", data)
	for who, ch := range map[string]<-chan sseEvent{"paris": provider, "rome": requester} {
		ev := next(t, ch)
		assert.Equal(t, "Reserved", ev.kind, who)
		assert.Equal(t, api.Event{Type: "Reserved", Reservation: "e1", Requester: "rome", Provider: "paris", Phase: "Reserved",
			Resources: ev.data.Resources, ExpiresAt: ev.data.ExpiresAt, RemainingMs: time.Hour.Milliseconds()}, ev.data,
			"the bare id, and the time left on the broker's clock")
		assert.Equal(t, "1", ev.data.Resources.CPU.String())
	}
	// berlin sees nothing of it: a stream carries only the caller's own events.
	other := openStream(t, b, "berlin", "", nil)

	// Events published while a client is away are delivered when it resumes.
	first := next(t, openStream(t, b, "paris", "?since=0", nil))
	assert.Equal(t, "e1", first.data.Reservation)
	code, _ = b.Do("rome", http.MethodDelete, "/api/v2/reservations/e1", nil)
	require.Equal(t, http.StatusOK, code)
	resumed := openStream(t, b, "paris", "", http.Header{"Last-Event-ID": {first.id}})
	ev := next(t, resumed)
	assert.Equal(t, "Released", ev.kind)
	assert.Equal(t, "e1", ev.data.Reservation)
	select {
	case ev := <-other:
		t.Fatalf("berlin got someone else's event %+v", ev)
	case <-time.After(700 * time.Millisecond): // longer than one keep-alive round
	}

	code, data = b.Do("paris", http.MethodGet, "/api/v2/events?since=not-an-id", nil)
	assert.Equal(t, http.StatusBadRequest, code, "%s", data)
}
