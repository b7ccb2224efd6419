package dashboard

import (
	"context"
	"fmt"
	"html/template"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/fluidos-project/resource-broker/broker/model"
)

// The capacity history is kept by the store (Store.AddCapacitySample), one
// entry per sample interval, capped to the window: every replica samples,
// the replicas share one history that outlives any of them. The figures
// are the federation's totals over its live clusters.

// sample is the federation's capacity at one time.
type sample struct {
	Time               time.Time
	Allocatable, Owner model.Resources
	Reserved, Free     model.Resources
}

var sampleFields = []string{"alloc", "owner", "resv", "free"}

func (d *Dashboard) sample(ctx context.Context) error {
	clusters, err := d.store.Clusters(ctx)
	if err != nil {
		return err
	}
	now, err := d.now(ctx)
	if err != nil {
		return err
	}
	var s sample
	for _, c := range clusters {
		if !c.Live {
			continue
		}
		free := c.Free()
		free = model.Resources{CPU: max(free.CPU, 0), Memory: max(free.Memory, 0), GPU: max(free.GPU, 0), Storage: max(free.Storage, 0)}
		s.Allocatable = s.Allocatable.Add(c.Allocatable)
		s.Owner = s.Owner.Add(c.Allocated)
		s.Reserved = s.Reserved.Add(c.Reserved)
		s.Free = s.Free.Add(free)
	}
	values := []any{}
	for i, r := range []model.Resources{s.Allocatable, s.Owner, s.Reserved, s.Free} {
		values = append(values, sampleFields[i], fmt.Sprintf("%d %d %d", r.CPU, r.Memory, r.GPU))
	}
	bucket := now.UnixMilli() / d.every.Milliseconds() * d.every.Milliseconds()
	return d.store.AddCapacitySample(ctx, time.UnixMilli(bucket), int64(d.window/d.every)+2, values)
}

// samples reads the history of the window up to now, oldest first.
func (d *Dashboard) samples(ctx context.Context, now time.Time) ([]sample, error) {
	msgs, err := d.store.CapacitySamples(ctx, now.Add(-d.window), int64(d.window/d.every)+2)
	if err != nil {
		return nil, err
	}
	out := make([]sample, 0, len(msgs))
	for i := len(msgs) - 1; i >= 0; i-- {
		m := msgs[i]
		ms, _ := strconv.ParseInt(strings.TrimSuffix(m.ID, "-0"), 10, 64)
		s := sample{Time: time.UnixMilli(ms)}
		for j, dst := range []*model.Resources{&s.Allocatable, &s.Owner, &s.Reserved, &s.Free} {
			v, _ := m.Values[sampleFields[j]].(string)
			f := strings.Fields(v)
			if len(f) != 3 {
				continue
			}
			dst.CPU, _ = strconv.ParseInt(f[0], 10, 64)
			dst.Memory, _ = strconv.ParseInt(f[1], 10, 64)
			dst.GPU, _ = strconv.ParseInt(f[2], 10, 64)
		}
		out = append(out, s)
	}
	return out, nil
}

// chart is one resource's plot: reserved and free over the window, drawn
// on the server as an inline SVG (no script, prints and zooms as text does).
type chart struct {
	Resource       string
	Reserved, Free template.HTMLAttr // points="..." of the two lines
	Max            string            // the top of the y axis, in the API's units
	LastReserved   string
	LastFree       string
	Samples        int
}

// Plot area of each chart, in SVG user units (the viewBox scales it).
const (
	plotW, plotH = 600.0, 160.0
)

func (d *Dashboard) charts(samples []sample, now time.Time) []chart {
	pick := []struct {
		name string
		get  func(model.Resources) int64
	}{
		{"cpu", func(r model.Resources) int64 { return r.CPU }},
		{"memory", func(r model.Resources) int64 { return r.Memory }},
		{"gpu", func(r model.Resources) int64 { return r.GPU }},
	}
	var out []chart
	for _, p := range pick {
		var top int64
		for _, s := range samples {
			top = max(top, p.get(s.Reserved)+p.get(s.Free), p.get(s.Allocatable))
		}
		if top == 0 && p.name == "gpu" {
			continue // a federation without GPUs has no GPU chart
		}
		line := func(get func(sample) int64) template.HTMLAttr {
			var b strings.Builder
			for _, s := range samples {
				x := plotW * (1 - float64(now.Sub(s.Time))/float64(d.window))
				y := plotH
				if top > 0 {
					y = plotH * (1 - float64(get(s))/float64(top))
				}
				fmt.Fprintf(&b, "%.1f,%.1f ", x, y)
			}
			return template.HTMLAttr(`points="` + strings.TrimSpace(b.String()) + `"`)
		}
		c := chart{Resource: p.name, Max: model.Quantity(p.name, top), Samples: len(samples),
			Reserved: line(func(s sample) int64 { return p.get(s.Reserved) }),
			Free:     line(func(s sample) int64 { return p.get(s.Free) })}
		if n := len(samples); n > 0 {
			c.LastReserved, c.LastFree = model.Quantity(p.name, p.get(samples[n-1].Reserved)), model.Quantity(p.name, p.get(samples[n-1].Free))
		}
		out = append(out, c)
	}
	return out
}

func (d *Dashboard) history(w http.ResponseWriter, r *http.Request) {
	now, err := d.now(r.Context())
	if err != nil {
		d.storeError(w, r, err)
		return
	}
	samples, err := d.samples(r.Context(), now)
	if err != nil {
		d.storeError(w, r, err)
		return
	}
	d.render(w, r, http.StatusOK, "history", "Capacity over time", struct {
		Charts []chart
		Window time.Duration
		Every  time.Duration
	}{d.charts(samples, now), d.window, d.every})
}
