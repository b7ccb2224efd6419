package store

import "github.com/fluidos-project/resource-broker/broker/model"

// Policy is the operator's fair-share configuration (broker/policy).
type Policy interface {
	// Limits returns a requester's limits.
	Limits(requester string) model.Limits
	// Preferences returns a requester's default preferences: those of a
	// request that carries none (nil: none).
	Preferences(requester string) []model.Preference
	// CheckAdvertisement returns a *BoundError when cluster advertises
	// something outside the operator's bounds for it.
	CheckAdvertisement(cluster string, ad model.Advertisement) error
	// Rates returns a member's rates other than its reserve calls'.
	Rates(member string) model.MemberRates
	// Clusters lists the clusters with settings of their own.
	Clusters() []string
}
