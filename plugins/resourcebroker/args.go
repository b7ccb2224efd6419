package resourcebroker

import (
	"fmt"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/fluidos-project/resource-broker/plugins/apis/config"
	"github.com/fluidos-project/resource-broker/plugins/apis/config/scheme"
	configv1 "github.com/fluidos-project/resource-broker/plugins/apis/config/v1"
	"github.com/fluidos-project/resource-broker/plugins/apis/config/validation"
)

// argsPath is where the args sit in a KubeSchedulerConfiguration profile,
// for the validation errors: pluginConfig[ResourceBroker].args.<field>.
var argsPath = field.NewPath("pluginConfig").Key(Name).Child("args")

// DecodeArgs turns the plugin's configuration object into defaulted,
// validated args. kube-scheduler hands over the internal type: importing
// this package registers ResourceBrokerArgs in its scheme (package
// plugins/apis/config/scheme), so its configuration loading has already
// decoded them strictly (an unknown field stops it), defaulted and
// converted them. nil (no scheme at all), the v1 type and *runtime.Unknown
// (JSON or YAML, decoded strictly through the same scheme) are accepted too.
func DecodeArgs(obj runtime.Object) (*config.ResourceBrokerArgs, error) {
	var args *config.ResourceBrokerArgs
	switch o := obj.(type) {
	case *config.ResourceBrokerArgs:
		args = o.DeepCopy()
	case nil, *configv1.ResourceBrokerArgs, *runtime.Unknown:
		var err error
		if args, err = toInternal(o); err != nil {
			return nil, fmt.Errorf("%s args: %w", Name, err)
		}
	default:
		return nil, fmt.Errorf("%s args: want %T, got %T", Name, &config.ResourceBrokerArgs{}, obj)
	}
	if err := validation.ValidateResourceBrokerArgs(argsPath, args); err != nil {
		return nil, fmt.Errorf("invalid %s args: %w", Name, err)
	}
	return args, nil
}

// toInternal defaults and converts versioned args through the scheme.
func toInternal(obj runtime.Object) (*config.ResourceBrokerArgs, error) {
	var in *configv1.ResourceBrokerArgs
	switch o := obj.(type) {
	case nil:
		in = &configv1.ResourceBrokerArgs{}
	case *configv1.ResourceBrokerArgs:
		in = o.DeepCopy()
	case *runtime.Unknown:
		in = &configv1.ResourceBrokerArgs{}
		if len(o.Raw) > 0 {
			gvk := configv1.SchemeGroupVersion.WithKind(Name + "Args")
			if _, _, err := scheme.Codecs.UniversalDeserializer().Decode(o.Raw, &gvk, in); err != nil {
				return nil, err
			}
		}
	}
	scheme.Scheme.Default(in)
	out := &config.ResourceBrokerArgs{}
	if err := scheme.Scheme.Convert(in, out, nil); err != nil {
		return nil, err
	}
	return out, nil
}
