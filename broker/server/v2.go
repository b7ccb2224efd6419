package server

import (
	"context"
	"errors"
	"net/http"
	"time"

	"github.com/fluidos-project/resource-broker/broker/api"
	"github.com/fluidos-project/resource-broker/broker/store"
)

func (s *Server) putAdvertisement(w http.ResponseWriter, r *http.Request, caller string) {
	id := r.PathValue("id")
	if id != caller {
		writeError(w, http.StatusForbidden, api.ReasonForbidden, "cluster "+caller+" may only advertise itself, not "+id)
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
	s.advertise(w, r.Context(), id, ad, func(c store.Cluster) any { return api.ClusterFromStore(c, true) })
}

// advertise stores ad and answers with the stored cluster rendered by view.
func (s *Server) advertise(w http.ResponseWriter, ctx context.Context, id string, ad store.Advertisement, view func(store.Cluster) any) {
	ack, err := s.store.Advertise(ctx, id, ad)
	if err != nil {
		s.writeStoreError(w, "advertise", err)
		return
	}
	writeJSON(w, http.StatusOK, view(store.Cluster{ID: id, Advertisement: ad, Reserved: ack.Reserved, SeenAt: ack.SeenAt,
		NodesReserved: ack.NodesReserved}))
}

func (s *Server) listClusters(w http.ResponseWriter, r *http.Request, _ string) {
	clusters, err := s.store.Clusters(r.Context())
	if err != nil {
		s.writeStoreError(w, "", err)
		return
	}
	out := make([]api.Cluster, 0, len(clusters))
	for _, c := range clusters {
		out = append(out, api.ClusterFromStore(c, s.live(c)))
	}
	writeJSON(w, http.StatusOK, out)
}

func (s *Server) getCluster(w http.ResponseWriter, r *http.Request, _ string) {
	c, err := s.store.Cluster(r.Context(), r.PathValue("id"))
	if err != nil {
		s.writeStoreError(w, "", err)
		return
	}
	writeJSON(w, http.StatusOK, api.ClusterFromStore(c, s.live(c)))
}

// live judges liveness for display only; decisions use the Redis clock in the script.
func (s *Server) live(c store.Cluster) bool {
	return time.Since(c.SeenAt) <= s.store.Config().StaleThreshold
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
	d, ok := s.reserve(w, r.Context(), req)
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
func (s *Server) reserve(w http.ResponseWriter, ctx context.Context, req store.ReserveRequest) (store.Decision, bool) {
	start := time.Now()
	d, err := s.store.Reserve(ctx, req)
	s.metrics.decision.Observe(time.Since(start).Seconds())
	var noFit *store.NoFitError
	switch {
	case err == nil:
		outcome := outcomeReserved
		if d.Replayed {
			outcome = outcomeReplayed
		} else if log := s.log.V(1); log.Enabled() { // no argument list built when disabled
			log.Info("reserved", "reservation", req.ID, "requester", req.Requester,
				"provider", d.Reservation.Target, "score", d.Reservation.Score)
		}
		s.metrics.reservation(outcome).Inc()
		return d, true
	case errors.As(err, &noFit):
		s.metrics.reservation(outcomeNoFit).Inc()
		writeJSON(w, http.StatusConflict, api.Error{Error: noFit.Error(), Reason: api.ReasonNoCapacity, Rejected: noFit.Rejected})
	case errors.Is(err, store.ErrConflict):
		s.metrics.reservation(outcomeConflict).Inc()
		s.writeStoreError(w, "reserve", err)
	default:
		s.metrics.reservation(outcomeError).Inc()
		s.writeStoreError(w, "reserve", err)
	}
	return store.Decision{}, false
}

func (s *Server) listReservations(w http.ResponseWriter, r *http.Request, caller string) {
	role := r.URL.Query().Get("role")
	var sets []string
	switch role {
	case "requester":
		sets = []string{"by-requester"}
	case "provider":
		sets = []string{"by-target"}
	case "":
		sets = []string{"by-requester", "by-target"}
	default:
		writeError(w, http.StatusBadRequest, api.ReasonBadRequest, "role: must be requester or provider")
		return
	}
	out := []api.Reservation{}
	for _, set := range sets {
		rs, err := s.store.LiveReservations(r.Context(), set, caller)
		if err != nil {
			s.writeStoreError(w, "", err)
			return
		}
		for _, res := range rs {
			out = append(out, api.ReservationFromStore(res, res.Requester == caller))
		}
	}
	writeJSON(w, http.StatusOK, out)
}

func (s *Server) getReservation(w http.ResponseWriter, r *http.Request, caller string) {
	res, err := s.store.Reservation(r.Context(), r.PathValue("id"))
	if err != nil {
		s.writeStoreError(w, "", err)
		return
	}
	if caller != res.Requester && caller != res.Target {
		s.writeStoreError(w, "", store.ErrForbidden)
		return
	}
	writeJSON(w, http.StatusOK, api.ReservationFromStore(res, caller == res.Requester))
}

func (s *Server) deleteReservation(w http.ResponseWriter, r *http.Request, caller string) {
	res, err := s.store.Release(r.Context(), r.PathValue("id"), caller)
	if err != nil {
		s.writeStoreError(w, "release", err)
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
	var g api.Grant
	if err := api.Decode(r.Body, &g); err != nil {
		writeDecodeError(w, err)
		return
	}
	if err := g.Validate(); err != nil {
		writeDecodeError(w, err)
		return
	}
	raw, err := jsonMarshal(g)
	if err != nil {
		writeError(w, http.StatusInternalServerError, api.ReasonInternal, err.Error())
		return
	}
	res, err := s.store.Grant(r.Context(), r.PathValue("id"), caller, raw)
	if err != nil {
		if res.ID != "" { // the reservation exists but has ended
			writeError(w, http.StatusConflict, api.ReasonConflict, err.Error())
			return
		}
		s.writeStoreError(w, "grant", err)
		return
	}
	writeJSON(w, http.StatusOK, api.ReservationFromStore(res, false))
}
