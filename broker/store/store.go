// Package store is the broker's state in Redis: every mutation is one Lua
// script from broker/scripts, run atomically, so any number of broker replicas
// can share one Redis without coordination.
package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fluidos-project/resource-broker/broker/model"
	"github.com/fluidos-project/resource-broker/broker/scripts"
)

// DefaultPrefix is the prefix of every key; the hash tag keeps all keys in one
// Redis Cluster slot so multi-key scripts run there too.
const DefaultPrefix = "rb:{b}:"

// Defaults of Config.
const (
	DefaultWaitTTL        = 5 * time.Second
	DefaultRetention      = 10 * time.Minute
	DefaultAuditRetention = time.Hour
	DefaultAuditMaxLen    = 10000
	DefaultEventsMaxLen   = 10000
	DefaultEventsTTL      = time.Hour
	DefaultOutageGap      = 5 * time.Second
)

// DefaultMaxEndedPerMember is Config.MaxEndedPerMember's default: it keeps a
// member's ended reservations to about 6.5 MB of Redis (about 1.3 KB each),
// where its default reserve rate (policy.Default: 100 a second) over the
// default retention would keep 60,000 (80 MB).
const DefaultMaxEndedPerMember = 5000

// Config tunes the store. Zero values take the defaults.
type Config struct {
	Prefix          string
	WeightResources float64       // default 0.7
	WeightCost      float64       // default 0.3
	StaleThreshold  time.Duration // default 60s
	// Retention is how long an ended reservation stays readable (its
	// requester's agent reads how it ended), then it is removed; default
	// 10m.
	Retention time.Duration
	// MaxEndedPerMember bounds the ended reservations kept of one requester
	// (scripts/lib/ended.lua): beyond it its oldest are removed before their
	// retention, so that what a member's ended reservations hold in Redis
	// counts against that member alone; default DefaultMaxEndedPerMember.
	MaxEndedPerMember int
	// EventsMaxLen bounds each cluster's event stream (entries, about);
	// default 10000. EventsTTL removes a stream to which nothing was added
	// for that long (a cluster gone); default 1h.
	EventsMaxLen int64
	EventsTTL    time.Duration
	// AuditMaxLen bounds the audit stream (entries, about); default 10000.
	// AuditRetention trims the entries older than that (at each expiry
	// run); default 1h.
	AuditMaxLen    int64
	AuditRetention time.Duration
	TopCandidates  int // candidates reported per decision; default 3
	ExpireBatch    int // reservations ended per expire call; default 500
	// OutageGap is how long without an expire run of any replica counts as
	// a broker outage, whose time does not count against leases
	// (scripts/lib/clock.lua last_outage); default 5s. It must exceed the expiry
	// interval of the replicas (1s by default): a shorter gap only gives
	// leases more time than they need.
	OutageGap time.Duration
	// WaitTTL is how long a request nothing fits stays on the waiting list
	// without a retry of the same id from its requester (each retry renews
	// it); default 5s, so that the place of a requester that is gone is
	// freed within seconds. It must exceed the longest interval between a
	// live agent's retries of a refused request: the v2 agent retries one
	// at least every 2s (agent/reservation DefaultWaitingRetry), and at once
	// on CapacityAvailable. Negative: no waiting list, no priority order.
	WaitTTL time.Duration
	// ReserveBatch is the most requests one reserve.lua call decides (the
	// requests that queued while earlier calls were in flight); default 64.
	// 1 sends every request alone.
	ReserveBatch int
	// ReserveInFlight is how many reserve.lua calls one store keeps in
	// flight at once; default 2 (Redis runs one while the other's reply is
	// read and the next batch forms).
	ReserveInFlight int
	// Policy holds the operator's per-requester limits and the bounds of
	// what a provider may advertise (broker/policy); nil: none.
	Policy Policy
	// MaxOwnerShare, in (0, 1], is the broker's spread policy: a provider
	// should hold at most max(1, ceil(share × replicas)) of one spread
	// group's live reservations (a preference, ScheduleAnyway-like; see
	// scripts/reserve_group.lua). 0: no policy.
	MaxOwnerShare float64
	// GrantKeys seal the grants in Redis; nil: a key of this process only
	// (RandomGrantKeys), which does for one broker, never for replicas.
	GrantKeys *GrantKeys
	// Replicas is how many Redis replicas must hold a script's writes
	// before its reply is used (replicate.go); 0: none, for a Redis without
	// replicas. ReplicaTimeout bounds that wait; default
	// DefaultReplicaTimeout.
	Replicas       int
	ReplicaTimeout time.Duration
}

func (c *Config) defaults() {
	if c.Prefix == "" {
		c.Prefix = DefaultPrefix
	}
	if c.WeightResources == 0 && c.WeightCost == 0 {
		c.WeightResources, c.WeightCost = 0.7, 0.3
	}
	if c.StaleThreshold == 0 {
		c.StaleThreshold = time.Minute
	}
	if c.OutageGap == 0 {
		c.OutageGap = DefaultOutageGap
	}
	if c.Retention == 0 {
		c.Retention = DefaultRetention
	}
	if c.MaxEndedPerMember <= 0 {
		c.MaxEndedPerMember = DefaultMaxEndedPerMember
	}
	if c.EventsMaxLen == 0 {
		c.EventsMaxLen = DefaultEventsMaxLen
	}
	if c.EventsTTL == 0 {
		c.EventsTTL = DefaultEventsTTL
	}
	if c.AuditMaxLen == 0 {
		c.AuditMaxLen = DefaultAuditMaxLen
	}
	if c.AuditRetention == 0 {
		c.AuditRetention = DefaultAuditRetention
	}
	if c.GrantKeys == nil {
		c.GrantKeys = RandomGrantKeys()
	}
	if c.TopCandidates == 0 {
		c.TopCandidates = 3
	}
	if c.ExpireBatch == 0 {
		c.ExpireBatch = 500
	}
	if c.WaitTTL == 0 {
		c.WaitTTL = DefaultWaitTTL
	}
	if c.ReserveBatch <= 0 {
		c.ReserveBatch = 64
	}
	if c.ReserveInFlight <= 0 {
		c.ReserveInFlight = 2
	}
	if c.ReplicaTimeout <= 0 {
		c.ReplicaTimeout = DefaultReplicaTimeout
	}
}

// Store reads and changes the broker state in Redis.
type Store struct {
	rdb     redis.UniversalClient
	cfg     Config
	reserve *reserveBatcher
	// decide is the script that decides reservations: scripts.Reserve, or
	// in tests the full-scan reference it is checked against.
	decide *redis.Script
}

// New returns a store over rdb.
func New(rdb redis.UniversalClient, cfg Config) *Store {
	cfg.defaults()
	s := &Store{rdb: rdb, cfg: cfg, decide: scripts.Reserve}
	s.reserve = &reserveBatcher{maxBatch: cfg.ReserveBatch, maxInFlight: cfg.ReserveInFlight, send: s.sendReserves}
	return s
}

// Client returns the Redis client the store uses.
func (s *Store) Client() redis.UniversalClient { return s.rdb }

// Config returns the effective configuration.
func (s *Store) Config() Config { return s.cfg }

// Key returns a full key name, e.g. Key("cluster:", "rome").
func (s *Store) Key(parts ...string) string {
	k := s.cfg.Prefix
	for _, p := range parts {
		k += p
	}
	return k
}

// LoadScripts loads every script into Redis' script cache, and builds the
// candidate index if this Redis does not hold one yet (written by an older
// broker).
func (s *Store) LoadScripts(ctx context.Context) error {
	for name, sc := range scripts.All {
		if err := sc.Load(ctx, s.rdb).Err(); err != nil {
			return fmt.Errorf("load script %s: %w", name, err)
		}
	}
	_, err := s.rebuildIndex(ctx, false)
	return err
}

// RebuildIndex rebuilds the candidate index from the cluster hashes and
// returns how many live clusters it indexed.
func (s *Store) RebuildIndex(ctx context.Context) (int64, error) {
	return s.rebuildIndex(ctx, true)
}

func (s *Store) rebuildIndex(ctx context.Context, force bool) (int64, error) {
	mode := ""
	if force {
		mode = "force"
	}
	n, err := scripts.Reindex.Run(ctx, s.rdb, []string{s.cfg.Prefix}, s.cfg.StaleThreshold.Milliseconds(), mode).Int64()
	if err != nil {
		return 0, fmt.Errorf("build the candidate index: %w", err)
	}
	return n, nil
}

// ErrScriptsNotLoaded is Ready's error when Redis lost its script cache (it
// restarted, or failed over): LoadScripts loads them again.
var ErrScriptsNotLoaded = errors.New("scripts not loaded")

// readyProbeTTL bounds the life of the key Ready writes.
const readyProbeTTL = time.Minute

// Ready checks that Redis answers, holds every script and takes writes: a
// Redis at maxmemory (OOM), a read-only replica or one that lost its disk
// (MISCONF) answers reads and refuses every reservation, so a broker in
// front of it must not be ready. The probe writes one short-lived key,
// readyz.
func (s *Store) Ready(ctx context.Context) error {
	shas := make([]string, 0, len(scripts.All))
	for _, sc := range scripts.All {
		shas = append(shas, sc.Hash())
	}
	loaded, err := s.rdb.ScriptExists(ctx, shas...).Result()
	if err != nil {
		return err
	}
	for i, ok := range loaded {
		if !ok {
			return fmt.Errorf("%w: %s", ErrScriptsNotLoaded, shas[i])
		}
	}
	if err := s.rdb.Set(ctx, s.Key("readyz"), "1", readyProbeTTL).Err(); err != nil {
		return fmt.Errorf("redis refuses writes: %w", err)
	}
	return nil
}

func (s *Store) run(ctx context.Context, sc *redis.Script, args ...any) ([]any, error) {
	v, err := s.eval(ctx, sc, args...)
	if err != nil {
		return nil, err
	}
	reply, ok := v.([]any)
	if !ok {
		return nil, fmt.Errorf("unexpected script reply %T", v)
	}
	return reply, nil
}

// Advertise stores a cluster's advertisement and marks it live. An
// advertisement that contradicts itself is refused (ErrInvalid), one outside
// the operator's bounds too (*BoundError): nothing is stored.
func (s *Store) Advertise(ctx context.Context, id string, ad model.Advertisement) (model.Ack, error) {
	if err := ad.Validate(); err != nil {
		return model.Ack{}, err
	}
	if s.cfg.Policy != nil {
		if err := s.cfg.Policy.CheckAdvertisement(id, ad); err != nil {
			return model.Ack{}, err
		}
	}
	labels := "{}"
	if len(ad.Labels) > 0 {
		b, err := json.Marshal(ad.Labels)
		if err != nil {
			return model.Ack{}, err
		}
		labels = string(b)
	}
	args := make([]any, 0, 40+9*len(ad.Nodes)+len(ad.ReservationsOnNodes))
	args = append(args, id, s.cfg.EventsMaxLen, s.cfg.EventsTTL.Milliseconds(), len(ad.Nodes))
	for _, n := range ad.Nodes {
		a, u := n.Allocatable, n.Allocated
		args = append(args, n.Name, a.CPU, a.Memory, a.GPU, a.Storage, u.CPU, u.Memory, u.GPU, u.Storage)
	}
	args = append(args, len(ad.ReservationsOnNodes))
	for _, rid := range ad.ReservationsOnNodes {
		args = append(args, rid)
	}
	args = append(args,
		"name", ad.Name, "endpoint", ad.Endpoint, "labels", labels,
		"price_cpu", ad.Prices.CPU, "price_mem", ad.Prices.Memory, "price_gpu", ad.Prices.GPU,
		"currency", ad.Prices.Currency,
	)
	args = appendResources(args, "cap_", ad.Capacity)
	args = appendResources(args, "alloc_", ad.Allocatable)
	args = appendResources(args, "used_", ad.Allocated)
	reply, err := s.run(ctx, scripts.Advertise, args...)
	if err != nil {
		return model.Ack{}, err
	}
	f := toStrings(reply[:5])
	debits, _ := reply[5].([]any)
	nodes := withNodes(model.Cluster{}, nil, flatMap(toStrings(debits)))
	return model.Ack{
		SeenAt:        msTime(atoi(f[0])),
		Reserved:      model.Resources{CPU: atoi(f[1]), Memory: atoi(f[2]), GPU: atoi(f[3]), Storage: atoi(f[4])},
		NodesReserved: nodes.NodesReserved,
	}, nil
}

func appendResources(args []any, prefix string, r model.Resources) []any {
	return append(args, prefix+"cpu", r.CPU, prefix+"mem", r.Memory, prefix+"gpu", r.GPU, prefix+"sto", r.Storage)
}

// Reserve decides a request: it returns the decision, or a *NoFitError, or
// ErrConflict when the id belongs to another requester, or a *LimitError
// when its requester's limits refuse it. Concurrent requests are decided in
// batches (Config.ReserveBatch), each exactly as if alone. With a
// Config.Policy, the requester's limits are the policy's.
func (s *Store) Reserve(ctx context.Context, req model.ReserveRequest) (model.Decision, error) {
	if sp := req.Spread; sp != nil && (sp.TopologyKey != "" || s.cfg.MaxOwnerShare > 0) {
		if s.cfg.Policy != nil {
			req.Limits = s.cfg.Policy.Limits(req.Requester)
		}
		return s.reserveSpread(ctx, req)
	}
	p, err := newPendingReserve(ctx, s.withLimits(req))
	if err != nil {
		return model.Decision{}, err
	}
	d, err := s.reserve.do(ctx, p)
	var nf *NoFitError
	if req.Preempt && errors.As(err, &nf) && nf.Rejected["waiting_higher_priority"] == 0 {
		return s.preemptFor(ctx, req, nf)
	}
	return d, err
}

// preemptFor runs Preempt for a request reserve.lua refused (nf): the
// decision, or the refusal, saying why nothing was preempted.
func (s *Store) preemptFor(ctx context.Context, req model.ReserveRequest, nf *NoFitError) (model.Decision, error) {
	pd, err := s.Preempt(ctx, req)
	var pnf *NoFitError
	switch {
	case err == nil:
		return model.Decision{Reservation: pd.Reservation, Replayed: pd.Replayed, Victims: pd.Victims}, nil
	case errors.Is(err, ErrFitsWithoutPreemption): // capacity came back meanwhile
		p, err := newPendingReserve(ctx, s.withLimits(req))
		if err != nil {
			return model.Decision{}, err
		}
		return s.reserve.do(ctx, p)
	case errors.Is(err, ErrCapacityComing):
		nf.Rejected["capacity_being_released"] = 1
		return model.Decision{}, nf
	case errors.As(err, &pnf):
		for k, n := range pnf.Rejected {
			nf.Rejected[k] = n
		}
		return model.Decision{}, nf
	}
	return model.Decision{}, err
}

// withLimits sets req's limits from the policy, if any.
func (s *Store) withLimits(req model.ReserveRequest) model.ReserveRequest {
	if s.cfg.Policy != nil {
		req.Limits = s.cfg.Policy.Limits(req.Requester)
	}
	return req
}

func newPendingReserve(ctx context.Context, req model.ReserveRequest) (*pendingReserve, error) {
	arg, err := encodeReserveArg(req)
	if err != nil {
		return nil, err
	}
	return &pendingReserve{ctx: ctx, req: req, done: make(chan reserveResult, 1), arg: arg}, nil
}

// reserveArg is one request as reserve.lua reads it, one JSON object per
// request (its header documents the fields). The amounts, times and the
// priority travel as decimal strings: the script stores and compares them
// as the reservation hash keeps them, with no float formatting between.
type reserveArg struct {
	ID        string        `json:"id"`
	Requester string        `json:"requester"`
	CPU       int64         `json:"cpu,string"`
	Memory    int64         `json:"mem,string"`
	GPU       int64         `json:"gpu,string"`
	Storage   int64         `json:"sto,string"`
	Duration  int64         `json:"duration,string"`
	Lease     int64         `json:"lease,string"`
	Priority  int32         `json:"priority,string"`
	Selector  string        `json:"selector"`
	Owner     string        `json:"owner"`
	Wait      bool          `json:"wait"`
	Limits    reserveLimits `json:"limits"`
}

// reserveLimits are a request's limits in reserveArg and groupArg (absent:
// no limit).
type reserveLimits struct {
	Reservations *int64  `json:"n,omitempty"`
	CPU          *int64  `json:"cpu,omitempty"`
	Memory       *int64  `json:"mem,omitempty"`
	GPU          *int64  `json:"gpu,omitempty"`
	Priority     *int32  `json:"priority,omitempty"`
	Rate         float64 `json:"rate,omitempty"`
	Burst        int     `json:"burst,omitempty"`
}

// limitsArg encodes l for the scripts.
func limitsArg(l model.Limits) reserveLimits {
	lim := reserveLimits{Reservations: l.Reservations, CPU: l.CPU, Memory: l.Memory, GPU: l.GPU, Priority: l.Priority}
	if l.Rate > 0 {
		lim.Rate, lim.Burst = l.Rate, max(l.Burst, 1)
	}
	return lim
}

func encodeReserveArg(req model.ReserveRequest) (string, error) {
	selector, err := selectorArg(req.Selector)
	if err != nil {
		return "", err
	}
	b, err := json.Marshal(reserveArg{
		ID: req.ID, Requester: req.Requester,
		CPU: req.Resources.CPU, Memory: req.Resources.Memory, GPU: req.Resources.GPU, Storage: req.Resources.Storage,
		Duration: req.Duration.Milliseconds(), Lease: req.Lease.Milliseconds(), Priority: req.Priority,
		Selector: selector, Owner: req.Owner, Wait: !req.NoWait, Limits: limitsArg(req.Limits),
	})
	return string(b), err
}

// sendReserves decides a batch in one reserve.lua call and hands each
// request its result.
func (s *Store) sendReserves(ctx context.Context, batch []*pendingReserve) {
	args := make([]any, 0, 8+len(batch))
	args = append(args, s.cfg.StaleThreshold.Milliseconds(), s.cfg.WeightResources, s.cfg.WeightCost,
		s.cfg.TopCandidates, s.cfg.EventsMaxLen, s.cfg.AuditMaxLen,
		max(s.cfg.WaitTTL.Milliseconds(), 0), s.cfg.EventsTTL.Milliseconds())
	for _, p := range batch {
		args = append(args, p.arg)
	}
	replies, err := s.run(ctx, s.decide, args...)
	if err == nil && len(replies) != len(batch) {
		err = fmt.Errorf("reserve: %d replies for %d requests", len(replies), len(batch))
	}
	for i, p := range batch {
		if err != nil {
			p.done <- reserveResult{err: err}
			continue
		}
		reply, ok := replies[i].([]any)
		if !ok || len(reply) != 5 {
			p.done <- reserveResult{err: fmt.Errorf("unexpected reserve reply %v", replies[i])}
			continue
		}
		d, err := s.parseReserveReply(p.req, reply)
		p.done <- reserveResult{decision: d, err: err}
	}
}

// parseReserveReply reads one request's {outcome, reservation, candidates, rejections, now_ms}.
func (s *Store) parseReserveReply(req model.ReserveRequest, reply []any) (model.Decision, error) {
	id := req.ID
	outcome, _ := reply[0].(string)
	switch outcome {
	case "reserved", "replay":
		flat, _ := reply[1].([]any)
		now, _ := reply[4].(int64)
		r, err := s.readReservation(id, flatMap(toStrings(flat)), now)
		return model.Decision{Reservation: r, Replayed: outcome == "replay"}, err
	case "conflict":
		return model.Decision{}, ErrConflict
	case "limited":
		msg, _ := reply[3].(string)
		return model.Decision{}, limitError(req.Requester, msg)
	case "error":
		msg, _ := reply[3].(string)
		return model.Decision{}, fmt.Errorf("reserve %s: %s", id, msg)
	case "nofit":
		nf := &NoFitError{}
		rejected, _ := reply[3].(string)
		if err := json.Unmarshal([]byte(rejected), &nf.Rejected); err != nil {
			return model.Decision{}, fmt.Errorf("decode rejections: %w", err)
		}
		return model.Decision{}, nf
	}
	return model.Decision{}, fmt.Errorf("unexpected reserve outcome %q", outcome)
}

// ReleaseResult tells what Release did.
type ReleaseResult struct {
	Reservation model.Reservation
	Released    bool // false: it had already ended, nothing changed
	Clamped     bool // a counter went below zero and was clamped: an invariant was broken before
}

// Release ends a live reservation, requester's id, on behalf of caller (its
// requester or provider).
func (s *Store) Release(ctx context.Context, requester, id, caller string) (ReleaseResult, error) {
	reply, err := s.run(ctx, scripts.Release, requester, id, caller, s.cfg.EventsMaxLen, s.cfg.EventsTTL.Milliseconds(),
		s.cfg.Retention.Milliseconds(), s.cfg.MaxEndedPerMember)
	if err != nil {
		return ReleaseResult{}, err
	}
	switch reply[0].(string) {
	case "notfound":
		return ReleaseResult{}, ErrNotFound
	case "forbidden":
		return ReleaseResult{}, ErrForbidden
	}
	now, _ := reply[3].(int64)
	r, err := s.readReservation(id, flatMap(toStrings(reply[1].([]any))), now)
	return ReleaseResult{Reservation: r, Released: reply[0] == "released", Clamped: reply[2] == int64(1)}, err
}

// Grant attaches the provider's access grant to a live reservation,
// requester's id (Active); caller must be its provider. The grant is sealed
// (Config.GrantKeys) before it reaches Redis.
func (s *Store) Grant(ctx context.Context, requester, id, caller string, grant json.RawMessage) (model.Reservation, error) {
	sealed := s.cfg.GrantKeys.seal(model.QualifiedID(requester, id), grant)
	reply, err := s.run(ctx, scripts.Grant, requester, id, caller, sealed, s.cfg.EventsMaxLen, s.cfg.EventsTTL.Milliseconds())
	if err != nil {
		return model.Reservation{}, err
	}
	switch reply[0].(string) {
	case "notfound":
		return model.Reservation{}, ErrNotFound
	case "forbidden":
		return model.Reservation{}, ErrForbidden
	}
	now, _ := reply[2].(int64)
	r, err := s.readReservation(id, flatMap(toStrings(reply[1].([]any))), now)
	if err == nil && reply[0] == "ended" {
		err = fmt.Errorf("reservation %s is %s", id, r.Phase)
	}
	return r, err
}

// Expire ends every reservation past its expiry; it returns how many ended
// and how many needed a counter clamped. It also sweeps the waiting list of
// the requests whose wait expired and trims the audit stream to
// Config.AuditRetention.
func (s *Store) Expire(ctx context.Context) (expired, clamped int64, err error) {
	res, err := s.ExpireRun(ctx)
	return res.Expired, res.Clamped, err
}

// ExpireResult is what one ExpireRun did.
type ExpireResult struct {
	Expired, Clamped int64
	// Credited counts the due leases given more time for a broker outage
	// instead of ending (scripts/lib/clock.lua last_outage).
	Credited int64
	// Outage is the broker outage this run found (no expire run of any
	// replica for longer than Config.OutageGap); zero: none.
	Outage time.Duration
}

// ExpireRun is Expire with everything the run found.
func (s *Store) ExpireRun(ctx context.Context) (ExpireResult, error) {
	var res ExpireResult
	for {
		reply, err := s.run(ctx, scripts.Expire, s.cfg.ExpireBatch, s.cfg.EventsMaxLen, s.cfg.EventsTTL.Milliseconds(),
			s.cfg.Retention.Milliseconds(), s.cfg.AuditRetention.Milliseconds(), s.cfg.OutageGap.Milliseconds(), s.cfg.MaxEndedPerMember)
		if err != nil {
			return res, err
		}
		n, c, credited := reply[0].(int64), reply[1].(int64), reply[3].(int64)
		res.Expired += n
		res.Clamped += c
		res.Credited += credited
		if o := reply[4].(int64); o > 0 {
			res.Outage = time.Duration(o) * time.Millisecond
		}
		// A full batch may leave due reservations for the next call; the
		// waiting members left (at most a batch per call) go at the next run.
		if n+credited < int64(s.cfg.ExpireBatch) {
			return res, nil
		}
	}
}

// Usage returns what each requester holding live reservations holds (the
// figures its limits are checked against).
func (s *Store) Usage(ctx context.Context) (map[string]model.Usage, error) {
	m, err := s.rdb.HGetAll(ctx, s.Key("usage")).Result()
	if err != nil {
		return nil, err
	}
	out := make(map[string]model.Usage, len(m))
	for requester, v := range m {
		a := amountsOf(v)
		out[requester] = model.Usage{Reservations: atoi(a["n"]), Resources: resourcesFrom(a, "")}
	}
	return out, nil
}

// EndedReservations returns how many ended reservations each requester has
// kept (readable until the retention, at most Config.MaxEndedPerMember;
// scripts/lib/ended.lua); a requester with none is absent.
func (s *Store) EndedReservations(ctx context.Context) (map[string]int64, error) {
	now, err := s.rdb.Time(ctx).Result()
	if err != nil {
		return nil, err
	}
	// Past the edge, a record has expired; expire.lua trims what is older.
	edge := "(" + strconv.FormatInt(now.Add(-s.cfg.Retention).UnixMilli(), 10)
	requesters, err := s.rdb.ZRangeByScore(ctx, s.Key("ended-requesters"), &redis.ZRangeBy{Min: edge, Max: "+inf"}).Result()
	if err != nil {
		return nil, err
	}
	pipe := s.rdb.Pipeline()
	counts := make([]*redis.IntCmd, len(requesters))
	for i, r := range requesters {
		counts[i] = pipe.ZCount(ctx, s.Key("ended:", r), edge, "+inf")
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return nil, err
	}
	out := make(map[string]int64, len(requesters))
	for i, r := range requesters {
		if n := counts[i].Val(); n > 0 {
			out[r] = n
		}
	}
	return out, nil
}

// MemberUsage is what one member holds as a requester: its live reservations
// (Usage), the ended ones kept (Ended) and its limits (Config.Policy's; none
// without a policy).
type MemberUsage struct {
	Cluster string
	Usage   model.Usage
	Ended   int64
	Limits  model.Limits
}

// MemberUsages lists what each member holds as a requester, in id order:
// the members holding live or ended reservations, those with limits of
// their own and every advertised cluster (GET /api/v2/usage, the
// dashboard's usage page).
func (s *Store) MemberUsages(ctx context.Context) ([]MemberUsage, error) {
	usage, err := s.Usage(ctx)
	if err != nil {
		return nil, err
	}
	ended, err := s.EndedReservations(ctx)
	if err != nil {
		return nil, err
	}
	ids, err := s.ClusterIDs(ctx)
	if err != nil {
		return nil, err
	}
	if s.cfg.Policy != nil {
		ids = append(ids, s.cfg.Policy.Clusters()...)
	}
	for id := range usage {
		ids = append(ids, id)
	}
	for id := range ended {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	ids = slices.Compact(ids)
	out := make([]MemberUsage, 0, len(ids))
	for _, id := range ids {
		m := MemberUsage{Cluster: id, Usage: usage[id], Ended: ended[id]}
		if s.cfg.Policy != nil {
			m.Limits = s.cfg.Policy.Limits(id)
		}
		out = append(out, m)
	}
	return out, nil
}

// Renew extends leases of requester (ids as it chose them) in one atomic
// call on the Redis clock; it returns one Renewal per id, in order. A
// refused id (not found, ended, not a lease) changed nothing.
func (s *Store) Renew(ctx context.Context, requester string, ids []string) ([]model.Renewal, error) {
	return s.renew(ctx, requester, "", ids)
}

// RenewFor is Renew by provider on requester's behalf: only the
// reservations of requester placed on provider are renewed, any other id is
// RenewNotFound. A provider that still hears a requester (scripts/renew.lua)
// keeps its leases while the requester cannot reach the broker.
func (s *Store) RenewFor(ctx context.Context, provider, requester string, ids []string) ([]model.Renewal, error) {
	if provider == "" {
		return nil, errors.New("renew: a provider renewing for a requester must be named")
	}
	return s.renew(ctx, requester, provider, ids)
}

func (s *Store) renew(ctx context.Context, requester, provider string, ids []string) ([]model.Renewal, error) {
	out := make([]model.Renewal, 0, len(ids))
	for chunk := range slices.Chunk(ids, renewChunk) {
		args := make([]any, 0, 2+len(chunk))
		args = append(args, requester, provider)
		for _, id := range chunk {
			args = append(args, id)
		}
		reply, err := s.run(ctx, scripts.Renew, args...)
		if err != nil {
			return nil, err
		}
		if len(reply) != 1+2*len(chunk) {
			return nil, fmt.Errorf("renew: %d reply values for %d ids", len(reply), len(chunk))
		}
		for i, id := range chunk {
			outcome, _ := reply[1+2*i].(string)
			ms, _ := reply[2+2*i].(int64)
			out = append(out, model.Renewal{ID: id, Outcome: model.RenewOutcome(outcome), Remaining: time.Duration(ms) * time.Millisecond})
		}
	}
	return out, nil
}

// renewChunk bounds the ids of one renew script call. Each id is renewed on
// its own, so a batch needs no single atomic step; and Redis runs one script
// at a time: 5,000 ids in one call would hold every other member's reserve
// for milliseconds, 100 ids a call lets them in between.
const renewChunk = 100

// Reservation reads reservation id of requester (ids are scoped per requester).
func (s *Store) Reservation(ctx context.Context, requester, id string) (model.Reservation, error) {
	rs, err := s.reservations(ctx, []string{model.QualifiedID(requester, id)})
	if err != nil {
		return model.Reservation{}, err
	}
	if len(rs) == 0 {
		return model.Reservation{}, ErrNotFound
	}
	return rs[0], nil
}

// LiveReservations returns the live reservations whose target (role "by-target")
// or requester (role "by-requester") is cluster.
func (s *Store) LiveReservations(ctx context.Context, role, cluster string) ([]model.Reservation, error) {
	qids, err := s.rdb.SMembers(ctx, s.Key(role, ":", cluster)).Result()
	if err != nil {
		return nil, err
	}
	return s.reservations(ctx, qids)
}

// reservations reads reservations by qualified id, in one pipeline with the
// Redis clock (TIME) for their remaining time; those gone are left out.
func (s *Store) reservations(ctx context.Context, qids []string) ([]model.Reservation, error) {
	pipe := s.rdb.Pipeline()
	cmds := make([]*redis.MapStringStringCmd, len(qids))
	for i, qid := range qids {
		cmds[i] = pipe.HGetAll(ctx, s.Key("resv:", qid))
	}
	now := pipe.Time(ctx)
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return nil, err
	}
	nowMs := now.Val().UnixMilli()
	out := make([]model.Reservation, 0, len(qids))
	for i, cmd := range cmds {
		if len(cmd.Val()) == 0 {
			continue // ended and gone between the two reads
		}
		_, id, ok := model.SplitQualifiedID(qids[i])
		if !ok {
			return nil, fmt.Errorf("reservation key %q has no requester", qids[i])
		}
		r, err := s.readReservation(id, cmd.Val(), nowMs)
		if err != nil {
			return nil, err
		}
		out = append(out, r)
	}
	return out, nil
}

// readReservation reads a reservation hash (reservationFromMap) and opens its grant.
func (s *Store) readReservation(id string, m map[string]string, nowMs int64) (model.Reservation, error) {
	r, err := reservationFromMap(id, m, nowMs)
	if err != nil || len(r.Grant) == 0 {
		return r, err
	}
	grant, err := s.cfg.GrantKeys.open(r.QID(), string(r.Grant))
	if err != nil {
		return r, err
	}
	r.Grant = grant
	return r, nil
}

// Cluster reads one cluster, its nodes included.
func (s *Store) Cluster(ctx context.Context, id string) (model.Cluster, error) {
	cs, err := s.readClusters(ctx, []string{id})
	if err != nil {
		return model.Cluster{}, err
	}
	if len(cs) == 0 {
		return model.Cluster{}, ErrNotFound
	}
	return cs[0], nil
}

// readClusters reads the keys of clusters (cluster, nodes, node debits and
// listed reservations) in one pipeline with the Redis clock, which judges
// Live; a cluster without a hash is left out.
func (s *Store) readClusters(ctx context.Context, ids []string) ([]model.Cluster, error) {
	pipe := s.rdb.Pipeline()
	cmds := make([][3]*redis.MapStringStringCmd, len(ids))
	listed := make([]*redis.StringSliceCmd, len(ids))
	for i, id := range ids {
		cmds[i] = [3]*redis.MapStringStringCmd{
			pipe.HGetAll(ctx, s.Key("cluster:", id)), pipe.HGetAll(ctx, s.Key("nodes:", id)), pipe.HGetAll(ctx, s.Key("node-resv:", id)),
		}
		listed[i] = pipe.SMembers(ctx, s.Key("node-listed:", id))
	}
	now := pipe.Time(ctx)
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return nil, err
	}
	edge := now.Val().Add(-s.cfg.StaleThreshold)
	out := make([]model.Cluster, 0, len(ids))
	for i, cmd := range cmds {
		if len(cmd[0].Val()) == 0 {
			continue
		}
		c, err := clusterFromMap(ids[i], cmd[0].Val())
		if err != nil {
			return nil, err
		}
		c.Live = !c.SeenAt.Before(edge)
		c = withNodes(c, cmd[1].Val(), cmd[2].Val())
		if l := listed[i].Val(); len(l) > 0 {
			c.ReservationsOnNodes = l
			slices.Sort(c.ReservationsOnNodes)
		}
		out = append(out, c)
	}
	return out, nil
}

// ClusterIDs lists every known cluster, live or stale, in id order.
func (s *Store) ClusterIDs(ctx context.Context) ([]string, error) {
	ids, err := s.rdb.ZRange(ctx, s.Key("clusters"), 0, -1).Result()
	if err != nil {
		return nil, err
	}
	slices.Sort(ids)
	return ids, nil
}

// Clusters reads every known cluster, live or stale, in id order.
func (s *Store) Clusters(ctx context.Context) ([]model.Cluster, error) {
	ids, err := s.rdb.ZRange(ctx, s.Key("clusters"), 0, -1).Result()
	if err != nil {
		return nil, err
	}
	out, err := s.readClusters(ctx, ids)
	if err != nil {
		return nil, err
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out, nil
}

// CountClusters returns how many clusters are live and stale now (Redis clock).
func (s *Store) CountClusters(ctx context.Context) (live, stale int64, err error) {
	t, err := s.rdb.Time(ctx).Result()
	if err != nil {
		return 0, 0, err
	}
	edge := strconv.FormatInt(t.Add(-s.cfg.StaleThreshold).UnixMilli(), 10)
	pipe := s.rdb.Pipeline()
	liveCmd := pipe.ZCount(ctx, s.Key("clusters"), edge, "+inf")
	staleCmd := pipe.ZCount(ctx, s.Key("clusters"), "-inf", "("+edge)
	if _, err := pipe.Exec(ctx); err != nil {
		return 0, 0, err
	}
	return liveCmd.Val(), staleCmd.Val(), nil
}
