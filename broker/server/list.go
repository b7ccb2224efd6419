package server

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"net/http"
	"slices"
	"strings"

	"github.com/fluidos-project/resource-broker/broker/api"
	"github.com/fluidos-project/resource-broker/broker/model"
	"github.com/fluidos-project/resource-broker/broker/store"
)

// Lists answer one page at a time (api.ReservationList, api.ClusterList),
// so that what one call costs the broker is bounded by the page size, not
// by how many reservations a member holds.

// continueToken is a list's position, opaque to clients: base64url of its
// JSON. A token only ever reads the caller's own sets (their key is the
// caller's identity), so a forged one harms nobody else; it is checked all
// the same, for a clear 400.
type continueToken struct {
	List string `json:"l"`           // "reservations" or "clusters": which list made it
	Role string `json:"r,omitempty"` // reservations: the query's role
	Set  int    `json:"s,omitempty"` // reservations: which of the role's sets
	// Cursor, After and Next: store.ScanPos in that set; for clusters,
	// After is the last id returned.
	Cursor uint64 `json:"c,omitempty"`
	After  string `json:"a,omitempty"`
	Next   uint64 `json:"n,omitempty"`
}

// maxTokenBytes bounds a continue token (a qualified id and three numbers).
const maxTokenBytes = 1024

const (
	listReservations = "reservations"
	listClusters     = "clusters"
)

func (t continueToken) encode() string {
	data, _ := json.Marshal(t)
	return base64.RawURLEncoding.EncodeToString(data)
}

// parseContinue reads ?continue= of list (and role); "" is the first page.
// A reservations token's Set counts the role's sets of every cell in turn
// (cells cells, in the order of their names).
func parseContinue(s, list, role string, cells int) (continueToken, error) {
	t := continueToken{List: list, Role: role}
	if s == "" {
		return t, nil
	}
	bad := func(why string) (continueToken, error) {
		return continueToken{}, &api.InvalidError{Msg: "continue: " + why + " (pass the continue value of the previous page as is)"}
	}
	if len(s) > maxTokenBytes {
		return bad("longer than any token")
	}
	data, err := base64.RawURLEncoding.DecodeString(s)
	if err != nil {
		return bad("not a token")
	}
	if err := api.Decode(bytes.NewReader(data), &t); err != nil {
		return bad("not a token")
	}
	switch {
	case t.List != list:
		return bad("a token of another list")
	case t.Role != role:
		return bad("a token of the list with role=" + t.Role)
	case list == listReservations && (t.Set < 0 || t.Set >= cells*len(roleSets[role])):
		return bad("not a token")
	case list == listReservations && t.After != "" && api.ValidateQualifiedReservationID(t.After) != nil:
		return bad("not a token")
	case list == listClusters && t.After != "" && api.ValidateClusterID(t.After) != nil:
		return bad("not a token")
	}
	return t, nil
}

// roleSets are the sets of live reservations each role lists.
var roleSets = map[string][]string{
	"requester": {store.ByRequester},
	"provider":  {store.ByTarget},
	"":          {store.ByRequester, store.ByTarget},
}

// pageParams reads ?limit= and ?continue=; false: answered (400).
func (s *Server) pageParams(w http.ResponseWriter, r *http.Request, list, role string) (int, continueToken, bool) {
	q := r.URL.Query()
	limit, err := api.ParseLimit(q.Get("limit"))
	if err == nil {
		var t continueToken
		if t, err = parseContinue(q.Get("continue"), list, role, len(s.stores())); err == nil {
			return limit, t, true
		}
	}
	writeDecodeError(w, err)
	return 0, continueToken{}, false
}

func (s *Server) listReservations(w http.ResponseWriter, r *http.Request, caller string) {
	role := r.URL.Query().Get("role")
	sets, ok := roleSets[role]
	if !ok {
		writeError(w, http.StatusBadRequest, api.ReasonBadRequest, "role: must be requester or provider")
		return
	}
	limit, tok, ok := s.pageParams(w, r, listReservations, role)
	if !ok {
		return
	}
	// With cells, the caller's reservations of every cell, one cell after
	// the other (those decided across cells live in their provider's).
	stores := s.stores()
	qids := make([][]string, len(stores)) // by cell
	found := 0
	set, pos := tok.Set, store.ScanPos{Cursor: tok.Cursor, After: tok.After, Next: tok.Next}
	for set < len(stores)*len(sets) {
		cell := set / len(sets)
		ids, next, more, err := stores[cell].ScanLive(r.Context(), sets[set%len(sets)], caller, pos, limit-found)
		if err != nil {
			s.writeStoreError(w, "", err)
			return
		}
		qids[cell] = append(qids[cell], ids...)
		found += len(ids)
		if more {
			pos = next
			break
		}
		set, pos = set+1, store.ScanPos{}
		if found == limit {
			break
		}
	}
	out := api.ReservationList{Items: make([]api.Reservation, 0, found)}
	for cell, ids := range qids {
		if len(ids) == 0 && len(stores) > 1 {
			continue
		}
		rs, err := stores[cell].Reservations(r.Context(), ids)
		if err != nil {
			s.writeStoreError(w, "", err)
			return
		}
		for _, res := range rs {
			out.Items = append(out.Items, api.ReservationFromStore(res, res.Requester == caller))
		}
	}
	if set < len(stores)*len(sets) {
		out.Continue = continueToken{List: listReservations, Role: role, Set: set, Cursor: pos.Cursor, After: pos.After, Next: pos.Next}.encode()
	}
	writeJSON(w, http.StatusOK, out)
}

func (s *Server) listClusters(w http.ResponseWriter, r *http.Request, _ string) {
	limit, tok, ok := s.pageParams(w, r, listClusters, "")
	if !ok {
		return
	}
	clusters, next, err := s.clustersPage(r.Context(), tok.After, limit)
	if err != nil {
		s.writeStoreError(w, "", err)
		return
	}
	out := api.ClusterList{Items: make([]api.Cluster, 0, len(clusters))}
	for _, c := range clusters {
		out.Items = append(out.Items, api.ClusterFromStore(c, c.Live))
	}
	if next != "" {
		out.Continue = continueToken{List: listClusters, After: next}.encode()
	}
	writeJSON(w, http.StatusOK, out)
}

// clustersPage is store.ClustersPage over every cell: their pages merged in
// id order. A cluster advertised in two cells (it moved) shows once, as
// its latest advertisement.
func (s *Server) clustersPage(ctx context.Context, after string, limit int) ([]model.Cluster, string, error) {
	if s.cells == nil {
		return s.store.ClustersPage(ctx, after, limit)
	}
	var all []model.Cluster
	more := false
	for _, st := range s.stores() {
		page, next, err := st.ClustersPage(ctx, after, limit)
		if err != nil {
			return nil, "", err
		}
		all = append(all, page...)
		more = more || next != ""
	}
	slices.SortStableFunc(all, func(a, b model.Cluster) int { return strings.Compare(a.ID, b.ID) })
	merged := all[:0]
	for _, c := range all {
		if n := len(merged); n > 0 && merged[n-1].ID == c.ID {
			if c.SeenAt.After(merged[n-1].SeenAt) {
				merged[n-1] = c
			}
			continue
		}
		merged = append(merged, c)
	}
	all = merged
	if len(all) > limit {
		all, more = all[:limit], true
	}
	next := ""
	if more && len(all) > 0 {
		next = all[len(all)-1].ID
	}
	return all, next, nil
}
