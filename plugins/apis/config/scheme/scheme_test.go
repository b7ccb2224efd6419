package scheme_test

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/klog/v2"
	"k8s.io/kubernetes/cmd/kube-scheduler/app/options"
	kubeschedulerscheme "k8s.io/kubernetes/pkg/scheduler/apis/config/scheme"
	"sigs.k8s.io/yaml"

	"github.com/fluidos-project/resource-broker/plugins/apis/config"
	"github.com/fluidos-project/resource-broker/plugins/apis/config/scheme"
	configv1 "github.com/fluidos-project/resource-broker/plugins/apis/config/v1"
)

const kubeSchedulerConfig = `apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
leaderElection: {leaderElect: false}
profiles:
- schedulerName: resource-broker
  plugins:
    multiPoint: {enabled: [{name: ResourceBroker}]}
  pluginConfig:
  - name: ResourceBroker
    args: {reservationDuration: 2h, excludedNamespaces: [], namespaces: [apps]}
- schedulerName: resource-broker-defaults
  plugins:
    multiPoint: {enabled: [{name: ResourceBroker}]}
`

// load reads a KubeSchedulerConfiguration as kube-scheduler's --config does.
func load(t *testing.T, data string) (*argsByProfile, error) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "config.yaml")
	require.NoError(t, os.WriteFile(path, []byte(data), 0o600))
	cfg, err := options.LoadConfigFromFile(klog.Background(), path)
	if err != nil {
		return nil, err
	}
	out := argsByProfile{}
	for _, p := range cfg.Profiles {
		for _, pc := range p.PluginConfig {
			if pc.Name == "ResourceBroker" {
				out[p.SchedulerName] = pc.Args
			}
		}
	}
	return &out, nil
}

type argsByProfile map[string]runtime.Object

// TestKubeSchedulerLoadsArgs: kube-scheduler's configuration loading
// decodes the args to the internal type and fills the defaults, with a
// pluginConfig entry or without one, as for an in-tree plugin.
func TestKubeSchedulerLoadsArgs(t *testing.T) {
	got, err := load(t, kubeSchedulerConfig)
	require.NoError(t, err)
	require.Len(t, *got, 2)
	assert.Equal(t, &config.ResourceBrokerArgs{
		ReservationDuration:                    &metav1.Duration{Duration: 2 * time.Hour},
		MaxOutstandingReservationsPerNamespace: configv1.DefaultMaxOutstandingReservationsPerNamespace,
		ExcludedNamespaces:                     []string{},
		Namespaces:                             []string{"apps"},
	}, (*got)["resource-broker"])
	assert.Equal(t, &config.ResourceBrokerArgs{
		MaxOutstandingReservationsPerNamespace: configv1.DefaultMaxOutstandingReservationsPerNamespace,
		ExcludedNamespaces:                     configv1.DefaultExcludedNamespaces,
	}, (*got)["resource-broker-defaults"])
}

func TestKubeSchedulerRefusesBadArgs(t *testing.T) {
	for name, tc := range map[string]struct{ args, want string }{
		"unknown field": {`{reservationDurationn: 1h}`, `decoding args for plugin ResourceBroker: strict decoding error: unknown field "reservationDurationn"`},
		"wrong type":    {`{maxOutstandingReservationsPerNamespace: ten}`, `decoding args for plugin ResourceBroker`},
		"duplicate key": {`{reservationDuration: 1h, reservationDuration: 2h}`, `key "reservationDuration" already set`},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := load(t, `apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
profiles:
- schedulerName: resource-broker
  pluginConfig:
  - name: ResourceBroker
    args: `+tc.args+"\n")
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.want)
		})
	}
}

// TestArgsRoundTrip: the internal args encode to v1 (kube-scheduler's
// --write-config-to) and decode back to the same args; an explicit empty
// excludedNamespaces stays empty rather than turning into the defaults.
func TestArgsRoundTrip(t *testing.T) {
	in := &config.ResourceBrokerArgs{
		Selector:                               &metav1.LabelSelector{MatchLabels: map[string]string{"a": "b"}},
		ReservationDuration:                    &metav1.Duration{Duration: 90 * time.Second},
		MaxOutstandingReservationsPerNamespace: 4,
		ExcludedNamespaces:                     []string{},
		Namespaces:                             []string{"x", "y"},
	}
	info, ok := runtime.SerializerInfoForMediaType(scheme.Codecs.SupportedMediaTypes(), runtime.ContentTypeYAML)
	require.True(t, ok)
	var buf bytes.Buffer
	require.NoError(t, scheme.Codecs.EncoderForVersion(info.Serializer, configv1.SchemeGroupVersion).Encode(in, &buf))
	var m map[string]any
	require.NoError(t, yaml.Unmarshal(buf.Bytes(), &m))
	assert.Equal(t, "kubescheduler.config.k8s.io/v1", m["apiVersion"])
	assert.Equal(t, "ResourceBrokerArgs", m["kind"])
	assert.Equal(t, "1m30s", m["reservationDuration"])
	assert.Equal(t, []any{}, m["excludedNamespaces"])

	out, _, err := scheme.Codecs.UniversalDecoder().Decode(buf.Bytes(), nil, nil)
	require.NoError(t, err)
	in.TypeMeta = metav1.TypeMeta{}
	assert.Equal(t, in, out)
}

// TestRegisteredInKubeSchedulerScheme: importing the package is enough.
func TestRegisteredInKubeSchedulerScheme(t *testing.T) {
	assert.Same(t, kubeschedulerscheme.Scheme, scheme.Scheme)
	v1obj, err := scheme.Scheme.New(configv1.SchemeGroupVersion.WithKind("ResourceBrokerArgs"))
	require.NoError(t, err)
	assert.IsType(t, &configv1.ResourceBrokerArgs{}, v1obj)
	internal, err := scheme.Scheme.New(config.SchemeGroupVersion.WithKind("ResourceBrokerArgs"))
	require.NoError(t, err)
	assert.IsType(t, &config.ResourceBrokerArgs{}, internal)
}
