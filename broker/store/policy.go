package store

import (
	"strconv"

	"github.com/fluidos-project/resource-broker/broker/model"
)

// limitArgs are the limits' values in reserve.lua's ARGV ("": none).
func limitArgs(l model.Limits) []any {
	opt := func(v *int64) string {
		if v == nil {
			return ""
		}
		return strconv.FormatInt(*v, 10)
	}
	priority, rate, burst := "", "", ""
	if l.Priority != nil {
		priority = strconv.FormatInt(int64(*l.Priority), 10)
	}
	if l.Rate > 0 {
		rate = strconv.FormatFloat(l.Rate, 'g', -1, 64)
		burst = strconv.Itoa(max(l.Burst, 1))
	}
	return []any{opt(l.Reservations), opt(l.CPU), opt(l.Memory), opt(l.GPU), priority, rate, burst}
}

// Policy is the operator's fair-share configuration (broker/policy).
type Policy interface {
	// Limits returns a requester's limits.
	Limits(requester string) model.Limits
	// CheckAdvertisement returns a *BoundError when cluster advertises
	// something outside the operator's bounds for it.
	CheckAdvertisement(cluster string, ad model.Advertisement) error
	// Rates returns a member's rates other than its reserve calls'.
	Rates(member string) model.MemberRates
	// Clusters lists the clusters with settings of their own.
	Clusters() []string
}
