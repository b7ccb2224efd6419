package api

import "strconv"

// Lists are paginated: GET /api/v2/clusters and /api/v2/reservations take
// ?limit= (at most MaxPageSize; DefaultPageSize when absent) and
// ?continue=, the token of the previous page, and answer one page. An empty
// Continue is the last page; a page may hold fewer than limit items (even
// none) with more to come.
const (
	DefaultPageSize = 500
	MaxPageSize     = 1000
)

// ReservationList is a page of GET /api/v2/reservations.
type ReservationList struct {
	Items []Reservation `json:"items"`
	// Continue, when not empty, is passed as ?continue= for the next page.
	Continue string `json:"continue,omitempty"`
}

// ClusterList is a page of GET /api/v2/clusters.
type ClusterList struct {
	Items    []Cluster `json:"items"`
	Continue string    `json:"continue,omitempty"`
}

// ParseLimit reads a list's ?limit=: empty is DefaultPageSize, else an
// integer from 1 to MaxPageSize.
func ParseLimit(s string) (int, error) {
	if s == "" {
		return DefaultPageSize, nil
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 1 || n > MaxPageSize {
		return 0, invalid("limit: %q is not an integer from 1 to %d", s, MaxPageSize)
	}
	return n, nil
}
