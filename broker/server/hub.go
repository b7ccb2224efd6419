package server

import (
	"cmp"
	"context"
	"errors"
	"hash/fnv"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"

	"github.com/fluidos-project/resource-broker/broker/model"
	"github.com/fluidos-project/resource-broker/broker/store"
	"github.com/fluidos-project/resource-broker/internal/backoff"
)

// eventHub reads, for this replica, the Redis event streams of every cluster
// that has an event stream open here, and hands each event to every open
// stream of its cluster. The clusters are spread over hubShards shards by
// hash; each shard reads all of its clusters with one blocking XREAD at a
// time, on one Redis connection: at most hubShards connections however many
// streams are open. (Each stream used to hold a pool connection in an XREAD
// of its own, so a few hundred streams opened by one member left none for
// the others' calls.) The shards keep each XREAD short where thousands of
// clusters are followed: a read's cost grows with the streams it names, and
// a shard reads again after each event of any of its clusters.
type eventHub struct {
	store *store.Store
	log   logr.Logger
	// block is how long one XREAD waits for events: also how late the first
	// events of a cluster that no stream followed before may come (a read in
	// flight names the clusters followed when it began), and how long stop
	// waits for the reads in flight.
	block   time.Duration
	maxSubs int // open streams per cluster; 0: no limit

	shards  [hubShards]*hubShard
	ctx     context.Context // ends with stop
	cancel  context.CancelFunc
	running sync.WaitGroup // the shards' readers
}

// hubShard is the clusters of one shard and their reader.
type hubShard struct {
	hub *eventHub
	// mu guards topics and their rings; a subscription's next is its own
	// stream's, so take needs only the read lock (a cluster's streams all
	// take each event at once).
	mu     sync.RWMutex
	topics map[string]*topic // by cluster
	wake   chan struct{}     // a topic was added: read
	start  sync.Once         // the reader starts with the first stream
}

// topic is one cluster's stream as the hub reads it: the events read that
// one of its subscriptions has not taken yet (at most hubBacklog).
type topic struct {
	last   string      // id of the last event read: the next read starts after it
	events []*sseEvent // events numbered base, base+1, ...
	base   uint64
	subs   map[*subscription]struct{}
	err    error // the hub stopped reading it: its subscriptions end
}

// n is the number of the next event read.
func (t *topic) n() uint64 { return t.base + uint64(len(t.events)) }

// subscription is one open event stream's place in its cluster's topic.
type subscription struct {
	shard   *hubShard
	cluster string
	topic   *topic
	next    uint64        // number of the next event to take
	notify  chan struct{} // a token when the topic has new events or ended (shared by a stream's cells)
}

const (
	hubShards    = 16
	hubBacklog   = 1024 // events a stream may fall behind before it must reconnect
	hubReadCount = 256  // events per cluster per XREAD
)

var (
	errTooManyStreams = errors.New("too many event streams")
	errStreamBehind   = errors.New("the event stream fell behind (the client reads too slowly): reconnect with the last event id")
	errHubStopped     = errors.New("the broker is shutting down")
)

func newEventHub(st *store.Store, log logr.Logger, block time.Duration, maxSubs int) *eventHub {
	ctx, cancel := context.WithCancel(context.Background())
	h := &eventHub{store: st, log: log, block: block, maxSubs: maxSubs, ctx: ctx, cancel: cancel}
	for i := range h.shards {
		h.shards[i] = &hubShard{hub: h, topics: map[string]*topic{}, wake: make(chan struct{}, 1)}
	}
	return h
}

// shard returns cluster's shard.
func (h *eventHub) shard(cluster string) *hubShard {
	f := fnv.New32a()
	_, _ = f.Write([]byte(cluster))
	return h.shards[f.Sum32()%hubShards]
}

// subscribe adds an open stream of cluster and returns it with the id the
// hub hands it events after: every later event of the cluster comes through
// the subscription, and those up to that id are the caller's to read from
// Redis. notify (capacity 1) gets a token when there are events to take: a
// stream that follows several cells gives each cell's subscription the same
// one, and waits on it alone. errTooManyStreams: the cluster has maxSubs
// streams open here.
func (h *eventHub) subscribe(ctx context.Context, cluster string, notify chan struct{}) (*subscription, string, error) {
	sh := h.shard(cluster)
	sh.start.Do(func() {
		h.running.Add(1)
		go sh.run()
	})
	if h.ctx.Err() != nil {
		return nil, "", errHubStopped
	}
	sh.mu.Lock()
	t := sh.topics[cluster]
	if t == nil {
		sh.mu.Unlock()
		// A new topic starts at the stream's end (read outside the lock).
		end, err := h.store.EventCursor(ctx, cluster, "")
		if err != nil {
			return nil, "", err
		}
		sh.mu.Lock()
		if t = sh.topics[cluster]; t == nil { // nobody added it meanwhile
			t = &topic{last: end, subs: map[*subscription]struct{}{}}
			sh.topics[cluster] = t
			select {
			case sh.wake <- struct{}{}:
			default:
			}
		}
	}
	defer sh.mu.Unlock()
	if h.maxSubs > 0 && len(t.subs) >= h.maxSubs {
		return nil, "", errTooManyStreams
	}
	s := &subscription{shard: sh, cluster: cluster, topic: t, next: t.n(), notify: notify}
	t.subs[s] = struct{}{}
	return s, t.last, nil
}

// close ends the subscription; the hub stops reading a cluster no stream follows.
func (s *subscription) close() {
	sh := s.shard
	sh.mu.Lock()
	defer sh.mu.Unlock()
	delete(s.topic.subs, s)
	if len(s.topic.subs) == 0 && sh.topics[s.cluster] == s.topic {
		delete(sh.topics, s.cluster)
	}
}

// take appends the events the subscription has not taken yet to buf, in
// order. Its error, once every event was taken: errStreamBehind when the
// stream fell more than hubBacklog events behind, else why the hub stopped
// reading the cluster.
func (s *subscription) take(buf []*sseEvent) ([]*sseEvent, error) {
	t := s.topic
	s.shard.mu.RLock()
	defer s.shard.mu.RUnlock()
	if s.next < t.base {
		return buf, errStreamBehind
	}
	buf = append(buf, t.events[s.next-t.base:]...)
	s.next = t.n()
	return buf, t.err
}

// run reads the shard's streams until stop.
func (sh *hubShard) run() {
	h := sh.hub
	defer h.running.Done()
	first := backoff.Exponential(100*time.Millisecond, 5*time.Second)
	retry := first
	for h.ctx.Err() == nil {
		clusters, cursors := sh.positions()
		if len(clusters) == 0 {
			select {
			case <-sh.wake:
			case <-h.ctx.Done():
			}
			continue
		}
		events, err := h.store.ReadStreams(h.ctx, clusters, cursors, hubReadCount, h.block)
		if err != nil {
			if h.ctx.Err() != nil {
				break
			}
			// Its streams end with the error, as each did when it read alone:
			// the agents reconnect, and resynchronise from the lists.
			h.log.Error(err, "read event streams", "clusters", len(clusters))
			sh.end(clusters, err)
			select {
			case <-time.After(retry.Step()):
			case <-h.ctx.Done():
			}
			continue
		}
		retry = first
		sh.deliver(events)
	}
	sh.end(nil, errHubStopped)
}

// positions returns the clusters to read and where each read starts.
func (sh *hubShard) positions() (clusters, cursors []string) {
	sh.mu.Lock()
	defer sh.mu.Unlock()
	for c, t := range sh.topics {
		clusters, cursors = append(clusters, c), append(cursors, t.last)
	}
	return clusters, cursors
}

// deliver adds what one read returned to the topics, each event encoded once
// for all the streams of its cluster, and tells the streams.
func (sh *hubShard) deliver(events map[string][]model.Event) {
	sh.mu.Lock()
	defer sh.mu.Unlock()
	for cluster, evs := range events {
		t := sh.topics[cluster]
		if t == nil {
			continue // its last stream closed during the read
		}
		t.trim()
		added := false
		for i := range evs {
			// A topic added again during the read may start past what it returned.
			if compareStreamIDs(evs[i].ID, t.last) <= 0 {
				continue
			}
			t.events = append(t.events, encodeEvent(evs[i]))
			t.last = evs[i].ID
			added = true
		}
		if added {
			if backlog := len(t.events) - hubBacklog; backlog > 0 {
				t.drop(backlog) // a stream this far behind reconnects
			}
			t.notifyAll()
		}
	}
}

// end stops the topics of clusters (all: nil) with err; new streams of those
// clusters start new topics.
func (sh *hubShard) end(clusters []string, err error) {
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if clusters == nil {
		for c := range sh.topics {
			clusters = append(clusters, c)
		}
	}
	for _, c := range clusters {
		if t := sh.topics[c]; t != nil {
			t.err = err
			t.notifyAll()
			delete(sh.topics, c)
		}
	}
}

// trim drops the events every subscription has taken (one that fell
// behind is past helping).
func (t *topic) trim() {
	low := t.n()
	for s := range t.subs {
		if s.next >= t.base {
			low = min(low, s.next)
		}
	}
	t.drop(int(low - t.base))
}

// drop forgets the k oldest events.
func (t *topic) drop(k int) {
	clear(t.events[:k]) // the backing array keeps no frame alive
	t.events, t.base = t.events[k:], t.base+uint64(k)
}

func (t *topic) notifyAll() {
	for s := range t.subs {
		select {
		case s.notify <- struct{}{}:
		default: // it has a token already
		}
	}
}

// stop ends the reads (waiting for those in flight, at most block) and
// every subscription with errHubStopped.
func (h *eventHub) stop() {
	h.cancel()
	for _, sh := range h.shards {
		sh.start.Do(func() {}) // a shard not started yet never starts
	}
	h.running.Wait()
}

// compareStreamIDs orders two Redis stream ids (<ms>-<seq>, or <ms> for
// <ms>-0), which validStreamID accepted or Redis returned.
func compareStreamIDs(a, b string) int {
	am, as := splitStreamID(a)
	bm, bs := splitStreamID(b)
	if c := cmp.Compare(am, bm); c != 0 {
		return c
	}
	return cmp.Compare(as, bs)
}

func splitStreamID(id string) (ms, seq uint64) {
	m, s, _ := strings.Cut(id, "-")
	ms, _ = strconv.ParseUint(m, 10, 64)
	seq, _ = strconv.ParseUint(s, 10, 64)
	return ms, seq
}
