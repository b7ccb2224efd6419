package resourcebroker

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/fluidos-project/resource-broker/plugins/apis/config"
	configv1 "github.com/fluidos-project/resource-broker/plugins/apis/config/v1"
)

func TestDecodeArgsDefaults(t *testing.T) {
	for name, obj := range map[string]runtime.Object{
		"nil":           nil,
		"empty":         &runtime.Unknown{},
		"empty JSON":    &runtime.Unknown{Raw: []byte(`{}`), ContentType: runtime.ContentTypeJSON},
		"v1 empty":      &configv1.ResourceBrokerArgs{},
		"v1 empty list": &configv1.ResourceBrokerArgs{ExcludedNamespaces: nil},
	} {
		t.Run(name, func(t *testing.T) {
			args, err := DecodeArgs(obj)
			require.NoError(t, err)
			assert.Nil(t, args.Selector, "nil selector: every pod of the profile")
			assert.Nil(t, args.ReservationDuration, "deprecated: no default")
			assert.Equal(t, configv1.DefaultMaxOutstandingReservationsPerNamespace, args.MaxOutstandingReservationsPerNamespace)
			assert.Equal(t, configv1.DefaultExcludedNamespaces, args.ExcludedNamespaces)
			assert.Empty(t, args.Namespaces, "every namespace")
		})
	}
}

func TestDecodeArgsValues(t *testing.T) {
	for name, raw := range map[string]string{
		"JSON": `{
			"selector": {"matchLabels": {"broker.fluidos.eu/offload": "true"}},
			"reservationDuration": "2h30m",
			"maxOutstandingReservationsPerNamespace": 7,
			"excludedNamespaces": [],
			"namespaces": ["batch", "render"]
		}`,
		"YAML": `
selector: {matchLabels: {broker.fluidos.eu/offload: "true"}}
reservationDuration: 2h30m
maxOutstandingReservationsPerNamespace: 7
excludedNamespaces: []
namespaces: [batch, render]
`,
	} {
		t.Run(name, func(t *testing.T) {
			args, err := DecodeArgs(&runtime.Unknown{Raw: []byte(raw)})
			require.NoError(t, err)
			assert.Equal(t, map[string]string{"broker.fluidos.eu/offload": "true"}, args.Selector.MatchLabels)
			assert.Equal(t, 150*time.Minute, args.ReservationDuration.Duration)
			assert.EqualValues(t, 7, args.MaxOutstandingReservationsPerNamespace)
			assert.NotNil(t, args.ExcludedNamespaces)
			assert.Empty(t, args.ExcludedNamespaces, "an explicit empty list excludes none")
			assert.Equal(t, []string{"batch", "render"}, args.Namespaces)
		})
	}
	// The internal type, as kube-scheduler hands it over, is taken as it is (and checked).
	in := &config.ResourceBrokerArgs{ReservationDuration: &metav1.Duration{Duration: time.Minute}, MaxOutstandingReservationsPerNamespace: 3}
	args, err := DecodeArgs(in)
	require.NoError(t, err)
	assert.Equal(t, in, args)
	assert.NotSame(t, in, args)
	_, err = DecodeArgs(&config.ResourceBrokerArgs{})
	assert.ErrorContains(t, err, "pluginConfig[ResourceBroker].args.maxOutstandingReservationsPerNamespace")
}

func TestDecodeArgsErrors(t *testing.T) {
	for _, tc := range []struct {
		name, raw string
		want      []string
	}{
		{"unknown field", `{"reservationDurationn": "1h"}`, []string{`unknown field "reservationDurationn"`}},
		{"wrong type", `{"maxOutstandingReservationsPerNamespace": "ten"}`, []string{"maxOutstandingReservationsPerNamespace"}},
		{"duration too short", `{"reservationDuration": "500ms"}`, []string{"pluginConfig[ResourceBroker].args.reservationDuration", "must be between 1s and 24h0m0s"}},
		{"duration too long", `{"reservationDuration": "25h"}`, []string{"args.reservationDuration"}},
		{"limit zero", `{"maxOutstandingReservationsPerNamespace": 0}`, []string{"args.maxOutstandingReservationsPerNamespace", "must be at least 1"}},
		{"bad namespace", `{"excludedNamespaces": ["ok", "Not_OK"]}`, []string{"args.excludedNamespaces[1]"}},
		{"duplicate namespace", `{"excludedNamespaces": ["a", "a"]}`, []string{"args.excludedNamespaces[1]: Duplicate value"}},
		{"bad allowed namespace", `{"namespaces": ["-x"]}`, []string{"args.namespaces[0]"}},
		{"allowed and excluded", `{"namespaces": ["apps", "kube-system"]}`, []string{`args.namespaces[1]: Invalid value: "kube-system": is also in excludedNamespaces`}},
		{"bad selector operator", `{"selector": {"matchExpressions": [{"key": "a", "operator": "Sideways"}]}}`, []string{"args.selector.matchExpressions[0].operator"}},
		{"bad selector key", `{"selector": {"matchLabels": {"-bad-": "x"}}}`, []string{"args.selector.matchLabels"}},
		{"several at once", `{"reservationDuration": "0s", "maxOutstandingReservationsPerNamespace": -1}`,
			[]string{"args.reservationDuration", "args.maxOutstandingReservationsPerNamespace"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := DecodeArgs(&runtime.Unknown{Raw: []byte(tc.raw), ContentType: runtime.ContentTypeJSON})
			require.Error(t, err)
			assert.True(t, strings.HasPrefix(err.Error(), "invalid ResourceBroker args") || strings.HasPrefix(err.Error(), "ResourceBroker args"), err.Error())
			for _, w := range tc.want {
				assert.Contains(t, err.Error(), w)
			}
		})
	}
	_, err := DecodeArgs(&metav1.Status{})
	assert.ErrorContains(t, err, "want *config.ResourceBrokerArgs")
}
