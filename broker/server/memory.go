package server

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/fluidos-project/resource-broker/broker/store"
)

// redisMemoryMaxAge is how old a reading of Redis' memory may be when
// /readyz or a scrape shows it: every replica's probes and scrapes need not
// each send an INFO.
const redisMemoryMaxAge = 5 * time.Second

// redisNearFull is the share of maxmemory from which /readyz warns. It
// warns only: every replica shares the one Redis, so failing readiness
// would take them all out of their Service at once, while Redis still takes
// writes. At maxmemory itself the write probe fails, and so does /readyz.
const redisNearFull = 0.95

// redisMemory is the last reading of how far Redis is from its maxmemory
// (store.RedisMemory), read again when older than redisMemoryMaxAge. With
// cells on a Redis Cluster each cell's primary is read, and the reading is
// the fullest one's: the first to refuse writes.
type redisMemory struct {
	stores []*store.Store // every cell's (one without cells)
	names  []string       // the cells' names, as stores (none without cells)
	log    logr.Logger

	mu   sync.Mutex
	at   time.Time
	last store.RedisMemory
	cell string // the cell whose primary is the fullest (with cells)
	err  error
	near bool // the last reading was at redisNearFull or more
}

// read returns the last reading, or a new one when it is too old.
func (r *redisMemory) read(ctx context.Context) (store.RedisMemory, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.at.IsZero() && time.Since(r.at) < redisMemoryMaxAge {
		return r.last, r.err
	}
	failing := r.err != nil
	r.last, r.cell, r.err = r.fullest(ctx)
	r.at = time.Now()
	if r.err != nil {
		if !failing { // once, not at every reading
			r.log.Error(r.err, "Cannot read Redis memory (INFO memory): /readyz and rb_broker_redis_memory_* cannot say how far Redis is from maxmemory")
		}
		return r.last, r.err
	}
	if near := r.last.Max > 0 && r.last.Share() >= redisNearFull; near != r.near {
		r.near = near
		r.log.Info("Redis memory", "nearMaxmemory", near, "usedBytes", r.last.Used, "maxmemoryBytes", r.last.Max,
			"share", fmt.Sprintf("%.3f", r.last.Share()), "warnAt", redisNearFull, "cell", r.cell)
	}
	return r.last, nil
}

// fullest reads every store's Redis and returns the reading nearest its
// maxmemory (without one anywhere, the largest), with its cell's name.
func (r *redisMemory) fullest(ctx context.Context) (store.RedisMemory, string, error) {
	var best store.RedisMemory
	var cell string
	for i, st := range r.stores {
		name := ""
		if i < len(r.names) {
			name = r.names[i]
		}
		m, err := st.RedisMemory(ctx)
		if err != nil {
			if name != "" {
				err = fmt.Errorf("cell %s: %w", name, err)
			}
			return store.RedisMemory{}, "", err
		}
		if i == 0 || m.Share() > best.Share() || (m.Share() == best.Share() && m.Used > best.Used) {
			best, cell = m, name
		}
	}
	return best, cell, nil
}

// describe is /readyz's line about Redis' memory.
func (r *redisMemory) describe(ctx context.Context) string {
	m, err := r.read(ctx)
	line := describeRedisMemory(m, err)
	if err == nil && len(r.stores) > 1 {
		r.mu.Lock()
		cell := r.cell
		r.mu.Unlock()
		line += fmt.Sprintf(" (the primary of cell %s, the fullest of %d cells)", cell, len(r.stores))
	}
	return line
}

// describeRedisMemory is the line about one reading.
func describeRedisMemory(m store.RedisMemory, err error) string {
	mib := func(b int64) string { return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20)) }
	switch {
	case err != nil:
		return "redis memory: unknown (" + err.Error() + ")"
	case m.Max <= 0:
		return "redis memory: " + mib(m.Used) + " used, no maxmemory (unlimited)"
	}
	line := fmt.Sprintf("redis memory: %s used of maxmemory %s (%.1f%%), %s headroom", mib(m.Used), mib(m.Max), 100*m.Share(), mib(m.Headroom()))
	if m.Share() >= redisNearFull {
		line = "warning: " + line + "; near maxmemory, where Redis refuses every write"
	}
	return line
}

// redisMemoryCollector reports the reading at scrape time.
type redisMemoryCollector struct{ memory *redisMemory }

var (
	redisUsedDesc = prometheus.NewDesc("rb_broker_redis_memory_used_bytes",
		"Memory Redis counts against its maxmemory (INFO memory: used_memory less mem_not_counted_for_evict), read at most every 5s.", nil, nil)
	redisMaxDesc = prometheus.NewDesc("rb_broker_redis_maxmemory_bytes",
		"Redis' maxmemory, past which it refuses every write (noeviction); 0: none set (unlimited).", nil, nil)
	redisHeadroomDesc = prometheus.NewDesc("rb_broker_redis_memory_headroom_bytes",
		"How much more memory Redis takes before it refuses every write (maxmemory less used); absent without a maxmemory (unlimited).", nil, nil)
)

func (c *redisMemoryCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- redisUsedDesc
	ch <- redisMaxDesc
	ch <- redisHeadroomDesc
}

func (c *redisMemoryCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	m, err := c.memory.read(ctx)
	if err != nil {
		ch <- prometheus.NewInvalidMetric(redisUsedDesc, err)
		return
	}
	ch <- prometheus.MustNewConstMetric(redisUsedDesc, prometheus.GaugeValue, float64(m.Used))
	ch <- prometheus.MustNewConstMetric(redisMaxDesc, prometheus.GaugeValue, float64(m.Max))
	if m.Max > 0 {
		ch <- prometheus.MustNewConstMetric(redisHeadroomDesc, prometheus.GaugeValue, float64(m.Headroom()))
	}
}
