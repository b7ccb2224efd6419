package store

import (
	"encoding/json"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/fluidos-project/resource-broker/broker/model"
)

func atoi(s string) int64 {
	if s == "" { // an absent field (ended_ms of a live reservation): no error to allocate
		return 0
	}
	n, _ := strconv.ParseInt(s, 10, 64)
	return n
}

func msTime(ms int64) time.Time {
	if ms == 0 {
		return time.Time{}
	}
	return time.UnixMilli(ms).UTC()
}

func toStrings(v []any) []string {
	out := make([]string, len(v))
	for i, x := range v {
		switch x := x.(type) {
		case string:
			out[i] = x
		case int64:
			out[i] = strconv.FormatInt(x, 10)
		default:
			out[i] = fmt.Sprint(x)
		}
	}
	return out
}

// flatMap reads a flat field, value, ... array (HGETALL's reply).
func flatMap(flat []string) map[string]string {
	m := make(map[string]string, len(flat)/2)
	for i := 0; i+1 < len(flat); i += 2 {
		m[flat[i]] = flat[i+1]
	}
	return m
}

func resourcesFrom(m map[string]string, prefix string) model.Resources {
	return model.Resources{
		CPU:     atoi(m[prefix+"cpu"]),
		Memory:  atoi(m[prefix+"mem"]),
		GPU:     atoi(m[prefix+"gpu"]),
		Storage: atoi(m[prefix+"sto"]),
	}
}

// reservationFromMap reads a reservation hash; nowMs is the Redis clock of
// the read, for Remaining.
func reservationFromMap(id string, m map[string]string, nowMs int64) (model.Reservation, error) {
	r := model.Reservation{
		ID:          id,
		Requester:   m["requester"],
		Target:      m["target"],
		Phase:       m["phase"],
		Resources:   resourcesFrom(m, ""),
		CreatedAt:   msTime(atoi(m["created_ms"])),
		ExpiresAt:   msTime(atoi(m["expires_ms"])),
		EndedAt:     msTime(atoi(m["ended_ms"])),
		Duration:    time.Duration(atoi(m["duration_ms"])) * time.Millisecond,
		Lease:       time.Duration(atoi(m["lease_ms"])) * time.Millisecond,
		Price:       atoi(m["price"]),
		Owner:       m["owner"],
		Priority:    int32(atoi(m["priority"])),
		Node:        m["node"],
		Group:       m["group"],
		Spread:      m["spread"],
		PreemptedBy: m["preempted_by"],
	}
	if exp := atoi(m["expires_ms"]); r.Live() && exp > nowMs {
		r.Remaining = time.Duration(exp-nowMs) * time.Millisecond
	}
	r.Score, _ = strconv.ParseFloat(m["score"], 64)
	if sel := m["selector"]; sel != "" {
		if err := json.Unmarshal([]byte(sel), &r.Selector); err != nil {
			return r, fmt.Errorf("reservation %s: selector: %w", id, err)
		}
	}
	// cjson encodes an empty array as {}; both mean no candidates. Records
	// of earlier versions hold them as one JSON field, newer ones one field each.
	if c := m["candidates"]; c != "" && c != "{}" {
		if err := json.Unmarshal([]byte(c), &r.Candidates); err != nil {
			return r, fmt.Errorf("reservation %s: candidates: %w", id, err)
		}
	}
	for i := 1; ; i++ {
		f, ok := m["cand_"+strconv.Itoa(i)]
		if !ok {
			break
		}
		c, err := candidateFrom(f)
		if err != nil {
			return r, fmt.Errorf("reservation %s: cand_%d: %w", id, i, err)
		}
		r.Candidates = append(r.Candidates, c)
	}
	if p := m["preference"]; p != "" {
		r.Preference = &model.PreferenceOutcome{}
		if err := json.Unmarshal([]byte(p), r.Preference); err != nil {
			return r, fmt.Errorf("reservation %s: preference: %w", id, err)
		}
	}
	if g := m["grant"]; g != "" {
		r.Grant = json.RawMessage(g)
	}
	return r, nil
}

// candidateFrom reads a candidate field of a reservation hash,
// "<cluster> <score> <resource_score> <cost_score> <price>"
// (scripts/lib/reservations.lua new_reservation).
func candidateFrom(f string) (model.Candidate, error) {
	parts := strings.Fields(f)
	if len(parts) != 5 {
		return model.Candidate{}, fmt.Errorf("%q: want 5 values", f)
	}
	c := model.Candidate{Cluster: parts[0]}
	var errs [4]error
	c.Score, errs[0] = strconv.ParseFloat(parts[1], 64)
	c.ResourceScore, errs[1] = strconv.ParseFloat(parts[2], 64)
	c.CostScore, errs[2] = strconv.ParseFloat(parts[3], 64)
	c.Price, errs[3] = strconv.ParseInt(parts[4], 10, 64)
	for _, err := range errs {
		if err != nil {
			return c, fmt.Errorf("%q: %w", f, err)
		}
	}
	return c, nil
}

func clusterFromMap(id string, m map[string]string) (model.Cluster, error) {
	c := model.Cluster{
		ID: id,
		Advertisement: model.Advertisement{
			Name:        m["name"],
			Endpoint:    m["endpoint"],
			Capacity:    resourcesFrom(m, "cap_"),
			Allocatable: resourcesFrom(m, "alloc_"),
			Allocated:   resourcesFrom(m, "used_"),
			Prices: model.Prices{
				CPU: atoi(m["price_cpu"]), Memory: atoi(m["price_mem"]), GPU: atoi(m["price_gpu"]),
				Currency: m["currency"],
			},
		},
		Reserved:  resourcesFrom(m, "resv_"),
		SeenAt:    msTime(atoi(m["seen_ms"])),
		FirstSeen: msTime(atoi(m["first_seen_ms"])),
		Digest:    m["digest"],
		Short:     resourcesFrom(amountsOf(m["short"]), ""),
	}
	if l := m["labels"]; l != "" && l != "{}" {
		if err := json.Unmarshal([]byte(l), &c.Labels); err != nil {
			return c, fmt.Errorf("cluster %s: labels: %w", id, err)
		}
	}
	return c, nil
}

// amountsOf reads a node hash value, "k=v k=v ..." (scripts/lib/core.lua parse_amounts).
func amountsOf(s string) map[string]string {
	m := map[string]string{}
	for _, kv := range strings.Fields(s) {
		if k, v, ok := strings.Cut(kv, "="); ok {
			m[k] = v
		}
	}
	return m
}

// withNodes adds a cluster's nodes (its nodes:<id> hash, in name order) and
// the broker's debits (its node-resv:<id> hash).
func withNodes(c model.Cluster, nodes, debits map[string]string) model.Cluster {
	for name, v := range nodes {
		a := amountsOf(v)
		c.Nodes = append(c.Nodes, model.NodeCapacity{Name: name, Allocatable: resourcesFrom(a, "alloc_"), Allocated: resourcesFrom(a, "used_")})
	}
	sort.Slice(c.Nodes, func(i, j int) bool { return c.Nodes[i].Name < c.Nodes[j].Name })
	if len(debits) > 0 {
		c.NodesReserved = make(map[string]model.Resources, len(debits))
		for name, v := range debits {
			c.NodesReserved[name] = resourcesFrom(amountsOf(v), "")
		}
	}
	return c
}

// limitError reads a script's "limited" detail, {limit, max, used, asked,
// retry_after_ms} (reserve.lua, reserve_group.lua), into the LimitError of
// requester; a detail it cannot read is an error of its own.
func limitError(requester, detail string) error {
	var l struct {
		Limit        string  `json:"limit"`
		Max          float64 `json:"max"`
		Used         int64   `json:"used"`
		Asked        int64   `json:"asked"`
		RetryAfterMs int64   `json:"retry_after_ms"` // with limit "rate": when the next call is allowed
	}
	if err := json.Unmarshal([]byte(detail), &l); err != nil {
		return fmt.Errorf("decode limit: %w", err)
	}
	if l.Limit == "mem" {
		l.Limit = "memory"
	}
	retry := LimitRetryAfter
	if l.Limit == "rate" {
		retry = time.Duration(l.RetryAfterMs) * time.Millisecond
	}
	return &LimitError{Requester: requester, Limit: l.Limit, Max: l.Max, Used: l.Used, Asked: l.Asked, RetryAfter: retry}
}

// selectorArg is a label selector as the scripts take it: a JSON object of
// required labels, or "" for none.
func selectorArg(sel map[string]string) (string, error) {
	if len(sel) == 0 {
		return "", nil
	}
	b, err := json.Marshal(sel)
	return string(b), err
}
