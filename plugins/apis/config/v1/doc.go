// Package v1 is the v1 version of the ResourceBroker plugin's args, kind
// ResourceBrokerArgs of kubescheduler.config.k8s.io/v1: what a
// KubeSchedulerConfiguration's pluginConfig holds. Its defaults
// (SetDefaults_ResourceBrokerArgs) and its conversions to and from the
// internal type are registered in kube-scheduler's v1 scheme builder.
// +kubebuilder:object:generate=true
package v1
