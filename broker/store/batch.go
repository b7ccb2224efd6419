package store

import (
	"context"
	"sync"
)

// batcher sends the calls that arrive while earlier ones are in flight as
// one script call (a group commit): reserve.lua decides a batch of Reserve
// requests, release.lua ends a batch of releases, each in order, exactly as
// one call each would. An idle broker sends each call alone, at once; a
// busy one pays the script's fixed costs (the call, its prelude of helper
// functions, reading the candidate index) once per batch.
//
// No goroutine runs while nothing is asked: the caller that finds fewer than
// maxInFlight script calls in flight sends the batch itself; when its call
// returns and calls have queued meanwhile, a new goroutine sends the next
// batch.
type batcher[Call, Result any] struct {
	maxBatch    int
	maxInFlight int
	send        func(ctx context.Context, batch []*pending[Call, Result]) // answers every call

	mu       sync.Mutex
	queue    []*pending[Call, Result]
	inFlight int
}

// pending is one call waiting for its batch's answer.
type pending[Call, Result any] struct {
	ctx  context.Context
	call Call
	done chan answer[Result]
}

type answer[Result any] struct {
	result Result
	err    error
}

func newPending[Call, Result any](ctx context.Context, call Call) *pending[Call, Result] {
	return &pending[Call, Result]{ctx: ctx, call: call, done: make(chan answer[Result], 1)}
}

// answer hands p its result (once; done is buffered).
func (p *pending[Call, Result]) answer(r Result, err error) {
	p.done <- answer[Result]{result: r, err: err}
}

// do queues p and returns its result, or the context's error if ctx ends
// first (the call may still be made: Reserve and Release are idempotent).
func (b *batcher[Call, Result]) do(ctx context.Context, p *pending[Call, Result]) (Result, error) {
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
	case a := <-p.done:
		return a.result, a.err
	case <-ctx.Done():
		var zero Result
		return zero, ctx.Err()
	}
}

// sendNext sends the queued calls (up to maxBatch) as one script call; if
// more queued meanwhile, a new goroutine sends them, so that this caller
// returns.
func (b *batcher[Call, Result]) sendNext() {
	b.mu.Lock()
	batch := make([]*pending[Call, Result], 0, min(len(b.queue), b.maxBatch))
	for len(b.queue) > 0 && len(batch) < b.maxBatch {
		p := b.queue[0]
		b.queue[0] = nil
		b.queue = b.queue[1:]
		if err := p.ctx.Err(); err != nil { // its caller gave up before it was sent
			var zero Result
			p.answer(zero, err)
			continue
		}
		batch = append(batch, p)
	}
	b.mu.Unlock()

	if len(batch) > 0 {
		// The script call serves every call of the batch: one caller's
		// cancellation must not abort it.
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
