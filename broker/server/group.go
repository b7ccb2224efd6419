package server

import (
	"errors"
	"net/http"
	"time"

	"github.com/fluidos-project/resource-broker/broker/api"
	"github.com/fluidos-project/resource-broker/broker/model"
	"github.com/fluidos-project/resource-broker/broker/store"
)

// postGroup reserves a gang, all or nothing (store.ReserveGroup): 201 with
// the members' reservations, 200 for a replay, 409 NoCapacity when fewer
// than minMember fit together (nothing reserved; the message says how many
// would), and the answers of POST /api/v2/reservations otherwise.
func (s *Server) postGroup(w http.ResponseWriter, r *http.Request, caller string) {
	var body api.GroupRequest
	if err := api.Decode(r.Body, &body); err != nil {
		s.metrics.reservation(outcomeInvalid).Inc()
		writeDecodeError(w, err)
		return
	}
	req, err := body.ToStore(caller, s.limits)
	if err != nil {
		s.metrics.reservation(outcomeInvalid).Inc()
		writeDecodeError(w, err)
		return
	}
	start := time.Now()
	if le := s.rateRefused.refused("", req.Requester, 1, start); le != nil {
		s.metrics.decided(outcomeLimited, 0)
		writeFairShareError(w, le)
		return
	}
	var d model.GroupDecision
	if s.cells == nil {
		d, err = s.store.ReserveGroup(r.Context(), req)
	} else {
		d, err = s.cells.ReserveGroup(r.Context(), s.cellOf(r.Context(), req.Requester), req)
	}
	took := time.Since(start)
	s.rateRefused.record(req.Requester, start, err, nil)
	var noFit *store.GroupNoFitError
	switch {
	case err == nil:
		outcome, code := outcomeReserved, http.StatusCreated
		if d.Replayed {
			outcome, code = outcomeReplayed, http.StatusOK
		} else {
			s.log.V(1).Info("group reserved", "group", req.Group, "requester", caller,
				"members", len(d.Reservations), "unplaced", len(d.Unplaced))
		}
		s.metrics.reservation(outcome).Add(float64(len(d.Reservations)))
		s.metrics.decision.WithLabelValues(outcome).Observe(took.Seconds())
		writeJSON(w, code, api.GroupFromStore(req.Group, d))
	case errors.As(err, &noFit):
		s.metrics.decided(outcomeNoFit, took)
		rejected := map[string]int64{"placeable": int64(noFit.Placeable)}
		for k, n := range noFit.Rejected {
			rejected[k] = n
		}
		writeJSON(w, http.StatusConflict, api.Error{Error: noFit.Error(), Reason: api.ReasonNoCapacity, Rejected: rejected})
	case errors.Is(err, store.ErrConflict):
		s.metrics.reservation(outcomeConflict).Inc()
		writeError(w, http.StatusConflict, api.ReasonConflict,
			"a member id of group "+req.Group+" is already used alone, by another group or for other amounts")
	case errors.Is(err, model.ErrInvalidRequest):
		s.metrics.reservation(outcomeInvalid).Inc()
		writeError(w, http.StatusBadRequest, api.ReasonBadRequest, err.Error())
	default:
		if errors.As(err, new(*store.LimitError)) {
			s.metrics.reservation(outcomeLimited).Inc()
		} else {
			s.metrics.reservation(outcomeError).Inc()
		}
		s.writeStoreError(w, "reserve_group", err)
	}
}

// putProtections replaces the caller's report of the reservations its pods'
// disruption budgets protect (store.Protect).
func (s *Server) putProtections(w http.ResponseWriter, r *http.Request, caller string) {
	if !s.throttle(w, r, caller, model.Charge{Kind: store.RateProtections, Rate: s.rates(caller).Protections, Cost: 1}) {
		return
	}
	body, ok := decodeValid[api.ProtectRequest](w, r)
	if !ok {
		return
	}
	n, err := s.storeOf(r.Context(), caller).Protect(r.Context(), caller, body.IDs)
	if err != nil {
		s.writeStoreError(w, "protect", err)
		return
	}
	writeJSON(w, http.StatusOK, api.ProtectResponse{Protected: n})
}
