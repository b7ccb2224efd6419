package server

import (
	"context"
	"fmt"
	"testing"

	"github.com/go-logr/logr"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fluidos-project/resource-broker/broker/model"
	"github.com/fluidos-project/resource-broker/broker/store"
	"github.com/fluidos-project/resource-broker/internal/redistest"
)

// TestHubStreamBehind: a stream whose client reads too slowly is ended
// (errStreamBehind) once the events it has not taken exceed hubBacklog,
// instead of the broker keeping them all for it; the other streams of the
// cluster go on, and the hub keeps only the events a stream has not taken.
func TestHubStreamBehind(t *testing.T) {
	st := store.New(redistest.Start(t).Client(), store.Config{})
	h := newEventHub(st, logr.Discard(), hubBlock, 0)
	t.Cleanup(h.stop)
	ctx := context.Background()
	slow, start, err := h.subscribe(ctx, "paris", make(chan struct{}, 1))
	require.NoError(t, err)
	assert.Equal(t, "0-0", start, "an empty stream starts at 0-0")
	fast, _, err := h.subscribe(ctx, "paris", make(chan struct{}, 1))
	require.NoError(t, err)

	var taken []*sseEvent
	for i := 1; i <= hubBacklog+10; i++ {
		h.shard("paris").deliver(map[string][]model.Event{"paris": {{ID: fmt.Sprintf("%d-0", i)}}})
		if taken, err = fast.take(taken[:0]); err != nil || len(taken) != 1 {
			t.Fatalf("fast stream: %d events, %v", len(taken), err)
		}
	}
	h.shard("paris").deliver(map[string][]model.Event{"paris": {{ID: "5-0"}}}) // not after the last: dropped
	_, err = slow.take(nil)
	assert.ErrorIs(t, err, errStreamBehind)
	taken, err = fast.take(nil)
	assert.NoError(t, err)
	assert.Empty(t, taken)

	topic := h.shard("paris").topics["paris"]
	assert.LessOrEqual(t, len(topic.events), 1, "only what a stream has not taken is kept")

	slow.close()
	fast.close()
	assert.Empty(t, h.shard("paris").topics, "a cluster no stream follows is not read")
}
