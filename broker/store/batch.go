package store

import (
	"context"
	"sync"

	"github.com/fluidos-project/resource-broker/broker/model"
)

// reserveBatcher sends the Reserve requests that arrive while earlier calls
// are in flight as one reserve.lua call (a group commit). An idle broker sends
// each request alone, at once; a busy one pays the script's fixed costs (the
// call, the prelude, reading the candidate index) once per batch. reserve.lua
// decides a batch's requests in order, exactly as one call each would.
//
// No goroutine runs while nothing is asked: the caller that finds fewer than
// maxInFlight calls in flight sends the batch itself; when its call returns
// and requests have queued meanwhile, a new goroutine sends the next batch.
type reserveBatcher struct {
	maxBatch    int
	maxInFlight int
	send        func(ctx context.Context, batch []*pendingReserve) // fills every result

	mu       sync.Mutex
	queue    []*pendingReserve
	inFlight int
}

// pendingReserve is one request waiting for its decision.
type pendingReserve struct {
	ctx  context.Context
	req  model.ReserveRequest
	arg  string // its ARGV value in reserve.lua: the request, encoded (reserveArg)
	done chan reserveResult
}

type reserveResult struct {
	decision model.Decision
	err      error
}

// do queues p and returns its decision, or the context's error if ctx ends
// first (the request may still be decided: Reserve is idempotent by id).
func (b *reserveBatcher) do(ctx context.Context, p *pendingReserve) (model.Decision, error) {
	b.mu.Lock()
	b.queue = append(b.queue, p)
	lead := b.inFlight < b.maxInFlight
	if lead {
		b.inFlight++
	}
	b.mu.Unlock()
	if lead {
		b.sendNext()
	}
	select {
	case r := <-p.done:
		return r.decision, r.err
	case <-ctx.Done():
		return model.Decision{}, ctx.Err()
	}
}

// sendNext sends the queued requests (up to maxBatch) as one call; if more
// queued meanwhile, a new goroutine sends them, so that this caller returns.
func (b *reserveBatcher) sendNext() {
	b.mu.Lock()
	batch := make([]*pendingReserve, 0, min(len(b.queue), b.maxBatch))
	for len(b.queue) > 0 && len(batch) < b.maxBatch {
		p := b.queue[0]
		b.queue[0] = nil
		b.queue = b.queue[1:]
		if err := p.ctx.Err(); err != nil { // its caller gave up before it was sent
			p.done <- reserveResult{err: err}
			continue
		}
		batch = append(batch, p)
	}
	b.mu.Unlock()

	if len(batch) > 0 {
		// The call serves every request of the batch: one caller's cancellation
		// must not abort it.
		b.send(context.WithoutCancel(batch[0].ctx), batch)
	}

	b.mu.Lock()
	more := len(b.queue) > 0
	if !more {
		b.inFlight--
	}
	b.mu.Unlock()
	if more {
		go b.sendNext()
	}
}
