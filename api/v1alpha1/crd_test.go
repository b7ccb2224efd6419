package v1alpha1_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	rbv1 "github.com/fluidos-project/resource-broker/api/v1alpha1"
	"github.com/fluidos-project/resource-broker/internal/testenv"
)

// TestReservationValidation installs the generated CRDs in a real API server
// and checks that its OpenAPI and CEL rules refuse what the agent could not
// send to the broker.
func TestReservationValidation(t *testing.T) {
	cfg := testenv.Start(t, testenv.WithCRDDirectories(testenv.ModulePath(t, "manifests", "crds")))
	scheme := runtime.NewScheme()
	require.NoError(t, rbv1.AddToScheme(scheme))
	c, err := client.New(cfg, client.Options{Scheme: scheme})
	require.NoError(t, err)
	ctx := context.Background()

	rsv := func(name string, res corev1.ResourceList) *rbv1.Reservation {
		return &rbv1.Reservation{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
			Spec:       rbv1.ReservationSpec{Resources: res, Duration: &metav1.Duration{Duration: time.Hour}},
		}
	}
	q := resource.MustParse
	ok := rsv("ok", corev1.ResourceList{"cpu": q("500m"), "memory": q("1Gi"), "nvidia.com/gpu": q("1")})
	require.NoError(t, c.Create(ctx, ok))

	for name, res := range map[string]corev1.ResourceList{
		"no-memory":    {"cpu": q("1")},
		"zero-cpu":     {"cpu": q("0"), "memory": q("1Gi")},
		"negative-mem": {"cpu": q("1"), "memory": q("-1Gi")},
		"unknown-key":  {"cpu": q("1"), "memory": q("1Gi"), "pods": q("3")},
	} {
		err := c.Create(ctx, rsv(name, res))
		assert.Error(t, err, name)
	}

	ok.Spec.Resources["cpu"] = q("2")
	err = c.Update(ctx, ok)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "spec is immutable")

	ok.Spec.Resources["cpu"] = q("500m")
	ok.Status.Phase = "Sleeping"
	err = c.Status().Update(ctx, ok)
	require.Error(t, err, "phase is an enum")

	pi := &rbv1.ProviderInstruction{
		ObjectMeta: metav1.ObjectMeta{Name: "pi", Namespace: "default"},
		Spec:       rbv1.ProviderInstructionSpec{ReservationID: "r1", Requester: "Rome!", Resources: corev1.ResourceList{"cpu": q("1")}},
	}
	require.Error(t, c.Create(ctx, pi), "requester must be a DNS label")
	pi.Spec.Requester = "rome"
	require.NoError(t, c.Create(ctx, pi))

	adv := &rbv1.Advertisement{
		ObjectMeta: metav1.ObjectMeta{Name: "rome"},
		Spec: rbv1.AdvertisementSpec{ClusterID: "rome", Capacity: corev1.ResourceList{"cpu": q("4")},
			Allocatable: corev1.ResourceList{"cpu": q("4")}, Allocated: corev1.ResourceList{},
			Prices: &rbv1.Prices{Currency: "euro"}},
	}
	require.Error(t, c.Create(ctx, adv), "currency is an ISO 4217 code")
	adv.Spec.Prices.Currency = "EUR"
	require.NoError(t, c.Create(ctx, adv), "cluster-scoped")
}
