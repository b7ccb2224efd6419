package server

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/fluidos-project/resource-broker/broker/api"
	"github.com/fluidos-project/resource-broker/broker/model"
)

func jsonMarshal(v any) ([]byte, error) { return json.Marshal(v) }

// streamEvents serves GET /api/v2/events as server-sent events: the caller's
// own notifications, each with its Redis stream id as the SSE id. A client
// resumes with ?since=<id> or the Last-Event-ID header; without either it gets
// only events from now on, and since=0 replays everything retained.
//
// The events come from the replica's eventHub; those before the hub's
// position (a resumed or replayed stream) are read from Redis first, without
// blocking. A cluster may hold Config.MaxStreamsPerCluster streams on one
// replica: one more is answered 429.
func (s *Server) streamEvents(w http.ResponseWriter, r *http.Request, caller string) {
	since := r.URL.Query().Get("since")
	if h := r.Header.Get("Last-Event-ID"); h != "" && since == "" {
		since = h
	}
	if since != "" && since != "$" && !validStreamID(since) {
		writeError(w, http.StatusBadRequest, api.ReasonBadRequest, "since: "+since+" is not a stream id such as 1700000000000-0")
		return
	}
	ctx := r.Context()
	// With cells, the events of the caller's cell (cells.go).
	sub, start, err := s.hubOf(ctx, caller).subscribe(ctx, caller)
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
	defer sub.close()
	cursor := since
	if since == "" || since == "$" {
		cursor = start
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
	if _, err := fmt.Fprintf(w, "retry: 1000\nid: %s\n: cursor %s\n\n", cursor, cursor); err != nil {
		return
	}
	_ = rc.Flush()
	last := cursor // events up to it were sent (or not asked for)
	send := func(e *sseEvent) bool {
		if compareStreamIDs(e.id, last) <= 0 {
			return true
		}
		_, err := w.Write(e.frame)
		last = e.id
		return err == nil
	}
	fail := func(msg string) {
		fmt.Fprintf(w, "event: error\ndata: %q\n\n", msg)
		_ = rc.Flush()
	}

	// Catch up, from Redis, on the events up to the hub's start.
	for caughtUp := compareStreamIDs(last, start) >= 0; !caughtUp; {
		events, err := s.storeOf(ctx, caller).ReadEvents(ctx, caller, last, hubReadCount, 0)
		if err != nil {
			if ctx.Err() == nil {
				s.log.Error(err, "read event stream", "cluster", caller)
				fail(err.Error())
			}
			return
		}
		caughtUp = len(events) < hubReadCount // nothing older than the start is left to read
		for i := range events {
			if compareStreamIDs(events[i].ID, start) > 0 {
				caughtUp = true // the hub hands this one over
				break
			}
			if !send(encodeEvent(events[i])) {
				return
			}
		}
		caughtUp = caughtUp || compareStreamIDs(last, start) >= 0
		extend()
		if err := rc.Flush(); err != nil {
			return
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
		case <-sub.notify:
			var err error
			buf, err = sub.take(buf[:0])
			extend()
			for _, e := range buf {
				if !send(e) {
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
		if err := rc.Flush(); err != nil {
			return
		}
	}
}

// sseEvent is an event as a stream sends it.
type sseEvent struct {
	id    string
	frame []byte // "id: ...\nevent: ...\ndata: ...\n\n"
}

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
