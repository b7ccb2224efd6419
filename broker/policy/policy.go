// Package policy is the operator's fair-share configuration of the broker
// (rb-broker --policy-file, a ConfigMap in manifests/broker): the limits of
// each member cluster as a requester (live reservations, the capacity they
// hold, reserve calls per second, a priority ceiling), enforced by the
// reserve script in the same atomic step as the decision, and the bounds of
// what each member may advertise as a provider (capacity, prices, labels),
// checked before an advertisement is stored. Both have defaults and
// per-cluster overrides; an override sets only the fields it names.
//
//	apiVersion: broker.fluidos.eu/v1alpha1
//	kind: BrokerPolicy
//	requesters:
//	  default:
//	    maxReservations: 200
//	    maxResources: {cpu: "64", memory: 256Gi, gpu: "4"}
//	    maxPriority: 1000
//	    reservesPerSecond: 20
//	    reserveBurst: 40
//	  clusters:
//	    rome:
//	      maxResources: {cpu: "128"}
//	      preferences:   # rome's requests that carry none: eu-south first, then paris
//	      - {weight: 100, matchLabels: {region: eu-south}}
//	      - {weight: 50, clusters: [paris]}
//	providers:
//	  default:
//	    maxCapacity: {cpu: "512", memory: 2Ti, gpu: "16", storage: 10Ti}
//	    prices:
//	      currencies: [EUR]
//	      cpu: {min: "0.005", max: "1"}
//	    labels:
//	      maxLabels: 16
//	      allowedKeys: [region, zone, "fluidos.eu/*"]
//	  clusters:
//	    paris:
//	      maxCapacity: {cpu: "64", memory: 256Gi}
//	      labels: {allowedValues: {region: [eu-west]}}
package policy

import (
	"errors"
	"fmt"
	"math"
	"os"
	"slices"
	"sort"
	"strings"

	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"
	sigsjson "sigs.k8s.io/json"
	"sigs.k8s.io/yaml"

	"github.com/fluidos-project/resource-broker/broker/api"
	"github.com/fluidos-project/resource-broker/broker/model"
	"github.com/fluidos-project/resource-broker/broker/store"
)

// APIVersion and Kind name the file's format.
const (
	APIVersion = "broker.fluidos.eu/v1alpha1"
	Kind       = "BrokerPolicy"
)

// HighestUserDefinablePriority is the default priority ceiling: the highest
// priority a Kubernetes PriorityClass of a user may have; the system's
// (system-cluster-critical, 2000000000) are clamped to it.
const HighestUserDefinablePriority = 1_000_000_000

// File is the policy file.
type File struct {
	APIVersion string     `json:"apiVersion"`
	Kind       string     `json:"kind"`
	Requesters Requesters `json:"requesters"`
	Providers  Providers  `json:"providers"`
	Members    Members    `json:"members"`
}

// Requesters are the limits of the members as requesters: Default for every
// member, Clusters[id] overriding some of them for one.
type Requesters struct {
	Default  RequesterLimits            `json:"default"`
	Clusters map[string]RequesterLimits `json:"clusters,omitempty"`
}

// RequesterLimits are one requester's limits; an absent field is no limit
// (in Default) or the default's (in an override).
type RequesterLimits struct {
	// MaxReservations bounds its live reservations.
	MaxReservations *int64 `json:"maxReservations,omitempty"`
	// MaxResources bounds what its live reservations hold (cpu, memory, gpu).
	MaxResources *Amounts `json:"maxResources,omitempty"`
	// MaxPriority is its priority ceiling: a request of a higher priority is
	// decided, waits and is stored at the ceiling (clamped, not refused).
	MaxPriority *int32 `json:"maxPriority,omitempty"`
	// ReservesPerSecond bounds its reserve calls (replays included), with
	// ReserveBurst calls at once; over it, 429 with Retry-After.
	ReservesPerSecond *float64 `json:"reservesPerSecond,omitempty"`
	ReserveBurst      *int32   `json:"reserveBurst,omitempty"`
	// Preferences are its requests' default preferences (as a request's
	// preferences field: at most 8 terms of weight, matchLabels,
	// clusters), used when a request carries none. An override's replace
	// the default's.
	Preferences []api.Preference `json:"preferences,omitempty"`
}

// Amounts are resource quantities as the API writes them.
type Amounts struct {
	CPU     *resource.Quantity `json:"cpu,omitempty"`
	Memory  *resource.Quantity `json:"memory,omitempty"`
	GPU     *resource.Quantity `json:"gpu,omitempty"`
	Storage *resource.Quantity `json:"storage,omitempty"`
}

// Providers are the bounds of what the members may advertise: Default for
// every member, Clusters[id] overriding some of them for one.
type Providers struct {
	Default  ProviderBounds            `json:"default"`
	Clusters map[string]ProviderBounds `json:"clusters,omitempty"`
}

// ProviderBounds bound one provider's advertisements; an absent field is no
// bound (in Default) or the default's (in an override).
type ProviderBounds struct {
	// MaxCapacity bounds the advertised capacity and allocatable, in total
	// and on each node.
	MaxCapacity *Amounts     `json:"maxCapacity,omitempty"`
	Prices      *PriceBounds `json:"prices,omitempty"`
	Labels      *LabelBounds `json:"labels,omitempty"`
}

// PriceBounds bound the advertised prices (per core-hour, GiB-hour,
// GPU-hour, as the API writes them) and currencies.
type PriceBounds struct {
	Currencies []string `json:"currencies,omitempty"`
	CPU        *Range   `json:"cpu,omitempty"`
	Memory     *Range   `json:"memory,omitempty"`
	GPU        *Range   `json:"gpu,omitempty"`
}

// Range is an inclusive range of prices; an absent end is unbounded.
type Range struct {
	Min *resource.Quantity `json:"min,omitempty"`
	Max *resource.Quantity `json:"max,omitempty"`
}

// LabelBounds bound the advertised labels (what a requester's selector matches).
type LabelBounds struct {
	MaxLabels *int32 `json:"maxLabels,omitempty"`
	// AllowedKeys: a key, or a prefix ending in "*" ("fluidos.eu/*"); absent:
	// any key.
	AllowedKeys []string `json:"allowedKeys,omitempty"`
	// AllowedValues: the values a key may take; a key absent here takes any.
	AllowedValues map[string][]string `json:"allowedValues,omitempty"`
}

// Policy is a loaded, validated policy: it implements store.Policy.
type Policy struct {
	limits        map[string]model.Limits // by cluster, for the overridden ones
	defaultLimits model.Limits
	prefs         map[string][]model.Preference // by cluster, for the overridden ones
	defaultPrefs  []model.Preference
	bounds        map[string]*bounds
	defaultBounds *bounds
	rates         map[string]model.MemberRates // by cluster, for the overridden ones
	defaultRates  model.MemberRates
	clusters      []string // every cluster with an override, sorted
}

var _ store.Policy = (*Policy)(nil)

// Default is the policy without a file: 100 reserve calls per second per
// requester (a burst of 200), a priority ceiling of
// HighestUserDefinablePriority, DefaultMemberRates, no quota and no bounds.
func Default() *Policy {
	p, err := New(File{APIVersion: APIVersion, Kind: Kind, Requesters: Requesters{Default: RequesterLimits{
		ReservesPerSecond: ptr(100.0), ReserveBurst: ptr[int32](200), MaxPriority: ptr[int32](HighestUserDefinablePriority),
	}}})
	if err != nil {
		panic(err)
	}
	return p
}

// Load reads and validates a policy file (YAML or JSON). Unknown, duplicate
// or miscased fields are errors; every error names its field.
func Load(path string) (*Policy, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	p, err := Parse(data)
	if err != nil {
		return nil, fmt.Errorf("policy file %s: %w", path, err)
	}
	return p, nil
}

// Parse reads and validates a policy (YAML or JSON).
func Parse(data []byte) (*Policy, error) {
	j, err := yaml.YAMLToJSONStrict(data)
	if err != nil {
		return nil, err
	}
	var f File
	strict, err := sigsjson.UnmarshalStrict(j, &f)
	if err != nil {
		return nil, err
	}
	if len(strict) > 0 {
		return nil, errors.Join(strict...)
	}
	return New(f)
}

// New validates f and returns its policy.
func New(f File) (*Policy, error) {
	if errs := f.validate(); len(errs) > 0 {
		return nil, errs.ToAggregate()
	}
	p := &Policy{limits: map[string]model.Limits{}, prefs: map[string][]model.Preference{},
		bounds: map[string]*bounds{}, rates: map[string]model.MemberRates{}}
	var errs field.ErrorList
	root := field.NewPath("requesters")
	// Preferences are checked as the API checks a request's: the error names the term's field.
	var err error
	if p.defaultPrefs, err = api.PreferencesToStore(root.Child("default", "preferences").String(), f.Requesters.Default.Preferences); err != nil {
		return nil, err
	}
	for _, id := range sortedKeys(f.Requesters.Clusters) {
		merged := f.Requesters.Default.merge(f.Requesters.Clusters[id])
		at := root.Child("clusters").Key(id).Child("preferences").String()
		if p.prefs[id], err = api.PreferencesToStore(at, merged.Preferences); err != nil {
			return nil, err
		}
	}
	// A burst needs a rate, the one it sets or the default's.
	burstWithoutRate := func(set, merged RequesterLimits, at *field.Path) {
		if set.ReserveBurst != nil && merged.ReservesPerSecond == nil {
			errs = append(errs, field.Required(at.Child("reservesPerSecond"), "reserveBurst needs a rate"))
		}
	}
	p.defaultLimits = f.Requesters.Default.limits()
	burstWithoutRate(f.Requesters.Default, f.Requesters.Default, root.Child("default"))
	for _, id := range sortedKeys(f.Requesters.Clusters) {
		merged := f.Requesters.Default.merge(f.Requesters.Clusters[id])
		p.limits[id] = merged.limits()
		burstWithoutRate(f.Requesters.Clusters[id], merged, root.Child("clusters").Key(id))
		p.clusters = append(p.clusters, id)
	}
	proot := field.NewPath("providers")
	p.defaultBounds = newBounds()
	p.defaultBounds.add(f.Providers.Default, proot.Child("default"))
	errs = append(errs, p.defaultBounds.validate(proot.Child("default"))...)
	for _, id := range sortedKeys(f.Providers.Clusters) {
		b := newBounds()
		b.add(f.Providers.Default, proot.Child("default"))
		b.add(f.Providers.Clusters[id], proot.Child("clusters").Key(id))
		errs = append(errs, b.validate(proot.Child("clusters").Key(id))...)
		p.bounds[id] = b
		if !slices.Contains(p.clusters, id) {
			p.clusters = append(p.clusters, id)
		}
	}
	p.defaultRates = f.Members.Default.over(DefaultMemberRates)
	for _, id := range sortedKeys(f.Members.Clusters) {
		p.rates[id] = f.Members.Clusters[id].over(p.defaultRates)
		if !slices.Contains(p.clusters, id) {
			p.clusters = append(p.clusters, id)
		}
	}
	if len(errs) > 0 {
		return nil, errs.ToAggregate()
	}
	sort.Strings(p.clusters)
	return p, nil
}

// Limits returns a requester's limits (store.Policy).
func (p *Policy) Limits(requester string) model.Limits {
	if l, ok := p.limits[requester]; ok {
		return l
	}
	return p.defaultLimits
}

// Preferences returns a requester's default preferences (store.Policy).
func (p *Policy) Preferences(requester string) []model.Preference {
	if prefs, ok := p.prefs[requester]; ok {
		return prefs
	}
	return p.defaultPrefs
}

// Clusters lists the clusters that have settings of their own, in order.
func (p *Policy) Clusters() []string { return p.clusters }

// CheckAdvertisement returns a *store.BoundError when cluster advertises
// something outside its bounds (store.Policy).
func (p *Policy) CheckAdvertisement(cluster string, ad model.Advertisement) error {
	b, ok := p.bounds[cluster]
	if !ok {
		b = p.defaultBounds
	}
	return b.check(ad)
}

func ptr[T any](v T) *T { return &v }

// merge returns the default d with the fields that override o sets.
func (d RequesterLimits) merge(o RequesterLimits) RequesterLimits {
	out := d
	if o.MaxReservations != nil {
		out.MaxReservations = o.MaxReservations
	}
	if o.MaxResources != nil {
		out.MaxResources = d.MaxResources.merge(o.MaxResources)
	}
	if o.MaxPriority != nil {
		out.MaxPriority = o.MaxPriority
	}
	if o.ReservesPerSecond != nil {
		out.ReservesPerSecond = o.ReservesPerSecond
	}
	if o.ReserveBurst != nil {
		out.ReserveBurst = o.ReserveBurst
	}
	if o.Preferences != nil {
		out.Preferences = o.Preferences
	}
	return out
}

func (a *Amounts) merge(o *Amounts) *Amounts {
	if a == nil {
		return o
	}
	out := *a
	for _, f := range []struct{ dst, src **resource.Quantity }{
		{&out.CPU, &o.CPU}, {&out.Memory, &o.Memory}, {&out.GPU, &o.GPU}, {&out.Storage, &o.Storage},
	} {
		if *f.src != nil {
			*f.dst = *f.src
		}
	}
	return &out
}

// limits converts to the store's units; the burst defaults to the rate
// (one second's worth of calls), at least 1.
func (r RequesterLimits) limits() model.Limits {
	var l model.Limits
	l.Reservations = r.MaxReservations
	if m := r.MaxResources; m != nil {
		if m.CPU != nil {
			l.CPU = ptr(m.CPU.MilliValue())
		}
		if m.Memory != nil {
			l.Memory = ptr(m.Memory.Value())
		}
		if m.GPU != nil {
			l.GPU = ptr(m.GPU.Value())
		}
	}
	l.Priority = r.MaxPriority
	if r.ReservesPerSecond != nil {
		l.Rate = *r.ReservesPerSecond
		l.Burst = max(1, int(math.Ceil(l.Rate)))
	}
	if r.ReserveBurst != nil {
		l.Burst = int(*r.ReserveBurst)
	}
	return l
}

// validate checks the file; each error names its field.
func (f File) validate() field.ErrorList {
	var errs field.ErrorList
	if f.APIVersion != APIVersion {
		errs = append(errs, field.NotSupported(field.NewPath("apiVersion"), f.APIVersion, []string{APIVersion}))
	}
	if f.Kind != Kind {
		errs = append(errs, field.NotSupported(field.NewPath("kind"), f.Kind, []string{Kind}))
	}
	req := field.NewPath("requesters")
	errs = append(errs, f.Requesters.Default.validate(req.Child("default"))...)
	for _, id := range sortedKeys(f.Requesters.Clusters) {
		p := req.Child("clusters").Key(id)
		errs = append(errs, validateClusterID(p, id)...)
		errs = append(errs, f.Requesters.Clusters[id].validate(p)...)
	}
	mem := field.NewPath("members")
	errs = append(errs, f.Members.Default.validate(mem.Child("default"))...)
	for _, id := range sortedKeys(f.Members.Clusters) {
		p := mem.Child("clusters").Key(id)
		errs = append(errs, validateClusterID(p, id)...)
		errs = append(errs, f.Members.Clusters[id].validate(p)...)
	}
	prov := field.NewPath("providers")
	errs = append(errs, f.Providers.Default.validate(prov.Child("default"))...)
	for _, id := range sortedKeys(f.Providers.Clusters) {
		p := prov.Child("clusters").Key(id)
		errs = append(errs, validateClusterID(p, id)...)
		errs = append(errs, f.Providers.Clusters[id].validate(p)...)
	}
	return errs
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

func validateClusterID(p *field.Path, id string) field.ErrorList {
	if msgs := validation.IsDNS1123Label(id); len(msgs) > 0 {
		return field.ErrorList{field.Invalid(p, id, "a cluster id: "+strings.Join(msgs, "; "))}
	}
	return nil
}

func (r RequesterLimits) validate(p *field.Path) field.ErrorList {
	var errs field.ErrorList
	if r.MaxReservations != nil && *r.MaxReservations < 0 {
		errs = append(errs, field.Invalid(p.Child("maxReservations"), *r.MaxReservations, "must not be negative"))
	}
	if r.MaxResources != nil {
		if r.MaxResources.Storage != nil {
			errs = append(errs, field.Forbidden(p.Child("maxResources", "storage"), "requesters are limited on cpu, memory and gpu"))
		}
		errs = append(errs, r.MaxResources.validate(p.Child("maxResources"))...)
	}
	if r.ReservesPerSecond != nil {
		if v := *r.ReservesPerSecond; !(v > 0) || math.IsInf(v, 0) {
			errs = append(errs, field.Invalid(p.Child("reservesPerSecond"), v, "must be a positive number"))
		}
	}
	if r.ReserveBurst != nil && *r.ReserveBurst < 1 {
		errs = append(errs, field.Invalid(p.Child("reserveBurst"), *r.ReserveBurst, "must be at least 1"))
	}
	return errs
}

func (a *Amounts) validate(p *field.Path) field.ErrorList {
	var errs field.ErrorList
	for _, f := range []struct {
		name string
		q    *resource.Quantity
	}{{"cpu", a.CPU}, {"memory", a.Memory}, {"gpu", a.GPU}, {"storage", a.Storage}} {
		most := model.MaxQuantity(f.name) // as the API bounds every amount
		switch {
		case f.q == nil:
		case f.q.Sign() < 0:
			errs = append(errs, field.Invalid(p.Child(f.name), f.q.String(), "must not be negative"))
		case f.q.Cmp(most) > 0:
			errs = append(errs, field.Invalid(p.Child(f.name), f.q.String(), "is above the largest amount the broker holds exactly ("+most.String()+")"))
		case f.name == "gpu" && f.q.MilliValue()%1000 != 0:
			errs = append(errs, field.Invalid(p.Child(f.name), f.q.String(), "must be a whole number of devices"))
		}
	}
	return errs
}

func (b ProviderBounds) validate(p *field.Path) field.ErrorList {
	var errs field.ErrorList
	if b.MaxCapacity != nil {
		errs = append(errs, b.MaxCapacity.validate(p.Child("maxCapacity"))...)
	}
	if pr := b.Prices; pr != nil {
		for i, c := range pr.Currencies {
			if !model.IsCurrencyCode(c) {
				errs = append(errs, field.Invalid(p.Child("prices", "currencies").Index(i), c, "an ISO 4217 code such as EUR"))
			}
		}
		for _, r := range []struct {
			name string
			r    *Range
		}{{"cpu", pr.CPU}, {"memory", pr.Memory}, {"gpu", pr.GPU}} {
			if r.r == nil {
				continue
			}
			for _, end := range []struct {
				name string
				q    *resource.Quantity
			}{{"min", r.r.Min}, {"max", r.r.Max}} {
				if end.q != nil && end.q.Sign() < 0 {
					errs = append(errs, field.Invalid(p.Child("prices", r.name, end.name), end.q.String(), "must not be negative"))
				}
			}
		}
	}
	if l := b.Labels; l != nil {
		if l.MaxLabels != nil && *l.MaxLabels < 0 {
			errs = append(errs, field.Invalid(p.Child("labels", "maxLabels"), *l.MaxLabels, "must not be negative"))
		}
		for i, k := range l.AllowedKeys {
			name := strings.TrimSuffix(k, "*")
			if name == "" {
				continue // "*": any key
			}
			if strings.HasSuffix(k, "*") {
				name += "x" // a prefix: what follows it is checked in each advertisement
			}
			if msgs := validation.IsQualifiedName(name); len(msgs) > 0 {
				errs = append(errs, field.Invalid(p.Child("labels", "allowedKeys").Index(i), k, "a label key, or a prefix ending in *: "+strings.Join(msgs, "; ")))
			}
		}
		for _, k := range sortedKeys(l.AllowedValues) {
			kp := p.Child("labels", "allowedValues").Key(k)
			if msgs := validation.IsQualifiedName(k); len(msgs) > 0 {
				errs = append(errs, field.Invalid(kp, k, "a label key: "+strings.Join(msgs, "; ")))
			}
			for i, v := range l.AllowedValues[k] {
				if msgs := validation.IsValidLabelValue(v); len(msgs) > 0 {
					errs = append(errs, field.Invalid(kp.Index(i), v, strings.Join(msgs, "; ")))
				}
			}
		}
	}
	return errs
}
