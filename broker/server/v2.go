package server

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net/http"
	"strconv"
	"time"

	"github.com/fluidos-project/resource-broker/broker/api"
	"github.com/fluidos-project/resource-broker/broker/model"
	"github.com/fluidos-project/resource-broker/broker/store"
)

func (s *Server) putAdvertisement(w http.ResponseWriter, r *http.Request, caller string) {
	id := r.PathValue("id")
	if id != caller {
		writeError(w, http.StatusForbidden, api.ReasonForbidden, "cluster "+caller+" may only advertise itself, not "+id)
		return
	}
	if !s.throttle(w, r, caller, model.Charge{Kind: store.RateAdvertisements, Rate: s.rates(caller).Advertisements, Cost: 1}) {
		return
	}
	var body api.Advertisement
	if err := api.Decode(r.Body, &body); err != nil {
		writeDecodeError(w, err)
		return
	}
	ad, err := body.ToStore()
	if err != nil {
		writeDecodeError(w, err)
		return
	}
	s.advertise(w, r.Context(), id, ad, func(c model.Cluster) any { return api.ClusterFromStore(c, true) })
}

// advertise stores ad and answers with the stored cluster rendered by view.
func (s *Server) advertise(w http.ResponseWriter, ctx context.Context, id string, ad model.Advertisement, view func(model.Cluster) any) {
	// Advertisements take turns (advertising): many members advertising at
	// once wait here, not in Redis, where each reserve would wait behind
	// all of them; one whose turn does not come soon is shed, to come back
	// when the backlog has drained.
	release, backlog, ok := s.advertising.acquire(ctx, advertWait)
	if !ok {
		if ctx.Err() != nil {
			writeError(w, http.StatusServiceUnavailable, api.ReasonUnavailable, "request ended while waiting for its turn")
			return
		}
		s.metrics.advertisementsShed.Inc()
		retry := s.advertising.retryAfter(backlog)
		w.Header().Set("Retry-After", strconv.Itoa(int(math.Ceil(retry.Seconds()))))
		writeError(w, http.StatusServiceUnavailable, api.ReasonBusy, fmt.Sprintf(
			"this broker replica is busy storing advertisements (%d more waiting): this one did not get its turn within %s and was not stored; retry after Retry-After", backlog, advertWait))
		return
	}
	defer release()
	ack, err := s.advertiseIn(ctx, id, ad)
	if err != nil {
		s.writeStoreError(w, "advertise", err)
		return
	}
	writeJSON(w, http.StatusOK, view(model.Cluster{ID: id, Advertisement: ad, Reserved: ack.Reserved, SeenAt: ack.SeenAt,
		NodesReserved: ack.NodesReserved, Digest: ack.Digest}))
}

// putHeartbeat serves PUT /api/v2/clusters/{id}/heartbeat: the caller's
// advertisement is still the one stored under the digest it names, so only
// its liveness is refreshed (store.Heartbeat); 409 AdvertisementNeeded when
// it must advertise in full. A heartbeat counts against the advertisements'
// rate but takes no advertisement turn: it costs Redis tens of µs, not the
// milliseconds of an advertisement of many nodes.
func (s *Server) putHeartbeat(w http.ResponseWriter, r *http.Request, caller string) {
	id := r.PathValue("id")
	if id != caller {
		writeError(w, http.StatusForbidden, api.ReasonForbidden, "cluster "+caller+" may only send its own heartbeat, not "+id)
		return
	}
	if !s.throttle(w, r, caller, model.Charge{Kind: store.RateAdvertisements, Rate: s.rates(caller).Advertisements, Cost: 1}) {
		return
	}
	body, ok := decodeValid[api.HeartbeatRequest](w, r)
	if !ok {
		return
	}
	ack, err := s.storeOf(r.Context(), id).Heartbeat(r.Context(), id, body.Digest)
	if errors.Is(err, store.ErrAdvertisementNeeded) {
		s.metrics.heartbeats.WithLabelValues(heartbeatAdvertisementNeeded).Inc()
		writeError(w, http.StatusConflict, api.ReasonAdvertisementNeeded, err.Error())
		return
	}
	if err != nil {
		s.writeStoreError(w, "heartbeat", err)
		return
	}
	s.metrics.heartbeats.WithLabelValues(heartbeatAccepted).Inc()
	writeJSON(w, http.StatusOK, api.HeartbeatFromStore(id, ack))
}

func (s *Server) getCluster(w http.ResponseWriter, r *http.Request, _ string) {
	id := r.PathValue("id")
	c, err := s.storeOf(r.Context(), id).Cluster(r.Context(), id)
	if err != nil {
		s.writeStoreError(w, "", err)
		return
	}
	writeJSON(w, http.StatusOK, api.ClusterFromStore(c, c.Live)) // judged on the Redis clock
}

// deleteCluster serves DELETE /api/v2/clusters/{id}: a member leaving the
// federation (rbctl leave). Only the cluster itself may; 204 once forgotten,
// 404 when the broker holds no advertisement of it, 409 while live
// reservations name it.
func (s *Server) deleteCluster(w http.ResponseWriter, r *http.Request, caller string) {
	id := r.PathValue("id")
	if id != caller {
		writeError(w, http.StatusForbidden, api.ReasonForbidden, "cluster "+caller+" may only remove itself, not "+id)
		return
	}
	if !s.throttle(w, r, caller, s.write(caller)) {
		return
	}
	if err := s.forgetEverywhere(r.Context(), id); err != nil {
		s.writeStoreError(w, "forget", err)
		return
	}
	s.log.Info("cluster left the federation", "cluster", id)
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) postReservation(w http.ResponseWriter, r *http.Request, caller string) {
	var body api.ReservationRequest
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
	d, ok := s.reserve(w, r.Context(), req, body.Cells == api.CellsAll)
	if !ok {
		return
	}
	code := http.StatusCreated
	if d.Replayed {
		code = http.StatusOK
	}
	writeJSON(w, code, api.ReservationFromStore(d.Reservation, true))
}

// reserve runs a decision, records its metrics, and answers failures itself.
// With cells, it decides in the requester's cell, or, across, in the cell
// of the best provider of all (store.Cells.ReserveAcross).
func (s *Server) reserve(w http.ResponseWriter, ctx context.Context, req model.ReserveRequest, across bool) (model.Decision, bool) {
	start := time.Now()
	if le := s.rateRefused.refused("", req.Requester, 1, start); le != nil {
		s.metrics.decided(outcomeLimited, 0)
		writeFairShareError(w, le)
		return model.Decision{}, false
	}
	d, cell, err := s.decide(ctx, req, across)
	took := time.Since(start)
	s.rateRefused.record(req.Requester, start, err, nil)
	var noFit *store.NoFitError
	switch {
	case err == nil:
		outcome := outcomeReserved
		if d.Replayed {
			outcome = outcomeReplayed
		} else if log := s.log.V(1); log.Enabled() { // no argument list built when disabled
			log.Info("reserved", "reservation", req.ID, "requester", req.Requester,
				"provider", d.Reservation.Target, "score", d.Reservation.Score, "cell", cell)
		}
		s.metrics.decided(outcome, took)
		return d, true
	case errors.As(err, &noFit):
		s.metrics.decided(outcomeNoFit, took)
		writeJSON(w, http.StatusConflict, api.Error{Error: noFit.Error(), Reason: api.ReasonNoCapacity, Rejected: noFit.Rejected})
	case errors.Is(err, store.ErrConflict):
		s.metrics.decided(outcomeConflict, took)
		s.writeStoreError(w, "reserve", err)
	case errors.As(err, new(*store.LimitError)):
		s.metrics.decided(outcomeLimited, took)
		writeFairShareError(w, err)
	default:
		s.metrics.decided(outcomeError, took)
		s.writeStoreError(w, "reserve", err)
	}
	return model.Decision{}, false
}

// decide reserves req: in the one cell, or in the requester's, or across
// every cell; it returns the cell that decided ("" with one cell).
func (s *Server) decide(ctx context.Context, req model.ReserveRequest, across bool) (model.Decision, string, error) {
	if s.cells == nil {
		d, err := s.store.Reserve(ctx, req)
		return d, "", err
	}
	home := s.cellOf(ctx, req.Requester)
	if !across {
		d, err := s.cells.Reserve(ctx, home, req)
		return d, home, err
	}
	d, err := s.cells.ReserveAcross(ctx, home, req)
	return d.Decision, d.Cell, err
}

// requesterOf is whose reservation a call addresses: ids are scoped per
// requester, so a provider names the requester with ?requester=<cluster>;
// without it the id is the caller's own. false: answered (400).
func requesterOf(w http.ResponseWriter, r *http.Request, caller string) (string, bool) {
	requester := r.URL.Query().Get("requester")
	if requester == "" {
		return caller, true
	}
	if err := api.ValidateClusterID(requester); err != nil {
		writeError(w, http.StatusBadRequest, api.ReasonBadRequest, "requester: "+err.Error())
		return "", false
	}
	return requester, true
}

// writeReservationError answers a failed call on reservation id of
// requester. One that exists but is not the caller's (it is neither its
// requester nor its provider) is answered exactly as one that does not
// exist: a member learns nothing of the others' reservations by guessing ids.
func (s *Server) writeReservationError(w http.ResponseWriter, script, requester, id string, err error) {
	if errors.Is(err, store.ErrNotFound) || errors.Is(err, store.ErrForbidden) {
		writeError(w, http.StatusNotFound, api.ReasonNotFound, "no reservation "+id+" of "+requester+
			" that you are a party to (ids are scoped per requester: a provider adds ?requester=<cluster>)")
		return
	}
	s.writeStoreError(w, script, err)
}

func (s *Server) getReservation(w http.ResponseWriter, r *http.Request, caller string) {
	requester, ok := requesterOf(w, r, caller)
	if !ok {
		return
	}
	id := r.PathValue("id")
	st, err := s.storeHolding(r.Context(), caller, requester, id)
	if err != nil {
		s.writeStoreError(w, "", err)
		return
	}
	res, err := st.Reservation(r.Context(), requester, id)
	if err == nil && caller != res.Requester && caller != res.Target {
		err = store.ErrForbidden
	}
	if err != nil {
		s.writeReservationError(w, "", requester, id, err)
		return
	}
	writeJSON(w, http.StatusOK, api.ReservationFromStore(res, caller == res.Requester))
}

func (s *Server) deleteReservation(w http.ResponseWriter, r *http.Request, caller string) {
	requester, ok := requesterOf(w, r, caller)
	if !ok {
		return
	}
	if !s.throttle(w, r, caller, s.write(caller)) {
		return
	}
	id := r.PathValue("id")
	st, err := s.storeHolding(r.Context(), caller, requester, id)
	if err != nil {
		s.writeStoreError(w, "release", err)
		return
	}
	res, err := st.Release(r.Context(), requester, id, caller)
	if err != nil {
		s.writeReservationError(w, "release", requester, id, err)
		return
	}
	if res.Released {
		s.metrics.ended.WithLabelValues("released").Inc()
	}
	if res.Clamped {
		s.metrics.clamps.Inc()
	}
	writeJSON(w, http.StatusOK, api.ReservationFromStore(res.Reservation, false))
}

func (s *Server) postGrant(w http.ResponseWriter, r *http.Request, caller string) {
	requester, ok := requesterOf(w, r, caller)
	if !ok {
		return
	}
	if !s.throttle(w, r, caller, s.write(caller)) {
		return
	}
	g, ok := decodeValid[api.Grant](w, r)
	if !ok {
		return
	}
	raw, err := jsonMarshal(g)
	if err != nil {
		writeError(w, http.StatusInternalServerError, api.ReasonInternal, err.Error())
		return
	}
	id := r.PathValue("id")
	st, err := s.storeHolding(r.Context(), caller, requester, id)
	if err != nil {
		s.writeStoreError(w, "grant", err)
		return
	}
	res, err := st.Grant(r.Context(), requester, id, caller, raw)
	switch {
	case err == nil:
	case res.ID != "": // the reservation exists but has ended (told to its provider only)
		writeError(w, http.StatusConflict, api.ReasonConflict, err.Error())
		return
	case errors.Is(err, store.ErrForbidden) && requester == caller:
		// Its requester knows it exists: only its provider grants.
		writeError(w, http.StatusForbidden, api.ReasonForbidden, "only the provider of reservation "+id+" grants it")
		return
	default:
		s.writeReservationError(w, "grant", requester, id, err)
		return
	}
	writeJSON(w, http.StatusOK, api.ReservationFromStore(res, false))
}

// postRenewals extends the caller's leases: atomic calls of at most 100 ids
// batch, on the Redis clock. Each id is renewed or refused (and then left
// as it was); the answer is 200 either way. With ?requester=, the caller is
// a provider renewing that requester's leases placed on it (store.RenewFor).
func (s *Server) postRenewals(w http.ResponseWriter, r *http.Request, caller string) {
	requester, ok := requesterOf(w, r, caller)
	if !ok {
		return
	}
	// The calls and bytes are known before the body is read, the ids after.
	rates := s.rates(caller)
	call := model.Charge{Kind: store.RateRenewals, Rate: rates.Renewals, Cost: 1}
	bytes := model.Charge{Kind: store.RateRenewalBytes, Rate: rates.RenewalBytes, Cost: bodyCost(r, api.MaxRenewBodyBytes)}
	if s.refusedByRate(w, r, caller, time.Now(), call, bytes) {
		return
	}
	body, err := api.DecodeRenewRequest(r.Body, r.ContentLength)
	if err != nil {
		writeDecodeError(w, err) // counted by rb_broker_http_requests_total, code 400
		return
	}
	if err := body.Validate(); err != nil {
		writeDecodeError(w, err)
		return
	}
	if !s.throttle(w, r, caller, call, bytes,
		model.Charge{Kind: store.RateRenewedIDs, Rate: rates.RenewedIDs, Cost: int64(len(body.IDs))}) {
		return
	}
	s.metrics.renewBatch.Observe(float64(len(body.IDs)))
	out := api.RenewResponse{Renewed: make([]api.RenewedLease, 0, len(body.IDs))}
	if len(body.IDs) == 0 {
		writeJSON(w, http.StatusOK, out)
		return
	}
	renew, whose := (*store.Store).Renew, "of "+requester
	if requester != caller {
		renew = func(st *store.Store, ctx context.Context, requester string, ids []string) ([]model.Renewal, error) {
			return st.RenewFor(ctx, caller, requester, ids)
		}
		whose = "of " + requester + " placed on " + caller
	}
	renewals, err := s.renewIn(r.Context(), caller, requester, body.IDs, renew)
	if err != nil {
		s.metrics.renewal(renewError).Add(float64(len(body.IDs)))
		s.writeStoreError(w, "renew", err)
		return
	}
	var counts [5]int // by renewOutcomes' order
	for _, rn := range renewals {
		switch rn.Outcome {
		case model.Renewed:
			counts[0]++
			out.Renewed = append(out.Renewed, api.RenewedLease{ID: rn.ID, RemainingMs: rn.Remaining.Milliseconds()})
			continue
		case model.RenewNotFound:
			counts[1]++
			out.Refused = append(out.Refused, api.RefusedRenewal{ID: rn.ID, Reason: api.RenewNotFound,
				Error: "no reservation " + rn.ID + " " + whose + " (ids are scoped per requester)"})
		case model.RenewEnded:
			counts[2]++
			out.Refused = append(out.Refused, api.RefusedRenewal{ID: rn.ID, Reason: api.RenewEnded,
				Error: "reservation " + rn.ID + " has ended (released or expired): it cannot be renewed"})
		case model.RenewNotALease:
			counts[3]++
			out.Refused = append(out.Refused, api.RefusedRenewal{ID: rn.ID, Reason: api.RenewNotALease,
				Error: "reservation " + rn.ID + " has a fixed duration (no lease): it is never renewed"})
		case model.RenewByRequester:
			counts[4]++
			out.Refused = append(out.Refused, api.RefusedRenewal{ID: rn.ID, Reason: api.RenewRequesterRenews,
				Error: "not renewed: " + requester + " renews its leases itself (it renewed within a third of a lease); a provider's renewal is needed only once it has gone quiet"})
		default:
			s.writeStoreError(w, "renew", errors.New("unexpected renewal outcome "+string(rn.Outcome)))
			return
		}
	}
	for i, n := range counts {
		if n > 0 {
			s.metrics.renewal(renewOutcomes[i]).Add(float64(n))
		}
	}
	if log := s.log.V(2); log.Enabled() {
		log.Info("renewed", "requester", requester, "caller", caller, "renewed", counts[0], "refused", len(body.IDs)-counts[0])
	}
	writeJSON(w, http.StatusOK, out)
}

// postQuietRequesters answers a provider which of the requesters it names
// have gone quiet: not renewed their own leases within a third of their
// shortest lease. The provider renews for those alone (postRenewals with
// ?requester=), so while the requesters renew, a provider costs one call a
// period however many requesters it hosts, not one per requester. It
// learns no more than a renewal for them would tell it (RequesterRenews).
// Charged as one renewal, each requester named as a renewed id.
func (s *Server) postQuietRequesters(w http.ResponseWriter, r *http.Request, caller string) {
	rates := s.rates(caller)
	call := model.Charge{Kind: store.RateRenewals, Rate: rates.Renewals, Cost: 1}
	bytes := model.Charge{Kind: store.RateRenewalBytes, Rate: rates.RenewalBytes, Cost: bodyCost(r, api.MaxRenewBodyBytes)}
	if s.refusedByRate(w, r, caller, time.Now(), call, bytes) {
		return
	}
	body, ok := decodeValid[api.QuietRequest](w, r)
	if !ok {
		return
	}
	if !s.throttle(w, r, caller, call, bytes,
		model.Charge{Kind: store.RateRenewedIDs, Rate: rates.RenewedIDs, Cost: int64(len(body.Requesters))}) {
		return
	}
	renewing, err := s.requestersRenewing(r.Context(), caller, body.Requesters)
	if err != nil {
		s.writeStoreError(w, "quiet", err)
		return
	}
	out := api.QuietResponse{Quiet: []string{}}
	for i, requester := range body.Requesters {
		if !renewing[i] {
			out.Quiet = append(out.Quiet, requester)
		}
	}
	writeJSON(w, http.StatusOK, out)
}
