package main

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math"
	"net"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	brokerclient "github.com/fluidos-project/resource-broker/broker/client"
)

// recorder gathers, per activity, the latency of every call as its client
// saw it and the errors by kind.
type recorder struct {
	mu   sync.Mutex
	acts map[string]*activity
}

type activity struct {
	latencies []time.Duration // every answered or failed call
	ok        []time.Duration // the calls that succeeded
	errors    map[string]int
	examples  map[string]string // the first error of each kind
}

func newRecorder() *recorder { return &recorder{acts: map[string]*activity{}} }

func (r *recorder) observe(name string, took time.Duration, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	a := r.acts[name]
	if a == nil {
		a = &activity{errors: map[string]int{}, examples: map[string]string{}}
		r.acts[name] = a
	}
	a.latencies = append(a.latencies, took)
	if err == nil {
		a.ok = append(a.ok, took)
	} else {
		k := errorKind(err)
		a.errors[k]++
		if _, ok := a.examples[k]; !ok {
			a.examples[k] = err.Error()
		}
	}
}

// count records an event that made no call (a tick dropped, a lease lost).
func (r *recorder) count(name, kind string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	a := r.acts[name]
	if a == nil {
		a = &activity{errors: map[string]int{}, examples: map[string]string{}}
		r.acts[name] = a
	}
	a.errors[kind]++
}

// errorsSoFar is every error counted so far, by activity and kind, on one
// line (a long phase's progress).
func (r *recorder) errorsSoFar() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var parts []string
	for name, a := range r.acts {
		for kind, n := range a.errors {
			parts = append(parts, fmt.Sprintf("%s %s: %d", name, kind, n))
		}
	}
	slices.Sort(parts)
	return strings.Join(parts, "; ")
}

// ActivityStats is one activity's line of the report.
type ActivityStats struct {
	Name   string  `json:"name"`
	Count  int     `json:"count"`
	PerSec float64 `json:"perSecond"`
	P50Ms  float64 `json:"p50Ms"`
	P99Ms  float64 `json:"p99Ms"`
	MaxMs  float64 `json:"maxMs"`
	// OK are the calls that succeeded, OKP50Ms and OKP99Ms their latency.
	OK      int            `json:"ok"`
	OKP50Ms float64        `json:"okP50Ms"`
	OKP99Ms float64        `json:"okP99Ms"`
	Errors  map[string]int `json:"errors,omitempty"`
	// Examples are the first error message of each kind.
	Examples map[string]string `json:"examples,omitempty"`
}

// summary returns the activities in a fixed order (order first, then the
// others by name), rates over window.
func (r *recorder) summary(window time.Duration, order []string) []ActivityStats {
	r.mu.Lock()
	defer r.mu.Unlock()
	names := make([]string, 0, len(r.acts))
	for n := range r.acts {
		names = append(names, n)
	}
	rank := func(n string) int {
		if i := slices.Index(order, n); i >= 0 {
			return i
		}
		return len(order)
	}
	sort.Slice(names, func(i, j int) bool {
		if ri, rj := rank(names[i]), rank(names[j]); ri != rj {
			return ri < rj
		}
		return names[i] < names[j]
	})
	out := make([]ActivityStats, 0, len(names))
	for _, n := range names {
		a := r.acts[n]
		lat := slices.Clone(a.latencies)
		slices.Sort(lat)
		ok := slices.Clone(a.ok)
		slices.Sort(ok)
		// The maps are copied: calls cut after the window still count in a.
		s := ActivityStats{Name: n, Count: len(lat), P50Ms: ms(percentile(lat, 50)), P99Ms: ms(percentile(lat, 99)),
			OK: len(ok), OKP50Ms: ms(percentile(ok, 50)), OKP99Ms: ms(percentile(ok, 99)), Errors: maps.Clone(a.errors), Examples: maps.Clone(a.examples)}
		if len(lat) > 0 {
			s.MaxMs = ms(lat[len(lat)-1])
		}
		if window > 0 {
			s.PerSec = float64(len(lat)) / window.Seconds()
		}
		if len(s.Errors) == 0 {
			s.Errors = nil
		}
		if len(s.Examples) == 0 {
			s.Examples = nil
		}
		out = append(out, s)
	}
	return out
}

// percentile is the nearest-rank p-th percentile of sorted durations (0 for none).
func percentile(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	rank := int(math.Ceil(p / 100 * float64(len(sorted))))
	return sorted[min(max(rank, 1), len(sorted))-1]
}

func ms(d time.Duration) float64 { return math.Round(float64(d)/1e4) / 100 }

// errorKind names an error for the report: the broker's status and reason,
// a timeout, or a transport failure.
func errorKind(err error) string {
	var ae *brokerclient.APIError
	var ne net.Error
	switch {
	case errors.As(err, &ae):
		return fmt.Sprintf("%d %s", ae.StatusCode, ae.Reason)
	case errors.Is(err, context.DeadlineExceeded), errors.As(err, &ne) && ne.Timeout():
		return "timeout"
	case errors.Is(err, context.Canceled):
		return "canceled"
	case errors.As(err, &ne):
		return "transport"
	default:
		return "other"
	}
}

// dueTicks is how many decisions an open loop offering rate per second owes
// after elapsed, of which issued were already sent: the ticker that drives it
// may fire late, and the decisions it owes then go out together.
func dueTicks(elapsed time.Duration, rate float64, issued int64) int64 {
	return max(int64(elapsed.Seconds()*rate)-issued, 0)
}

// phase spreads n members' periodic calls over one period, as n independent
// agents that started at random times would: member i first calls after
// i/n of the period.
func phase(i, n int, period time.Duration) time.Duration {
	if n <= 0 {
		return 0
	}
	return time.Duration(int64(period) * int64(i) / int64(n))
}

// batches splits ids into batches of at most size, as the renewer does.
func batches(ids []string, size int) [][]string {
	var out [][]string
	for len(ids) > 0 {
		n := min(size, len(ids))
		out = append(out, ids[:n])
		ids = ids[n:]
	}
	return out
}
