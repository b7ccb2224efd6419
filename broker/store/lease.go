package store

import (
	"context"
	"crypto/sha1"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fluidos-project/resource-broker/broker/model"
	"github.com/fluidos-project/resource-broker/broker/scripts"
)

// ReleaseResult tells what Release did.
type ReleaseResult struct {
	Reservation model.Reservation
	Released    bool // false: it had already ended, nothing changed
	Clamped     bool // a counter went below zero and was clamped: an invariant was broken before
}

// Release ends a live reservation, requester's id, on behalf of caller (its
// requester or provider). The releases a busy replica receives meanwhile
// are ended together, in one release.lua call (batcher).
func (s *Store) Release(ctx context.Context, requester, id, caller string) (ReleaseResult, error) {
	return s.release.do(ctx, newPending[releaseCall, ReleaseResult](ctx, releaseCall{requester: requester, id: id, caller: caller}))
}

// releaseCall is one release, as release.lua reads it.
type releaseCall struct{ requester, id, caller string }

// sendReleases ends a batch of releases in one release.lua call and hands
// each its result.
func (s *Store) sendReleases(ctx context.Context, batch []*pending[releaseCall, ReleaseResult]) {
	args := make([]any, 0, 4+3*len(batch))
	args = append(args, s.cfg.EventsMaxLen, s.cfg.EventsTTL.Milliseconds(), s.cfg.Retention.Milliseconds(), s.cfg.MaxEndedPerMember)
	for _, p := range batch {
		args = append(args, p.call.requester, p.call.id, p.call.caller)
	}
	replies, err := s.run(ctx, scripts.Release, args...)
	if err == nil && len(replies) != len(batch) {
		err = fmt.Errorf("release: %d replies for %d releases", len(replies), len(batch))
	}
	for i, p := range batch {
		if err != nil {
			p.answer(ReleaseResult{}, err)
			continue
		}
		reply, ok := replies[i].([]any)
		if !ok || len(reply) < 4 {
			p.answer(ReleaseResult{}, fmt.Errorf("unexpected release reply %v", replies[i]))
			continue
		}
		p.answer(s.parseReleaseReply(p.call.id, reply))
	}
}

// parseReleaseReply reads one release's {status, reservation, clamped, now_ms[, message]}.
func (s *Store) parseReleaseReply(id string, reply []any) (ReleaseResult, error) {
	switch reply[0] {
	case "notfound":
		return ReleaseResult{}, ErrNotFound
	case "forbidden":
		return ReleaseResult{}, ErrForbidden
	case "error":
		msg, _ := reply[len(reply)-1].(string)
		return ReleaseResult{}, fmt.Errorf("release %s: %s", id, msg)
	}
	now, _ := reply[3].(int64)
	r, err := s.readReservation(id, flatMap(toStrings(reply[1].([]any))), now)
	return ReleaseResult{Reservation: r, Released: reply[0] == "released", Clamped: reply[2] == int64(1)}, err
}

// Grant attaches the provider's access grant to a live reservation,
// requester's id (Active); caller must be its provider. The grant's access
// is stored once for the pair of provider and requester, sealed
// (Config.GrantKeys) before it reaches Redis, the newest by its expiry
// winning; its placement goes to the reservation's record (grant.go).
func (s *Store) Grant(ctx context.Context, requester, id, caller string, grant json.RawMessage) (model.Reservation, error) {
	g, err := splitGrant(grant)
	if err != nil {
		return model.Reservation{}, err
	}
	sealed := s.cfg.GrantKeys.sealAccess(caller, requester, g.access)
	placed := ""
	if g.placed {
		placed = "placed"
	}
	reply, err := s.run(ctx, scripts.Grant, requester, id, caller, sealed, g.expiresMs, placed, g.placement.Node, g.placement.PriorityClassName,
		s.cfg.EventsMaxLen, s.cfg.EventsTTL.Milliseconds())
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
	// Moved counts the leases covered by a renewal set not committed
	// whose expiry score was moved to their end (scripts/lib/renew_set.lua).
	Moved int64
	// Parked counts the leases covered by their requester's renewal set
	// that were parked near their scores (scripts/expire.lua): their set's
	// end stands for them. Unparked counts those whose set's end passed
	// (the requester stopped renewing) and that got their ends back.
	Parked, Unparked int64
}

// ExpireRun is Expire with everything the run found.
func (s *Store) ExpireRun(ctx context.Context) (ExpireResult, error) {
	var res ExpireResult
	for {
		// A lease that a renewal set covers is parked within two outage gaps
		// of its score (scripts/expire.lua): more than an expiry interval
		// (the outage gap exceeds it), so a covered lease's score is never
		// found due while a replica of this release runs.
		reply, err := s.run(ctx, scripts.Expire, s.cfg.ExpireBatch, s.cfg.EventsMaxLen, s.cfg.EventsTTL.Milliseconds(),
			s.cfg.Retention.Milliseconds(), s.cfg.AuditRetention.Milliseconds(), s.cfg.OutageGap.Milliseconds(), s.cfg.MaxEndedPerMember,
			2*s.cfg.OutageGap.Milliseconds())
		if err != nil {
			return res, err
		}
		n, c, credited := reply[0].(int64), reply[1].(int64), reply[3].(int64)
		res.Expired += n
		res.Clamped += c
		res.Credited += credited
		res.Moved += reply[5].(int64)
		res.Parked += reply[7].(int64)
		res.Unparked += reply[8].(int64)
		if o := reply[4].(int64); o > 0 {
			res.Outage = time.Duration(o) * time.Millisecond
		}
		// A full batch may leave due reservations for the next call; the
		// waiting members left (at most a batch per call) go at the next run.
		if reply[6].(int64) == 0 {
			return res, nil
		}
	}
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
//
// While the requester renews its leases itself (it renewed within a third
// of its shortest lease), nothing is read or written: every id is
// RenewByRequester. A provider renews every lease of every requester it
// hears, period after period; its renewals matter only once the requester
// has missed its schedule (a requester renews at least every third of its
// lease: rb-agent checks it), and then the lease still has two thirds of
// its length for the provider's renewal.
func (s *Store) RenewFor(ctx context.Context, provider, requester string, ids []string) ([]model.Renewal, error) {
	if provider == "" {
		return nil, errors.New("renew: a provider renewing for a requester must be named")
	}
	renews, err := s.RequestersRenewing(ctx, []string{requester})
	if err != nil {
		return nil, err
	}
	if renews[0] {
		out := make([]model.Renewal, len(ids))
		for i, id := range ids {
			out[i] = model.Renewal{ID: id, Outcome: model.RenewByRequester}
		}
		return out, nil
	}
	return s.renew(ctx, requester, provider, ids)
}

// RequestersRenewing tells, for each of requesters, whether it renewed its
// leases itself within a third of the shortest lease it renewed, on the
// Redis clock: its renewal set's last renewal (at_ms, lease_ms) or its last
// renewal id by id (called_ms, called_lease_ms: scripts/renew.lua). A
// provider's renewals for one that does are not needed (RenewFor); one that
// never renewed here is not renewing. One round trip, one HMGET each.
func (s *Store) RequestersRenewing(ctx context.Context, requesters []string) ([]bool, error) {
	pipe := s.rdb.Pipeline()
	now := pipe.Time(ctx)
	last := make([]*redis.SliceCmd, len(requesters))
	for i, r := range requesters {
		last[i] = pipe.HMGet(ctx, s.Key("renewal:", r), "at_ms", "lease_ms", "called_ms", "called_lease_ms")
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return nil, err
	}
	nowMs := now.Val().UnixMilli()
	out := make([]bool, len(requesters))
	for i, v := range last {
		var f [4]int64
		for j, x := range v.Val() {
			if str, ok := x.(string); ok {
				f[j], _ = strconv.ParseInt(str, 10, 64)
			}
		}
		for _, l := range [][2]int64{{f[0], f[1]}, {f[2], f[3]}} {
			if at, lease := l[0], l[1]; lease > 0 && nowMs-at < lease/3 {
				out[i] = true
			}
		}
	}
	return out, nil
}

func (s *Store) renew(ctx context.Context, requester, provider string, ids []string) ([]model.Renewal, error) {
	// A requester names its renewal by a digest, with its first chunk: the
	// same ids as its renewal set are renewed at once (scripts/lib/renew_set.lua).
	var digest string
	if provider == "" && len(ids) > 0 && len(ids) <= RenewalSetMaxIDs {
		digest = renewalDigest(ids)
	}
	out := make([]model.Renewal, 0, len(ids))
	var gen, shortest int64 // the set's generation opened for these ids; the shortest lease renewed (ms)
	named := digest         // the digest goes with the first chunk only
	for chunk := range slices.Chunk(ids, renewChunk) {
		args := make([]any, 0, 4+len(chunk))
		args = append(args, requester, provider, named, gen)
		named = ""
		for _, id := range chunk {
			args = append(args, id)
		}
		reply, err := s.run(ctx, scripts.Renew, args...)
		if err != nil {
			return nil, err
		}
		if len(reply) == 4 && reply[3] == "same" {
			lease := time.Duration(reply[1].(int64)) * time.Millisecond
			for _, id := range ids {
				out = append(out, model.Renewal{ID: id, Outcome: model.Renewed, Remaining: lease})
			}
			return out, nil
		}
		if len(reply) != 4+2*len(chunk) {
			return nil, fmt.Errorf("renew: %d reply values for %d ids", len(reply), len(chunk))
		}
		gen = reply[2].(int64)
		if l, _ := reply[1].(int64); l > 0 && (shortest == 0 || l < shortest) {
			shortest = l
		}
		for i, id := range chunk {
			outcome, _ := reply[4+2*i].(string)
			ms, _ := reply[5+2*i].(int64)
			out = append(out, model.Renewal{ID: id, Outcome: model.RenewOutcome(outcome), Remaining: time.Duration(ms) * time.Millisecond})
		}
	}
	if gen == 0 || shortest == 0 || slices.ContainsFunc(out, func(r model.Renewal) bool { return r.Outcome != model.Renewed }) {
		return out, nil
	}
	// Every id renewed: they are the set its next renewals renew at once. A
	// commit that fails changes nothing (the next renewal is full again), so
	// its error is not the renewal's.
	_, _ = s.run(ctx, scripts.RenewCommit, requester, digest, gen, shortest)
	return out, nil
}

// RenewalSetMaxIDs: a renewal naming more ids is renewed id by id. A
// requester with more leases than one call takes (api.MaxRenewBatch) renews
// them in several calls, each naming other ids: one set per requester would
// be replaced at every call.
const RenewalSetMaxIDs = 4999

// renewalDigest names a set of ids whatever their order and however often
// each is named: for each id the first 96 bits of its SHA-1 as two 48-bit
// numbers, summed modulo 2^48 lane by lane, "<a>:<b>". A sum, so that the
// scripts move a set's digest by one id when a lease joins or leaves it
// (scripts/lib/core.lua digest_move). SHA-1 names, it does not protect: a
// requester that finds other ids of the same sum only misleads itself
// (they are answered renewed, and its own set is).
func renewalDigest(ids []string) string {
	var a, b uint64
	for _, id := range slices.Compact(slices.Sorted(slices.Values(ids))) {
		h := sha1.Sum([]byte(id))
		a += binary.BigEndian.Uint64(h[0:8]) >> 16
		b += binary.BigEndian.Uint64(h[6:14]) >> 16
	}
	const lane = 1<<48 - 1
	return strconv.FormatUint(a&lane, 10) + ":" + strconv.FormatUint(b&lane, 10)
}

// renewChunk bounds the ids of one renew script call. Each id is renewed on
// its own, so a batch needs no single atomic step; and Redis runs one script
// at a time: 5,000 ids in one call would hold every other member's reserve
// for milliseconds, 100 ids a call lets them in between.
const renewChunk = 100
