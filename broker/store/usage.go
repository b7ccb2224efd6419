package store

import (
	"context"
	"slices"
	"strconv"

	"github.com/redis/go-redis/v9"

	"github.com/fluidos-project/resource-broker/broker/model"
)

// Usage returns what each requester holding live reservations holds (the
// figures its limits are checked against).
func (s *Store) Usage(ctx context.Context) (map[string]model.Usage, error) {
	m, err := s.rdb.HGetAll(ctx, s.Key("usage")).Result()
	if err != nil {
		return nil, err
	}
	out := make(map[string]model.Usage, len(m))
	for requester, v := range m {
		a := amountsOf(v)
		out[requester] = model.Usage{Reservations: atoi(a["n"]), Resources: resourcesFrom(a, "")}
	}
	return out, nil
}

// EndedReservations returns how many ended reservations each requester has
// kept (readable until the retention, at most Config.MaxEndedPerMember;
// scripts/lib/ended.lua); a requester with none is absent.
func (s *Store) EndedReservations(ctx context.Context) (map[string]int64, error) {
	now, err := s.rdb.Time(ctx).Result()
	if err != nil {
		return nil, err
	}
	// Past the edge, a record has expired; expire.lua trims what is older.
	edge := "(" + strconv.FormatInt(now.Add(-s.cfg.Retention).UnixMilli(), 10)
	requesters, err := s.rdb.ZRangeByScore(ctx, s.Key("ended-requesters"), &redis.ZRangeBy{Min: edge, Max: "+inf"}).Result()
	if err != nil {
		return nil, err
	}
	pipe := s.rdb.Pipeline()
	counts := make([]*redis.IntCmd, len(requesters))
	for i, r := range requesters {
		counts[i] = pipe.ZCount(ctx, s.Key("ended:", r), edge, "+inf")
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return nil, err
	}
	out := make(map[string]int64, len(requesters))
	for i, r := range requesters {
		if n := counts[i].Val(); n > 0 {
			out[r] = n
		}
	}
	return out, nil
}

// MemberUsage is what one member holds as a requester: its live reservations
// (Usage), the ended ones kept (Ended) and its limits (Config.Policy's; none
// without a policy).
type MemberUsage struct {
	Cluster string
	Usage   model.Usage
	Ended   int64
	Limits  model.Limits
}

// MemberUsages lists what each member holds as a requester, in id order:
// the members holding live or ended reservations, those with limits of
// their own and every advertised cluster (GET /api/v2/usage, the
// dashboard's usage page).
func (s *Store) MemberUsages(ctx context.Context) ([]MemberUsage, error) {
	usage, err := s.Usage(ctx)
	if err != nil {
		return nil, err
	}
	ended, err := s.EndedReservations(ctx)
	if err != nil {
		return nil, err
	}
	ids, err := s.ClusterIDs(ctx)
	if err != nil {
		return nil, err
	}
	if s.cfg.Policy != nil {
		ids = append(ids, s.cfg.Policy.Clusters()...)
	}
	for id := range usage {
		ids = append(ids, id)
	}
	for id := range ended {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	ids = slices.Compact(ids)
	out := make([]MemberUsage, 0, len(ids))
	for _, id := range ids {
		m := MemberUsage{Cluster: id, Usage: usage[id], Ended: ended[id]}
		if s.cfg.Policy != nil {
			m.Limits = s.cfg.Policy.Limits(id)
		}
		out = append(out, m)
	}
	return out, nil
}
