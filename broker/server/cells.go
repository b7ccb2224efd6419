package server

import (
	"context"
	"errors"
	"time"

	"github.com/fluidos-project/resource-broker/broker/model"
	"github.com/fluidos-project/resource-broker/broker/store"
)

// A federation split into cells (Config.Cells) keeps each cell's state
// under its own prefix. A member's calls go to its cell, the one its last
// advertisement went to (store.Cells.CellOf its labels); a member that never
// advertised is in the default cell. Each replica keeps the member -> cell
// map in memory: built at start from every cell's clusters, updated by the
// advertisements it serves, looked up in Redis for a member it does not
// know yet, and rebuilt every memberCellsRefresh (another replica may have
// served a member's move).
//
// A reservation lives in the cell that decided it: its requester's, or,
// asked of every cell (cells: all), the cell of its provider. So the calls
// on one reservation (get, release, grant) find its cell first
// (store.Cells.Find), renewals try the caller's cell and then the others
// for the ids it does not hold, a provider's reservations (its list,
// v1 instructions, protections) are in its own cell, and a member's event
// stream follows its events in every cell (events.go).

// memberCellsRefresh is how often a replica rebuilds its member -> cell
// map: how late it may see a member's move to another cell that another
// replica served.
const memberCellsRefresh = 30 * time.Second

// memberCell is a member's cell as a replica remembers it: advertised,
// the cell of its latest advertisement; else the default cell, looked up
// again at the next rebuild.
type memberCell struct {
	cell       string
	advertised bool
}

// cellOf is the cell of member (one cell: "").
func (s *Server) cellOf(ctx context.Context, member string) string {
	if s.cells == nil {
		return ""
	}
	if v, ok := s.memberCells.Load(member); ok {
		return v.(memberCell).cell
	}
	mc := memberCell{cell: s.cells.Default()}
	if found, err := s.findMember(ctx, member); err == nil && found != "" {
		mc = memberCell{cell: found, advertised: true}
	}
	s.memberCells.Store(member, mc)
	return mc.cell
}

// storeOf is the store of member's cell.
func (s *Server) storeOf(ctx context.Context, member string) *store.Store {
	if s.cells == nil {
		return s.store
	}
	return s.cells.Cell(s.cellOf(ctx, member))
}

// streamCells are the cells an event stream follows, sorted: with one cell,
// the one "".
func (s *Server) streamCells() []string {
	if s.cells == nil {
		return []string{""}
	}
	return s.cells.Names()
}

// subscribeCells subscribes member's event stream to the hub of each of
// cells (streamCells), all notifying notify. An error closes those opened.
func (s *Server) subscribeCells(ctx context.Context, member string, cells []string, notify chan struct{}) ([]*cellFeed, error) {
	feeds := make([]*cellFeed, 0, len(cells))
	for _, cell := range cells {
		hub, st := s.hub, s.store
		if s.cells != nil {
			hub, st = s.hubs[cell], s.cells.Cell(cell)
		}
		sub, start, err := hub.subscribe(ctx, member, notify)
		if err != nil {
			for _, f := range feeds {
				f.sub.close()
			}
			return nil, err
		}
		feeds = append(feeds, &cellFeed{cell: cell, store: st, sub: sub, start: start})
	}
	return feeds, nil
}

// stores are the stores of every cell.
func (s *Server) stores() []*store.Store {
	if s.cells == nil {
		return []*store.Store{s.store}
	}
	out := make([]*store.Store, 0, len(s.cells.Names()))
	for _, n := range s.cells.Names() {
		out = append(out, s.cells.Cell(n))
	}
	return out
}

// storeHolding is the store of the cell that holds requester's reservation
// id; none holds it: the caller's, whose answer is then the usual one.
func (s *Server) storeHolding(ctx context.Context, caller, requester, id string) (*store.Store, error) {
	if s.cells == nil {
		return s.store, nil
	}
	cell, err := s.cells.Find(ctx, requester, id)
	switch {
	case err == nil:
		return s.cells.Cell(cell), nil
	case errors.Is(err, store.ErrNotFound):
		return s.storeOf(ctx, caller), nil
	}
	return nil, err
}

// advertiseIn stores an advertisement in its cell and remembers the
// member's cell. A member whose label moves it to another cell goes stale
// in the old one: its live reservations there stay there, found by their
// calls as before, until they end.
func (s *Server) advertiseIn(ctx context.Context, id string, ad model.Advertisement) (model.Ack, error) {
	if s.cells == nil {
		return s.store.Advertise(ctx, id, ad)
	}
	ack, cell, err := s.cells.Advertise(ctx, id, ad)
	if err != nil {
		return ack, err
	}
	if old, ok := s.memberCells.Swap(id, memberCell{cell: cell, advertised: true}); ok && old.(memberCell).advertised && old.(memberCell).cell != cell {
		s.log.Info("member moved to another cell: its live reservations stay in the old one until they end", "cluster", id, "from", old.(memberCell).cell, "to", cell)
	}
	return ack, nil
}

// findMember is the cell that holds member's latest advertisement, "" if
// none does.
func (s *Server) findMember(ctx context.Context, member string) (string, error) {
	best, bestSeen := "", time.Time{}
	for _, n := range s.cells.Names() {
		c, err := s.cells.Cell(n).Cluster(ctx, member)
		if errors.Is(err, store.ErrNotFound) {
			continue
		}
		if err != nil {
			return "", err
		}
		if best == "" || c.SeenAt.After(bestSeen) {
			best, bestSeen = n, c.SeenAt
		}
	}
	return best, nil
}

// loadMemberCells rebuilds the member -> cell map from every cell's
// clusters: a member advertised in several cells (it moved) is in the one
// of its latest advertisement.
func (s *Server) loadMemberCells(ctx context.Context) error {
	if s.cells == nil {
		return nil
	}
	seen := map[string]string{}
	moved := map[string]bool{}
	for _, n := range s.cells.Names() {
		ids, err := s.cells.Cell(n).ClusterIDs(ctx)
		if err != nil {
			return err
		}
		for _, id := range ids {
			if _, ok := seen[id]; ok {
				moved[id] = true
			}
			seen[id] = n
		}
	}
	for id := range moved {
		cell, err := s.findMember(ctx, id)
		if err != nil {
			return err
		}
		seen[id] = cell
	}
	s.memberCells.Range(func(k, _ any) bool {
		if _, ok := seen[k.(string)]; !ok {
			s.memberCells.Delete(k) // forgotten, or never advertised: looked up again
		}
		return true
	})
	for id, cell := range seen {
		s.memberCells.Store(id, memberCell{cell: cell, advertised: true})
	}
	return nil
}

// refreshMemberCells rebuilds the member -> cell map every
// memberCellsRefresh until ctx ends.
func (s *Server) refreshMemberCells(ctx context.Context) {
	t := time.NewTicker(memberCellsRefresh)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if err := s.loadMemberCells(ctx); err != nil && ctx.Err() == nil {
			s.log.Error(err, "rebuild the members' cells")
		}
	}
}

// forgetEverywhere forgets cluster id in every cell that holds it (one it
// moved out of keeps its stale advertisement): store.ErrNotFound when none
// does, the first other error (a conflict: live reservations name it).
func (s *Server) forgetEverywhere(ctx context.Context, id string) error {
	if s.cells == nil {
		return s.store.Forget(ctx, id)
	}
	forgotten := false
	for _, st := range s.stores() {
		err := st.Forget(ctx, id)
		if errors.Is(err, store.ErrNotFound) {
			continue
		}
		if err != nil {
			return err
		}
		forgotten = true
	}
	if !forgotten {
		return store.ErrNotFound
	}
	s.memberCells.Delete(id)
	return nil
}

// renewIn renews ids with renew in the store of the caller's cell, then,
// with cells, those it does not hold in the other cells in turn (a
// reservation decided across cells lives in its provider's).
func (s *Server) renewIn(ctx context.Context, caller, requester string, ids []string,
	renew func(*store.Store, context.Context, string, []string) ([]model.Renewal, error)) ([]model.Renewal, error) {
	home := s.storeOf(ctx, caller)
	out, err := renew(home, ctx, requester, ids)
	if err != nil || s.cells == nil {
		return out, err
	}
	at := map[string]int{} // id -> its index in out, for the ids not found yet
	var missing []string
	for i, rn := range out {
		if rn.Outcome == model.RenewNotFound {
			at[rn.ID] = i
			missing = append(missing, rn.ID)
		}
	}
	for _, st := range s.stores() {
		if len(missing) == 0 {
			break
		}
		if st == home {
			continue
		}
		got, err := renew(st, ctx, requester, missing)
		if err != nil {
			return nil, err
		}
		missing = missing[:0]
		for _, rn := range got {
			if rn.Outcome == model.RenewNotFound {
				missing = append(missing, rn.ID)
				continue
			}
			out[at[rn.ID]] = rn
		}
	}
	return out, nil
}

// requestersRenewing is store.RequestersRenewing for a provider, caller:
// with cells, a requester's leases placed on caller live in the
// requester's cell or in caller's (asked of every cell), and its renewals
// reach each cell holding one of them, so it renews itself if it does in
// either cell.
func (s *Server) requestersRenewing(ctx context.Context, caller string, requesters []string) ([]bool, error) {
	if s.cells == nil {
		return s.store.RequestersRenewing(ctx, requesters)
	}
	out := make([]bool, len(requesters))
	// ask asks cell about requesters[i] for each i of at.
	ask := func(cell string, at []int) error {
		names := make([]string, len(at))
		for j, i := range at {
			names[j] = requesters[i]
		}
		got, err := s.cells.Cell(cell).RequestersRenewing(ctx, names)
		for j, i := range at {
			out[i] = out[i] || (err == nil && got[j])
		}
		return err
	}
	byCell := map[string][]int{}
	for i, r := range requesters {
		cell := s.cellOf(ctx, r)
		byCell[cell] = append(byCell[cell], i)
	}
	home := s.cellOf(ctx, caller)
	var again []int // not renewing in their own cell, which is not caller's
	for cell, at := range byCell {
		if err := ask(cell, at); err != nil {
			return nil, err
		}
		for _, i := range at {
			if cell != home && !out[i] {
				again = append(again, i)
			}
		}
	}
	if len(again) > 0 {
		if err := ask(home, again); err != nil {
			return nil, err
		}
	}
	return out, nil
}
