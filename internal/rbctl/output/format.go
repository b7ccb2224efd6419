package output

import (
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/duration"
)

// Cores renders millicores as cores: 16, 13.5, 0.25.
func Cores(q *resource.Quantity) string {
	if q == nil {
		return "0"
	}
	return strconv.FormatFloat(float64(q.MilliValue())/1000, 'f', -1, 64)
}

// Bytes renders a byte count in binary units with at most one decimal: 64Gi, 59.5Gi.
func Bytes(q *resource.Quantity) string {
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

// Count renders a whole number (devices).
func Count(q *resource.Quantity) string {
	if q == nil {
		return "0"
	}
	return strconv.FormatInt(q.Value(), 10)
}

// Decimal renders a price quantity as a plain decimal (the broker sends 0.03 as "30m").
func Decimal(q *resource.Quantity) string {
	return strconv.FormatFloat(q.AsApproximateFloat64(), 'f', -1, 64)
}

// Money renders micro-units of a currency: 76000 -> "0.076 EUR".
func Money(micros int64, currency string) string {
	s := strconv.FormatFloat(float64(micros)/1e6, 'f', -1, 64)
	if currency != "" {
		s += " " + currency
	}
	return s
}

// Score renders a score of the broker's (0-100) with two decimals.
func Score(f float64) string { return strconv.FormatFloat(f, 'f', 2, 64) }

// Ago renders how long ago t was, kubectl style: 5s, 3m2s, 4h.
func Ago(now, t time.Time) string {
	if t.IsZero() {
		return "<unknown>"
	}
	return duration.HumanDuration(max(now.Sub(t), 0)) // the broker's clock may be ahead
}

// Until renders a deadline relative to now: "in 59m" or "3m ago".
func Until(now, t time.Time) string {
	if t.IsZero() {
		return "<unknown>"
	}
	if d := t.Sub(now); d >= 0 {
		return "in " + duration.HumanDuration(d)
	}
	return duration.HumanDuration(now.Sub(t)) + " ago"
}

// Timestamp renders an instant in UTC, RFC 3339.
func Timestamp(t time.Time) string { return t.UTC().Format(time.RFC3339) }

// Labels renders labels as a selector reads them: k1=v1,k2=v2, by key.
func Labels(m map[string]string) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = k + "=" + m[k]
	}
	return strings.Join(parts, ",")
}

// OrDash renders an empty cell as "-".
func OrDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
