package server

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/fluidos-project/resource-broker/broker/api"
)

func jsonMarshal(v any) ([]byte, error) { return json.Marshal(v) }

// streamEvents serves GET /api/v2/events as server-sent events: the caller's
// own notifications, each with its Redis stream id as the SSE id. A client
// resumes with ?since=<id> or the Last-Event-ID header; without either it gets
// only events from now on, and since=0 replays everything retained.
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
	cursor, err := s.store.EventCursor(ctx, caller, since)
	if err != nil {
		s.writeStoreError(w, "", err)
		return
	}
	s.metrics.streams.Inc()
	defer s.metrics.streams.Dec()

	rc := http.NewResponseController(w)
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	w.Header().Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	// The server's WriteTimeout would cut a long stream: push the deadline on.
	extend := func() { _ = rc.SetWriteDeadline(time.Now().Add(s.block + 30*time.Second)) }
	extend()
	// An id without data dispatches no event but sets the client's last event
	// id, so a standard SSE client that reconnects at once resumes from here.
	if _, err := fmt.Fprintf(w, "retry: 1000\nid: %s\n: cursor %s\n\n", cursor, cursor); err != nil {
		return
	}
	_ = rc.Flush()
	for ctx.Err() == nil {
		if s.certs != nil && !s.certs.trusts(r) { // checked every s.block at least
			fmt.Fprintf(w, "event: error\ndata: %q\n\n", errNoLongerTrusted)
			_ = rc.Flush()
			return
		}
		events, err := s.store.ReadEvents(ctx, caller, cursor, 256, s.block)
		if err != nil {
			if ctx.Err() == nil {
				s.log.Error(err, "read event stream", "cluster", caller)
				fmt.Fprintf(w, "event: error\ndata: %q\n\n", err.Error())
				_ = rc.Flush()
			}
			return
		}
		extend()
		if len(events) == 0 {
			if _, err := fmt.Fprint(w, ": keep-alive\n\n"); err != nil {
				return
			}
		}
		for _, e := range events {
			data, _ := json.Marshal(api.EventFromStore(e))
			if _, err := fmt.Fprintf(w, "id: %s\nevent: %s\ndata: %s\n\n", e.ID, e.Type, data); err != nil {
				return
			}
			cursor = e.ID
		}
		if err := rc.Flush(); err != nil {
			return
		}
	}
}

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
