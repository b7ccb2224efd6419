package dashboard

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"html/template"
	"math"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/fluidos-project/resource-broker/broker/api"
	"github.com/fluidos-project/resource-broker/broker/model"
	"github.com/fluidos-project/resource-broker/broker/store"
)

// The figures on the pages are the API's: the same store reads rendered by
// the same api.*FromStore functions, so a quantity reads as the API writes it.

var funcs = template.FuncMap{
	"pct":   func(f float64) string { return strconv.FormatFloat(f, 'f', 1, 64) },
	"add":   func(a, b float64) float64 { return a + b },
	"score": func(f float64) string { return strconv.FormatFloat(f, 'f', 2, 64) },
	"q": func(q *resource.Quantity) string {
		if q == nil {
			return "0"
		}
		return q.String()
	},
	// A price as a decimal number (the API writes 0.05 as the quantity 50m).
	"price": func(q *resource.Quantity) string {
		if q == nil {
			return "0"
		}
		return strconv.FormatFloat(float64(q.ScaledValue(resource.Micro))/1e6, 'f', -1, 64)
	},
	"when": func(t time.Time) string {
		if t.IsZero() {
			return ""
		}
		return t.UTC().Format("2006-01-02 15:04:05Z")
	},
	// cell is the link made of parts on the cell p shows: with ?cell= or
	// &cell= when the broker has several cells, as is without.
	"cell": func(p page, parts ...any) template.URL {
		u := fmt.Sprint(parts...)
		if p.Cell == "" {
			return template.URL(u)
		}
		sep := "?"
		if strings.Contains(u, "?") {
			sep = "&"
		}
		return template.URL(u + sep + "cell=" + url.QueryEscape(p.Cell))
	},
	"query": func(kv ...string) template.URL {
		v := url.Values{}
		for i := 0; i+1 < len(kv); i += 2 {
			if kv[i+1] != "" {
				v.Set(kv[i], kv[i+1])
			}
		}
		if len(v) == 0 {
			return ""
		}
		return template.URL("?" + v.Encode())
	},
}

// now is the Redis clock, which every time the broker stores is on.
func (d *Dashboard) now(ctx context.Context) (time.Time, error) {
	return d.store.Now(ctx)
}

// bar is one resource of a cluster split three ways.
type bar struct {
	Resource                       string // cpu, memory, gpu
	Total, Owner, Reserved, Free   string // as the API writes them
	OwnerPct, ReservedPct, FreePct float64
	None                           bool // nothing allocatable
}

func newBar(res string, alloc, owner, reserved, free int64) bar {
	b := bar{Resource: res, Total: model.Quantity(res, alloc), Owner: model.Quantity(res, owner),
		Reserved: model.Quantity(res, reserved), Free: model.Quantity(res, free), None: alloc <= 0}
	if alloc > 0 {
		f := func(v int64) float64 { return math.Max(0, 100*float64(v)/float64(alloc)) }
		b.OwnerPct, b.ReservedPct, b.FreePct = f(owner), f(reserved), f(max(free, 0))
	}
	return b
}

type clusterRow struct {
	ID     string
	Live   bool
	Age    string // since its last advertisement
	Bars   []bar
	Prices *api.Prices
}

func (d *Dashboard) overview(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	clusters, err := d.store.Clusters(ctx)
	if err == nil {
		var now time.Time
		if now, err = d.now(ctx); err == nil {
			rows := make([]clusterRow, 0, len(clusters))
			stale := 0
			for _, c := range clusters {
				a := api.ClusterFromStore(c, c.Live)
				free := c.Free()
				rows = append(rows, clusterRow{ID: c.ID, Live: c.Live, Age: age(now.Sub(c.SeenAt)), Prices: a.Prices,
					Bars: []bar{
						newBar("cpu", c.Allocatable.CPU, c.Allocated.CPU, c.Reserved.CPU, free.CPU),
						newBar("memory", c.Allocatable.Memory, c.Allocated.Memory, c.Reserved.Memory, free.Memory),
						newBar("gpu", c.Allocatable.GPU, c.Allocated.GPU, c.Reserved.GPU, free.GPU),
					}})
				if !c.Live {
					stale++
				}
			}
			d.render(w, r, http.StatusOK, "overview", "Federation", struct {
				Clusters       []clusterRow
				Live, Stale    int
				StaleThreshold time.Duration
			}{rows, len(rows) - stale, stale, d.store.Config().StaleThreshold})
			return
		}
	}
	d.storeError(w, r, err)
}

// age renders a duration to the second, e.g. 4s, 2m5s.
func age(dt time.Duration) string {
	return max(dt, 0).Truncate(time.Second).String()
}

// listToken is a position in the dashboard's list of reservations: the
// requester whose set is scanned (all requesters in turn when no filter
// names one) and the scan's place in it.
type listToken struct {
	Requester string `json:"r,omitempty"`
	Cursor    uint64 `json:"c,omitempty"`
	After     string `json:"a,omitempty"`
	Next      uint64 `json:"n,omitempty"`
}

func (t listToken) encode() string {
	data, _ := json.Marshal(t)
	return base64.RawURLEncoding.EncodeToString(data)
}

// pageSize is how many live reservations one page of the list reads.
const pageSize = 25

type reservationsPage struct {
	Requester, Provider, State string
	States                     []string
	Items                      []api.Reservation
	Continue                   string
	Error                      string // a bad filter, shown above the list
}

// reservations lists the live reservations, by requester, provider and
// phase, a page at a time: at most pageSize ids read from Redis per page,
// however many there are (the phase filter is applied to the page read, so
// a page may show fewer).
func (d *Dashboard) reservations(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	p := reservationsPage{Requester: q.Get("requester"), Provider: q.Get("provider"), State: q.Get("state"),
		States: []string{model.PhaseReserved, model.PhaseActive}}
	var tok listToken
	switch {
	case p.Requester != "" && api.ValidateClusterID(p.Requester) != nil:
		p.Error = "requester: " + api.ValidateClusterID(p.Requester).Error()
	case p.Provider != "" && api.ValidateClusterID(p.Provider) != nil:
		p.Error = "provider: " + api.ValidateClusterID(p.Provider).Error()
	case p.State != "" && !slices.Contains(p.States, p.State):
		p.Error = "state: must be Reserved or Active (ended reservations are in the audit log)"
	case q.Get("continue") != "":
		data, err := base64.RawURLEncoding.DecodeString(q.Get("continue"))
		if err != nil || json.Unmarshal(data, &tok) != nil || (tok.Requester != "" && api.ValidateClusterID(tok.Requester) != nil) {
			p.Error = "continue: not a position of this list (follow the Next link)"
		}
	}
	if p.Error != "" {
		d.render(w, r, http.StatusBadRequest, "reservations", "Reservations", p)
		return
	}
	qids, next, err := d.scanReservations(r.Context(), p.Requester, p.Provider, tok)
	if err != nil {
		d.storeError(w, r, err)
		return
	}
	rs, err := d.store.Reservations(r.Context(), qids)
	if err != nil {
		d.storeError(w, r, err)
		return
	}
	slices.SortFunc(rs, func(a, b model.Reservation) int { return strings.Compare(a.QID(), b.QID()) })
	for _, res := range rs {
		if (p.Provider != "" && res.Target != p.Provider) || (p.State != "" && res.Phase != p.State) {
			continue
		}
		p.Items = append(p.Items, api.ReservationFromStore(res, false)) // never the grant
	}
	if next != nil {
		p.Continue = next.encode()
	}
	d.render(w, r, http.StatusOK, "reservations", "Reservations", p)
}

// scanReservations reads a page of qualified ids: of requester's set when
// one is named, else of provider's, else of every requester's in turn (the
// requesters holding live reservations, from the usage hash). next is nil on
// the last page.
func (d *Dashboard) scanReservations(ctx context.Context, requester, provider string, tok listToken) ([]string, *listToken, error) {
	set, owner := store.ByRequester, requester
	if requester == "" && provider != "" {
		set, owner = store.ByTarget, provider
	}
	pos := store.ScanPos{Cursor: tok.Cursor, After: tok.After, Next: tok.Next}
	if owner != "" {
		qids, next, more, err := d.store.ScanLive(ctx, set, owner, pos, pageSize)
		if !more || err != nil {
			return qids, nil, err
		}
		return qids, &listToken{Cursor: next.Cursor, After: next.After, Next: next.Next}, nil
	}
	usage, err := d.store.Usage(ctx)
	if err != nil {
		return nil, nil, err
	}
	requesters := make([]string, 0, len(usage))
	for id := range usage {
		if id >= tok.Requester {
			requesters = append(requesters, id)
		}
	}
	slices.Sort(requesters)
	if len(requesters) > 0 && requesters[0] != tok.Requester {
		pos = store.ScanPos{} // that requester holds nothing any more: the next from its start
	}
	var qids []string
	for i, req := range requesters {
		ids, next, more, err := d.store.ScanLive(ctx, store.ByRequester, req, pos, pageSize-len(qids))
		if err != nil {
			return nil, nil, err
		}
		qids = append(qids, ids...)
		if more {
			return qids, &listToken{Requester: req, Cursor: next.Cursor, After: next.After, Next: next.Next}, nil
		}
		pos = store.ScanPos{}
		if len(qids) == pageSize && i+1 < len(requesters) {
			return qids, &listToken{Requester: requesters[i+1]}, nil
		}
	}
	return qids, nil, nil
}

// auditEntry is one decision of the audit stream.
type auditEntry struct {
	ID          string
	Time        time.Time
	Reservation string
	Requester   string
	Outcome     string // reserved, nofit, deferred
	Winner      string
	Node        string
	Score       string
	Weights     string // resources/cost
	Considered  string
	Examined    string
	Method      string
	Candidates  []model.Candidate
	Rejected    map[string]float64
}

func auditFrom(m redis.XMessage) auditEntry {
	s := func(k string) string { v, _ := m.Values[k].(string); return v }
	ms, _ := strconv.ParseInt(s("ts_ms"), 10, 64)
	e := auditEntry{ID: m.ID, Time: time.UnixMilli(ms), Reservation: s("reservation"), Requester: s("requester"),
		Outcome: s("outcome"), Winner: s("winner"), Node: s("node"), Score: s("score"), Weights: s("weights"),
		Considered: s("considered"), Examined: s("examined"), Method: s("method")}
	// cjson encodes an empty table as {}: not a list of candidates, and none.
	_ = json.Unmarshal([]byte(s("candidates")), &e.Candidates)
	_ = json.Unmarshal([]byte(s("rejected")), &e.Rejected)
	return e
}

// auditPageSize is how many decisions one page of the audit log shows.
const auditPageSize = 50

func (d *Dashboard) audit(w http.ResponseWriter, r *http.Request) {
	before := r.URL.Query().Get("before")
	end := "+"
	if before != "" {
		if !validStreamID(before) {
			d.render(w, r, http.StatusBadRequest, "audit", "Audit log", struct {
				Entries []auditEntry
				Before  string
				Error   string
			}{Error: "before: not a stream id such as 1700000000000-0 (follow the Older link)"})
			return
		}
		end = "(" + before
	}
	msgs, err := d.store.AuditBefore(r.Context(), end, auditPageSize)
	if err != nil {
		d.storeError(w, r, err)
		return
	}
	entries := make([]auditEntry, len(msgs))
	for i, m := range msgs {
		entries[i] = auditFrom(m)
	}
	older := ""
	if len(msgs) == auditPageSize {
		older = msgs[len(msgs)-1].ID
	}
	d.render(w, r, http.StatusOK, "audit", "Audit log", struct {
		Entries []auditEntry
		Before  string
		Error   string
	}{entries, older, ""})
}

// validStreamID reports whether s is a Redis stream id (ms-seq).
func validStreamID(s string) bool {
	ms, seq, ok := strings.Cut(s, "-")
	_, err1 := strconv.ParseUint(ms, 10, 64)
	_, err2 := strconv.ParseUint(seq, 10, 64)
	return ok && err1 == nil && err2 == nil
}

// auditSearch bounds how far back the decision page looks for a
// reservation's audit entry (entries, newest first).
const auditSearch = 5000

// findDecision returns the audit entry that reserved requester's id, if the
// audit stream still holds it.
func (d *Dashboard) findDecision(ctx context.Context, requester, id string) (*auditEntry, error) {
	end := "+"
	for read := 0; read < auditSearch; {
		msgs, err := d.store.AuditBefore(ctx, end, 500)
		if err != nil {
			return nil, err
		}
		for _, m := range msgs {
			if m.Values["reservation"] == id && m.Values["requester"] == requester && m.Values["outcome"] == "reserved" {
				e := auditFrom(m)
				return &e, nil
			}
		}
		if len(msgs) < 500 {
			break
		}
		read += len(msgs)
		end = "(" + msgs[len(msgs)-1].ID
	}
	return nil, nil
}

type decisionPage struct {
	Requester, ID string
	Reservation   *api.Reservation
	Granted       bool // only whether: the grant is the requester's secret
	Decision      *auditEntry
	Candidates    []model.Candidate
	WeightRes     string
	WeightCost    string
}

// decision shows why a reservation went where it did: its candidates'
// scores and the weights they were combined with.
func (d *Dashboard) decision(w http.ResponseWriter, r *http.Request) {
	requester, id := r.PathValue("requester"), r.PathValue("id")
	if api.ValidateClusterID(requester) != nil || api.ValidateQualifiedReservationID(model.QualifiedID(requester, id)) != nil {
		d.fail(w, r, http.StatusBadRequest, "not a reservation: /dashboard/reservations/<requester>/<id>")
		return
	}
	ctx := r.Context()
	p := decisionPage{Requester: requester, ID: id}
	res, err := d.store.Reservation(ctx, requester, id)
	switch {
	case err == nil:
		a := api.ReservationFromStore(res, false)
		// Active: its provider granted it, even if the pair's access has
		// expired since (store.Grant keeps one per provider and requester).
		granted := len(res.Grant) > 0 || res.Phase == model.PhaseActive
		p.Reservation, p.Granted, p.Candidates = &a, granted, res.Candidates
	case !errors.Is(err, store.ErrNotFound):
		d.storeError(w, r, err)
		return
	}
	if p.Decision, err = d.findDecision(ctx, requester, id); err != nil {
		d.storeError(w, r, err)
		return
	}
	if p.Reservation == nil && p.Decision == nil {
		d.fail(w, r, http.StatusNotFound, fmt.Sprintf("no reservation %s of %s: it ended longer ago than the retention, and the audit log no longer holds its decision", id, requester))
		return
	}
	cfg := d.store.Config()
	p.WeightRes, p.WeightCost = strconv.FormatFloat(cfg.WeightResources, 'f', -1, 64), strconv.FormatFloat(cfg.WeightCost, 'f', -1, 64)
	if p.Decision != nil {
		if wr, wc, ok := strings.Cut(p.Decision.Weights, "/"); ok { // the weights it was decided with
			p.WeightRes, p.WeightCost = wr, wc
		}
		if p.Candidates == nil {
			p.Candidates = p.Decision.Candidates
		}
	}
	d.render(w, r, http.StatusOK, "decision", "Reservation "+id, p)
}

// usageRow is one member's usage against its limits.
type usageRow struct {
	api.MemberUsage
	Bars []limitBar
}

// limitBar is one limited amount: how much of its limit is used.
type limitBar struct {
	Name, Used, Limit string
	Pct               float64
	Over              bool
}

// usage shows each member's live reservations against its limits, and the
// ended reservations it keeps, as GET /api/v2/usage lists them.
func (d *Dashboard) usage(w http.ResponseWriter, r *http.Request) {
	members, err := d.store.MemberUsages(r.Context())
	if err != nil {
		d.storeError(w, r, err)
		return
	}
	rows := make([]usageRow, 0, len(members))
	for _, m := range members {
		u, l := m.Usage, m.Limits
		row := usageRow{MemberUsage: api.MemberUsageFromStore(m.Cluster, u, m.Ended, l)}
		add := func(name, res string, used int64, limit *int64) {
			if limit == nil {
				return
			}
			b := limitBar{Name: name, Used: model.Quantity(res, used), Limit: model.Quantity(res, *limit), Over: used > *limit}
			if *limit > 0 {
				b.Pct = math.Min(100, 100*float64(used)/float64(*limit))
			} else if used > 0 {
				b.Pct = 100
			}
			row.Bars = append(row.Bars, b)
		}
		add("reservations", "count", u.Reservations, l.Reservations)
		add("cpu", "cpu", u.Resources.CPU, l.CPU)
		add("memory", "memory", u.Resources.Memory, l.Memory)
		add("gpu", "gpu", u.Resources.GPU, l.GPU)
		rows = append(rows, row)
	}
	d.render(w, r, http.StatusOK, "usage", "Usage and limits", rows)
}
