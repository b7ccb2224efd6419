package v1

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestSetDefaults(t *testing.T) {
	args := &ResourceBrokerArgs{}
	SetObjectDefaults_ResourceBrokerArgs(args)
	assert.Nil(t, args.ReservationDuration, "deprecated: no default")
	assert.Equal(t, DefaultMaxOutstandingReservationsPerNamespace, *args.MaxOutstandingReservationsPerNamespace)
	assert.Equal(t, DefaultExcludedNamespaces, args.ExcludedNamespaces)
	assert.Nil(t, args.Namespaces)
	args.ExcludedNamespaces[0] = "changed"
	assert.Equal(t, "kube-system", DefaultExcludedNamespaces[0], "the defaults are copied")

	n := int32(3)
	set := &ResourceBrokerArgs{ReservationDuration: &metav1.Duration{Duration: time.Minute}, MaxOutstandingReservationsPerNamespace: &n, ExcludedNamespaces: []string{}}
	SetObjectDefaults_ResourceBrokerArgs(set)
	assert.Equal(t, time.Minute, set.ReservationDuration.Duration)
	assert.EqualValues(t, 3, *set.MaxOutstandingReservationsPerNamespace)
	assert.Empty(t, set.ExcludedNamespaces, "an explicit empty list stays empty")
}

func TestDeepCopy(t *testing.T) {
	n := int32(3)
	in := &ResourceBrokerArgs{
		Selector:                               &metav1.LabelSelector{MatchLabels: map[string]string{"a": "b"}},
		ReservationDuration:                    &metav1.Duration{Duration: time.Minute},
		MaxOutstandingReservationsPerNamespace: &n,
		ExcludedNamespaces:                     []string{"x"},
		Namespaces:                             []string{"y"},
	}
	out := in.DeepCopyObject().(*ResourceBrokerArgs)
	assert.Equal(t, in, out)
	out.Selector.MatchLabels["a"] = "c"
	out.ReservationDuration.Duration = time.Hour
	*out.MaxOutstandingReservationsPerNamespace = 9
	out.ExcludedNamespaces[0] = "z"
	out.Namespaces[0] = "z"
	assert.Equal(t, "b", in.Selector.MatchLabels["a"])
	assert.Equal(t, time.Minute, in.ReservationDuration.Duration)
	assert.EqualValues(t, 3, *in.MaxOutstandingReservationsPerNamespace)
	assert.Equal(t, "x", in.ExcludedNamespaces[0])
	assert.Equal(t, "y", in.Namespaces[0])
}
