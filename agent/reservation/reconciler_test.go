package reservation

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
	"sigs.k8s.io/controller-runtime/pkg/controller/priorityqueue"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	rbv1 "github.com/fluidos-project/resource-broker/api/v1alpha1"
	"github.com/fluidos-project/resource-broker/broker/api"
)

// fakeBroker answers with one reservation, whatever is asked.
type fakeBroker struct {
	at       api.Reservation
	reserved atomic.Int32
	released atomic.Int32
}

func (f *fakeBroker) Reserve(context.Context, api.ReservationRequest) (api.Reservation, error) {
	f.reserved.Add(1)
	return f.at, nil
}
func (f *fakeBroker) Reservation(context.Context, string) (api.Reservation, error) { return f.at, nil }
func (f *fakeBroker) Release(context.Context, string) (api.Reservation, error) {
	f.released.Add(1)
	return f.at, nil
}

func testScheme(t *testing.T) *runtime.Scheme {
	scheme := runtime.NewScheme()
	if err := rbv1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	return scheme
}

func testReservation(finalizers ...string) *rbv1.Reservation {
	return &rbv1.Reservation{
		ObjectMeta: metav1.ObjectMeta{Name: "web-0", Namespace: "default", UID: "u-1", Finalizers: finalizers},
		Spec: rbv1.ReservationSpec{Resources: corev1.ResourceList{
			corev1.ResourceCPU: resource.MustParse("1"), corev1.ResourceMemory: resource.MustParse("1Gi")}},
	}
}

// TestFinalizerBeforeAskingTheBroker: the finalizer is patched before the
// broker is asked and the decision is written on the patched object; when
// the finalizer cannot be added (the object is gone) the broker is never
// asked, so nothing is left there to release.
func TestFinalizerBeforeAskingTheBroker(t *testing.T) {
	now := time.Now()
	at := api.Reservation{ID: "u-1", Provider: "paris", Phase: string(rbv1.ReservationReserved), CreatedAt: now, ExpiresAt: now.Add(time.Hour)}
	rsv := testReservation()
	c := fake.NewClientBuilder().WithScheme(testScheme(t)).WithObjects(rsv).WithStatusSubresource(rsv).Build()
	b := &fakeBroker{at: at}
	r := &Reconciler{Client: c, Broker: b, Recorder: events.NewFakeRecorder(10), MinBackoff: time.Second, MaxBackoff: time.Minute}
	req := ctrl.Request{NamespacedName: client.ObjectKeyFromObject(rsv)}
	if _, err := r.Reconcile(context.Background(), req); err != nil {
		t.Fatal(err)
	}
	var got rbv1.Reservation
	if err := c.Get(context.Background(), req.NamespacedName, &got); err != nil {
		t.Fatal(err)
	}
	if len(got.Finalizers) != 1 || got.Finalizers[0] != rbv1.ReleaseFinalizer || got.Status.Phase != rbv1.ReservationReserved {
		t.Errorf("finalizers %v, phase %q", got.Finalizers, got.Status.Phase)
	}
	if b.released.Load() != 0 {
		t.Errorf("released %d times", b.released.Load())
	}

	gone := testReservation()
	c = fake.NewClientBuilder().WithScheme(testScheme(t)).WithObjects(gone).WithStatusSubresource(gone).
		WithInterceptorFuncs(interceptor.Funcs{Patch: func(ctx context.Context, c client.WithWatch, o client.Object, p client.Patch, opts ...client.PatchOption) error {
			_ = c.Delete(ctx, o)
			return c.Patch(ctx, o, p, opts...) // not found
		}}).Build()
	b = &fakeBroker{at: at}
	r = &Reconciler{Client: c, Broker: b, Recorder: events.NewFakeRecorder(10), MinBackoff: time.Second, MaxBackoff: time.Minute}
	if _, err := r.Reconcile(context.Background(), req); err != nil {
		t.Fatal(err)
	}
	if b.reserved.Load() != 0 || b.released.Load() != 0 {
		t.Errorf("object gone before its finalizer: reserved %d and released %d times, want neither", b.reserved.Load(), b.released.Load())
	}
}

// TestRefreshWritesOnChangesOnly: the broker sends an event for every change
// of a reservation and the agent looks again after every reconnection; a
// look that finds the status right writes nothing (neither status nor
// event), a change is written once.
func TestRefreshWritesOnChangesOnly(t *testing.T) {
	scheme := testScheme(t)
	rsv := testReservation(rbv1.ReleaseFinalizer)
	var statusWrites atomic.Int32
	c := fake.NewClientBuilder().WithScheme(scheme).WithObjects(rsv).WithStatusSubresource(rsv).
		WithInterceptorFuncs(interceptor.Funcs{SubResourceUpdate: func(ctx context.Context, c client.Client, sub string, o client.Object, opts ...client.SubResourceUpdateOption) error {
			statusWrites.Add(1)
			return c.SubResource(sub).Update(ctx, o, opts...)
		}}).Build()
	now := time.Now()
	b := &fakeBroker{at: api.Reservation{ID: "u-1", Provider: "paris", Phase: string(rbv1.ReservationReserved), Score: 71.5,
		CreatedAt: now, ExpiresAt: now.Add(30 * time.Minute), RemainingMs: (30 * time.Minute).Milliseconds()}}
	rec := events.NewFakeRecorder(10)
	r := &Reconciler{Client: c, Broker: b, Recorder: rec, MinBackoff: time.Second, MaxBackoff: time.Minute}
	req := ctrl.Request{NamespacedName: client.ObjectKeyFromObject(rsv)}
	reconcile := func(what string) {
		t.Helper()
		if _, err := r.Reconcile(context.Background(), req); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}

	reconcile("reserve")
	if n := statusWrites.Load(); n != 1 {
		t.Fatalf("reserve: %d status writes, want 1", n)
	}
	reconcile("Reserved event") // the broker's Reserved event: nothing new
	reconcile("reconnection")
	if n := statusWrites.Load(); n != 1 {
		t.Errorf("looking again at an unchanged reservation: %d status writes, want 1", n)
	}
	b.at.RemainingMs -= 1500 // read again 1.5s later: the same end
	reconcile("reconnection, later")
	if n := statusWrites.Load(); n != 1 {
		t.Errorf("looking again later at an unchanged reservation: %d status writes, want 1", n)
	}
	b.at.Phase = string(rbv1.ReservationActive)
	reconcile("granted")
	reconcile("granted again")
	if n := statusWrites.Load(); n != 2 {
		t.Errorf("after the grant: %d status writes, want 2", n)
	}
	var got rbv1.Reservation
	if err := c.Get(context.Background(), req.NamespacedName, &got); err != nil {
		t.Fatal(err)
	}
	if got.Status.Phase != rbv1.ReservationActive || got.Status.ExpiresAt == nil || got.Status.ExpiresAt.Unix() != now.Add(30*time.Minute).Unix() {
		t.Errorf("status %+v", got.Status)
	}
	close(rec.Events)
	var reasons []string
	for e := range rec.Events {
		reasons = append(reasons, e)
	}
	if len(reasons) != 2 {
		t.Errorf("events %q, want Reserved and Active", reasons)
	}
}

// TestBrokerNewsFirst: a Reservation the broker changed is reconciled
// before the ones already waiting for their first decision.
func TestBrokerNewsFirst(t *testing.T) {
	q := priorityqueue.New[reconcile.Request]("test")
	defer q.ShutDown()
	waiting := reconcile.Request{NamespacedName: types.NamespacedName{Namespace: "default", Name: "new"}}
	q.Add(waiting)
	granted := &rbv1.Reservation{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "granted"}}
	brokerNews.Generic(context.Background(), event.GenericEvent{Object: granted}, q)
	first, _ := q.Get()
	if first.Name != "granted" {
		t.Errorf("first %v, want the granted one", first)
	}
}
