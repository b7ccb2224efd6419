package dashboard

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"time"
)

// Live updates: /dashboard/events is a server-sent event stream that says
// "change" when the broker's streams in Redis show one (a decision in the
// audit stream, a reservation reserved, granted, released or expired in a
// cluster's event stream), and "tick" every tickEvery (advertisement ages
// and the capacity plot move without events). The page's script then
// reloads its main content (?fragment=1). Each open page holds one blocking
// XREAD of at most liveBlock; operators are few.
const (
	liveBlock = 500 * time.Millisecond
	tickEvery = 5 * time.Second
)

func (d *Dashboard) events(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	rc := http.NewResponseController(w)
	now, err := d.now(ctx)
	if err != nil {
		d.storeError(w, r, err)
		return
	}
	// Start just before now on the Redis clock, which stamps the stream ids.
	start := strconv.FormatInt(now.UnixMilli()-1, 10) + "-0"
	cursors := map[string]string{}
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	send := func(event string) bool {
		_ = rc.SetWriteDeadline(time.Now().Add(tickEvery + 30*time.Second))
		if _, err := fmt.Fprintf(w, "retry: 1000\nevent: %s\ndata: %d\n\n", event, time.Now().UnixMilli()); err != nil {
			return false
		}
		return rc.Flush() == nil
	}
	if !send("tick") {
		return
	}
	tick := time.Now()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-d.stopped:
			cancel()
		case <-ctx.Done():
		}
	}()
	for ctx.Err() == nil {
		changed, err := d.watch(ctx, cursors, start)
		switch {
		case ctx.Err() != nil:
			return
		case err != nil:
			d.log.V(1).Info("dashboard live stream: read", "err", err.Error())
			select { // Redis unavailable: the page keeps what it shows
			case <-ctx.Done():
				return
			case <-time.After(time.Second):
			}
		case changed:
			if !send("change") {
				return
			}
			tick = time.Now()
		}
		if time.Since(tick) >= tickEvery {
			if !send("tick") {
				return
			}
			tick = time.Now()
		}
	}
}

// watch waits up to liveBlock for a new entry in the audit stream or an
// event stream of any known cluster (Store.WaitForChange).
func (d *Dashboard) watch(ctx context.Context, cursors map[string]string, start string) (bool, error) {
	return d.store.WaitForChange(ctx, cursors, start, liveBlock)
}
