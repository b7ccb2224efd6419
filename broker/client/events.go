package client

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/fluidos-project/resource-broker/broker/api"
)

// StreamError ends an event stream that was cut off: the connection failed,
// the broker closed it (shutdown, an error on its side), or nothing arrived
// for the idle timeout. It is retryable: open the stream again with
// since = LastEventID to get exactly the events that followed.
type StreamError struct {
	Err error
	// LastEventID is the id of the last event received; before any, the
	// broker's starting position of this stream, so resuming from it loses
	// nothing either. Empty only if the stream failed before telling.
	LastEventID string
	// Retry is the reconnection delay the broker advised (its retry: field).
	Retry time.Duration
}

func (e *StreamError) Error() string {
	msg := "event stream: " + e.Err.Error()
	if e.LastEventID != "" {
		msg += " (resume with since=" + e.LastEventID + ")"
	}
	return msg
}

func (e *StreamError) Unwrap() error { return e.Err }

// ErrStreamIdle is the StreamError's Err when nothing arrived on an event
// stream for the idle timeout (WithStreamIdleTimeout).
var ErrStreamIdle = errors.New("no data from the broker within the idle timeout")

// BrokerStreamError is the StreamError's Err when the broker ended the stream
// with an error event (it lost Redis, for example).
type BrokerStreamError struct{ Message string }

func (e *BrokerStreamError) Error() string { return "broker error: " + e.Message }

var (
	errOpenTimeout  = errors.New("timed out waiting for the event stream to open")
	errStreamClosed = errors.New("client: event stream closed")
)

// Events follows the caller's event stream (GET /api/v2/events) and calls
// handler, in order, with each event and its id, until ctx ends (it then
// returns ctx.Err()) or handler returns an error (returned as is).
//
// since is where to start: "" for only the events from now on, "0" for every
// event the broker retains, or an id received earlier for exactly the events
// after it. Ids are opaque (a broker split into cells sends a cursor of
// every cell's position): pass them back as they came. When the stream is cut off Events returns a *StreamError wrapping
// the transport error (IsRetryable is true); the caller resumes by calling
// Events again with since set to the last id its handler saw, or to the
// StreamError's LastEventID (which is also right before any event arrived):
//
//	since := ""
//	for {
//		err := c.Events(ctx, since, func(id string, e api.Event) error {
//			since = id
//			return handle(e)
//		})
//		var se *client.StreamError
//		if errors.As(err, &se) && se.LastEventID != "" {
//			since = se.LastEventID
//		}
//		if !client.IsRetryable(err) {
//			return err
//		}
//		time.Sleep(time.Second) // or se.Retry, with back-off
//	}
//
// Events does not retry anything itself. The stream is not subject to
// WithTimeout (only its opening is); WithStreamIdleTimeout detects a dead
// connection instead.
func (c *Client) Events(ctx context.Context, since string, handler func(id string, e api.Event) error) error {
	s, err := c.OpenEvents(ctx, since)
	if err != nil {
		return err
	}
	defer s.Close()
	for {
		id, e, err := s.Next()
		if err != nil {
			return err
		}
		if err := handler(id, e); err != nil {
			return err
		}
	}
}

// EventStream is an open event stream; see Events. Next must not be called
// concurrently; Close may be called from any goroutine.
type EventStream struct {
	ctx    context.Context // the caller's
	sctx   context.Context // the request's, cancelled by Close and the idle timer
	cancel context.CancelCauseFunc
	body   io.ReadCloser
	sse    *sseReader
	idle   *time.Timer
	once   sync.Once
}

// OpenEvents opens the caller's event stream at since (see Events) and
// returns once the broker accepted it: from then on no event is missed. An
// answer other than a stream is an *APIError (400 for a malformed since).
func (c *Client) OpenEvents(ctx context.Context, since string) (*EventStream, error) {
	target := c.base + "/api/v2/events"
	if since != "" {
		target += "?" + url.Values{"since": {since}}.Encode()
	}
	sctx, cancel := context.WithCancelCause(ctx)
	req, err := http.NewRequestWithContext(sctx, http.MethodGet, target, nil)
	if err != nil {
		cancel(nil)
		return nil, fmt.Errorf("client: %w", err)
	}
	req.Header.Set("Accept", "text/event-stream")
	req.Header.Set("Cache-Control", "no-cache")
	req.Header.Set("User-Agent", c.cfg.userAgent)
	var openTimer *time.Timer
	if c.cfg.timeout > 0 {
		openTimer = time.AfterFunc(c.cfg.timeout, func() { cancel(errOpenTimeout) })
	}
	resp, err := c.httpClient(true).Do(req)
	if openTimer != nil {
		openTimer.Stop()
	}
	if err != nil {
		cause := context.Cause(sctx)
		cancel(nil)
		if errors.Is(cause, errOpenTimeout) {
			return nil, fmt.Errorf("GET %s: %w", target, cause)
		}
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		data, _ := io.ReadAll(io.LimitReader(resp.Body, maxErrorBytes))
		resp.Body.Close()
		cancel(nil)
		return nil, newAPIError(http.MethodGet, "/api/v2/events", resp, data)
	}
	if mt, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type")); mt != "text/event-stream" {
		resp.Body.Close()
		cancel(nil)
		return nil, fmt.Errorf("client: GET /api/v2/events: answer is %q, not an event stream", resp.Header.Get("Content-Type"))
	}
	s := &EventStream{ctx: ctx, sctx: sctx, cancel: cancel, body: resp.Body}
	var r io.Reader = resp.Body
	if c.cfg.streamIdle > 0 {
		s.idle = time.AfterFunc(c.cfg.streamIdle, func() { cancel(ErrStreamIdle) })
		r = &idleReader{r: resp.Body, timer: s.idle, d: c.cfg.streamIdle}
	}
	s.sse = newSSEReader(r)
	return s, nil
}

// Next returns the next event and its id, waiting for it. Errors: ctx.Err()
// when the caller's context ended, a *StreamError when the stream was cut
// off, or a decoding error (the broker sent something that is not an event).
func (s *EventStream) Next() (string, api.Event, error) {
	ev, err := s.sse.next()
	if err != nil {
		return "", api.Event{}, s.streamError(err)
	}
	if ev.Type == "error" { // the broker's last word before it closes the stream
		var msg string
		if json.Unmarshal([]byte(ev.Data), &msg) != nil {
			msg = ev.Data
		}
		s.Close()
		return "", api.Event{}, &StreamError{Err: &BrokerStreamError{Message: msg}, LastEventID: s.LastEventID(), Retry: s.sse.retry}
	}
	var e api.Event
	if err := json.Unmarshal([]byte(ev.Data), &e); err != nil {
		return "", api.Event{}, fmt.Errorf("client: event %s (%s): decode %q: %w", ev.ID, ev.Type, ev.Data, err)
	}
	if e.Type == "" && ev.Type != "message" {
		e.Type = ev.Type
	}
	return ev.ID, e, nil
}

func (s *EventStream) streamError(err error) error {
	if s.ctx.Err() != nil {
		return s.ctx.Err()
	}
	switch cause := context.Cause(s.sctx); {
	case errors.Is(cause, errStreamClosed):
		return errStreamClosed
	case cause != nil:
		err = cause // the idle timeout
	case errors.Is(err, io.EOF):
		err = fmt.Errorf("broker closed the stream: %w", io.ErrUnexpectedEOF)
	}
	return &StreamError{Err: err, LastEventID: s.LastEventID(), Retry: s.sse.retry}
}

// LastEventID is the id of the last event Next returned or, before any, the
// broker's starting position (see StreamError.LastEventID).
func (s *EventStream) LastEventID() string {
	if s.sse.lastID != "" {
		return s.sse.lastID
	}
	return s.sse.cursor
}

// Close ends the stream.
func (s *EventStream) Close() error {
	s.once.Do(func() {
		if s.idle != nil {
			s.idle.Stop()
		}
		s.cancel(errStreamClosed)
		s.body.Close()
	})
	return nil
}

// idleReader re-arms the idle timer whenever data arrives.
type idleReader struct {
	r     io.Reader
	timer *time.Timer
	d     time.Duration
}

func (r *idleReader) Read(p []byte) (int, error) {
	n, err := r.r.Read(p)
	if n > 0 {
		r.timer.Reset(r.d)
	}
	return n, err
}

// sseEvent is one dispatched server-sent event.
type sseEvent struct {
	ID, Type, Data string
}

// maxSSELine bounds a line of the stream; an event is a few hundred bytes.
const maxSSELine = 1 << 20

// sseReader parses text/event-stream as the HTML standard says: lines end in
// CRLF, LF or CR; a line starting with ':' is a comment; "field: value" (one
// optional space after the colon); data lines accumulate with "\n" between
// them; a blank line dispatches the event (none if it had no data); id sets
// the last event id, also without data, unless it contains NUL; retry sets
// the reconnection delay if it is all digits; other fields are ignored. The
// broker's ": cursor <id>" comment, its starting position, is remembered.
type sseReader struct {
	r      *bufio.Reader
	skipLF bool // the last line ended in CR: a following LF belongs to it
	lastID string
	cursor string
	retry  time.Duration
	line   []byte
}

func newSSEReader(r io.Reader) *sseReader {
	return &sseReader{r: bufio.NewReaderSize(r, 4096)}
}

func (s *sseReader) readLine() (string, error) {
	s.line = s.line[:0]
	for {
		b, err := s.r.ReadByte()
		if err != nil {
			return "", err // an unterminated last line is discarded
		}
		if s.skipLF {
			s.skipLF = false
			if b == '\n' {
				continue
			}
		}
		switch b {
		case '\n':
			return string(s.line), nil
		case '\r':
			s.skipLF = true
			return string(s.line), nil
		}
		if len(s.line) >= maxSSELine {
			return "", fmt.Errorf("event stream line longer than %d bytes", maxSSELine)
		}
		s.line = append(s.line, b)
	}
}

func (s *sseReader) next() (sseEvent, error) {
	var data strings.Builder
	typ := ""
	for {
		line, err := s.readLine()
		if err != nil {
			return sseEvent{}, err // an event not ended by a blank line is discarded
		}
		if line == "" {
			if data.Len() == 0 {
				typ = ""
				continue
			}
			if typ == "" {
				typ = "message"
			}
			return sseEvent{ID: s.lastID, Type: typ, Data: strings.TrimSuffix(data.String(), "\n")}, nil
		}
		if line[0] == ':' {
			if c, ok := strings.CutPrefix(line[1:], " cursor "); ok {
				s.cursor = strings.TrimSpace(c)
			}
			continue
		}
		field, value, found := strings.Cut(line, ":")
		if found {
			value = strings.TrimPrefix(value, " ")
		}
		switch field {
		case "event":
			typ = value
		case "data":
			data.WriteString(value)
			data.WriteByte('\n')
		case "id":
			if !strings.ContainsRune(value, 0) {
				s.lastID = value
			}
		case "retry":
			if ms, err := strconv.ParseUint(value, 10, 32); err == nil {
				s.retry = time.Duration(ms) * time.Millisecond
			}
		}
	}
}
