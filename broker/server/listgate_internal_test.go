package server

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fluidos-project/resource-broker/broker/api"
)

// TestListGate: a cluster has at most max turns; one more waits and gets
// one when a turn is released, or none after the wait; other clusters are
// not held back; a cluster's semaphore goes once nobody holds or waits.
func TestListGate(t *testing.T) {
	ctx := context.Background()
	g := newListGate(2)
	r1, ok := g.acquire(ctx, "bulk", time.Second)
	require.True(t, ok)
	r2, ok := g.acquire(ctx, "bulk", time.Second)
	require.True(t, ok)
	_, ok = g.acquire(ctx, "bulk", 50*time.Millisecond)
	assert.False(t, ok, "a third turn after the wait")
	r3, ok := g.acquire(ctx, "rome", 0)
	assert.True(t, ok, "another cluster is not held back")
	r3()

	got := make(chan bool)
	go func() {
		release, ok := g.acquire(ctx, "bulk", 5*time.Second)
		if ok {
			release()
		}
		got <- ok
	}()
	time.Sleep(20 * time.Millisecond)
	r1()
	assert.True(t, <-got, "a waiter gets the released turn")
	r2()
	g.mu.Lock()
	assert.Empty(t, g.turns, "no semaphore left")
	g.mu.Unlock()

	unbounded := newListGate(0)
	for range 100 {
		_, ok := unbounded.acquire(ctx, "bulk", 0)
		require.True(t, ok)
	}
}

// TestGatedAnswers429: a list request past the caller's turns is answered
// 429 TooManyRequests with Retry-After and a message that says what to do;
// the handler is not called.
func TestGatedAnswers429(t *testing.T) {
	s := &Server{lists: newListGate(1)}
	release, ok := s.lists.acquire(context.Background(), "bulk", 0)
	require.True(t, ok)
	defer release()
	called := false
	w := httptest.NewRecorder()
	s.gated(func(http.ResponseWriter, *http.Request, string) { called = true })(w, httptest.NewRequest(http.MethodGet, "/api/v2/reservations", nil), "bulk")
	assert.False(t, called)
	assert.Equal(t, http.StatusTooManyRequests, w.Code)
	assert.Equal(t, "1", w.Header().Get("Retry-After"))
	var e api.Error
	require.NoError(t, json.Unmarshal(w.Body.Bytes(), &e))
	assert.Equal(t, api.ReasonTooManyRequests, e.Reason)
	assert.Equal(t, "cluster bulk has 1 list requests in progress on this broker replica, the most it may: list one page at a time", e.Error)
}
