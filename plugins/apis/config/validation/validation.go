// Package validation checks the plugins' args (internal type, after
// defaulting), in the manner of kube-scheduler's ValidateXxxArgs: every
// problem is a field.Error naming the field.
package validation

import (
	"fmt"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	metav1validation "k8s.io/apimachinery/pkg/apis/meta/v1/validation"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/fluidos-project/resource-broker/plugins/apis/config"
)

// Bounds of ResourceBrokerArgs.ReservationDuration (deprecated and ignored,
// still checked when set: a configuration valid before stays valid, a
// broken one still fails).
const (
	MinReservationDuration = time.Second
	// MaxReservationDuration is the longest duration the plugin asks for
	// (the broker's default maximum).
	MaxReservationDuration = 24 * time.Hour
)

// ValidateResourceBrokerArgs checks defaulted args; path is where they sit
// in the configuration, e.g. field.NewPath("pluginConfig").Key("ResourceBroker").Child("args").
func ValidateResourceBrokerArgs(path *field.Path, args *config.ResourceBrokerArgs) error {
	var errs field.ErrorList
	if args.Selector != nil {
		sel := metav1validation.ValidateLabelSelector(args.Selector, metav1validation.LabelSelectorValidationOptions{}, path.Child("selector"))
		if len(sel) == 0 {
			if _, err := metav1.LabelSelectorAsSelector(args.Selector); err != nil {
				sel = append(sel, field.Invalid(path.Child("selector"), args.Selector, err.Error()))
			}
		}
		errs = append(errs, sel...)
	}
	if d := args.ReservationDuration; d != nil && (d.Duration < MinReservationDuration || d.Duration > MaxReservationDuration) {
		errs = append(errs, field.Invalid(path.Child("reservationDuration"), d.Duration.String(),
			fmt.Sprintf("must be between %s and %s", MinReservationDuration, MaxReservationDuration)))
	}
	if n := args.MaxOutstandingReservationsPerNamespace; n < 1 {
		errs = append(errs, field.Invalid(path.Child("maxOutstandingReservationsPerNamespace"), n, "must be at least 1"))
	}
	excluded := sets.New[string]()
	errs = append(errs, validateNamespaces(path.Child("excludedNamespaces"), args.ExcludedNamespaces, excluded)...)
	allowed := sets.New[string]()
	errs = append(errs, validateNamespaces(path.Child("namespaces"), args.Namespaces, allowed)...)
	for i, ns := range args.Namespaces {
		if excluded.Has(ns) {
			errs = append(errs, field.Invalid(path.Child("namespaces").Index(i), ns,
				"is also in excludedNamespaces (whose default is kube-system, kube-public, kube-node-lease); remove it from one of the lists"))
		}
	}
	return errs.ToAggregate()
}

func validateNamespaces(path *field.Path, names []string, seen sets.Set[string]) field.ErrorList {
	var errs field.ErrorList
	for i, ns := range names {
		p := path.Index(i)
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
