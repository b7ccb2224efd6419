package server

import (
	"errors"
	"math"
	"net/http"
	"strconv"

	"github.com/fluidos-project/resource-broker/broker/api"
	"github.com/fluidos-project/resource-broker/broker/model"
	"github.com/fluidos-project/resource-broker/broker/store"
)

// outcomeLimited: a reservation refused by its requester's limits
// (rb_broker_reservations_total).
const outcomeLimited = "limited"

// writeFairShareError answers the refusals of the operator's policy
// (broker/policy): a requester over its limits (429 with Retry-After, as
// Kubernetes' API Priority and Fairness answers: its agent retries later) or
// an advertisement outside its bounds (403 naming the bound, as a quota or a
// LimitRange refuses). It returns false for any other error.
func writeFairShareError(w http.ResponseWriter, err error) bool {
	var limit *store.LimitError
	var bound *model.BoundError
	switch {
	case errors.As(err, &limit):
		w.Header().Set("Retry-After", strconv.FormatInt(int64(math.Ceil(limit.RetryAfter.Seconds())), 10))
		reason := api.ReasonLimitExceeded
		if limit.Limit == "rate" {
			reason = api.ReasonRateLimited
		}
		writeError(w, http.StatusTooManyRequests, reason, limit.Error())
	case errors.As(err, &bound):
		writeError(w, http.StatusForbidden, api.ReasonOutsideBounds, bound.Error())
	case errors.Is(err, model.ErrInvalid):
		writeError(w, http.StatusBadRequest, api.ReasonBadRequest, err.Error())
	default:
		return false
	}
	return true
}

// getUsage lists what each member holds as a requester against its limits,
// and the ended reservations it keeps (store.MemberUsages), over every cell.
// Any member may read it, as it may read every cluster's advertisement.
func (s *Server) getUsage(w http.ResponseWriter, r *http.Request, caller string) {
	var members []store.MemberUsage
	var err error
	if s.cells == nil {
		members, err = s.store.MemberUsages(r.Context())
	} else {
		members, err = s.cells.MemberUsages(r.Context())
	}
	if err != nil {
		s.writeStoreError(w, "", err)
		return
	}
	out := make([]api.MemberUsage, 0, len(members))
	for _, m := range members {
		out = append(out, api.MemberUsageFromStore(m.Cluster, m.Usage, m.Ended, m.Limits))
	}
	writeJSON(w, http.StatusOK, out)
}
