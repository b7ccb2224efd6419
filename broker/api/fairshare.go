package api

import (
	"strconv"

	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/fluidos-project/resource-broker/broker/model"
)

// Error reasons of the operator's fair share (broker/policy).
const (
	// ReasonLimitExceeded (429, with Retry-After): the requester is at one of
	// its limits on live reservations or the capacity they hold.
	ReasonLimitExceeded = "LimitExceeded"
	// ReasonRateLimited (429, with Retry-After): the requester's reserve
	// calls exceed its rate.
	ReasonRateLimited = "RateLimited"
	// ReasonOutsideBounds (403): an advertisement outside what the operator
	// allows its cluster; the message names the bound.
	ReasonOutsideBounds = "OutsideBounds"
)

// MemberUsage is what one member holds as a requester, against its limits:
// an element of GET /api/v2/usage.
type MemberUsage struct {
	Cluster string `json:"cluster"`
	// Reservations and Resources are its live reservations and what they hold.
	Reservations int64      `json:"reservations"`
	Resources    Quantities `json:"resources"`
	// EndedReservations are its ended reservations kept readable (until
	// the retention, at most rb-broker's --max-ended-per-member).
	EndedReservations int64        `json:"endedReservations"`
	Limits            MemberLimits `json:"limits"`
}

// MemberLimits are a member's limits as a requester; an absent one is no limit.
type MemberLimits struct {
	MaxReservations *int64      `json:"maxReservations,omitempty"`
	MaxResources    *Quantities `json:"maxResources,omitempty"`
	// MaxPriority is its priority ceiling: higher priorities are clamped to it.
	MaxPriority       *int32 `json:"maxPriority,omitempty"`
	ReservesPerSecond string `json:"reservesPerSecond,omitempty"` // a decimal number
	ReserveBurst      int    `json:"reserveBurst,omitempty"`
}

// MemberUsageFromStore renders a member's usage (u: its live reservations,
// ended: the ended ones kept) and limits.
func MemberUsageFromStore(cluster string, u model.Usage, ended int64, l model.Limits) MemberUsage {
	out := MemberUsage{Cluster: cluster, Reservations: u.Reservations, Resources: FromResources(u.Resources), EndedReservations: ended,
		Limits: MemberLimits{MaxReservations: l.Reservations, MaxPriority: l.Priority}}
	if l.CPU != nil || l.Memory != nil || l.GPU != nil {
		q := Quantities{}
		if l.CPU != nil {
			q.CPU = resource.NewMilliQuantity(*l.CPU, resource.DecimalSI)
		}
		if l.Memory != nil {
			q.Memory = resource.NewQuantity(*l.Memory, resource.BinarySI)
		}
		if l.GPU != nil {
			q.GPU = resource.NewQuantity(*l.GPU, resource.DecimalSI)
		}
		out.Limits.MaxResources = &q
	}
	if l.Rate > 0 {
		out.Limits.ReservesPerSecond = strconv.FormatFloat(l.Rate, 'f', -1, 64)
		out.Limits.ReserveBurst = l.Burst
	}
	return out
}
