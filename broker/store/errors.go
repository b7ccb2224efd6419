package store

import (
	"errors"
	"fmt"
	"sort"
	"strings"
)

var (
	// ErrNotFound means there is no such reservation or cluster.
	ErrNotFound = errors.New("not found")
	// ErrForbidden means the caller is neither the requester nor the provider.
	ErrForbidden = errors.New("caller is not a party to this reservation")
	// ErrConflict means the reservation id is taken by another requester or was decided for other amounts.
	ErrConflict = errors.New("reservation id already used by another cluster or for other amounts")
)

// NoFitError says that no cluster can take a request, and why, by class.
type NoFitError struct {
	Rejected map[string]int64 // reason -> number of clusters
}

func (e *NoFitError) Error() string {
	reasons := make([]string, 0, len(e.Rejected))
	for k, n := range e.Rejected {
		if n > 0 {
			reasons = append(reasons, fmt.Sprintf("%s=%d", k, n))
		}
	}
	sort.Strings(reasons)
	if len(reasons) == 0 {
		return "no cluster fits the request: no cluster is advertised"
	}
	return "no cluster fits the request (" + strings.Join(reasons, ", ") + ")"
}
