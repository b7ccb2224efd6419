package resourcebroker

import (
	"bytes"
	"encoding/json"
	"fmt"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	metav1validation "k8s.io/apimachinery/pkg/apis/meta/v1/validation"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

// Defaults of ResourceBrokerArgs.
const (
	// DefaultReservationDuration is asked of the broker when the args name none
	// (the broker's own default duration).
	DefaultReservationDuration = time.Hour
	// MaxReservationDuration is the longest duration the plugin asks for (the
	// broker's default maximum).
	MaxReservationDuration = 24 * time.Hour
	// DefaultMaxOutstandingReservationsPerNamespace bounds how many pods of
	// one namespace may wait for a reservation at once.
	DefaultMaxOutstandingReservationsPerNamespace int32 = 50
)

// DefaultExcludedNamespaces are never sent to the broker when the args leave
// excludedNamespaces unset.
var DefaultExcludedNamespaces = []string{"kube-system", "kube-public", "kube-node-lease"}

// ResourceBrokerArgs are the arguments of the ResourceBroker plugin, given in
// the KubeSchedulerConfiguration's pluginConfig:
//
//	pluginConfig:
//	- name: ResourceBroker
//	  args:
//	    selector:
//	      matchLabels:
//	        broker.fluidos.eu/offload: "true"
//	    reservationDuration: 2h
//	    maxOutstandingReservationsPerNamespace: 20
//	    excludedNamespaces: [kube-system, monitoring]
//
// Unknown fields are an error.
type ResourceBrokerArgs struct { //nolint:revive // <Plugin>Args is the scheduler-plugins convention

	metav1.TypeMeta `json:",inline"`

	// Selector picks the pods of the profile that may get a broker
	// reservation when no local node fits them. Nil (the default) selects
	// every pod; an empty selector also selects every pod.
	Selector *metav1.LabelSelector `json:"selector,omitempty"`

	// ReservationDuration is spec.duration of the reservations the plugin
	// creates (default 1h, at most 24h).
	ReservationDuration *metav1.Duration `json:"reservationDuration,omitempty"`

	// MaxOutstandingReservationsPerNamespace bounds how many pods of one
	// namespace wait for a reservation at once: reservations that have not
	// ended (no phase yet, Pending, Reserved or Active) and whose pod is not
	// bound yet, counting those being created (default 50, at least 1). A
	// reservation in use by its bound pod does not count, so a workload of
	// any size is served, this many pods at a time.
	MaxOutstandingReservationsPerNamespace *int32 `json:"maxOutstandingReservationsPerNamespace,omitempty"`

	// ExcludedNamespaces never get reservations; their pods are scheduled as
	// the default profile would (default kube-system, kube-public,
	// kube-node-lease; an explicit empty list excludes none).
	ExcludedNamespaces []string `json:"excludedNamespaces,omitempty"`
}

// SetDefaults fills the unset fields of args.
func SetDefaults(args *ResourceBrokerArgs) {
	if args.ReservationDuration == nil {
		args.ReservationDuration = &metav1.Duration{Duration: DefaultReservationDuration}
	}
	if args.MaxOutstandingReservationsPerNamespace == nil {
		n := DefaultMaxOutstandingReservationsPerNamespace
		args.MaxOutstandingReservationsPerNamespace = &n
	}
	if args.ExcludedNamespaces == nil {
		args.ExcludedNamespaces = append([]string(nil), DefaultExcludedNamespaces...)
	}
}

// ValidateArgs checks defaulted args; path is where they sit in the
// configuration (e.g. field.NewPath("pluginConfig").Index(0).Child("args")).
func ValidateArgs(path *field.Path, args *ResourceBrokerArgs) field.ErrorList {
	var errs field.ErrorList
	if args.Selector != nil {
		errs = append(errs, metav1validation.ValidateLabelSelector(args.Selector, metav1validation.LabelSelectorValidationOptions{}, path.Child("selector"))...)
		if len(errs) == 0 {
			if _, err := metav1.LabelSelectorAsSelector(args.Selector); err != nil {
				errs = append(errs, field.Invalid(path.Child("selector"), args.Selector, err.Error()))
			}
		}
	}
	if d := args.ReservationDuration; d == nil {
		errs = append(errs, field.Required(path.Child("reservationDuration"), ""))
	} else if d.Duration < time.Second || d.Duration > MaxReservationDuration {
		errs = append(errs, field.Invalid(path.Child("reservationDuration"), d.Duration.String(),
			fmt.Sprintf("must be between 1s and %s", MaxReservationDuration)))
	}
	if n := args.MaxOutstandingReservationsPerNamespace; n == nil {
		errs = append(errs, field.Required(path.Child("maxOutstandingReservationsPerNamespace"), ""))
	} else if *n < 1 {
		errs = append(errs, field.Invalid(path.Child("maxOutstandingReservationsPerNamespace"), *n, "must be at least 1"))
	}
	seen := sets.New[string]()
	for i, ns := range args.ExcludedNamespaces {
		p := path.Child("excludedNamespaces").Index(i)
		for _, msg := range validation.IsDNS1123Label(ns) {
			errs = append(errs, field.Invalid(p, ns, msg))
		}
		if seen.Has(ns) {
			errs = append(errs, field.Duplicate(p, ns))
		}
		seen.Insert(ns)
	}
	return errs
}

// DecodeArgs turns the plugin's configuration object (nil, *runtime.Unknown
// holding JSON as the scheduler hands it over, or *ResourceBrokerArgs) into
// defaulted, validated args. Unknown fields are an error, so that a typo
// stops the scheduler instead of being ignored.
func DecodeArgs(obj runtime.Object) (*ResourceBrokerArgs, error) {
	args := &ResourceBrokerArgs{}
	switch o := obj.(type) {
	case nil:
	case *ResourceBrokerArgs:
		args = o.DeepCopy()
	case *runtime.Unknown:
		if len(o.Raw) > 0 {
			if o.ContentType != "" && o.ContentType != runtime.ContentTypeJSON {
				return nil, fmt.Errorf("%s args: content type %q is not supported", Name, o.ContentType)
			}
			dec := json.NewDecoder(bytes.NewReader(o.Raw))
			dec.DisallowUnknownFields()
			if err := dec.Decode(args); err != nil {
				return nil, fmt.Errorf("%s args: %w", Name, err)
			}
		}
	default:
		return nil, fmt.Errorf("%s args: want *runtime.Unknown or *ResourceBrokerArgs, got %T", Name, obj)
	}
	SetDefaults(args)
	if errs := ValidateArgs(field.NewPath("args"), args); len(errs) > 0 {
		return nil, fmt.Errorf("invalid %s args: %w", Name, errs.ToAggregate())
	}
	return args, nil
}

// DeepCopyObject implements runtime.Object.
func (in *ResourceBrokerArgs) DeepCopyObject() runtime.Object { return in.DeepCopy() }

// DeepCopy copies the args.
func (in *ResourceBrokerArgs) DeepCopy() *ResourceBrokerArgs {
	if in == nil {
		return nil
	}
	out := *in
	out.Selector = in.Selector.DeepCopy()
	if in.ReservationDuration != nil {
		d := *in.ReservationDuration
		out.ReservationDuration = &d
	}
	if in.MaxOutstandingReservationsPerNamespace != nil {
		n := *in.MaxOutstandingReservationsPerNamespace
		out.MaxOutstandingReservationsPerNamespace = &n
	}
	if in.ExcludedNamespaces != nil {
		out.ExcludedNamespaces = append([]string{}, in.ExcludedNamespaces...)
	}
	return &out
}
