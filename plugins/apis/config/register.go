package config

import (
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	schedconfig "k8s.io/kubernetes/pkg/scheduler/apis/config"
)

// SchemeGroupVersion is the internal version of kube-scheduler's
// configuration group, where the args are registered.
var SchemeGroupVersion = schema.GroupVersion{Group: schedconfig.GroupName, Version: runtime.APIVersionInternal}

var (
	// localSchemeBuilder is kube-scheduler's own: what is registered here is
	// added to every scheme built from it (its Scheme, and the scheme it
	// converts plugin args with).
	localSchemeBuilder = &schedconfig.SchemeBuilder
	// AddToScheme registers the internal types in a scheme.
	AddToScheme = localSchemeBuilder.AddToScheme
)

func addKnownTypes(scheme *runtime.Scheme) error {
	scheme.AddKnownTypes(SchemeGroupVersion, &ResourceBrokerArgs{})
	return nil
}

func init() {
	localSchemeBuilder.Register(addKnownTypes)
}
