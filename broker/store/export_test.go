package store

import "context"

// ReserveBatch decides reqs in one reserve.lua call, in order: the batch the
// batcher would send if they all queued at once (tests compare it with one
// call per request).
func (s *Store) ReserveBatch(ctx context.Context, reqs []ReserveRequest) ([]Decision, []error) {
	batch := make([]*pendingReserve, len(reqs))
	for i, req := range reqs {
		p, err := newPendingReserve(ctx, s.withLimits(req))
		if err != nil {
			panic(err)
		}
		batch[i] = p
	}
	s.sendReserves(ctx, batch)
	decisions, errs := make([]Decision, len(reqs)), make([]error, len(reqs))
	for i, p := range batch {
		r := <-p.done
		decisions[i], errs[i] = r.decision, r.err
	}
	return decisions, errs
}
