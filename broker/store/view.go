package store

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fluidos-project/resource-broker/broker/model"
	"github.com/fluidos-project/resource-broker/broker/scripts"
)

// clusterView is a replica's copy of the candidate index's records and
// labels (idx:rec, idx:labels; scripts/lib/index.lua), from which it
// proposes each decision's candidates (a hint, reserve.lua): reserve.lua
// then judges those few clusters on their records as they are, instead of
// walking the index, which at 10,000 clusters reads hundreds of them per
// decision inside Redis' one thread. The replica does the walk instead,
// over memory, and Redis keeps what must be atomic: the judgement of the
// few, the capacity taken, the records.
//
// The view catches up just before each reserve call (view.lua: the
// clusters changed since the last change it saw, idx:changes), so a
// decision misses only what other replicas wrote in between; with no such
// write it is exactly the index's (TestHintedDecisionsMatchFullScan).
type clusterView struct {
	catchingUp sync.Mutex // one catch-up at a time

	// What the view did, for the metrics (ViewStats).
	hinted, walked, failed atomic.Uint64

	readWhole atomic.Int64 // when the view last read the whole index (Unix ns); batches catch up concurrently

	mu    sync.RWMutex
	epoch string // the numbering of the changes the view follows ("-": it holds nothing yet)
	seq   int64  // the last change it holds
	recs  []viewRecord
	pos   map[string]int // cluster id -> its index in recs
	// carrying counts the clusters carrying each label ("k=v"), as the
	// index's label sets do.
	carrying map[string]int
}

// viewRecord is one cluster's record (records.lua REC_FIELDS, in order) and labels.
type viewRecord struct {
	id     string
	f      [recFields]float64
	labels map[string]string
}

// The positions of records.lua's REC_FIELDS: per resource (cpu, mem, gpu,
// sto) alloc and free pairs, the three prices, the node count, the node
// summary's top (the node with the most free cpu) and max (the most free
// of each on any node).
const (
	recAlloc  = 0 // + 2 * resource
	recFree   = 1 // + 2 * resource
	recPrice  = 8 // + resource, cpu, mem and gpu
	recNodes  = 11
	recTop    = 12 // + resource
	recMax    = 16 // + resource
	recFields = 20
)

// viewPage is the most changed clusters one view.lua call returns (a
// variable for the tests' sake).
var viewPage = 2000

// viewRereadEvery: a view reads the whole index again this often. A record
// written without being numbered (by a replica of an earlier release, during
// a rolling update) would otherwise stay as the view last read it until the
// cluster changes again. About 2 ms of Redis at 10,000 clusters.
var viewRereadEvery = 5 * time.Minute

func newClusterView() *clusterView {
	return &clusterView{epoch: "-", pos: map[string]int{}, carrying: map[string]int{}}
}

// catchUpView brings s's view up to the index's last change.
func (s *Store) catchUpView(ctx context.Context) error {
	v := s.view
	v.catchingUp.Lock()
	defer v.catchingUp.Unlock()
	for {
		v.mu.RLock()
		epoch, seq := v.epoch, v.seq
		v.mu.RUnlock()
		if time.Since(time.Unix(0, v.readWhole.Load())) > viewRereadEvery {
			epoch = "-" // read whole
		}
		reply, err := s.run(ctx, scripts.View, epoch, seq, viewPage)
		if err != nil {
			return fmt.Errorf("view: %w", err)
		}
		page, err := parseViewReply(reply)
		if err != nil {
			return err
		}
		v.apply(page)
		if page.whole {
			v.readWhole.Store(time.Now().UnixNano())
		}
		if page.whole || len(page.ids) < viewPage {
			return nil
		}
	}
}

// ViewStats counts what this replica's view of the candidate index did
// (Config.DecideFromView): requests sent with a hint, requests that walked
// the index (the view could not propose, or a catch-up failed: they count
// in CatchUpErrors too). Zero without a view.
type ViewStats struct {
	Hinted, Walked, CatchUpErrors uint64
}

// ViewStats returns the counts of s's view.
func (s *Store) ViewStats() ViewStats {
	if s.view == nil {
		return ViewStats{}
	}
	return ViewStats{Hinted: s.view.hinted.Load(), Walked: s.view.walked.Load(), CatchUpErrors: s.view.failed.Load()}
}

// viewReply is one view.lua reply, decoded.
type viewReply struct {
	epoch string
	seq   int64
	whole bool
	ids   []string
	recs  []*viewRecord // nil: the cluster left the index
}

func parseViewReply(reply []any) (viewReply, error) {
	var p viewReply
	if len(reply) != 6 {
		return p, fmt.Errorf("view: unexpected reply of %d values", len(reply))
	}
	p.epoch, _ = reply[0].(string)
	p.seq, _ = reply[1].(int64)
	whole, _ := reply[2].(int64)
	p.whole = whole == 1
	ids, _ := reply[3].([]any)
	recs, _ := reply[4].([]any)
	labels, _ := reply[5].([]any)
	if len(recs) != len(ids) || len(labels) != len(ids) {
		return p, fmt.Errorf("view: %d records and %d labels for %d clusters", len(recs), len(labels), len(ids))
	}
	p.ids = make([]string, len(ids))
	p.recs = make([]*viewRecord, len(ids))
	for i := range ids {
		p.ids[i], _ = ids[i].(string)
		raw, ok := recs[i].(string)
		if !ok {
			continue // left the index
		}
		r := &viewRecord{id: p.ids[i]}
		f, err := decodeRecord(raw) // the invariant's reader of the same records
		if err != nil {
			return p, fmt.Errorf("view: cluster %s: %w", p.ids[i], err)
		}
		copy(r.f[:], f)
		if l, _ := labels[i].(string); l != "" && l != "{}" {
			if err := json.Unmarshal([]byte(l), &r.labels); err != nil {
				return p, fmt.Errorf("view: cluster %s labels: %w", p.ids[i], err)
			}
		}
		p.recs[i] = r
	}
	return p, nil
}

// apply writes one reply into the view.
func (v *clusterView) apply(p viewReply) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if p.whole {
		v.recs, v.pos, v.carrying = v.recs[:0], make(map[string]int, len(p.ids)), map[string]int{}
	}
	count := func(labels map[string]string, by int) {
		for k, val := range labels {
			if v.carrying[k+"="+val] += by; v.carrying[k+"="+val] == 0 {
				delete(v.carrying, k+"="+val)
			}
		}
	}
	for i, id := range p.ids {
		at, held := v.pos[id]
		r := p.recs[i]
		if held {
			count(v.recs[at].labels, -1)
		}
		switch {
		case r != nil && held:
			v.recs[at] = *r
		case r != nil:
			v.pos[id] = len(v.recs)
			v.recs = append(v.recs, *r)
		case held: // left the index: the last record takes its place
			last := len(v.recs) - 1
			v.recs[at] = v.recs[last]
			v.pos[v.recs[at].id] = at
			v.recs = v.recs[:last]
			delete(v.pos, id)
		}
		if r != nil {
			count(r.labels, 1)
		}
	}
	v.epoch, v.seq = p.epoch, p.seq
}

// viewHint is a request's hint in reserve.lua's ARGV: the clusters to
// judge, best first by the view, and the two of them that set the price
// range over the fitting clusters.
type viewHint struct {
	Clusters []string `json:"c"`
	Low      string   `json:"lo"`
	High     string   `json:"hi"`
}

// hintUndecided bounds the clusters of a hint whose node summary cannot
// tell whether one of their nodes holds the request (reserve.lua reads
// their node records): a request more than that many rank among the best
// is decided over the whole index.
const hintUndecided = 16

// hintDirectMax: a selector one of whose labels this many clusters carry,
// or fewer, is decided without a hint: reserve.lua evaluates those clusters
// directly (reserve_candidates.lua DIRECT_MAX).
const hintDirectMax = 128

// viewFit is one cluster that fits (or may) by the view, as a hint is built.
type viewFit struct {
	at        int32 // index in recs
	decided   bool  // its totals, or its node summary, say it fits; false: it may
	rs, price float64
	score     float64
}

// fitsPool holds the fits of the hints being built: a view of 10,000
// clusters fits most of them, 320 KB a request.
var fitsPool = sync.Pool{New: func() any { return new([]viewFit) }}

// hint proposes req's candidates: the clusters reserve.lua would score
// best if the view were the index, until want of them are sure to fit
// (every cluster that may fit and ranks above the last of those comes
// too), and the two setting the price range. ok is false when the view
// cannot stand for the index's walk: nothing sure to fit, or a cluster that
// may fit, by its node summary, priced outside the range of those that
// surely do (the range weighs every score), or too many that may fit among
// the best; or the request is better left to the index: a selector label
// few clusters carry (hintDirectMax). The request then walks the index.
func (v *clusterView) hint(req model.ReserveRequest, wRes, wCost float64, want int) (viewHint, bool) {
	q := [4]float64{float64(req.Resources.CPU), float64(req.Resources.Memory), float64(req.Resources.GPU), float64(req.Resources.Storage)}
	var reqd [4]int // the requested resources, in order
	n := 0
	for res, x := range q {
		if x > 0 {
			reqd[n] = res
			n++
		}
	}
	if n == 0 {
		return viewHint{}, false
	}
	requested := reqd[:n]
	v.mu.RLock()
	defer v.mu.RUnlock()
	for k, val := range req.Selector {
		if v.carrying[k+"="+val] <= hintDirectMax {
			return viewHint{}, false // reserve.lua evaluates those few directly, for less than a walk of the view
		}
	}

	// The fits, judged as reserve_score.lua's judge does, by the totals, the
	// selector and the node summary, with their resource score and price
	// computed in the same order (the same doubles), and the price range
	// over those sure to fit.
	pooled := fitsPool.Get().(*[]viewFit)
	defer fitsPool.Put(pooled)
	fits := (*pooled)[:0]
	self := -1 // the requester's record: never its own candidate (by position: ids of one length compare in full)
	if at, ok := v.pos[req.Requester]; ok {
		self = at
	}
	lo, hi := -1, -1
	var minP, maxP float64
next:
	for i := range v.recs {
		r := &v.recs[i]
		f := &r.f
		sum := 0.0
		for _, res := range requested {
			free := f[recFree+2*res]
			if free < q[res] {
				continue next
			}
			sum += (free - q[res]) / f[recAlloc+2*res]
		}
		if i == self {
			continue
		}
		if len(req.Selector) > 0 { // ranging over an empty map costs as much as the rest
			for k, want := range req.Selector {
				if r.labels[k] != want {
					continue next
				}
			}
		}
		decided := true
		if f[recNodes] > 0 {
			for _, res := range requested {
				if q[res] > f[recMax+res] {
					continue next // more than any node has free
				}
				if f[recTop+res] < q[res] {
					decided = false // the node with the most free cpu cannot tell
				}
			}
		}
		price := q[0]/1000*f[recPrice] + q[1]/1073741824*f[recPrice+1] + q[2]*f[recPrice+2]
		fits = append(fits, viewFit{at: int32(i), decided: decided, rs: 100 * sum / float64(n), price: price})
		if decided {
			if lo < 0 || price < minP {
				lo, minP = i, price
			}
			if hi < 0 || price > maxP {
				hi, maxP = i, price
			}
		}
	}
	*pooled = fits
	if lo < 0 {
		return viewHint{}, false
	}

	// The best, scored as offer in reserve_score.lua does, up to the want-th
	// sure fit. A list longer than limit cannot make a hint (too many unsure
	// fits among the best), and a fit ranked past limit only goes further
	// down as others come: it is never needed.
	limit := want + hintUndecided + 1
	ranked := make([]viewFit, 0, limit+1)
	full := false // ranked ends with its want-th sure fit: nothing after it counts
	for _, fit := range fits {
		if !fit.decided && (fit.price < minP || fit.price > maxP) {
			return viewHint{}, false
		}
		cs := 100.0
		if maxP > minP {
			cs = 100 * (maxP - fit.price) / (maxP - minP)
		}
		fit.score = wRes*fit.rs + wCost*cs
		pos := len(ranked)
		for pos > 0 {
			t := &ranked[pos-1]
			if fit.score > t.score || (fit.score == t.score && v.recs[fit.at].id < v.recs[t.at].id) {
				pos--
			} else {
				break
			}
		}
		if pos >= limit || (full && pos == len(ranked)) {
			continue
		}
		ranked = slices.Insert(ranked, pos, fit)
		sure := 0
		full = false
		for k, e := range ranked {
			if e.decided {
				if sure++; sure == want {
					ranked, full = ranked[:k+1], true
					break
				}
			}
		}
		if len(ranked) > limit {
			ranked, full = ranked[:limit], false
		}
	}
	undecided := 0
	for _, e := range ranked {
		if !e.decided {
			undecided++
		}
	}
	if undecided > hintUndecided {
		return viewHint{}, false
	}
	h := viewHint{Clusters: make([]string, 0, len(ranked)+2), Low: v.recs[lo].id, High: v.recs[hi].id}
	inHint := func(id string) bool {
		for _, c := range h.Clusters {
			if c == id {
				return true
			}
		}
		return false
	}
	for _, e := range ranked {
		h.Clusters = append(h.Clusters, v.recs[e.at].id)
	}
	for _, id := range []string{h.Low, h.High} {
		if !inHint(id) {
			h.Clusters = append(h.Clusters, id)
		}
	}
	return h, true
}

// withHint is a request's reserveArg (a JSON object) with its hint added.
func withHint(arg string, h viewHint) string {
	b, _ := json.Marshal(h) // strings only: it cannot fail
	return arg[:len(arg)-1] + `,"hint":` + string(b) + "}"
}
