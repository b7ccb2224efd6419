package store

import (
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/fluidos-project/resource-broker/broker/model"
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

// LimitRetryAfter is when a requester refused at one of its limits on live
// reservations or what they hold may try again: the time it takes its own
// reservations to end is unknown, so this is a hint, not a promise.
const LimitRetryAfter = 5 * time.Second

// LimitError is a reservation refused by its requester's limits (Limits):
// nothing was stored and the request does not wait.
type LimitError struct {
	Requester string
	// Limit is "rate" (reserve calls per second), "reservations" (live
	// ones), "cpu" (millicores), "memory" (bytes) or "gpu".
	Limit string
	// Calls is, for a member's rate other than reserve calls (Throttle),
	// the kind of what it counts (RateKinds); "" for reserve calls.
	Calls string
	Max   float64 // the limit
	Used  int64   // what the requester holds (not for "rate")
	Asked int64   // what the request would add (not for "rate")
	// RetryAfter is when a call may succeed: for "rate", when the next
	// call is allowed; else LimitRetryAfter.
	RetryAfter time.Duration
}

func (e *LimitError) Error() string {
	if e.Limit == "rate" && e.Calls != "" {
		return fmt.Sprintf("member %s exceeds its limit of %g %s per second: retry in %s", e.Requester, e.Max, rateUnits(e.Calls), e.RetryAfter)
	}
	if e.Limit == "rate" {
		return fmt.Sprintf("requester %s exceeds its limit of %g reserve calls per second: retry in %s", e.Requester, e.Max, e.RetryAfter)
	}
	return fmt.Sprintf("requester %s is at its limit of %s: holds %s, asks %s more, limit %s",
		e.Requester, limitNames[e.Limit], e.amount(e.Used), e.amount(e.Asked), e.amount(int64(e.Max)))
}

// The kinds of a member's rates other than reserve calls (Throttle's
// charges, broker/policy members), as their rate keys and the rate-limited
// metric name them.
const (
	RateAdvertisements = "advertisements"
	RateRenewals       = "renewals"
	RateRenewedIDs     = "renewed-ids"
	RateRenewalBytes   = "renewal-bytes"
	RateWrites         = "writes"
	RateProtections    = "protections"
)

// rateUnits names what a rate of kind counts, for its error message.
func rateUnits(kind string) string {
	switch kind {
	case RateRenewals:
		return "renewal calls"
	case RateRenewedIDs:
		return "renewed ids"
	case RateRenewalBytes:
		return "renewal bytes"
	case RateWrites:
		return "writes (release, grant, leave)"
	case RateProtections:
		return "protection updates"
	}
	return kind
}

var limitNames = map[string]string{"reservations": "live reservations", "cpu": "reserved cpu", "memory": "reserved memory", "gpu": "reserved gpus"}

// amount renders one of the limit's amounts in the API's units.
func (e *LimitError) amount(v int64) string { return model.Quantity(e.Limit, v) }
