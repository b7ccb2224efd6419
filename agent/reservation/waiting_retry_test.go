package reservation

import (
	"context"
	"net/http"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/events"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	rbv1 "github.com/fluidos-project/resource-broker/api/v1alpha1"
	"github.com/fluidos-project/resource-broker/broker/api"
	brokerclient "github.com/fluidos-project/resource-broker/broker/client"
)

// noCapacityBroker refuses every reservation: nothing fits.
type noCapacityBroker struct{ fakeBroker }

func (*noCapacityBroker) Reserve(context.Context, api.ReservationRequest) (api.Reservation, error) {
	return api.Reservation{}, &brokerclient.APIError{StatusCode: http.StatusConflict, Reason: api.ReasonNoCapacity, Message: "no capacity"}
}

// TestWaitingRetry: a reservation refused for lack of capacity waits on the
// broker's list, whose place lasts --wait-ttl (5s) without a retry: however
// many attempts, the agent asks again within WaitingRetry.
func TestWaitingRetry(t *testing.T) {
	scheme := testScheme(t)
	rsv := testReservation(rbv1.ReleaseFinalizer)
	rsv.Status.Attempts = 10 // the back-off alone would be MaxBackoff
	c := fake.NewClientBuilder().WithScheme(scheme).WithObjects(rsv).WithStatusSubresource(rsv).Build()
	r := &Reconciler{Client: c, Broker: &noCapacityBroker{}, Recorder: events.NewFakeRecorder(10),
		MinBackoff: time.Second, MaxBackoff: time.Minute, WaitingRetry: DefaultWaitingRetry}
	res, err := r.Reconcile(context.Background(), ctrl.Request{NamespacedName: client.ObjectKeyFromObject(rsv)})
	if err != nil {
		t.Fatal(err)
	}
	if res.RequeueAfter <= 0 || res.RequeueAfter > DefaultWaitingRetry {
		t.Errorf("NoCapacity retried after %s, want at most %s", res.RequeueAfter, DefaultWaitingRetry)
	}
	var got rbv1.Reservation
	if err := c.Get(context.Background(), client.ObjectKeyFromObject(rsv), &got); err != nil {
		t.Fatal(err)
	}
	if got.Status.Phase != rbv1.ReservationPending || got.Status.Reason != "NoCapacity" {
		t.Errorf("waiting for capacity is Pending, not Failed: status %+v", got.Status)
	}
	for typ, want := range map[string]metav1.ConditionStatus{rbv1.ConditionReserved: metav1.ConditionFalse, rbv1.ConditionReady: metav1.ConditionFalse} {
		if c := meta.FindStatusCondition(got.Status.Conditions, typ); c == nil || c.Status != want || c.Reason != "NoCapacity" || c.Message != "no capacity" {
			t.Errorf("condition %s: %+v, want %s, NoCapacity, the broker's message", typ, c, want)
		}
	}
}
