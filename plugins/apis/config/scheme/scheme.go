// Package scheme registers the plugins' args (internal and v1) in
// kube-scheduler's own scheme, as sigs.k8s.io/scheduler-plugins/apis/config/scheme
// does: importing it is what makes kube-scheduler's configuration loading
// decode ResourceBrokerArgs strictly, default them and convert them to the
// internal type that the plugin's New receives.
package scheme

import (
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	kubeschedulerscheme "k8s.io/kubernetes/pkg/scheduler/apis/config/scheme"

	"github.com/fluidos-project/resource-broker/plugins/apis/config"
	configv1 "github.com/fluidos-project/resource-broker/plugins/apis/config/v1"
)

var (
	// Scheme is kube-scheduler's scheme, with the plugins' args added.
	Scheme = kubeschedulerscheme.Scheme
	// Codecs decodes strictly (an unknown field is an error), like kube-scheduler's.
	Codecs = serializer.NewCodecFactory(Scheme, serializer.EnableStrict)
)

func init() {
	AddToScheme(Scheme)
}

// AddToScheme registers the internal and v1 args (and, through the scheme
// builders they share, kube-scheduler's configuration types) in scheme.
func AddToScheme(scheme *runtime.Scheme) {
	utilruntime.Must(config.AddToScheme(scheme))
	utilruntime.Must(configv1.AddToScheme(scheme))
	utilruntime.Must(scheme.SetVersionPriority(configv1.SchemeGroupVersion))
}
