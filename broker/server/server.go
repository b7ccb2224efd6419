// Package server is the broker's HTTP API: v2 (ours) and v1 (the seed agents'
// protocol), over mutual TLS where the client certificate's CN is the cluster
// identity, plus health, readiness and Prometheus metrics.
package server

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/fluidos-project/resource-broker/broker/api"
	"github.com/fluidos-project/resource-broker/broker/store"
)

// Config configures a Server.
type Config struct {
	Store *store.Store
	// Cells, when set, is the federation's state split into cells (Store is
	// then its default cell's): each member's calls go to its cell
	// (cells.go). One cell is the same as Store alone.
	Cells  *store.Cells
	Limits api.Limits
	Log    logr.Logger
	// EventKeepAlive is how often an idle event stream sends a keep-alive
	// comment (and checks that its client certificate is still trusted);
	// default 5s.
	EventKeepAlive time.Duration
	// MaxStreamsPerCluster bounds the event streams one cluster holds open on
	// this replica; one more is answered 429. 0: DefaultMaxStreamsPerCluster;
	// negative: no bound.
	MaxStreamsPerCluster int
	// MaxListsPerCluster bounds the list requests (pages of
	// GET /api/v2/reservations, /clusters and /usage) one cluster has in
	// progress on this replica; one more waits up to a second for a turn,
	// then is answered 429. 0: DefaultMaxListsPerCluster; negative: no bound.
	MaxListsPerCluster int
	// Dashboard, when set, is served under /dashboard/ (broker/dashboard);
	// the common names it takes for operators are refused on the API:
	// an operator's certificate is not a member's.
	Dashboard Dashboard
}

// Dashboard is the operators' web dashboard (broker/dashboard.Dashboard).
type Dashboard interface {
	http.Handler
	IsOperator(cn string) bool
}

// DefaultMaxStreamsPerCluster is Config.MaxStreamsPerCluster's default: an
// agent holds one stream, two for a moment while it reconnects, and rbctl or
// a rolling update of the agent a few more.
const DefaultMaxStreamsPerCluster = 8

// maxConcurrentAdvertisements bounds the advertisements one replica sends
// Redis at once. Redis runs one script at a time, in the order they come:
// 50 members advertising together would put 50 scripts, milliseconds each
// with many nodes, in front of every reserve call. Advertisements can wait
// (an agent's next one is seconds away); decisions should not. One at a
// time: a reserve waits behind one advertisement at most. Two turns store
// more advertisements when Redis is saturated (a turn lasts the round trip
// through Redis' queue: docs/benchmarks.md, "Advertisements under
// overload"), but TestAbuseChurnAndHeavyRenewals, alone on a quiet
// machine, then put the honest members' reserve p99 at 1.43-2.08x of the
// same load alone (it asks for 2x at most), against 1.38x with one. The
// others wait, the newest first, at most advertWait (advertGate).
const maxConcurrentAdvertisements = 1

// hubBlock bounds one read of the event hub (eventHub.block).
const hubBlock = 250 * time.Millisecond

// Server serves the broker API.
type Server struct {
	store *store.Store
	// cells is the federation's cells, nil with one cell (store);
	// memberCells maps a member to its cell, hubs a cell to its event hub.
	cells       *store.Cells
	memberCells sync.Map
	hubs        map[string]*eventHub
	limits      api.Limits
	log         logr.Logger
	metrics     *metrics
	memory      *redisMemory
	keepAlive   time.Duration
	hub         *eventHub
	lists       *listGate
	// rateRefused answers reserve calls its rate still refuses without Redis.
	rateRefused *rateRefusals
	// refusals holds the refused calls of members looping past their rates.
	refusals *heldRefusals
	// advertising bounds the advertisements in progress on this replica
	// (maxConcurrentAdvertisements) and sheds those that wait too long.
	advertising *advertGate
	certs       *Certs // set by Run; nil: the TLS configuration is fixed
	dashboard   Dashboard
	// draining is set when shutdown begins: /readyz fails from then on.
	draining atomic.Bool
	// streamsEnd is closed when the event streams must end (shutdown).
	streamsEnd chan struct{}
	endStreams sync.Once
}

// New returns a server.
func New(cfg Config) *Server {
	if cfg.EventKeepAlive <= 0 {
		cfg.EventKeepAlive = 5 * time.Second
	}
	if cfg.Limits.DefaultDuration == 0 {
		cfg.Limits.DefaultDuration = time.Hour
	}
	switch {
	case cfg.MaxStreamsPerCluster == 0:
		cfg.MaxStreamsPerCluster = DefaultMaxStreamsPerCluster
	case cfg.MaxStreamsPerCluster < 0:
		cfg.MaxStreamsPerCluster = 0
	}
	switch {
	case cfg.MaxListsPerCluster == 0:
		cfg.MaxListsPerCluster = DefaultMaxListsPerCluster
	case cfg.MaxListsPerCluster < 0:
		cfg.MaxListsPerCluster = 0
	}
	var cells *store.Cells
	if cfg.Cells != nil {
		cfg.Store = cfg.Cells.Cell(cfg.Cells.Default())
		if len(cfg.Cells.Names()) > 1 {
			cells = cfg.Cells
		}
	}
	newHub := func(st *store.Store) *eventHub {
		return newEventHub(st, cfg.Log.WithName("events"), min(hubBlock, cfg.EventKeepAlive), cfg.MaxStreamsPerCluster)
	}
	memory := &redisMemory{stores: []*store.Store{cfg.Store}, log: cfg.Log.WithName("redis-memory")}
	if cells != nil {
		memory.stores, memory.names = memory.stores[:0], cells.Names()
		for _, n := range memory.names {
			memory.stores = append(memory.stores, cells.Cell(n))
		}
	}
	advertising := newAdvertGate(maxConcurrentAdvertisements)
	s := &Server{store: cfg.Store, cells: cells, limits: cfg.Limits, log: cfg.Log, memory: memory, keepAlive: cfg.EventKeepAlive,
		hub:   newHub(cfg.Store),
		lists: newListGate(cfg.MaxListsPerCluster), rateRefused: newRateRefusals(), refusals: newHeldRefusals(),
		advertising: advertising,
		streamsEnd:  make(chan struct{}), dashboard: cfg.Dashboard}
	if cells != nil {
		s.hubs = map[string]*eventHub{}
		for _, n := range cells.Names() {
			s.hubs[n] = newHub(cells.Cell(n))
		}
		s.hub = s.hubs[cells.Default()]
	}
	s.metrics = newMetrics(s.stores(), memory, advertising)
	return s
}

// eventsRoute is the event stream's route: its requests last as long as
// their connection, so their durations are not observed.
const eventsRoute = "GET /api/v2/events"

// route is an API route: its pattern, the handler of an authenticated
// caller and the bound of its request body.
type route struct {
	pattern string
	h       func(http.ResponseWriter, *http.Request, string)
	maxBody int64
}

// routes are the API's routes (broker/api/openapi.yaml documents each).
func (s *Server) routes() []route {
	return []route{
		{"PUT /api/v2/clusters/{id}/advertisement", s.putAdvertisement, api.MaxBodyBytes},
		{"PUT /api/v2/clusters/{id}/heartbeat", s.putHeartbeat, api.MaxBodyBytes},
		{"GET /api/v2/clusters", s.gated(s.listClusters), api.MaxBodyBytes},
		{"GET /api/v2/clusters/{id}", s.getCluster, api.MaxBodyBytes},
		{"DELETE /api/v2/clusters/{id}", s.deleteCluster, api.MaxBodyBytes},
		{"POST /api/v2/reservations", s.postReservation, api.MaxBodyBytes},
		{"GET /api/v2/reservations", s.gated(s.listReservations), api.MaxBodyBytes},
		{"GET /api/v2/reservations/{id}", s.getReservation, api.MaxBodyBytes},
		{"DELETE /api/v2/reservations/{id}", s.deleteReservation, api.MaxBodyBytes},
		{"POST /api/v2/reservations/{id}/grant", s.postGrant, api.MaxBodyBytes},
		// A renewal carries up to api.MaxRenewBatch ids: a larger body bound.
		{"POST /api/v2/renewals", s.postRenewals, api.MaxRenewBodyBytes},
		// A provider names up to api.MaxQuietRequesters requesters.
		{"POST /api/v2/renewals/quiet", s.postQuietRequesters, api.MaxRenewBodyBytes},
		{"POST /api/v2/groups", s.postGroup, api.MaxBodyBytes},
		// A cluster's protected reservations: as many ids as a renewal.
		{"PUT /api/v2/protections", s.putProtections, api.MaxRenewBodyBytes},
		{eventsRoute, s.streamEvents, api.MaxBodyBytes},
		{"GET /api/v2/usage", s.gated(s.getUsage), api.MaxBodyBytes},

		{"POST /api/v1/advertisements", s.v1PostAdvertisement, api.MaxBodyBytes},
		{"GET /api/v1/advertisements/{clusterID}", s.v1GetAdvertisement, api.MaxBodyBytes},
		{"POST /api/v1/reservations", s.v1PostReservation, api.MaxBodyBytes},
		{"GET /api/v1/instructions", s.v1Instructions, api.MaxBodyBytes},
	}
}

// The routes served on both ports, to anyone.
const (
	healthzRoute = "GET /healthz"
	readyzRoute  = "GET /readyz"
	metricsRoute = "GET /metrics"
	openAPIRoute = "GET /openapi/v3" // broker/api/openapi.yaml, in JSON
)

var healthRoutes = []string{healthzRoute, readyzRoute, metricsRoute, openAPIRoute}

// Routes lists the patterns of every route the server registers (the API's
// and healthRoutes), as net/http's ServeMux takes them: "GET /api/v2/clusters/{id}".
func Routes() []string {
	var out []string
	for _, r := range (&Server{}).routes() {
		out = append(out, r.pattern)
	}
	return append(out, healthRoutes...)
}

// Handler returns the API routes, to be served over mutual TLS.
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	s.health(mux)
	for _, r := range s.routes() {
		mux.Handle(r.pattern, s.authenticated(r.pattern, r.maxBody, r.h))
	}
	if s.dashboard != nil {
		mux.Handle("/dashboard/", s.trusted(s.dashboard))
	}
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusNotFound, api.ReasonNotFound, "no route for "+r.Method+" "+r.URL.Path)
	})
	return mux
}

// HealthHandler serves /healthz, /readyz and /metrics in plain HTTP, for
// kubelet probes and Prometheus, which present no client certificate.
func (s *Server) HealthHandler() http.Handler {
	mux := http.NewServeMux()
	s.health(mux)
	return mux
}

func (s *Server) health(mux *http.ServeMux) {
	mux.HandleFunc(healthzRoute, func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain")
		_, _ = w.Write([]byte("ok"))
	})
	mux.HandleFunc(readyzRoute, func(w http.ResponseWriter, r *http.Request) {
		if s.draining.Load() {
			writeError(w, http.StatusServiceUnavailable, api.ReasonUnavailable, "shutting down")
			return
		}
		ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
		defer cancel()
		var err error
		for _, st := range s.stores() { // with cells, every cell's primary
			if err = st.Ready(ctx); errors.Is(err, store.ErrScriptsNotLoaded) {
				// After a Redis restart the script cache is empty: load again.
				if err = st.LoadScripts(ctx); err == nil {
					err = st.Ready(ctx)
				}
			}
			if err != nil {
				if s.cells != nil {
					err = fmt.Errorf("cell %s: %w", st.Config().Prefix, err)
				}
				break
			}
		}
		if err != nil {
			writeError(w, http.StatusServiceUnavailable, api.ReasonUnavailable, "redis: "+err.Error())
			return
		}
		// Ready, and how far Redis is from maxmemory (a warning near it: see
		// redisNearFull).
		w.Header().Set("Content-Type", "text/plain")
		_, _ = w.Write([]byte("ok\n" + s.memory.describe(ctx) + "\n"))
	})
	mux.Handle(metricsRoute, promhttp.HandlerFor(s.metrics.registry, promhttp.HandlerOpts{ErrorHandling: promhttp.ContinueOnError}))
	mux.HandleFunc(openAPIRoute, func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(api.OpenAPI())
	})
}

// authenticated resolves the caller's identity from its client certificate,
// bounds the body to maxBody bytes, and counts the request.
func (s *Server) authenticated(route string, maxBody int64, h func(http.ResponseWriter, *http.Request, string)) http.Handler {
	requests := s.metrics.route(route, route == eventsRoute)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		rec := recorders.Get().(*statusRecorder)
		rec.ResponseWriter, rec.code = w, http.StatusOK
		defer func() {
			requests.done(rec.code, start)
			rec.ResponseWriter = nil // the handler has returned: nothing holds rec any more
			recorders.Put(rec)
		}()
		if r.TLS == nil || len(r.TLS.PeerCertificates) == 0 {
			writeError(rec, http.StatusUnauthorized, api.ReasonForbidden, "a client certificate is required")
			return
		}
		cn := r.TLS.PeerCertificates[0].Subject.CommonName
		if cn == "" {
			writeError(rec, http.StatusForbidden, api.ReasonForbidden, "client certificate has an empty common name")
			return
		}
		if s.dashboard != nil && s.dashboard.IsOperator(cn) {
			writeError(rec, http.StatusForbidden, api.ReasonForbidden, "client certificate "+cn+" is an operator's: it reads the dashboard (/dashboard/), it is no member of the federation")
			return
		}
		if err := validIdentities.check(cn); err != nil {
			writeError(rec, http.StatusForbidden, api.ReasonForbidden, "client certificate: "+err.Error())
			return
		}
		if s.certs != nil && !s.certs.trusts(r) {
			rec.Header().Set("Connection", "close") // its next connection is verified at the handshake
			writeError(rec, http.StatusUnauthorized, api.ReasonForbidden, errNoLongerTrusted)
			return
		}
		r.Body = http.MaxBytesReader(rec, r.Body, maxBody)
		h(rec, r, cn)
	})
}

// trusted serves h only on connections whose client certificate's CA the
// broker still trusts (h judges the certificate itself).
func (s *Server) trusted(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if s.certs != nil && r.TLS != nil && !s.certs.trusts(r) {
			w.Header().Set("Connection", "close")
			writeError(w, http.StatusUnauthorized, api.ReasonForbidden, errNoLongerTrusted)
			return
		}
		h.ServeHTTP(w, r)
	})
}

// errNoLongerTrusted answers a connection made with a client certificate of
// a CA that the broker no longer trusts.
const errNoLongerTrusted = "the client certificate is no longer trusted: the broker's client CAs changed since this connection was made"

// identityCache remembers the common names that passed api.ValidateClusterID
// (regular expressions, about 1-2 % of a request's CPU when run every time).
// Only CA-signed certificates get this far, so the names are few; the cache
// still stops growing at maxIdentities, after which names are checked each time.
type identityCache struct {
	valid sync.Map // common name -> struct{}
	n     atomic.Int64
}

const maxIdentities = 10_000

var validIdentities identityCache

func (c *identityCache) check(cn string) error {
	if _, ok := c.valid.Load(cn); ok {
		return nil
	}
	if err := api.ValidateClusterID(cn); err != nil {
		return err
	}
	if c.n.Load() < maxIdentities {
		if _, loaded := c.valid.LoadOrStore(cn, struct{}{}); !loaded {
			c.n.Add(1)
		}
	}
	return nil
}

// statusRecorder remembers the status code; it forwards Flush and Unwrap so
// streaming and http.ResponseController keep working.
type statusRecorder struct {
	http.ResponseWriter
	code int
}

// recorders recycles the statusRecorders of finished requests.
var recorders = sync.Pool{New: func() any { return new(statusRecorder) }}

func (r *statusRecorder) WriteHeader(code int) {
	r.code = code
	r.ResponseWriter.WriteHeader(code)
}

func (r *statusRecorder) Flush() {
	if f, ok := r.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

func (r *statusRecorder) Unwrap() http.ResponseWriter { return r.ResponseWriter }

// jsonBuffer is a buffer with its encoder, recycled through jsonBuffers.
type jsonBuffer struct {
	buf bytes.Buffer
	enc *json.Encoder
}

var jsonBuffers = sync.Pool{New: func() any {
	b := new(jsonBuffer)
	b.enc = json.NewEncoder(&b.buf)
	return b
}}

// Header values shared by every answer (net/http only reads them).
var contentTypeJSON = []string{"application/json"}

// jsonAppender is an answer that writes its own JSON (api.RenewResponse).
type jsonAppender interface{ AppendJSON([]byte) []byte }

// writeJSON answers v as JSON (with a trailing newline, as json.Encoder
// writes it), in one Write with its Content-Length.
func writeJSON(w http.ResponseWriter, code int, v any) {
	b := jsonBuffers.Get().(*jsonBuffer)
	defer func() {
		if b.buf.Cap() <= 64<<10 { // keep the pool from holding on to large list answers
			jsonBuffers.Put(b)
		}
	}()
	b.buf.Reset()
	if a, ok := v.(jsonAppender); ok {
		b.buf.Write(a.AppendJSON(b.buf.AvailableBuffer()))
		b.buf.WriteByte('\n')
	} else if err := b.enc.Encode(v); err != nil {
		b.buf.Reset()
		code = http.StatusInternalServerError
		_ = b.enc.Encode(api.Error{Error: "encode answer: " + err.Error(), Reason: api.ReasonInternal})
	}
	h := w.Header()
	h["Content-Type"] = contentTypeJSON
	h["Content-Length"] = []string{strconv.Itoa(b.buf.Len())}
	w.WriteHeader(code)
	_, _ = w.Write(b.buf.Bytes())
}

func writeError(w http.ResponseWriter, code int, reason, msg string) {
	writeJSON(w, code, api.Error{Error: msg, Reason: reason})
}

// decodeValid decodes the request's body into a T and validates it; false:
// it answered 400 with why.
func decodeValid[T any, PT interface {
	*T
	Validate() error
}](w http.ResponseWriter, r *http.Request) (T, bool) {
	var v T
	if err := api.Decode(r.Body, &v); err != nil {
		writeDecodeError(w, err)
		return v, false
	}
	if err := PT(&v).Validate(); err != nil {
		writeDecodeError(w, err)
		return v, false
	}
	return v, true
}

// writeDecodeError answers a body that failed api.Decode or validation.
func writeDecodeError(w http.ResponseWriter, err error) {
	var tooBig *http.MaxBytesError
	if errors.As(err, &tooBig) {
		writeError(w, http.StatusRequestEntityTooLarge, api.ReasonTooLarge,
			"request body exceeds "+strconv.FormatInt(tooBig.Limit, 10)+" bytes")
		return
	}
	writeError(w, http.StatusBadRequest, api.ReasonBadRequest, err.Error())
}

// writeStoreError answers a failed store call.
func (s *Server) writeStoreError(w http.ResponseWriter, script string, err error) {
	if writeFairShareError(w, err) {
		return
	}
	switch {
	case errors.Is(err, store.ErrNotFound):
		writeError(w, http.StatusNotFound, api.ReasonNotFound, err.Error())
	case errors.Is(err, store.ErrForbidden):
		writeError(w, http.StatusForbidden, api.ReasonForbidden, err.Error())
	case errors.Is(err, store.ErrConflict):
		writeError(w, http.StatusConflict, api.ReasonConflict, err.Error())
	case errors.Is(err, store.ErrNotReplicated):
		// Not acknowledged: a failover now could lose it. The request is
		// idempotent, so the client retries it as it is.
		if script != "" {
			s.metrics.scriptErrors.WithLabelValues(script).Inc()
		}
		s.log.Info("Redis replicas did not acknowledge a write in time", "script", script, "err", err)
		w.Header().Set("Retry-After", strconv.Itoa(int(store.NotReplicatedRetryAfter.Seconds())))
		writeError(w, http.StatusServiceUnavailable, api.ReasonUnavailable, "broker state not replicated, retry: "+err.Error())
	default:
		if script != "" {
			s.metrics.scriptErrors.WithLabelValues(script).Inc() // failures only: not worth a cache
		}
		s.log.Error(err, "redis call failed", "script", script)
		writeError(w, http.StatusServiceUnavailable, api.ReasonUnavailable, "broker state unavailable, retry: "+err.Error())
	}
}
