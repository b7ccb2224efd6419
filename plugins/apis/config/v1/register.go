package v1

import (
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	schedschemev1 "k8s.io/kube-scheduler/config/v1"
	schedconfig "k8s.io/kubernetes/pkg/scheduler/apis/config"
)

// SchemeGroupVersion is kubescheduler.config.k8s.io/v1.
var SchemeGroupVersion = schema.GroupVersion{Group: schedconfig.GroupName, Version: "v1"}

var (
	// localSchemeBuilder is kube-scheduler's v1 scheme builder: what is
	// registered here is part of every scheme kube-scheduler builds for v1
	// (the one it decodes configurations with, and the one it defaults and
	// converts plugin args with).
	localSchemeBuilder = &schedschemev1.SchemeBuilder
	// AddToScheme registers the v1 types, their defaults and conversions in a scheme.
	AddToScheme = localSchemeBuilder.AddToScheme
)

func addKnownTypes(scheme *runtime.Scheme) error {
	scheme.AddKnownTypes(SchemeGroupVersion, &ResourceBrokerArgs{})
	return nil
}

func init() {
	localSchemeBuilder.Register(addKnownTypes, RegisterDefaults, RegisterConversions)
}
