package server

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/fluidos-project/resource-broker/broker/api"
	"github.com/fluidos-project/resource-broker/broker/model"
	"github.com/fluidos-project/resource-broker/broker/store"
)

func jsonMarshal(v any) ([]byte, error) { return json.Marshal(v) }

// streamEvents serves GET /api/v2/events as server-sent events: the caller's
// own notifications, each with its Redis stream id as the SSE id. A client
// resumes with ?since=<id> or the Last-Event-ID header; without either it gets
// only events from now on, and since=0 replays everything retained.
//
// With cells, the caller has a stream in every cell (a reservation asked of
// every cell lives in its provider's, one made before a move in the old
// cell): the stream follows them all, and its SSE id is a cursor holding the
// last id sent of each (appendStreamCursor). Each cell's events come in order;
// across cells, as they arrive.
//
// The events come from the replica's eventHub (one per cell); those before
// the hub's position (a resumed or replayed stream) are read from Redis
// first, without blocking. A cluster may hold Config.MaxStreamsPerCluster
// streams on one replica: one more is answered 429.
func (s *Server) streamEvents(w http.ResponseWriter, r *http.Request, caller string) {
	since := r.URL.Query().Get("since")
	if h := r.Header.Get("Last-Event-ID"); h != "" && since == "" {
		since = h
	}
	cells := s.streamCells()
	resume, err := parseStreamCursor(since, cells)
	if err != nil {
		writeError(w, http.StatusBadRequest, api.ReasonBadRequest, "since: "+err.Error())
		return
	}
	ctx := r.Context()
	notify := make(chan struct{}, 1)
	feeds, err := s.subscribeCells(ctx, caller, cells, notify)
	switch {
	case errors.Is(err, errTooManyStreams):
		w.Header().Set("Retry-After", strconv.Itoa(int(streamRetryAfter.Seconds())))
		writeError(w, http.StatusTooManyRequests, api.ReasonTooManyRequests, fmt.Sprintf(
			"cluster %s has %d event streams open on this broker replica, the most it may: close one (an agent needs one)", caller, s.hub.maxSubs))
		return
	case errors.Is(err, errHubStopped):
		w.Header().Set("Retry-After", "1")
		writeError(w, http.StatusServiceUnavailable, api.ReasonUnavailable, err.Error())
		return
	case err != nil:
		s.writeStoreError(w, "", err)
		return
	}
	defer func() {
		for _, f := range feeds {
			f.sub.close()
		}
	}()
	for i, f := range feeds {
		f.last = f.start
		if resume != nil {
			f.last = resume[i]
		}
	}
	s.metrics.streams.Inc()
	defer s.metrics.streams.Dec()

	rc := http.NewResponseController(w)
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	w.Header().Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	// The server's WriteTimeout would cut a long stream: push the deadline on.
	extend := func() { _ = rc.SetWriteDeadline(time.Now().Add(s.keepAlive + 30*time.Second)) }
	extend()
	// An id without data dispatches no event but sets the client's last event
	// id, so a standard SSE client that reconnects at once resumes from here.
	cursor := string(appendStreamCursor(nil, feeds))
	if _, err := fmt.Fprintf(w, "retry: 1000\nid: %s\n: cursor %s\n\n", cursor, cursor); err != nil {
		return
	}
	_ = rc.Flush()
	var frame []byte // with cells, an event's frame with the cursor as its id
	send := func(f *cellFeed, e *sseEvent) bool {
		if compareStreamIDs(e.id, f.last) <= 0 {
			return true
		}
		f.last = e.id
		if len(feeds) == 1 {
			_, err := w.Write(e.frame)
			return err == nil
		}
		frame = append(frame[:0], "id: "...)
		frame = appendStreamCursor(frame, feeds)
		frame = append(append(frame, '\n'), e.body()...)
		_, err := w.Write(frame)
		return err == nil
	}
	fail := func(msg string) {
		fmt.Fprintf(w, "event: error\ndata: %q\n\n", msg)
		_ = rc.Flush()
	}

	// Catch up, from Redis, on each cell's events up to its hub's start.
	for _, f := range feeds {
		for caughtUp := compareStreamIDs(f.last, f.start) >= 0; !caughtUp; {
			events, err := f.store.ReadEvents(ctx, caller, f.last, hubReadCount, 0)
			if err != nil {
				if ctx.Err() == nil {
					s.log.Error(err, "read event stream", "cluster", caller, "cell", f.cell)
					fail(err.Error())
				}
				return
			}
			caughtUp = len(events) < hubReadCount // nothing older than the start is left to read
			for i := range events {
				if compareStreamIDs(events[i].ID, f.start) > 0 {
					caughtUp = true // the hub hands this one over
					break
				}
				if !send(f, encodeEvent(events[i])) {
					return
				}
			}
			caughtUp = caughtUp || compareStreamIDs(f.last, f.start) >= 0
			extend()
			if err := rc.Flush(); err != nil {
				return
			}
		}
	}

	keepAlive := time.NewTicker(s.keepAlive)
	defer keepAlive.Stop()
	var buf []*sseEvent
	for {
		select {
		case <-ctx.Done():
			return
		case <-s.streamsEnd:
			// Shutting down: the client reconnects (to another replica) at
			// once and resumes after the last id it saw.
			fmt.Fprintf(w, "retry: %d\n: the broker is shutting down: reconnect\n\n", streamReconnect.Milliseconds())
			_ = rc.Flush()
			return
		case <-keepAlive.C:
			if s.certs != nil && !s.certs.trusts(r) {
				fail(errNoLongerTrusted)
				return
			}
			extend()
			if _, err := fmt.Fprint(w, ": keep-alive\n\n"); err != nil {
				return
			}
		case <-notify:
			extend()
			for _, f := range feeds {
				var err error
				buf, err = f.sub.take(buf[:0])
				for _, e := range buf {
					if !send(f, e) {
						return
					}
				}
				if err != nil {
					if errors.Is(err, errHubStopped) {
						fmt.Fprintf(w, "retry: %d\n: the broker is shutting down: reconnect\n\n", streamReconnect.Milliseconds())
					} else {
						fail(err.Error())
					}
					_ = rc.Flush()
					return
				}
			}
		}
		if err := rc.Flush(); err != nil {
			return
		}
	}
}

// cellFeed is one cell's part of a caller's event stream.
type cellFeed struct {
	cell  string // "" with one cell
	store *store.Store
	sub   *subscription
	start string // the hub hands over the events after it
	last  string // the events up to it were sent (or not asked for)
}

// appendStreamCursor appends the SSE id of a stream at feeds to b. With one
// cell it is the Redis stream id of the last event sent, as it always was.
// With cells it holds the last id sent of every cell, in the cells' sorted
// order: "<cell>:<stream id>,<cell>:<stream id>,...", e.g.
// "eu:1700000000000-0,us:1700000000000-3" (a cell name holds no ",": the
// flag --cells splits on it; parseStreamCursor splits each pair on its last
// ":"). Clients treat it as opaque.
func appendStreamCursor(b []byte, feeds []*cellFeed) []byte {
	if len(feeds) == 1 {
		return append(b, feeds[0].last...)
	}
	for i, f := range feeds {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(append(append(b, f.cell...), ':'), f.last...)
	}
	return b
}

// parseStreamCursor reads since as the position to resume after in each of
// cells (by index); nil: from now on ("" or "$"). A stream id is the position
// in every cell (a client of a broker that had one cell resumes about where it
// was; "0" replays everything retained in each). In a cursor, a cell it does
// not name is read from its beginning (a cell added since), and one the broker
// does not have is ignored (a cell removed: its state is not read any more).
func parseStreamCursor(since string, cells []string) ([]string, error) {
	switch {
	case since == "" || since == "$":
		return nil, nil
	case validStreamID(since):
		resume := make([]string, len(cells))
		for i := range resume {
			resume[i] = since
		}
		return resume, nil
	case len(cells) == 1:
		return nil, fmt.Errorf("%s is not a stream id such as 1700000000000-0", since)
	}
	malformed := fmt.Errorf("%s is neither a stream id such as 1700000000000-0 nor an event id of this broker such as %s:1700000000000-0,%s:1700000000000-3",
		since, cells[0], cells[1])
	resume := make([]string, len(cells))
	for i := range resume {
		resume[i] = "0"
	}
	named := map[string]bool{}
	for part := range strings.SplitSeq(since, ",") {
		at := strings.LastIndexByte(part, ':')
		if at <= 0 || !validStreamID(part[at+1:]) || named[part[:at]] {
			return nil, malformed
		}
		named[part[:at]] = true
		if i := slices.Index(cells, part[:at]); i >= 0 {
			resume[i] = part[at+1:]
		}
	}
	return resume, nil
}

// sseEvent is an event as a stream sends it.
type sseEvent struct {
	id    string
	frame []byte // "id: ...\nevent: ...\ndata: ...\n\n"
}

// body is the frame after its id line.
func (e *sseEvent) body() []byte { return e.frame[len("id: ")+len(e.id)+1:] }

func encodeEvent(e model.Event) *sseEvent {
	data, _ := json.Marshal(api.EventFromStore(e))
	return &sseEvent{id: e.ID, frame: fmt.Appendf(nil, "id: %s\nevent: %s\ndata: %s\n\n", e.ID, e.Type, data)}
}

// streamRetryAfter is the Retry-After of a stream refused for the cap, and
// streamReconnect the reconnection delay a stream ended by a shutdown advises.
const (
	streamRetryAfter = 5 * time.Second
	streamReconnect  = 200 * time.Millisecond
)

// validStreamID accepts what Redis takes as a stream id: <ms> or <ms>-<seq>,
// each a 64-bit unsigned decimal, so that a stream never starts only to end
// in an error event from Redis.
func validStreamID(s string) bool {
	ms, seq, hasSeq := strings.Cut(s, "-")
	if !isUint64(ms) {
		return false
	}
	return !hasSeq || isUint64(seq)
}

func isUint64(s string) bool {
	_, err := strconv.ParseUint(s, 10, 64) // digits only: no sign, no underscore in base 10
	return err == nil
}
