package resourcebroker

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
)

func TestDecodeArgsDefaults(t *testing.T) {
	for name, obj := range map[string]runtime.Object{
		"nil":         nil,
		"empty":       &runtime.Unknown{},
		"empty JSON":  &runtime.Unknown{Raw: []byte(`{}`), ContentType: runtime.ContentTypeJSON},
		"typed empty": &ResourceBrokerArgs{},
	} {
		t.Run(name, func(t *testing.T) {
			args, err := DecodeArgs(obj)
			require.NoError(t, err)
			assert.Nil(t, args.Selector, "nil selector: every pod of the profile")
			assert.Equal(t, DefaultReservationDuration, args.ReservationDuration.Duration)
			assert.Equal(t, DefaultMaxOutstandingReservationsPerNamespace, *args.MaxOutstandingReservationsPerNamespace)
			assert.Equal(t, DefaultExcludedNamespaces, args.ExcludedNamespaces)
		})
	}
}

func TestDecodeArgsValues(t *testing.T) {
	args, err := DecodeArgs(&runtime.Unknown{Raw: []byte(`{
		"selector": {"matchLabels": {"broker.fluidos.eu/offload": "true"}},
		"reservationDuration": "2h30m",
		"maxOutstandingReservationsPerNamespace": 7,
		"excludedNamespaces": []
	}`)})
	require.NoError(t, err)
	assert.Equal(t, map[string]string{"broker.fluidos.eu/offload": "true"}, args.Selector.MatchLabels)
	assert.Equal(t, 150*time.Minute, args.ReservationDuration.Duration)
	assert.EqualValues(t, 7, *args.MaxOutstandingReservationsPerNamespace)
	assert.Empty(t, args.ExcludedNamespaces, "an explicit empty list excludes none")
}

func TestDecodeArgsErrors(t *testing.T) {
	for _, tc := range []struct {
		name, raw string
		want      []string
	}{
		{"unknown field", `{"reservationDurationn": "1h"}`, []string{`unknown field "reservationDurationn"`}},
		{"wrong type", `{"maxOutstandingReservationsPerNamespace": "ten"}`, []string{"cannot unmarshal"}},
		{"duration too short", `{"reservationDuration": "500ms"}`, []string{"args.reservationDuration", "must be between 1s and 24h0m0s"}},
		{"duration too long", `{"reservationDuration": "25h"}`, []string{"args.reservationDuration"}},
		{"limit zero", `{"maxOutstandingReservationsPerNamespace": 0}`, []string{"args.maxOutstandingReservationsPerNamespace", "must be at least 1"}},
		{"bad namespace", `{"excludedNamespaces": ["ok", "Not_OK"]}`, []string{"args.excludedNamespaces[1]"}},
		{"duplicate namespace", `{"excludedNamespaces": ["a", "a"]}`, []string{"args.excludedNamespaces[1]: Duplicate value"}},
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
	assert.ErrorContains(t, err, "want *runtime.Unknown")
}

func TestArgsDeepCopy(t *testing.T) {
	n := int32(3)
	in := &ResourceBrokerArgs{
		Selector:                               &metav1.LabelSelector{MatchLabels: map[string]string{"a": "b"}},
		ReservationDuration:                    &metav1.Duration{Duration: time.Minute},
		MaxOutstandingReservationsPerNamespace: &n,
		ExcludedNamespaces:                     []string{"x"},
	}
	out := in.DeepCopyObject().(*ResourceBrokerArgs)
	out.Selector.MatchLabels["a"] = "c"
	out.ReservationDuration.Duration = time.Hour
	*out.MaxOutstandingReservationsPerNamespace = 9
	out.ExcludedNamespaces[0] = "y"
	assert.Equal(t, "b", in.Selector.MatchLabels["a"])
	assert.Equal(t, time.Minute, in.ReservationDuration.Duration)
	assert.EqualValues(t, 3, *in.MaxOutstandingReservationsPerNamespace)
	assert.Equal(t, "x", in.ExcludedNamespaces[0])
}
