package v1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/conversion"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/fluidos-project/resource-broker/plugins/apis/config"
)

// RegisterConversions adds the conversion functions to the given scheme.
func RegisterConversions(s *runtime.Scheme) error {
	if err := s.AddConversionFunc((*ResourceBrokerArgs)(nil), (*config.ResourceBrokerArgs)(nil), func(a, b any, scope conversion.Scope) error {
		return Convert_v1_ResourceBrokerArgs_To_config_ResourceBrokerArgs(a.(*ResourceBrokerArgs), b.(*config.ResourceBrokerArgs), scope)
	}); err != nil {
		return err
	}
	return s.AddConversionFunc((*config.ResourceBrokerArgs)(nil), (*ResourceBrokerArgs)(nil), func(a, b any, scope conversion.Scope) error {
		return Convert_config_ResourceBrokerArgs_To_v1_ResourceBrokerArgs(a.(*config.ResourceBrokerArgs), b.(*ResourceBrokerArgs), scope)
	})
}

// Convert_v1_ResourceBrokerArgs_To_config_ResourceBrokerArgs converts the
// versioned args (defaulted: an unset field becomes its zero value, which
// validation refuses) to the internal type.
func Convert_v1_ResourceBrokerArgs_To_config_ResourceBrokerArgs(in *ResourceBrokerArgs, out *config.ResourceBrokerArgs, _ conversion.Scope) error { //nolint:revive // the conversion naming convention
	out.Selector = in.Selector.DeepCopy()
	out.ReservationDuration = nil
	if in.ReservationDuration != nil {
		out.ReservationDuration = &metav1.Duration{Duration: in.ReservationDuration.Duration}
	}
	out.MaxOutstandingReservationsPerNamespace = 0
	if in.MaxOutstandingReservationsPerNamespace != nil {
		out.MaxOutstandingReservationsPerNamespace = *in.MaxOutstandingReservationsPerNamespace
	}
	out.ExcludedNamespaces = cloneStrings(in.ExcludedNamespaces)
	out.Namespaces = cloneStrings(in.Namespaces)
	return nil
}

// Convert_config_ResourceBrokerArgs_To_v1_ResourceBrokerArgs converts the
// internal args to the versioned type (for --write-config-to).
func Convert_config_ResourceBrokerArgs_To_v1_ResourceBrokerArgs(in *config.ResourceBrokerArgs, out *ResourceBrokerArgs, _ conversion.Scope) error { //nolint:revive // the conversion naming convention
	out.Selector = in.Selector.DeepCopy()
	out.ReservationDuration = nil
	if in.ReservationDuration != nil {
		out.ReservationDuration = &metav1.Duration{Duration: in.ReservationDuration.Duration}
	}
	n := in.MaxOutstandingReservationsPerNamespace
	out.MaxOutstandingReservationsPerNamespace = &n
	out.ExcludedNamespaces = cloneStrings(in.ExcludedNamespaces)
	if out.ExcludedNamespaces == nil {
		out.ExcludedNamespaces = []string{} // none excluded, not the defaults
	}
	out.Namespaces = cloneStrings(in.Namespaces)
	return nil
}

func cloneStrings(in []string) []string {
	if in == nil {
		return nil
	}
	return append(make([]string, 0, len(in)), in...)
}
