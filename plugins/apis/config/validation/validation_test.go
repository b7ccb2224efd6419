package validation

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/fluidos-project/resource-broker/plugins/apis/config"
)

func TestValidateResourceBrokerArgs(t *testing.T) {
	valid := func() *config.ResourceBrokerArgs {
		return &config.ResourceBrokerArgs{
			ReservationDuration:                    &metav1.Duration{Duration: time.Hour},
			MaxOutstandingReservationsPerNamespace: 1,
			ExcludedNamespaces:                     []string{"kube-system"},
		}
	}
	path := field.NewPath("args")
	assert.NoError(t, ValidateResourceBrokerArgs(path, valid()))
	for _, tc := range []struct {
		name   string
		modify func(*config.ResourceBrokerArgs)
		want   []string
	}{
		{"bounds", func(a *config.ResourceBrokerArgs) { a.ReservationDuration.Duration = MaxReservationDuration }, nil},
		{"too short", func(a *config.ResourceBrokerArgs) { a.ReservationDuration.Duration = 999 * time.Millisecond },
			[]string{`args.reservationDuration: Invalid value: "999ms": must be between 1s and 24h0m0s`}},
		{"zero duration", func(a *config.ResourceBrokerArgs) { a.ReservationDuration.Duration = 0 }, []string{"args.reservationDuration"}},
		{"unset duration (deprecated)", func(a *config.ResourceBrokerArgs) { a.ReservationDuration = nil }, nil},
		{"limit", func(a *config.ResourceBrokerArgs) { a.MaxOutstandingReservationsPerNamespace = 0 },
			[]string{"args.maxOutstandingReservationsPerNamespace: Invalid value: 0: must be at least 1"}},
		{"excluded", func(a *config.ResourceBrokerArgs) { a.ExcludedNamespaces = []string{"a", "B", "a"} },
			[]string{`args.excludedNamespaces[1]: Invalid value: "B"`, `args.excludedNamespaces[2]: Duplicate value: "a"`}},
		{"allowed", func(a *config.ResourceBrokerArgs) { a.Namespaces = []string{"apps", "apps", "kube-system"} },
			[]string{`args.namespaces[1]: Duplicate value: "apps"`, `args.namespaces[2]: Invalid value: "kube-system": is also in excludedNamespaces`}},
		{"selector", func(a *config.ResourceBrokerArgs) {
			a.Selector = &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "k", Operator: metav1.LabelSelectorOpIn}}}
		}, []string{"args.selector.matchExpressions[0].values"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := valid()
			tc.modify(a)
			err := ValidateResourceBrokerArgs(path, a)
			if tc.want == nil {
				assert.NoError(t, err)
				return
			}
			for _, w := range tc.want {
				assert.ErrorContains(t, err, w)
			}
		})
	}
}
