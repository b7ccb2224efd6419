package v1

import (
	"k8s.io/apimachinery/pkg/runtime"
)

// DeepCopyInto copies in into out.
func (in *ResourceBrokerArgs) DeepCopyInto(out *ResourceBrokerArgs) {
	*out = *in
	out.TypeMeta = in.TypeMeta
	if in.Selector != nil {
		out.Selector = in.Selector.DeepCopy()
	}
	if in.ReservationDuration != nil {
		d := *in.ReservationDuration
		out.ReservationDuration = &d
	}
	if in.MaxOutstandingReservationsPerNamespace != nil {
		n := *in.MaxOutstandingReservationsPerNamespace
		out.MaxOutstandingReservationsPerNamespace = &n
	}
	if in.ExcludedNamespaces != nil {
		out.ExcludedNamespaces = make([]string, len(in.ExcludedNamespaces))
		copy(out.ExcludedNamespaces, in.ExcludedNamespaces)
	}
	if in.Namespaces != nil {
		out.Namespaces = make([]string, len(in.Namespaces))
		copy(out.Namespaces, in.Namespaces)
	}
}

// DeepCopy copies the args.
func (in *ResourceBrokerArgs) DeepCopy() *ResourceBrokerArgs {
	if in == nil {
		return nil
	}
	out := new(ResourceBrokerArgs)
	in.DeepCopyInto(out)
	return out
}

// DeepCopyObject implements runtime.Object.
func (in *ResourceBrokerArgs) DeepCopyObject() runtime.Object {
	if c := in.DeepCopy(); c != nil {
		return c
	}
	return nil
}
