// Package config holds the internal version of the arguments of this
// repository's scheduler plugins (ResourceBrokerArgs), registered in
// kube-scheduler's configuration group kubescheduler.config.k8s.io, in the
// layout of sigs.k8s.io/scheduler-plugins/apis/config: this package is the
// internal type, v1 the versioned type with its defaults and conversions,
// validation its checks, and scheme registers both in kube-scheduler's
// scheme so that its configuration loading decodes (strictly), defaults and
// converts the plugin's args like those of an in-tree plugin.
//
// The deep-copy functions are generated (controller-gen, make generate); the
// conversion and defaulting functions are written by hand in the shape the
// Kubernetes code generators give them (the module does not depend on
// k8s.io/code-generator); they are covered by the packages' tests.
// +kubebuilder:object:generate=true
package config
