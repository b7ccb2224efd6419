package server_test

import (
	"bufio"
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
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
	// With one cell, an event's id is its Redis stream id, as it always was.
	entries, err := b.RDB.XRange(context.Background(), "rb:{b}:events:paris", "-", "+").Result()
	require.NoError(t, err)
	require.NotEmpty(t, entries)
	assert.Equal(t, entries[0].ID, first.id)
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
	assert.Contains(t, string(data), "since: not-an-id is not a stream id such as 1700000000000-0")
	code, data = b.Do("paris", http.MethodGet, "/api/v2/events?since=b:1-0", nil)
	assert.Equal(t, http.StatusBadRequest, code, "one cell takes stream ids only: %s", data)
}

// TestEventStreamsExactUnderLoad opens streams of one cluster at every kind
// of start (from now, from the beginning, from ids in the middle) while its
// events keep coming: each stream gets exactly the events after its start,
// in order, none twice and none missing, where those before the shared
// reader's position come from Redis and the rest from the reader.
func TestEventStreamsExactUnderLoad(t *testing.T) {
	b := brokertest.Start(t, brokertest.Options{MaxStreamsPerCluster: -1})
	b.Advertise("paris", "100000", "100000Gi", "", "0.03", nil)
	ctx := context.Background()
	c, err := client.New(b.URL, b.ClusterCertDir("paris"))
	require.NoError(t, err)
	t.Cleanup(c.CloseIdleConnections)

	const reservations = 300
	var made atomic.Int64
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := range reservations {
			code, data := b.Do("rome", http.MethodPost, "/api/v2/reservations", reservation(fmt.Sprintf("x%d", i), "1", "1Gi"))
			if code != http.StatusCreated {
				t.Errorf("reserve: %d %s", code, data)
				return
			}
			made.Add(1)
		}
	}()
	type follower struct {
		since  string
		stream *client.EventStream
		mu     sync.Mutex
		got    []string
	}
	var followers []*follower
	var wg sync.WaitGroup
	for i := 0; made.Load() < reservations; i++ {
		since := ""
		switch i % 3 {
		case 1:
			since = "0"
		case 2: // an id already past
			if ids, _ := b.RDB.XRevRangeN(ctx, "rb:{b}:events:paris", "+", "-", 1+int64(i)).Result(); len(ids) > 0 {
				since = ids[len(ids)-1].ID
			}
		}
		s, err := c.OpenEvents(ctx, since)
		require.NoError(t, err)
		t.Cleanup(func() { s.Close() })
		f := &follower{since: since, stream: s}
		followers = append(followers, f)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				id, _, err := s.Next()
				if err != nil {
					return // closed below
				}
				f.mu.Lock()
				f.got = append(f.got, id)
				f.mu.Unlock()
			}
		}()
		time.Sleep(5 * time.Millisecond)
	}
	<-done
	all, err := b.RDB.XRange(ctx, "rb:{b}:events:paris", "-", "+").Result()
	require.NoError(t, err)
	require.Len(t, all, reservations)
	final := all[len(all)-1].ID
	assert.Eventually(t, func() bool {
		for _, f := range followers {
			f.mu.Lock()
			last := ""
			if len(f.got) > 0 {
				last = f.got[len(f.got)-1]
			}
			f.mu.Unlock()
			if last != final && (f.since != "" || last != "") {
				return false
			}
		}
		return true
	}, 10*time.Second, 10*time.Millisecond, "every stream gets to the last event")
	time.Sleep(200 * time.Millisecond) // a stream from now that got nothing has nothing on the way
	for _, f := range followers {
		f.stream.Close()
	}
	wg.Wait()
	for _, f := range followers {
		if f.since == "" && len(f.got) == 0 {
			// Opened once every event was in: its start is the last.
			assert.Equal(t, all[len(all)-1].ID, f.stream.LastEventID())
			continue
		}
		var want []string
		for _, m := range all {
			if f.since == "0" || compareIDs(m.ID, f.since) > 0 {
				want = append(want, m.ID)
			}
		}
		if f.since == "" {
			want = want[max(0, slices.Index(want, f.got[0])):]
		}
		assert.Equal(t, want, f.got, "stream from %q", f.since)
	}
	t.Logf("%d streams opened while %d events came", len(followers), reservations)
}

func firstOf(ids []string) string {
	if len(ids) == 0 {
		return ""
	}
	return ids[0]
}

// compareIDs orders two Redis stream ids.
func compareIDs(a, b string) int {
	parse := func(id string) (uint64, uint64) {
		ms, seq, _ := strings.Cut(id, "-")
		m, _ := strconv.ParseUint(ms, 10, 64)
		s, _ := strconv.ParseUint(seq, 10, 64)
		return m, s
	}
	am, as := parse(a)
	bm, bs := parse(b)
	if c := cmp.Compare(am, bm); c != 0 {
		return c
	}
	return cmp.Compare(as, bs)
}
