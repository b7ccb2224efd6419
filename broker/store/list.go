package store

import (
	"context"
	"slices"

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
