package store

import (
	"context"
	"fmt"
	"maps"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fluidos-project/resource-broker/broker/model"
	"github.com/fluidos-project/resource-broker/broker/scripts"
	"github.com/fluidos-project/resource-broker/broker/scripts/reference"
)

// NewFullScan returns a store whose decisions read every live cluster's
// hashes (scripts/reference) instead of the candidate index: the reference
// the index is tested against and the baseline of the benchmarks.
// Decisions are the same either way.
func NewFullScan(rdb redis.UniversalClient, cfg Config) *Store {
	s := New(rdb, cfg)
	s.decide = reference.ReserveFullScan
	return s
}

// ReserveBatch decides reqs in one reserve.lua call, in order: the batch the
// batcher would send if they all queued at once (tests compare it with one
// call per request).
func (s *Store) ReserveBatch(ctx context.Context, reqs []model.ReserveRequest) ([]model.Decision, []error) {
	batch := make([]*pendingReserve, len(reqs))
	for i, req := range reqs {
		p, err := newPendingReserve(ctx, s.withLimits(req))
		if err != nil {
			panic(err)
		}
		batch[i] = p
	}
	s.sendReserves(ctx, batch)
	decisions, errs := make([]model.Decision, len(reqs)), make([]error, len(reqs))
	for i, p := range batch {
		a := <-p.done
		decisions[i], errs[i] = a.result, a.err
	}
	return decisions, errs
}

// ReleaseCase is one release of ReleaseBatch: an id, released by Caller.
type ReleaseCase struct{ ID, Caller string }

// ReleaseBatch ends requester's reservations in one release.lua call, in
// order: the batch the batcher would send if they all queued at once.
func (s *Store) ReleaseBatch(ctx context.Context, requester string, cases []ReleaseCase) ([]ReleaseResult, []error) {
	batch := make([]*pending[releaseCall, ReleaseResult], len(cases))
	for i, c := range cases {
		batch[i] = newPending[releaseCall, ReleaseResult](ctx, releaseCall{requester: requester, id: c.ID, caller: c.Caller})
	}
	s.sendReleases(ctx, batch)
	results, errs := make([]ReleaseResult, len(cases)), make([]error, len(cases))
	for i, p := range batch {
		a := <-p.done
		results[i], errs[i] = a.result, a.err
	}
	return results, errs
}

// SealGrantOfRecord seals grant as a broker of the previous release wrote it
// into reservation qid's record (field grant, bound to the qualified id).
func (s *Store) SealGrantOfRecord(qid string, grant []byte) string {
	return s.cfg.GrantKeys.seal(qid, grant)
}

// OpenRenewalSet, RenewTagged and CommitRenewalSet are the three steps of a
// requester's full renewal (Store.renew), apart, so that a test may end a
// lease between them.
func (s *Store) OpenRenewalSet(ctx context.Context, requester string, ids []string) (gen int64, err error) {
	reply, err := s.run(ctx, scripts.Renew, requester, "", renewalDigest(ids), 0)
	if err != nil {
		return 0, err
	}
	return reply[2].(int64), nil
}

func (s *Store) RenewTagged(ctx context.Context, requester string, gen int64, ids []string) error {
	args := []any{requester, "", "", gen}
	for _, id := range ids {
		args = append(args, id)
	}
	_, err := s.run(ctx, scripts.Renew, args...)
	return err
}

func (s *Store) CommitRenewalSet(ctx context.Context, requester string, ids []string, gen, shortestMs int64) (bool, error) {
	reply, err := s.run(ctx, scripts.RenewCommit, requester, renewalDigest(ids), gen, shortestMs)
	if err != nil {
		return false, err
	}
	return reply[0].(int64) == 1, nil
}

// RenewalDigest is renewalDigest.
var RenewalDigest = renewalDigest

// CheckView catches s's view up (Config.DecideFromView) and compares it
// with a view read whole from the index now: the same clusters, records
// and labels, or an error naming the first difference.
func (s *Store) CheckView(ctx context.Context) error {
	if err := s.catchUpView(ctx); err != nil {
		return err
	}
	fresh := &Store{rdb: s.rdb, cfg: s.cfg, view: newClusterView()}
	if err := fresh.catchUpView(ctx); err != nil {
		return err
	}
	got, want := s.view, fresh.view
	if got.seq != want.seq || got.epoch != want.epoch {
		return fmt.Errorf("view at change %d of %q, the index at %d of %q", got.seq, got.epoch, want.seq, want.epoch)
	}
	if len(got.recs) != len(want.recs) {
		return fmt.Errorf("view holds %d clusters, the index %d", len(got.recs), len(want.recs))
	}
	if !maps.Equal(got.carrying, want.carrying) {
		return fmt.Errorf("view counts labels %v, the index %v", got.carrying, want.carrying)
	}
	for _, w := range want.recs {
		at, ok := got.pos[w.id]
		if !ok {
			return fmt.Errorf("cluster %s missing from the view", w.id)
		}
		g := got.recs[at]
		if g.f != w.f || !maps.Equal(g.labels, w.labels) {
			return fmt.Errorf("cluster %s: view %v %v, index %v %v", w.id, g.f, g.labels, w.f, w.labels)
		}
	}
	return nil
}

// SetViewPage sets how many changed clusters one catch-up reads at most, and
// returns the previous value.
func SetViewPage(n int) int {
	old := viewPage
	viewPage = n
	return old
}

// SetViewRereadEvery sets how often a view reads the whole index again, and
// returns the previous value.
func SetViewRereadEvery(d time.Duration) time.Duration {
	old := viewRereadEvery
	viewRereadEvery = d
	return old
}

// ViewHolds returns the record s's view holds for cluster id (nil: none).
func (s *Store) ViewHolds(id string) []float64 {
	s.view.mu.RLock()
	defer s.view.mu.RUnlock()
	if at, ok := s.view.pos[id]; ok {
		return s.view.recs[at].f[:]
	}
	return nil
}
