package policy

import (
	"fmt"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/fluidos-project/resource-broker/broker/model"
)

// bound is one resolved setting and the field it comes from (the default's
// or an override's), which a refusal names.
type bound[T any] struct {
	v    T
	path string
	set  bool
}

func (b *bound[T]) to(v T, p *field.Path) { *b = bound[T]{v: v, path: p.String(), set: true} }

// bounds are one provider's resolved bounds, in the store's units.
type bounds struct {
	capacity      map[string]*bound[int64] // cpu (millicores), memory, storage (bytes), gpu
	priceMin      map[string]*bound[int64] // micro-units per hour, by cpu, memory, gpu
	priceMax      map[string]*bound[int64]
	currencies    bound[[]string]
	maxLabels     bound[int]
	allowedKeys   bound[[]string]
	allowedValues map[string]*bound[[]string]
}

var (
	capacityResources = []string{"cpu", "memory", "gpu", "storage"}
	pricedResources   = []string{"cpu", "memory", "gpu"}
)

func newBounds() *bounds {
	b := &bounds{capacity: map[string]*bound[int64]{}, priceMin: map[string]*bound[int64]{},
		priceMax: map[string]*bound[int64]{}, allowedValues: map[string]*bound[[]string]{}}
	for _, r := range capacityResources {
		b.capacity[r] = &bound[int64]{}
	}
	for _, r := range pricedResources {
		b.priceMin[r], b.priceMax[r] = &bound[int64]{}, &bound[int64]{}
	}
	return b
}

// add applies the fields pb sets (the default, then an override), at path p.
func (b *bounds) add(pb ProviderBounds, p *field.Path) {
	if m := pb.MaxCapacity; m != nil {
		for r, q := range map[string]*resource.Quantity{"cpu": m.CPU, "memory": m.Memory, "gpu": m.GPU, "storage": m.Storage} {
			if q != nil {
				b.capacity[r].to(amountOf(r, q), p.Child("maxCapacity", r))
			}
		}
	}
	if pr := pb.Prices; pr != nil {
		if pr.Currencies != nil {
			b.currencies.to(pr.Currencies, p.Child("prices", "currencies"))
		}
		for r, rg := range map[string]*Range{"cpu": pr.CPU, "memory": pr.Memory, "gpu": pr.GPU} {
			if rg == nil {
				continue
			}
			if rg.Min != nil {
				b.priceMin[r].to(rg.Min.ScaledValue(resource.Micro), p.Child("prices", r, "min"))
			}
			if rg.Max != nil {
				b.priceMax[r].to(rg.Max.ScaledValue(resource.Micro), p.Child("prices", r, "max"))
			}
		}
	}
	if l := pb.Labels; l != nil {
		if l.MaxLabels != nil {
			b.maxLabels.to(int(*l.MaxLabels), p.Child("labels", "maxLabels"))
		}
		if l.AllowedKeys != nil {
			b.allowedKeys.to(l.AllowedKeys, p.Child("labels", "allowedKeys"))
		}
		for k, vs := range l.AllowedValues {
			if b.allowedValues[k] == nil {
				b.allowedValues[k] = &bound[[]string]{}
			}
			b.allowedValues[k].to(vs, p.Child("labels", "allowedValues").Key(k))
		}
	}
}

// validate checks what only the resolved bounds tell: a price range whose
// min exceeds its max (each may come from the default or an override; an
// override's bounds are reported only for what the override sets).
func (b *bounds) validate(p *field.Path) field.ErrorList {
	var errs field.ErrorList
	for _, r := range pricedResources {
		lo, hi := b.priceMin[r], b.priceMax[r]
		own := strings.HasPrefix(lo.path, p.String()) || strings.HasPrefix(hi.path, p.String())
		if lo.set && hi.set && lo.v > hi.v && own {
			errs = append(errs, field.Invalid(p.Child("prices", r), fmt.Sprintf("min %s (%s), max %s (%s)", price(lo.v), lo.path, price(hi.v), hi.path),
				"the minimum exceeds the maximum"))
		}
	}
	return errs
}

// amountOf converts a quantity to the store's unit of resource r.
func amountOf(r string, q *resource.Quantity) int64 {
	if r == "cpu" {
		return q.MilliValue()
	}
	return q.Value()
}

// price renders micro-units as the API writes a price.
func price(micros int64) string {
	return resource.NewScaledQuantity(micros, resource.Micro).String()
}

// check refuses an advertisement outside the bounds with a *store.BoundError.
func (b *bounds) check(ad model.Advertisement) error {
	refuse := func(bd string, format string, args ...any) error {
		return &model.BoundError{Bound: bd, Message: fmt.Sprintf(format, args...)}
	}
	amounts := func(r model.Resources) map[string]int64 {
		return map[string]int64{"cpu": r.CPU, "memory": r.Memory, "gpu": r.GPU, "storage": r.Storage}
	}
	for _, res := range capacityResources {
		max := b.capacity[res]
		if !max.set {
			continue
		}
		for _, what := range []struct {
			name string
			v    int64
		}{{"capacity", amounts(ad.Capacity)[res]}, {"allocatable", amounts(ad.Allocatable)[res]}} {
			if what.v > max.v {
				return refuse(max.path, "advertised %s %s %s exceeds the most allowed, %s",
					what.name, res, model.Quantity(res, what.v), model.Quantity(res, max.v))
			}
		}
		for _, n := range ad.Nodes {
			if v := amounts(n.Allocatable)[res]; v > max.v {
				return refuse(max.path, "node %s: advertised allocatable %s %s exceeds the most allowed, %s",
					n.Name, res, model.Quantity(res, v), model.Quantity(res, max.v))
			}
		}
	}
	prices := map[string]int64{"cpu": ad.Prices.CPU, "memory": ad.Prices.Memory, "gpu": ad.Prices.GPU}
	for _, res := range pricedResources {
		v := prices[res]
		if lo := b.priceMin[res]; lo.set && v < lo.v {
			return refuse(lo.path, "advertised price of %s %s is below the least allowed, %s", res, price(v), price(lo.v))
		}
		if hi := b.priceMax[res]; hi.set && v > hi.v {
			return refuse(hi.path, "advertised price of %s %s exceeds the most allowed, %s", res, price(v), price(hi.v))
		}
	}
	if c := b.currencies; c.set && !slices.Contains(c.v, ad.Prices.Currency) {
		return refuse(c.path, "advertised currency %q is not one of %s", ad.Prices.Currency, strings.Join(c.v, ", "))
	}
	if m := b.maxLabels; m.set && len(ad.Labels) > m.v {
		return refuse(m.path, "%d labels advertised, at most %d allowed", len(ad.Labels), m.v)
	}
	for _, k := range sortedKeys(ad.Labels) {
		if ak := b.allowedKeys; ak.set && !keyAllowed(ak.v, k) {
			return refuse(ak.path, "label %s is not allowed (allowed: %s)", k, strings.Join(ak.v, ", "))
		}
		if av := b.allowedValues[k]; av != nil && !slices.Contains(av.v, ad.Labels[k]) {
			return refuse(av.path, "label %s=%s is not allowed (allowed values: %s)", k, ad.Labels[k], strings.Join(av.v, ", "))
		}
	}
	return nil
}

// keyAllowed tells whether key matches one of patterns: a key, or a prefix ending in "*".
func keyAllowed(patterns []string, key string) bool {
	for _, p := range patterns {
		if prefix, ok := strings.CutSuffix(p, "*"); ok {
			if strings.HasPrefix(key, prefix) {
				return true
			}
		} else if p == key {
			return true
		}
	}
	return false
}
