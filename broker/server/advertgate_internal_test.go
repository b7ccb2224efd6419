package server

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fluidos-project/resource-broker/broker/api"
	"github.com/fluidos-project/resource-broker/broker/model"
)

// TestAdvertGate: one turn; the waiters get it newest first; a waiter
// whose wait ends, or whose request ends, leaves the queue without a turn;
// a turn released with nobody waiting is free again.
func TestAdvertGate(t *testing.T) {
	ctx := context.Background()
	g := newAdvertGate(1)
	holder, _, ok := g.acquire(ctx, time.Second)
	require.True(t, ok)

	_, backlog, ok := g.acquire(ctx, 20*time.Millisecond)
	assert.False(t, ok, "no turn within the wait")
	assert.Zero(t, backlog)
	assert.Zero(t, g.waiting(), "a shed waiter leaves the queue")

	order := make(chan string, 2)
	wait := func(name string) {
		release, _, ok := g.acquire(ctx, 5*time.Second)
		if !ok {
			order <- name + " shed"
			return
		}
		order <- name
		release()
	}
	go wait("older")
	require.Eventually(t, func() bool { return g.waiting() == 1 }, time.Second, time.Millisecond)
	go wait("newer")
	require.Eventually(t, func() bool { return g.waiting() == 2 }, time.Second, time.Millisecond)

	cancelled, cancel := context.WithCancel(ctx)
	gone := make(chan int)
	go func() {
		_, backlog, ok := g.acquire(cancelled, 5*time.Second)
		assert.False(t, ok)
		gone <- backlog
	}()
	require.Eventually(t, func() bool { return g.waiting() == 3 }, time.Second, time.Millisecond)
	cancel()
	assert.Equal(t, 2, <-gone, "a request that ended leaves the queue; two still wait")

	holder()
	assert.Equal(t, "newer", <-order, "the newest waiter gets the next turn")
	assert.Equal(t, "older", <-order)
	release, _, ok := g.acquire(ctx, 0)
	require.True(t, ok, "the turn is free again")
	release()
}

// TestAdvertGateRetryAfter: a shed advertisement comes back when the
// backlog has drained (its count times the mean turn), 1 to 2 times that
// at random, within 1 s and 30 s.
func TestAdvertGateRetryAfter(t *testing.T) {
	g := newAdvertGate(1)
	g.meanHold = 60 * time.Millisecond
	for range 100 {
		d := g.retryAfter(100) // 6 s to drain
		require.GreaterOrEqual(t, d, 6*time.Second)
		require.LessOrEqual(t, d, 12*time.Second)
	}
	assert.Equal(t, minAdvertRetryAfter, g.retryAfter(0))
	assert.Equal(t, maxAdvertRetryAfter, g.retryAfter(10_000))
	two := newAdvertGate(2)
	two.meanHold = 60 * time.Millisecond
	for range 100 {
		require.LessOrEqual(t, two.retryAfter(100), 6*time.Second, "two turns drain twice as fast")
	}
}

// TestAdvertisementShedAnswers503: an advertisement whose turn does not
// come within advertWait is answered 503 Busy with a Retry-After and a
// message that says what happened, counted in
// rb_broker_advertisements_shed_total; nothing reaches the store.
func TestAdvertisementShedAnswers503(t *testing.T) {
	g := newAdvertGate(1)
	s := &Server{advertising: g, metrics: newMetrics(nil, nil, g)}
	release, _, ok := g.acquire(context.Background(), 0)
	require.True(t, ok)
	defer release()
	g.meanHold = 50 * time.Millisecond
	w := httptest.NewRecorder()
	began := time.Now()
	s.advertise(w, context.Background(), "rome", model.Advertisement{}, func(model.Cluster) any {
		t.Error("answered as stored")
		return nil
	})
	assert.GreaterOrEqual(t, time.Since(began), advertWait)
	assert.Equal(t, http.StatusServiceUnavailable, w.Code)
	secs, err := strconv.Atoi(w.Header().Get("Retry-After"))
	require.NoError(t, err)
	assert.GreaterOrEqual(t, secs, 1)
	var e api.Error
	require.NoError(t, json.Unmarshal(w.Body.Bytes(), &e))
	assert.Equal(t, api.ReasonBusy, e.Reason)
	assert.Equal(t, "this broker replica is busy storing advertisements (0 more waiting): this one did not get its turn within 3s and was not stored; retry after Retry-After", e.Error)
	assert.Equal(t, 1.0, testutil.ToFloat64(s.metrics.advertisementsShed))
}
