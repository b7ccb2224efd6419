package store

import (
	"context"
	"errors"
	"strings"
	"time"

	"github.com/fluidos-project/resource-broker/broker/model"
	"github.com/redis/go-redis/v9"
)

// EventCursor resolves where a reader starts on a cluster's stream: since as
// given ("0" = everything retained), or the current end when since is "" or "$"
// (only new events). Returned cursors are concrete ids, so no event is lost
// between two reads.
func (s *Store) EventCursor(ctx context.Context, cluster, since string) (string, error) {
	if since != "" && since != "$" {
		return since, nil
	}
	last, err := s.rdb.XRevRangeN(ctx, s.Key("events:", cluster), "+", "-", 1).Result()
	if err != nil {
		return "", err
	}
	if len(last) == 0 {
		return "0-0", nil
	}
	return last[0].ID, nil
}

// ReadEvents returns up to count events after cursor, waiting up to block for
// the first one (0: don't wait). An empty slice means none arrived in time.
func (s *Store) ReadEvents(ctx context.Context, cluster, cursor string, count int64, block time.Duration) ([]model.Event, error) {
	args := &redis.XReadArgs{Streams: []string{s.Key("events:", cluster), cursor}, Count: count, Block: block}
	if block <= 0 {
		args.Block = -1 // go-redis: negative means no BLOCK argument
	}
	streams, err := s.rdb.XRead(ctx, args).Result()
	if errors.Is(err, redis.Nil) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []model.Event
	for _, st := range streams {
		for _, m := range st.Messages {
			out = append(out, eventFromMessage(m))
		}
	}
	return out, nil
}

// ReadStreams reads the event streams of several clusters in one XREAD:
// up to count events of each after its cursor (cursors[i] for clusters[i]),
// waiting up to block for the first (0: not at all). It returns the events by
// cluster; none arrived in time: an empty map.
func (s *Store) ReadStreams(ctx context.Context, clusters, cursors []string, count int64, block time.Duration) (map[string][]model.Event, error) {
	streams := make([]string, 0, 2*len(clusters))
	for _, c := range clusters {
		streams = append(streams, s.Key("events:", c))
	}
	streams = append(streams, cursors...)
	args := &redis.XReadArgs{Streams: streams, Count: count, Block: block}
	if block <= 0 {
		args.Block = -1
	}
	res, err := s.rdb.XRead(ctx, args).Result()
	if errors.Is(err, redis.Nil) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	out := make(map[string][]model.Event, len(res))
	prefix := s.Key("events:")
	for _, st := range res {
		events := make([]model.Event, len(st.Messages))
		for i, m := range st.Messages {
			events[i] = eventFromMessage(m)
		}
		out[strings.TrimPrefix(st.Stream, prefix)] = events
	}
	return out, nil
}

func eventFromMessage(m redis.XMessage) model.Event {
	str := func(k string) string { v, _ := m.Values[k].(string); return v }
	e := model.Event{
		ID:          m.ID,
		Type:        str("type"),
		Reservation: str("reservation"),
		Requester:   str("requester"),
		Provider:    str("provider"),
		Phase:       str("phase"),
		Resources:   model.Resources{CPU: atoi(str("cpu")), Memory: atoi(str("mem")), GPU: atoi(str("gpu")), Storage: atoi(str("sto"))},
		ExpiresAt:   msTime(atoi(str("expires_ms"))),
		Remaining:   time.Duration(atoi(str("remaining_ms"))) * time.Millisecond,
		Node:        str("node"),
	}
	if by := str("by"); by != "" {
		e.PreemptedBy = str("by_requester") + "/" + by
	}
	return e
}
