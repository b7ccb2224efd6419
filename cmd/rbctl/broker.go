package main

import (
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/duration"
)

func newTabWriter(w io.Writer) *tabwriter.Writer {
	return tabwriter.NewWriter(w, 0, 8, 3, ' ', 0)
}

// row writes one tab-separated table row.
func row(w io.Writer, cells ...string) {
	fmt.Fprintln(w, strings.Join(cells, "\t"))
}

// cores renders millicores as cores: 16, 13.5, 0.25.
func cores(q *resource.Quantity) string {
	if q == nil {
		return "0"
	}
	return strconv.FormatFloat(float64(q.MilliValue())/1000, 'f', -1, 64)
}

// bytesHuman renders a byte count in binary units with at most one decimal: 64Gi, 59.5Gi.
func bytesHuman(q *resource.Quantity) string {
	if q == nil {
		return "0"
	}
	v := q.Value()
	units := []string{"Ei", "Pi", "Ti", "Gi", "Mi", "Ki"}
	for i, u := range units {
		size := int64(1) << (10 * (len(units) - i))
		if v >= size || -v >= size {
			f := math.Round(float64(v)/float64(size)*10) / 10
			return strconv.FormatFloat(f, 'f', -1, 64) + u
		}
	}
	return strconv.FormatInt(v, 10)
}

// count renders a whole number (devices).
func count(q *resource.Quantity) string {
	if q == nil {
		return "0"
	}
	return strconv.FormatInt(q.Value(), 10)
}

// decimal renders a price quantity as a plain decimal (the broker sends 0.03 as "30m").
func decimal(q *resource.Quantity) string {
	return strconv.FormatFloat(q.AsApproximateFloat64(), 'f', -1, 64)
}

// money renders micro-units of a currency: 76000 -> "0.076 EUR".
func money(micros int64, currency string) string {
	s := strconv.FormatFloat(float64(micros)/1e6, 'f', -1, 64)
	if currency != "" {
		s += " " + currency
	}
	return s
}

// ago renders how long ago t was, kubectl style: 5s, 3m2s, 4h.
func ago(now, t time.Time) string {
	if t.IsZero() {
		return "<unknown>"
	}
	return duration.HumanDuration(max(now.Sub(t), 0)) // the broker's clock may be ahead
}

// until renders a deadline relative to now: "in 59m" or "3m ago".
func until(now, t time.Time) string {
	if t.IsZero() {
		return "<unknown>"
	}
	if d := t.Sub(now); d >= 0 {
		return "in " + duration.HumanDuration(d)
	}
	return duration.HumanDuration(now.Sub(t)) + " ago"
}
