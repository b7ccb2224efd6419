package testbed

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fluidos-project/resource-broker/agent/publisher"
)

// Capacity is the brokers' accounting as stored: cluster id -> the fields of
// rb:{b}:cluster:<id>, without seen_ms (every advertisement moves it) and
// digest (it names the content, compared field by field), and with absent
// resv_* counted as "0" (they appear with the first reservation).
type Capacity map[string]map[string]string

// Capacity reads every rb:{b}:cluster:* hash.
func (b *Bed) Capacity(ctx context.Context) (Capacity, error) {
	keys, err := b.scan(ctx, b.Store.Key("cluster:*"))
	if err != nil {
		return nil, err
	}
	out := Capacity{}
	for _, k := range keys {
		m, err := b.RDB.HGetAll(ctx, k).Result()
		if err != nil {
			return nil, err
		}
		delete(m, "seen_ms")
		delete(m, "digest")
		for _, r := range []string{"cpu", "mem", "gpu", "sto"} {
			if _, ok := m["resv_"+r]; !ok {
				m["resv_"+r] = "0"
			}
		}
		out[strings.TrimPrefix(k, b.Store.Key("cluster:"))] = m
	}
	return out, nil
}

// BrokerNow is the brokers' clock: redis-server's TIME (Options.BrokerClockOffset
// moves it). Compare the times the broker stores (SeenAt, CreatedAt, ...) with
// it, never with this process's clock.
func (b *Bed) BrokerNow(ctx context.Context) (time.Time, error) {
	return b.RDB.Time(ctx).Result()
}

// Diff describes how c differs from want ("" when equal).
func (c Capacity) Diff(want Capacity) string {
	var d []string
	for id, w := range want {
		g, ok := c[id]
		if !ok {
			d = append(d, id+": missing")
			continue
		}
		if maps.Equal(g, w) {
			continue
		}
		for f, wv := range w {
			if g[f] != wv && !withinBand(f, g[f], wv, w) {
				d = append(d, fmt.Sprintf("%s.%s=%q, want %q", id, f, g[f], wv))
			}
		}
		for f, gv := range g {
			if _, ok := w[f]; !ok {
				d = append(d, fmt.Sprintf("%s.%s=%q, want absent", id, f, gv))
			}
		}
	}
	for id := range c {
		if _, ok := want[id]; !ok {
			d = append(d, id+": unexpected")
		}
	}
	return strings.Join(d, "; ")
}

// withinBand tells whether the stored used figure f, got, may stand for
// want: an agent sends its used cpu, memory and storage again only once
// they moved past publisher.DefaultBand of the allocatable (it heartbeats
// otherwise), so the broker may hold figures that old, by design.
func withinBand(f, got, want string, wantFields map[string]string) bool {
	r, ok := strings.CutPrefix(f, "used_")
	if !ok || r == "gpu" {
		return false
	}
	g, err1 := strconv.ParseFloat(got, 64)
	w, err2 := strconv.ParseFloat(want, 64)
	alloc, err3 := strconv.ParseFloat(wantFields["alloc_"+r], 64)
	if err1 != nil || err2 != nil || err3 != nil {
		return false
	}
	return math.Abs(g-w) <= publisher.DefaultBand*alloc
}

// LiveIndexes returns the size of every non-empty index of live
// reservations (rb:{b}:by-target:*, rb:{b}:by-requester:*, rb:{b}:expiry).
func (b *Bed) LiveIndexes(ctx context.Context) (map[string]int64, error) {
	out := map[string]int64{}
	for _, pattern := range []string{"by-target:*", "by-requester:*"} {
		keys, err := b.scan(ctx, b.Store.Key(pattern))
		if err != nil {
			return nil, err
		}
		for _, k := range keys {
			n, err := b.RDB.SCard(ctx, k).Result()
			if err != nil {
				return nil, err
			}
			if n > 0 {
				out[k] = n
			}
		}
	}
	n, err := b.RDB.ZCard(ctx, b.Store.Key("expiry")).Result()
	if err != nil {
		return nil, err
	}
	if n > 0 {
		out[b.Store.Key("expiry")] = n
	}
	return out, nil
}

// AuditEntry is one decision of rb:{b}:audit.
type AuditEntry struct {
	ID     string
	Fields map[string]string
}

// Audit reads the whole audit stream.
func (b *Bed) Audit(ctx context.Context) ([]AuditEntry, error) {
	msgs, err := b.RDB.XRange(ctx, b.Store.Key("audit"), "-", "+").Result()
	if err != nil {
		return nil, err
	}
	out := make([]AuditEntry, 0, len(msgs))
	for _, m := range msgs {
		f := make(map[string]string, len(m.Values))
		for k, v := range m.Values {
			f[k] = fmt.Sprint(v)
		}
		out = append(out, AuditEntry{ID: m.ID, Fields: f})
	}
	return out, nil
}

func (b *Bed) scan(ctx context.Context, pattern string) ([]string, error) {
	var keys []string
	iter := b.RDB.Scan(ctx, 0, pattern, 1000).Iterator()
	for iter.Next(ctx) {
		keys = append(keys, iter.Val())
	}
	if err := iter.Err(); err != nil && !errors.Is(err, redis.Nil) {
		return nil, err
	}
	return keys, nil
}
