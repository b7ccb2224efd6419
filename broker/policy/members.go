package policy

import (
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/fluidos-project/resource-broker/broker/model"
)

// Members are the rates of the members' calls other than reserve (those
// are the requesters' reservesPerSecond): Default for every member,
// Clusters[id] overriding some of them for one. Unlike the requesters'
// limits they are on without a policy file and with a file that does not
// name them: each rate left out is DefaultMemberRates'. A rate of 0 per
// second is no limit.
//
//	members:
//	  default:
//	    advertisements: {perSecond: "5", burst: "20"}
//	    renewalBytes: {perSecond: 256Ki, burst: 4Mi}
//	  clusters:
//	    bulk: {renewedIDs: {perSecond: "10k", burst: "100k"}}
type Members struct {
	Default  MemberRates            `json:"default"`
	Clusters map[string]MemberRates `json:"clusters,omitempty"`
}

// MemberRates are one member's rates; an absent field is the default's.
type MemberRates struct {
	// Advertisements: PUT of its advertisement (v2) and POST of it (v1).
	Advertisements *Rate `json:"advertisements,omitempty"`
	// Renewals, RenewedIDs, RenewalBytes: its renewal calls, the ids they
	// carry and the bytes of their bodies (a renewal's cost grows with both).
	Renewals     *Rate `json:"renewals,omitempty"`
	RenewedIDs   *Rate `json:"renewedIDs,omitempty"`
	RenewalBytes *Rate `json:"renewalBytes,omitempty"`
	// Writes: releases, grants and leaving the federation (DELETE cluster).
	Writes *Rate `json:"writes,omitempty"`
	// Protections: PUT of the reservations its PodDisruptionBudgets protect.
	Protections *Rate `json:"protections,omitempty"`
}

// Rate is a rate with a burst, as quantities ("10", "500m", "256Ki").
type Rate struct {
	PerSecond *resource.Quantity `json:"perSecond"`       // required; 0: no limit
	Burst     *resource.Quantity `json:"burst,omitempty"` // default: one second's worth, at least 1
}

// DefaultMemberRates are the rates no honest agent reaches, derived from
// the agents' own schedule (docs/architecture.md, "Fair share"):
//   - advertisements: an agent publishes at most once per debounce (1 s)
//     plus its period's tick (every 30 s), about once a second while its
//     cluster keeps changing: 2 a second, 5 at once (a faster schedule
//     needs a policy of its own, as the test bed's: internal/testbed);
//   - renewals: an agent renews every 30 s, one call per 5,000 of its
//     leases, and a provider one call per requester it hosts: 10 calls a
//     second with 100 at once cover 100 requesters renewed together; ids,
//     2,000 a second with 20,000 at once, renew 60,000 leases in a 30 s
//     cycle; bytes, 128 KiB a second with 2 MiB at once (ids of about 40
//     bytes, 2,000 of them about 86 KiB; 2 MiB holds a full batch of the
//     longest ids);
//   - writes: a release per reservation ended and a grant per reservation
//     hosted follow the reserve rates (100 a second, 200 at once, per
//     requester): 200 a second, 1,000 at once;
//   - protections: an agent sends its protected set when a
//     PodDisruptionBudget's allowance changes, debounced: 2 a second, 10 at once.
var DefaultMemberRates = model.MemberRates{
	Advertisements: model.Rate{PerSecond: 2, Burst: 5},
	Renewals:       model.Rate{PerSecond: 10, Burst: 100},
	RenewedIDs:     model.Rate{PerSecond: 2000, Burst: 20_000},
	RenewalBytes:   model.Rate{PerSecond: 128 << 10, Burst: 2 << 20},
	Writes:         model.Rate{PerSecond: 200, Burst: 1000},
	Protections:    model.Rate{PerSecond: 2, Burst: 10},
}

// Rates returns a member's rates (store.Policy).
func (p *Policy) Rates(member string) model.MemberRates {
	if r, ok := p.rates[member]; ok {
		return r
	}
	return p.defaultRates
}

// memberRate is one rate of a MemberRates: its name in the file, its value
// (nil: not set) and where it goes in model.MemberRates.
type memberRate struct {
	name string
	rate *Rate
	in   func(*model.MemberRates) *model.Rate
}

// fields lists m's rates, the one list merging and validation go by.
func (m MemberRates) fields() []memberRate {
	return []memberRate{
		{"advertisements", m.Advertisements, func(r *model.MemberRates) *model.Rate { return &r.Advertisements }},
		{"renewals", m.Renewals, func(r *model.MemberRates) *model.Rate { return &r.Renewals }},
		{"renewedIDs", m.RenewedIDs, func(r *model.MemberRates) *model.Rate { return &r.RenewedIDs }},
		{"renewalBytes", m.RenewalBytes, func(r *model.MemberRates) *model.Rate { return &r.RenewalBytes }},
		{"writes", m.Writes, func(r *model.MemberRates) *model.Rate { return &r.Writes }},
		{"protections", m.Protections, func(r *model.MemberRates) *model.Rate { return &r.Protections }},
	}
}

// over returns base with the rates m sets in the store's units.
func (m MemberRates) over(base model.MemberRates) model.MemberRates {
	for _, f := range m.fields() {
		if f.rate != nil {
			*f.in(&base) = f.rate.rate()
		}
	}
	return base
}

func (r *Rate) rate() model.Rate {
	out := model.Rate{PerSecond: r.PerSecond.AsApproximateFloat64()} // validated: set
	out.Burst = max(1, int64(out.PerSecond+0.999999))
	if r.Burst != nil {
		out.Burst = r.Burst.Value()
	}
	return out
}

func (m MemberRates) validate(p *field.Path) field.ErrorList {
	var errs field.ErrorList
	for _, f := range m.fields() {
		if f.rate == nil {
			continue
		}
		if f.rate.PerSecond == nil {
			errs = append(errs, field.Required(p.Child(f.name, "perSecond"), "a rate needs its units per second (0: no limit)"))
		} else if f.rate.PerSecond.Sign() < 0 || f.rate.PerSecond.Cmp(*maxRate) > 0 {
			errs = append(errs, field.Invalid(p.Child(f.name, "perSecond"), f.rate.PerSecond.String(), "must be between 0 (no limit) and 2^53-1"))
		}
		if b := f.rate.Burst; b != nil && (b.Cmp(*resource.NewQuantity(1, resource.DecimalSI)) < 0 || b.Cmp(*maxRate) > 0) {
			errs = append(errs, field.Invalid(p.Child(f.name, "burst"), b.String(), "must be between 1 and 2^53-1"))
		}
	}
	return errs
}

// maxRate bounds rates and bursts: the throttle script computes in doubles.
var maxRate = resource.NewQuantity(model.MaxAmount, resource.DecimalSI)
