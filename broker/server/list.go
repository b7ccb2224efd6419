package server

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"net/http"

	"github.com/fluidos-project/resource-broker/broker/api"
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
func parseContinue(s, list, role string) (continueToken, error) {
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
	case list == listReservations && (t.Set < 0 || t.Set >= len(roleSets[role])):
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
func pageParams(w http.ResponseWriter, r *http.Request, list, role string) (int, continueToken, bool) {
	q := r.URL.Query()
	limit, err := api.ParseLimit(q.Get("limit"))
	if err == nil {
		var t continueToken
		if t, err = parseContinue(q.Get("continue"), list, role); err == nil {
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
	limit, tok, ok := pageParams(w, r, listReservations, role)
	if !ok {
		return
	}
	var qids []string
	set, pos := tok.Set, store.ScanPos{Cursor: tok.Cursor, After: tok.After, Next: tok.Next}
	for set < len(sets) {
		ids, next, more, err := s.store.ScanLive(r.Context(), sets[set], caller, pos, limit-len(qids))
		if err != nil {
			s.writeStoreError(w, "", err)
			return
		}
		qids = append(qids, ids...)
		if more {
			pos = next
			break
		}
		set, pos = set+1, store.ScanPos{}
		if len(qids) == limit {
			break
		}
	}
	rs, err := s.store.Reservations(r.Context(), qids)
	if err != nil {
		s.writeStoreError(w, "", err)
		return
	}
	out := api.ReservationList{Items: make([]api.Reservation, 0, len(rs))}
	for _, res := range rs {
		out.Items = append(out.Items, api.ReservationFromStore(res, res.Requester == caller))
	}
	if set < len(sets) {
		out.Continue = continueToken{List: listReservations, Role: role, Set: set, Cursor: pos.Cursor, After: pos.After, Next: pos.Next}.encode()
	}
	writeJSON(w, http.StatusOK, out)
}

func (s *Server) listClusters(w http.ResponseWriter, r *http.Request, _ string) {
	limit, tok, ok := pageParams(w, r, listClusters, "")
	if !ok {
		return
	}
	clusters, next, err := s.store.ClustersPage(r.Context(), tok.After, limit)
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
