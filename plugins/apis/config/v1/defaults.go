package v1

import (
	"k8s.io/apimachinery/pkg/runtime"
)

// Defaults of ResourceBrokerArgs.
const (
	// DefaultMaxOutstandingReservationsPerNamespace bounds how many pods of
	// one namespace may wait for a reservation at once.
	DefaultMaxOutstandingReservationsPerNamespace int32 = 50
)

// DefaultExcludedNamespaces are never offloaded when the args leave
// excludedNamespaces unset.
var DefaultExcludedNamespaces = []string{"kube-system", "kube-public", "kube-node-lease"}

// SetDefaults_ResourceBrokerArgs fills the unset fields of args.
func SetDefaults_ResourceBrokerArgs(args *ResourceBrokerArgs) { //nolint:revive // the defaulter naming convention
	if args.MaxOutstandingReservationsPerNamespace == nil {
		n := DefaultMaxOutstandingReservationsPerNamespace
		args.MaxOutstandingReservationsPerNamespace = &n
	}
	if args.ExcludedNamespaces == nil {
		args.ExcludedNamespaces = append([]string(nil), DefaultExcludedNamespaces...)
	}
}

// SetObjectDefaults_ResourceBrokerArgs is what the scheme runs to default a
// ResourceBrokerArgs.
func SetObjectDefaults_ResourceBrokerArgs(in *ResourceBrokerArgs) { //nolint:revive // the defaulter naming convention
	SetDefaults_ResourceBrokerArgs(in)
}

// RegisterDefaults adds the defaulting functions to the given scheme.
func RegisterDefaults(scheme *runtime.Scheme) error {
	scheme.AddTypeDefaultingFunc(&ResourceBrokerArgs{}, func(obj any) { SetObjectDefaults_ResourceBrokerArgs(obj.(*ResourceBrokerArgs)) })
	return nil
}
