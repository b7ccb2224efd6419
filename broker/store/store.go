// Package store is the broker's state in Redis: every mutation is one Lua
// script from broker/scripts, run atomically, so any number of broker replicas
// can share one Redis without coordination.
package store

import (
	"context"
	"errors"
	"fmt"
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
	// requests that queued while earlier calls were in flight), and the most
	// releases one release.lua call ends; default 64. 1 sends every request
	// alone.
	ReserveBatch int
	// ReserveInFlight is how many reserve.lua calls one store keeps in
	// flight at once, and how many release.lua calls; default 2 (Redis runs
	// one while the other's reply is read and the next batch forms).
	ReserveInFlight int
	// DecideFromView has this replica keep a view of the candidate index in
	// memory (view.go) and propose each decision's candidates from it, so
	// that reserve.lua judges a few clusters instead of walking the index.
	DecideFromView bool
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
	reserve *batcher[reserveCall, model.Decision]
	release *batcher[releaseCall, ReleaseResult]
	// decide is the script that decides reservations: scripts.Reserve, or
	// in tests the full-scan reference it is checked against.
	decide *redis.Script
	// view proposes each decision's candidates (Config.DecideFromView); nil: off.
	view *clusterView
}

// New returns a store over rdb.
func New(rdb redis.UniversalClient, cfg Config) *Store {
	cfg.defaults()
	s := &Store{rdb: rdb, cfg: cfg, decide: scripts.Reserve}
	s.reserve = &batcher[reserveCall, model.Decision]{maxBatch: cfg.ReserveBatch, maxInFlight: cfg.ReserveInFlight, send: s.sendReserves}
	s.release = &batcher[releaseCall, ReleaseResult]{maxBatch: cfg.ReserveBatch, maxInFlight: cfg.ReserveInFlight, send: s.sendReleases}
	if cfg.DecideFromView {
		s.view = newClusterView()
	}
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
