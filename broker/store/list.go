package store

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"

	"github.com/fluidos-project/resource-broker/broker/model"
)

// Sets of live reservations, by role of the cluster that names them.
const (
	ByRequester = "by-requester"
	ByTarget    = "by-target"
)

// ScanPos is where a paginated listing of a set of live reservations
// resumes; the zero ScanPos is the beginning. Cursor is Redis' SSCAN cursor. A page can end inside the batch one SSCAN step returns (a
// step returns about as many ids as asked, and a small set whole): After
// then names the last id returned, the batch being sorted, and Next the
// cursor that step returned. The next page scans from Cursor again and
// skips the ids up to After only if the step returns Next again, i.e. it
// covered the same buckets, so every id it skips was returned before.
// Otherwise (the set was resized in between) it skips nothing: an id may be
// listed twice, none is missed.
type ScanPos struct {
	Cursor uint64
	After  string
	Next   uint64
}

// maxScanSteps bounds the SSCAN calls of one page: a set that rehashing left
// sparse answers a step with few ids, and a page stops short rather than
// scan on.
const maxScanSteps = 16

// ScanLive returns up to limit qualified ids of the live reservations in set
// (ByRequester or ByTarget) of cluster from pos on, where the next page
// resumes, and whether anything is left. Every id in the set from the first
// page to the last is returned at least once (SSCAN's guarantee); one added
// or removed meanwhile may or may not be. Each page reads about limit ids
// from Redis, whatever the size of the set.
func (s *Store) ScanLive(ctx context.Context, set, cluster string, pos ScanPos, limit int) (qids []string, next ScanPos, more bool, err error) {
	key := s.Key(set, ":", cluster)
	for step := 0; step < maxScanSteps; step++ {
		batch, cursor, err := s.rdb.SScan(ctx, key, pos.Cursor, "", int64(limit)).Result()
		if err != nil {
			return nil, ScanPos{}, false, err
		}
		slices.Sort(batch)
		batch = slices.Compact(batch) // a step may return an id twice while Redis rehashes
		if pos.After != "" && cursor == pos.Next {
			i, found := slices.BinarySearch(batch, pos.After)
			if found {
				i++
			}
			batch = batch[i:]
		}
		if room := limit - len(qids); len(batch) > room {
			qids = append(qids, batch[:room]...)
			return qids, ScanPos{Cursor: pos.Cursor, After: qids[len(qids)-1], Next: cursor}, true, nil
		}
		qids = append(qids, batch...)
		if cursor == 0 {
			return qids, ScanPos{}, false, nil
		}
		pos = ScanPos{Cursor: cursor}
		if len(qids) == limit {
			break
		}
	}
	return qids, pos, true, nil
}

// Reservations reads reservations by qualified id in one pipeline; those
// that are gone are left out.
func (s *Store) Reservations(ctx context.Context, qids []string) ([]model.Reservation, error) {
	return s.reservations(ctx, qids)
}

// ClustersPage returns up to limit clusters, live or stale, in id order
// after the id after ("" from the first), and the id the next page starts
// after ("" when this page is the last). Only the page's clusters are read
// in full; the ids of all are read to order them (one sorted set, as long as
// the federation, which the operator sizes).
func (s *Store) ClustersPage(ctx context.Context, after string, limit int) ([]model.Cluster, string, error) {
	ids, err := s.rdb.ZRange(ctx, s.Key("clusters"), 0, -1).Result()
	if err != nil {
		return nil, "", err
	}
	slices.Sort(ids)
	i, found := slices.BinarySearch(ids, after)
	if found {
		i++
	}
	ids, next := ids[i:], ""
	if len(ids) > limit {
		ids = ids[:limit]
		next = ids[limit-1]
	}
	out, err := s.readClusters(ctx, ids) // in the order of ids
	return out, next, err
}

// Reservation reads reservation id of requester (ids are scoped per requester).
func (s *Store) Reservation(ctx context.Context, requester, id string) (model.Reservation, error) {
	rs, err := s.reservations(ctx, []string{model.QualifiedID(requester, id)})
	if err != nil {
		return model.Reservation{}, err
	}
	if len(rs) == 0 {
		return model.Reservation{}, ErrNotFound
	}
	return rs[0], nil
}

// LiveReservations returns the live reservations whose target (role "by-target")
// or requester (role "by-requester") is cluster.
func (s *Store) LiveReservations(ctx context.Context, role, cluster string) ([]model.Reservation, error) {
	qids, err := s.rdb.SMembers(ctx, s.Key(role, ":", cluster)).Result()
	if err != nil {
		return nil, err
	}
	return s.reservations(ctx, qids)
}

// reservations reads reservations by qualified id, in one pipeline with the
// Redis clock (TIME) for their remaining time; those gone are left out.
// A live reservation's end is its expiry score (renewals move only that),
// or later while its requester's renewal set covers it (coveredEnd,
// scripts/lib/core.lua with_live_end), read first: a record then read live
// was live at that read too, and one ended between the two has its last end.
func (s *Store) reservations(ctx context.Context, qids []string) ([]model.Reservation, error) {
	if len(qids) == 0 {
		return []model.Reservation{}, nil
	}
	pipe := s.rdb.Pipeline()
	ends := pipe.ZMScore(ctx, s.Key("expiry"), qids...)
	cmds := make([]*redis.MapStringStringCmd, len(qids))
	entries := make([]*redis.StringCmd, len(qids))
	sets := map[string]*redis.SliceCmd{}
	for i, qid := range qids {
		cmds[i] = pipe.HGetAll(ctx, s.Key("resv:", qid))
		if requester, _, ok := model.SplitQualifiedID(qid); ok {
			entries[i] = pipe.HGet(ctx, s.Key("leases:", requester), qid)
			if sets[requester] == nil {
				sets[requester] = pipe.HMGet(ctx, s.Key("renewal:", requester), "gen", "at_ms")
			}
		}
	}
	now := pipe.Time(ctx)
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return nil, err
	}
	nowMs := now.Val().UnixMilli()
	records := make([]map[string]string, len(qids))
	for i, cmd := range cmds {
		records[i] = cmd.Val()
	}
	if err := s.withAccesses(ctx, records); err != nil {
		return nil, err
	}
	out := make([]model.Reservation, 0, len(qids))
	for i, cmd := range cmds {
		if len(cmd.Val()) == 0 {
			continue // ended and gone between the two reads
		}
		_, id, ok := model.SplitQualifiedID(qids[i])
		if !ok {
			return nil, fmt.Errorf("reservation key %q has no requester", qids[i])
		}
		m := cmd.Val()
		if score := ends.Val()[i]; score > 0 && (m["phase"] == model.PhaseReserved || m["phase"] == model.PhaseActive) {
			// A parked lease (+inf: scripts/expire.lua) ends as its set has it.
			end := int64(0)
			if !math.IsInf(score, 1) {
				end = int64(score)
			}
			if entries[i] != nil {
				end = coveredEnd(end, entries[i].Val(), sets[m["requester"]])
			}
			if end > 0 {
				m["expires_ms"] = strconv.FormatInt(end, 10)
			}
		}
		r, err := s.readReservation(id, m, nowMs)
		if err != nil {
			return nil, err
		}
		out = append(out, r)
	}
	return out, nil
}

// readReservation reads a reservation hash (reservationFromMap) and opens its
// grant: the access of its pair (field "access", which the reader adds:
// scripts/lib/grants.lua with_access, Store.withAccesses) with the record's
// placement. A record granted by a broker of the previous release holds its
// own sealed grant instead; one that a replica of that release granted again
// during a rolling update holds both, its own the newer.
func (s *Store) readReservation(id string, m map[string]string, nowMs int64) (model.Reservation, error) {
	r, err := reservationFromMap(id, m, nowMs)
	if err != nil {
		return r, err
	}
	if len(r.Grant) > 0 {
		r.Grant, err = s.cfg.GrantKeys.open(r.QID(), string(r.Grant))
		return r, err
	}
	if access := m["access"]; access != "" {
		plain, err := s.cfg.GrantKeys.openAccess(r.Target, r.Requester, access)
		if err != nil {
			return r, err
		}
		r.Grant, err = composeGrant(plain, m)
		return r, err
	}
	return r, nil
}

// Cluster reads one cluster, its nodes included.
func (s *Store) Cluster(ctx context.Context, id string) (model.Cluster, error) {
	cs, err := s.readClusters(ctx, []string{id})
	if err != nil {
		return model.Cluster{}, err
	}
	if len(cs) == 0 {
		return model.Cluster{}, ErrNotFound
	}
	return cs[0], nil
}

// readClusters reads the keys of clusters (cluster, nodes, node debits and
// listed reservations) in one pipeline with the Redis clock, which judges
// Live; a cluster without a hash is left out.
func (s *Store) readClusters(ctx context.Context, ids []string) ([]model.Cluster, error) {
	pipe := s.rdb.Pipeline()
	cmds := make([][3]*redis.MapStringStringCmd, len(ids))
	listed := make([]*redis.StringSliceCmd, len(ids))
	for i, id := range ids {
		cmds[i] = [3]*redis.MapStringStringCmd{
			pipe.HGetAll(ctx, s.Key("cluster:", id)), pipe.HGetAll(ctx, s.Key("nodes:", id)), pipe.HGetAll(ctx, s.Key("node-resv:", id)),
		}
		listed[i] = pipe.SMembers(ctx, s.Key("node-listed:", id))
	}
	now := pipe.Time(ctx)
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return nil, err
	}
	edge := now.Val().Add(-s.cfg.StaleThreshold)
	out := make([]model.Cluster, 0, len(ids))
	for i, cmd := range cmds {
		if len(cmd[0].Val()) == 0 {
			continue
		}
		c, err := clusterFromMap(ids[i], cmd[0].Val())
		if err != nil {
			return nil, err
		}
		c.Live = !c.SeenAt.Before(edge)
		c = withNodes(c, cmd[1].Val(), cmd[2].Val())
		if l := listed[i].Val(); len(l) > 0 {
			c.ReservationsOnNodes = l
			slices.Sort(c.ReservationsOnNodes)
		}
		out = append(out, c)
	}
	return out, nil
}

// ClusterIDs lists every known cluster, live or stale, in id order.
func (s *Store) ClusterIDs(ctx context.Context) ([]string, error) {
	ids, err := s.rdb.ZRange(ctx, s.Key("clusters"), 0, -1).Result()
	if err != nil {
		return nil, err
	}
	slices.Sort(ids)
	return ids, nil
}

// Clusters reads every known cluster, live or stale, in id order.
func (s *Store) Clusters(ctx context.Context) ([]model.Cluster, error) {
	ids, err := s.rdb.ZRange(ctx, s.Key("clusters"), 0, -1).Result()
	if err != nil {
		return nil, err
	}
	out, err := s.readClusters(ctx, ids)
	if err != nil {
		return nil, err
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out, nil
}

// CountClusters returns how many clusters are live and stale now (Redis clock).
func (s *Store) CountClusters(ctx context.Context) (live, stale int64, err error) {
	t, err := s.rdb.Time(ctx).Result()
	if err != nil {
		return 0, 0, err
	}
	edge := strconv.FormatInt(t.Add(-s.cfg.StaleThreshold).UnixMilli(), 10)
	pipe := s.rdb.Pipeline()
	liveCmd := pipe.ZCount(ctx, s.Key("clusters"), edge, "+inf")
	staleCmd := pipe.ZCount(ctx, s.Key("clusters"), "-inf", "("+edge)
	if _, err := pipe.Exec(ctx); err != nil {
		return 0, 0, err
	}
	return liveCmd.Val(), staleCmd.Val(), nil
}

// coveredEnd is a live lease's end given its expiry score (0: parked), its
// leases entry and its requester's renewal set (gen, at_ms), as
// scripts/lib/core.lua covered_end has it: a lease after the set's last
// renewal when the set covers it, else the score.
func coveredEnd(score int64, entry string, set *redis.SliceCmd) int64 {
	fields := strings.Fields(entry)
	if len(fields) != 3 || set == nil || len(set.Val()) != 2 || set.Val()[0] != fields[2] {
		return score
	}
	lease, err1 := strconv.ParseInt(fields[0], 10, 64)
	at, err2 := strconv.ParseInt(fmt.Sprint(set.Val()[1]), 10, 64)
	if err1 != nil || err2 != nil {
		return score
	}
	return max(score, at+lease)
}
