package api

import (
	"time"

	"github.com/fluidos-project/resource-broker/broker/model"
)

// The seed agents' protocol (v1). Field names and shapes are fixed by the
// agents already deployed; see docs/architecture.md.

// V1Resources are an advertisement's amounts. Reserved is broker-owned and
// Available is recomputed by the broker: both are ignored on input.
type V1Resources struct {
	Capacity    Quantities  `json:"capacity"`
	Allocatable Quantities  `json:"allocatable"`
	Allocated   Quantities  `json:"allocated"`
	Reserved    *Quantities `json:"reserved,omitempty"`
	Available   Quantities  `json:"available"`
}

// V1Advertisement is the body of POST /api/v1/advertisements.
type V1Advertisement struct {
	ClusterID   string      `json:"clusterID"`
	ClusterName string      `json:"clusterName"`
	Resources   V1Resources `json:"resources"`
	Timestamp   time.Time   `json:"timestamp"`
}

// ToStore validates and converts the advertisement.
func (a V1Advertisement) ToStore() (model.Advertisement, error) {
	v2 := Advertisement{ClusterName: a.ClusterName, Resources: ClusterResources{
		Capacity: a.Resources.Capacity, Allocatable: a.Resources.Allocatable, Allocated: a.Resources.Allocated,
	}}
	return v2.ToStore()
}

// V1AdvertisementFromStore renders a stored cluster in the v1 shape.
func V1AdvertisementFromStore(c model.Cluster) V1Advertisement {
	reserved := FromResources(c.Reserved)
	return V1Advertisement{
		ClusterID:   c.ID,
		ClusterName: c.Name,
		Resources: V1Resources{
			Capacity:    FromResources(c.Capacity),
			Allocatable: FromResources(c.Allocatable),
			Allocated:   FromResources(c.Allocated),
			Reserved:    &reserved,
			Available:   FromResources(c.Free()),
		},
		Timestamp: c.SeenAt,
	}
}

// V1AdvertisementResponse answers POST /api/v1/advertisements.
type V1AdvertisementResponse struct {
	Advertisement        V1Advertisement `json:"advertisement"`
	ProviderInstructions []V1Reservation `json:"providerInstructions,omitempty"`
}

// V1ReservationStatus is a v1 reservation's status.
type V1ReservationStatus struct {
	Phase      string     `json:"phase"`
	Message    string     `json:"message"`
	ReservedAt *time.Time `json:"reservedAt,omitempty"`
	ExpiresAt  *time.Time `json:"expiresAt,omitempty"`
}

// V1Reservation is a reservation in the v1 shape.
type V1Reservation struct {
	ID                 string              `json:"id"`
	RequesterID        string              `json:"requesterID"`
	TargetClusterID    string              `json:"targetClusterID"`
	RequestedResources Quantities          `json:"requestedResources"`
	Status             V1ReservationStatus `json:"status"`
	CreatedAt          time.Time           `json:"createdAt"`
}

// V1ReservationFromStore renders a stored reservation in the v1 shape.
func V1ReservationFromStore(r model.Reservation) V1Reservation {
	created, expires := r.CreatedAt, r.ExpiresAt
	return V1Reservation{
		ID: r.ID, RequesterID: r.Requester, TargetClusterID: r.Target,
		RequestedResources: FromResources(r.Resources),
		Status: V1ReservationStatus{
			Phase:      r.Phase,
			Message:    "reserved on " + r.Target,
			ReservedAt: &created,
			ExpiresAt:  &expires,
		},
		CreatedAt: r.CreatedAt,
	}
}

// V1ReservationRequest is the body of POST /api/v1/reservations; the
// requester is the client certificate's CN, never the body.
type V1ReservationRequest struct {
	RequestedResources Quantities `json:"requestedResources"`
	Priority           int32      `json:"priority,omitempty"`
	Duration           string     `json:"duration,omitempty"`
}

// ToStore validates the request and converts it under the given id.
func (r V1ReservationRequest) ToStore(id, requester string, lim Limits) (model.ReserveRequest, error) {
	// NoWait: a seed agent never retries an id (each POST makes a new one), so
	// a refused request must not hold a place on the waiting list.
	out := model.ReserveRequest{ID: id, Requester: requester, Priority: r.Priority, NoWait: true}
	var err error
	if out.Resources, err = requestedResources(r.RequestedResources, "requestedResources"); err != nil {
		return out, err
	}
	out.Duration, err = lim.duration(r.Duration)
	return out, err
}
