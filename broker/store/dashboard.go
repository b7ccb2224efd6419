package store

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// What the dashboard reads and writes, so that it names no key and sends no
// command itself: the audit stream, the clusters' event streams (to wake on
// any change) and the capacity history it samples.

// historyKey is the capacity history: a stream, one entry per sample
// interval, the entry id the interval's start on the Redis clock.
const historyKey = "dashboard:capacity"

// Now is the Redis clock, which every time the broker stores is on.
func (s *Store) Now(ctx context.Context) (time.Time, error) {
	return s.rdb.Time(ctx).Result()
}

// AuditBefore returns up to n audit entries, newest first, from end on:
// "+" for the newest, "(<id>" for those older than id.
func (s *Store) AuditBefore(ctx context.Context, end string, n int64) ([]redis.XMessage, error) {
	return s.rdb.XRevRangeN(ctx, s.Key("audit"), end, "-", n).Result()
}

// WaitForChange waits up to block for a new entry in the audit stream or
// the event stream of any known cluster, advancing cursors (stream ->
// last id seen; a stream not read before starts at start). It reports
// whether anything new came.
func (s *Store) WaitForChange(ctx context.Context, cursors map[string]string, start string, block time.Duration) (bool, error) {
	ids, err := s.ClusterIDs(ctx)
	if err != nil {
		return false, err
	}
	keys := []string{s.Key("audit")}
	for _, id := range ids {
		keys = append(keys, s.Key("events:", id))
	}
	streams := make([]string, 0, 2*len(keys))
	streams = append(streams, keys...)
	for _, k := range keys {
		c, ok := cursors[k]
		if !ok {
			c = start
		}
		streams = append(streams, c)
	}
	res, err := s.rdb.XRead(ctx, &redis.XReadArgs{Streams: streams, Count: 100, Block: block}).Result()
	if errors.Is(err, redis.Nil) {
		for _, k := range keys {
			if _, ok := cursors[k]; !ok {
				cursors[k] = start
			}
		}
		return false, nil
	}
	if err != nil {
		return false, err
	}
	for _, st := range res {
		if n := len(st.Messages); n > 0 {
			cursors[st.Stream] = st.Messages[n-1].ID
		}
	}
	return len(res) > 0, nil
}

// AddCapacitySample stores the sample of the interval starting at bucket,
// keeping about keep entries. Every replica samples; a second sample of the
// same interval is refused by XADD (ids only grow), so the replicas share
// one history: that is not an error.
func (s *Store) AddCapacitySample(ctx context.Context, bucket time.Time, keep int64, values []any) error {
	err := s.rdb.XAdd(ctx, &redis.XAddArgs{
		Stream: s.Key(historyKey), ID: strconv.FormatInt(bucket.UnixMilli(), 10) + "-0",
		MaxLen: keep, Approx: true, Values: values,
	}).Err()
	if err != nil && strings.Contains(err.Error(), "equal or smaller") {
		return nil
	}
	return err
}

// CapacitySamples returns up to n samples taken since from, newest first.
func (s *Store) CapacitySamples(ctx context.Context, from time.Time, n int64) ([]redis.XMessage, error) {
	msgs, err := s.rdb.XRevRangeN(ctx, s.Key(historyKey), "+", strconv.FormatInt(from.UnixMilli(), 10), n).Result()
	if errors.Is(err, redis.Nil) {
		return nil, nil
	}
	return msgs, err
}
