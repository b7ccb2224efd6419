package server

import (
	"crypto/rand"
	"encoding/hex"
	"net/http"
	"strconv"
	"time"

	"github.com/fluidos-project/resource-broker/broker/api"
	"github.com/fluidos-project/resource-broker/broker/model"
	"github.com/fluidos-project/resource-broker/broker/store"
)

// The seed agents' protocol, served unchanged beside v2.

func (s *Server) v1PostAdvertisement(w http.ResponseWriter, r *http.Request, caller string) {
	if !s.throttle(w, r, caller, model.Charge{Kind: store.RateAdvertisements, Rate: s.rates(caller).Advertisements, Cost: 1}) {
		return
	}
	var body api.V1Advertisement
	if err := api.Decode(r.Body, &body); err != nil {
		writeDecodeError(w, err)
		return
	}
	if body.ClusterID != caller {
		writeError(w, http.StatusForbidden, api.ReasonForbidden,
			"clusterID "+strconv.Quote(body.ClusterID)+" differs from the certificate's "+caller)
		return
	}
	ad, err := body.ToStore()
	if err != nil {
		writeDecodeError(w, err)
		return
	}
	s.capV1Allocated(caller, &ad)
	instructions, err := s.v1InstructionsFor(r, caller)
	if err != nil {
		s.writeStoreError(w, "", err)
		return
	}
	s.advertise(w, r.Context(), caller, ad, func(c model.Cluster) any {
		return api.V1AdvertisementResponse{Advertisement: api.V1AdvertisementFromStore(c), ProviderInstructions: instructions}
	})
}

// capV1Allocated caps each resource's allocated at its allocatable. A seed
// agent counts Pending pods in allocated and GPUs of Ready nodes only, so one
// unschedulable pod asking for a GPU puts allocated above allocatable: v2
// refuses such an advertisement (400), but a seed agent would then be
// refused every time and go stale, its free CPU and memory lost. For that
// resource the cluster has nothing free, which is what capping says.
func (s *Server) capV1Allocated(caller string, ad *model.Advertisement) {
	for _, r := range []struct {
		name             string
		allocated, alloc *int64
	}{
		{"cpu", &ad.Allocated.CPU, &ad.Allocatable.CPU}, {"memory", &ad.Allocated.Memory, &ad.Allocatable.Memory},
		{"gpu", &ad.Allocated.GPU, &ad.Allocatable.GPU}, {"storage", &ad.Allocated.Storage, &ad.Allocatable.Storage},
	} {
		if *r.allocated <= *r.alloc {
			continue
		}
		s.log.Info("Warning: seed advertisement allocates more than allocatable, capped at allocatable (nothing free)",
			"cluster", caller, "resource", r.name, "allocated", model.Quantity(r.name, *r.allocated), "allocatable", model.Quantity(r.name, *r.alloc))
		s.metrics.v1Capped.WithLabelValues(r.name).Inc()
		*r.allocated = *r.alloc
	}
}

func (s *Server) v1GetAdvertisement(w http.ResponseWriter, r *http.Request, _ string) {
	id := r.PathValue("clusterID")
	c, err := s.storeOf(r.Context(), id).Cluster(r.Context(), id)
	if err != nil {
		s.writeStoreError(w, "", err)
		return
	}
	writeJSON(w, http.StatusOK, api.V1AdvertisementFromStore(c))
}

func (s *Server) v1PostReservation(w http.ResponseWriter, r *http.Request, caller string) {
	var body api.V1ReservationRequest
	if err := api.Decode(r.Body, &body); err != nil {
		s.metrics.reservation(outcomeInvalid).Inc()
		writeDecodeError(w, err)
		return
	}
	req, err := body.ToStore(v1ReservationID(caller), caller, s.limits)
	if err != nil {
		s.metrics.reservation(outcomeInvalid).Inc()
		writeDecodeError(w, err)
		return
	}
	if d, ok := s.reserve(w, r.Context(), req, false); ok {
		writeJSON(w, http.StatusCreated, api.V1ReservationFromStore(d.Reservation))
	}
}

// v1ReservationID makes an id in the seed's style, rsv-<requester>-<unix-millis>,
// with a random suffix so two requests in one millisecond don't collide.
func v1ReservationID(requester string) string {
	var b [3]byte
	_, _ = rand.Read(b[:])
	return "rsv-" + requester + "-" + strconv.FormatInt(time.Now().UnixMilli(), 10) + "-" + hex.EncodeToString(b[:])
}

func (s *Server) v1Instructions(w http.ResponseWriter, r *http.Request, caller string) {
	out, err := s.v1InstructionsFor(r, caller)
	if err != nil {
		s.writeStoreError(w, "", err)
		return
	}
	if out == nil {
		out = []api.V1Reservation{}
	}
	writeJSON(w, http.StatusOK, out)
}

// v1InstructionsFor lists the reservations in phase Reserved whose target is
// the caller. The seed protocol has no pages, so it reads every page of the
// caller's live reservations (api.MaxPageSize each, as a v2 list reads them):
// a seed provider never grants, so all of them may be Reserved.
func (s *Server) v1InstructionsFor(r *http.Request, caller string) ([]api.V1Reservation, error) {
	var out []api.V1Reservation
	st := s.storeOf(r.Context(), caller) // a provider's reservations are in its cell
	seen := map[string]bool{}            // SSCAN may return an id twice across pages
	for pos, more := (store.ScanPos{}), true; more; {
		var qids []string
		var err error
		qids, pos, more, err = st.ScanLive(r.Context(), store.ByTarget, caller, pos, api.MaxPageSize)
		if err != nil {
			return nil, err
		}
		rs, err := st.Reservations(r.Context(), qids)
		if err != nil {
			return nil, err
		}
		for _, res := range rs {
			if res.Phase == model.PhaseReserved && !seen[res.QID()] {
				seen[res.QID()] = true
				out = append(out, api.V1ReservationFromStore(res))
			}
		}
	}
	return out, nil
}
