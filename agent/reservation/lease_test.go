package reservation

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	rbv1 "github.com/fluidos-project/resource-broker/api/v1alpha1"
	"github.com/fluidos-project/resource-broker/broker/api"
	brokerclient "github.com/fluidos-project/resource-broker/broker/client"
)

// TestLeaseRequest: a Reservation opened for a pod asks for a lease of
// LeaseLength held HoldTime (or its spec.duration); one made by hand keeps
// its fixed duration and no lease.
func TestLeaseRequest(t *testing.T) {
	r := &Reconciler{LeaseLength: 90 * time.Second, HoldTime: 45 * time.Second}
	forPod := testReservation()
	forPod.Spec.PodName = "web-0"
	req, err := r.requestFor(forPod)
	require.NoError(t, err)
	assert.Equal(t, "1m30s", req.Lease)
	assert.Equal(t, "45s", req.Duration, "the hold time")

	forPod.Spec.Duration = &metav1.Duration{Duration: 5 * time.Minute}
	req, err = r.requestFor(forPod)
	require.NoError(t, err)
	assert.Equal(t, "1m30s", req.Lease)
	assert.Equal(t, "5m0s", req.Duration, "spec.duration is the hold time of a pod's reservation")

	manual := testReservation()
	manual.Spec.Duration = &metav1.Duration{Duration: 30 * time.Minute}
	req, err = r.requestFor(manual)
	require.NoError(t, err)
	assert.Empty(t, req.Lease, "a manual reservation is no lease")
	assert.Equal(t, "30m0s", req.Duration)

	r = &Reconciler{}
	r.defaults()
	req, err = r.requestFor(forPod)
	require.NoError(t, err)
	assert.Equal(t, "2m0s", req.Lease, "default lease length")
}

// TestOneClock: status.expiresAt is this cluster's now plus the broker's
// remaining time, whatever the broker's own clock says (an hour off here);
// status.lease and status.placement mirror the broker's; Ready is True
// exactly while Active; a lease gets no timer at its expiry, a fixed
// reservation one from the remaining time.
func TestOneClock(t *testing.T) {
	rsv := testReservation(rbv1.ReleaseFinalizer)
	rsv.Spec.PodName = "web-0"
	c := fake.NewClientBuilder().WithScheme(testScheme(t)).WithObjects(rsv).WithStatusSubresource(rsv).Build()
	local := time.Date(2026, 11, 25, 12, 0, 0, 0, time.UTC)
	brokerNow := local.Add(time.Hour) // the broker's clock is an hour ahead
	at := api.Reservation{ID: "u-1", Provider: "paris", Phase: string(rbv1.ReservationReserved), CreatedAt: brokerNow,
		ExpiresAt: brokerNow.Add(2 * time.Minute), RemainingMs: 120_000, Lease: "2m0s"}
	b := &fakeBroker{at: at}
	rec := events.NewFakeRecorder(10)
	r := &Reconciler{Client: c, Broker: b, Recorder: rec, Now: func() time.Time { return local }}
	req := ctrl.Request{NamespacedName: client.ObjectKeyFromObject(rsv)}
	get := func() *rbv1.Reservation {
		var got rbv1.Reservation
		require.NoError(t, c.Get(context.Background(), req.NamespacedName, &got))
		return &got
	}

	res, err := r.Reconcile(context.Background(), req)
	require.NoError(t, err)
	assert.Zero(t, res.RequeueAfter, "a lease: no timer at its expiry")
	got := get()
	assert.Equal(t, local.Add(2*time.Minute), got.Status.ExpiresAt.UTC(), "local now + remainingMs, not the broker's expiresAt")
	require.NotNil(t, got.Status.Lease)
	assert.Equal(t, 2*time.Minute, got.Status.Lease.Duration)
	assert.Equal(t, metav1.ConditionFalse, meta.FindStatusCondition(got.Status.Conditions, rbv1.ConditionReady).Status)
	assert.Nil(t, got.Status.Placement)

	// Granted: the broker's answer carries the grant and its placement.
	b.at.Phase = string(rbv1.ReservationActive)
	b.at.RemainingMs = 119_000 // the same end, read a second later
	b.at.Grant = &api.Grant{Namespace: "rb-rome", Placement: &api.Placement{Node: "paris-3", PriorityClassName: "rb-tenant"}}
	_, err = r.Reconcile(context.Background(), req)
	require.NoError(t, err)
	got = get()
	assert.Equal(t, &rbv1.ReservationPlacement{Node: "paris-3", PriorityClassName: "rb-tenant"}, got.Status.Placement)
	ready := meta.FindStatusCondition(got.Status.Conditions, rbv1.ConditionReady)
	assert.Equal(t, metav1.ConditionTrue, ready.Status)
	assert.Equal(t, "Granted", ready.Reason)
	assert.Equal(t, local.Add(2*time.Minute), got.Status.ExpiresAt.UTC(), "within the slack of the last reading: kept")

	// The lease ended at the broker (its pod never came): Ready goes False.
	b.at.Phase, b.at.RemainingMs = string(rbv1.ReservationExpired), 0
	_, err = r.Reconcile(context.Background(), req)
	require.NoError(t, err)
	got = get()
	assert.Equal(t, rbv1.ReservationExpired, got.Status.Phase)
	assert.Equal(t, metav1.ConditionFalse, meta.FindStatusCondition(got.Status.Conditions, rbv1.ConditionReady).Status)
	assert.Equal(t, metav1.ConditionFalse, meta.FindStatusCondition(got.Status.Conditions, rbv1.ConditionReserved).Status)
	close(rec.Events)
	var all []string
	for e := range rec.Events {
		all = append(all, e)
	}
	require.Len(t, all, 3, "%q", all)
	assert.Contains(t, all[0], "Reserved")
	assert.Contains(t, all[0], "a lease of 2m0s")
	assert.Contains(t, all[1], "Active")
	assert.Contains(t, all[2], "Expired")

	// A fixed reservation: looked at again from the remaining time.
	manual := testReservation(rbv1.ReleaseFinalizer)
	manual.Name, manual.UID = "manual", "u-2"
	c = fake.NewClientBuilder().WithScheme(testScheme(t)).WithObjects(manual).WithStatusSubresource(manual).Build()
	b = &fakeBroker{at: api.Reservation{ID: "u-2", Provider: "paris", Phase: string(rbv1.ReservationReserved), CreatedAt: brokerNow,
		ExpiresAt: brokerNow.Add(time.Hour), RemainingMs: 600_000}}
	r = &Reconciler{Client: c, Broker: b, Recorder: events.NewFakeRecorder(10), Now: func() time.Time { return local }}
	res, err = r.Reconcile(context.Background(), ctrl.Request{NamespacedName: client.ObjectKeyFromObject(manual)})
	require.NoError(t, err)
	assert.Equal(t, 10*time.Minute+2*time.Second, res.RequeueAfter, "from remainingMs, not from the broker's expiresAt")
}

// TestFailedIsFinal: a reservation refused for good is Failed and never
// asked for again; one that an older agent marked Failed for lack of
// capacity is waiting, and asked for again.
func TestFailedIsFinal(t *testing.T) {
	forbidden := &brokerclient.APIError{StatusCode: http.StatusForbidden, Reason: api.ReasonForbidden, Message: "not yours"}
	b := &scriptedBroker{reserve: func(api.ReservationRequest) (api.Reservation, error) { return api.Reservation{}, forbidden }}
	rsv := testReservation(rbv1.ReleaseFinalizer)
	c := fake.NewClientBuilder().WithScheme(testScheme(t)).WithObjects(rsv).WithStatusSubresource(rsv).Build()
	r := &Reconciler{Client: c, Broker: b, Recorder: events.NewFakeRecorder(10)}
	req := ctrl.Request{NamespacedName: client.ObjectKeyFromObject(rsv)}
	res, err := r.Reconcile(context.Background(), req)
	require.NoError(t, err)
	assert.Zero(t, res.RequeueAfter)
	var got rbv1.Reservation
	require.NoError(t, c.Get(context.Background(), req.NamespacedName, &got))
	assert.Equal(t, rbv1.ReservationFailed, got.Status.Phase)
	assert.Equal(t, api.ReasonForbidden, got.Status.Reason)
	_, err = r.Reconcile(context.Background(), req)
	require.NoError(t, err)
	assert.Equal(t, 1, b.reserves(), "Failed is final: not asked again")

	got.Status.Reason = api.ReasonNoCapacity // as an agent older than leases wrote it
	require.NoError(t, c.Status().Update(context.Background(), &got))
	b.reserve = func(api.ReservationRequest) (api.Reservation, error) {
		return api.Reservation{ID: "u-1", Provider: "paris", Phase: "Reserved", RemainingMs: 60_000}, nil
	}
	_, err = r.Reconcile(context.Background(), req)
	require.NoError(t, err)
	require.NoError(t, c.Get(context.Background(), req.NamespacedName, &got))
	assert.Equal(t, rbv1.ReservationReserved, got.Status.Phase)
}

// scriptedBroker answers as its functions say and counts the calls.
type scriptedBroker struct {
	mu      sync.Mutex
	reserve func(api.ReservationRequest) (api.Reservation, error)
	renew   func([]string) (api.RenewResponse, error)
	calls   map[string]int
	batches [][]string
}

func (s *scriptedBroker) count(call string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.calls == nil {
		s.calls = map[string]int{}
	}
	s.calls[call]++
}

func (s *scriptedBroker) reserves() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.calls["reserve"]
}

func (s *scriptedBroker) Reserve(_ context.Context, r api.ReservationRequest) (api.Reservation, error) {
	s.count("reserve")
	return s.reserve(r)
}
func (s *scriptedBroker) Reservation(context.Context, string) (api.Reservation, error) {
	return api.Reservation{}, &brokerclient.APIError{StatusCode: http.StatusNotFound}
}
func (s *scriptedBroker) Release(context.Context, string) (api.Reservation, error) {
	return api.Reservation{}, nil
}
func (s *scriptedBroker) Renew(_ context.Context, ids []string) (api.RenewResponse, error) {
	s.count("renew")
	s.mu.Lock()
	s.batches = append(s.batches, slices.Clone(ids))
	s.mu.Unlock()
	if s.renew != nil {
		return s.renew(ids)
	}
	out := api.RenewResponse{}
	for _, id := range ids {
		out.Renewed = append(out.Renewed, api.RenewedLease{ID: id, RemainingMs: 120_000})
	}
	return out, nil
}

// podMap is a PodLookup.
type podMap map[string]PodState

func (m podMap) Pod(ns, name string) (PodState, bool) {
	p, ok := m[ns+"/"+name]
	return p, ok
}

// leased is a live leased Reservation opened for pod (owned by it when uid is set).
func leased(name, pod string, uid types.UID, phase rbv1.ReservationPhase) *rbv1.Reservation {
	r := testReservation(rbv1.ReleaseFinalizer)
	r.Name, r.UID, r.Spec.PodName = name, types.UID("id-"+name), pod
	if uid != "" {
		r.OwnerReferences = []metav1.OwnerReference{{APIVersion: "v1", Kind: "Pod", Name: pod, UID: uid, Controller: ptr.To(true)}}
	}
	r.Status = rbv1.ReservationStatus{Phase: phase, ReservationID: "id-" + name, Provider: "paris", Lease: &metav1.Duration{Duration: 2 * time.Minute}}
	return r
}

// TestRenewalRound: a round renews the live leases whose pod exists, is
// bound and runs, and only those; in batches of MaxBatch; a refused id is
// handed to the reconciler; a broker that cannot answer is tried again
// within the interval.
func TestRenewalRound(t *testing.T) {
	running := PodState{UID: "p-uid", NodeName: "rb-paris", Phase: corev1.PodRunning}
	pods := podMap{
		"default/running":   running,
		"default/unbound":   {UID: "p-uid", Phase: corev1.PodPending},
		"default/succeeded": {UID: "p-uid", NodeName: "rb-paris", Phase: corev1.PodSucceeded},
		"default/failed":    {UID: "p-uid", NodeName: "rb-paris", Phase: corev1.PodFailed},
		"default/replaced":  {UID: "another-uid", NodeName: "rb-paris", Phase: corev1.PodRunning},
	}
	objs := []client.Object{
		leased("active", "running", "p-uid", rbv1.ReservationActive),
		leased("reserved", "running", "", rbv1.ReservationReserved), // made by hand for the pod's name
		leased("unbound", "unbound", "p-uid", rbv1.ReservationActive),
		leased("succeeded", "succeeded", "p-uid", rbv1.ReservationActive),
		leased("failed", "failed", "p-uid", rbv1.ReservationActive),
		leased("replaced", "replaced", "p-uid", rbv1.ReservationActive),
		leased("no-pod", "missing", "p-uid", rbv1.ReservationActive),
		leased("pending", "running", "p-uid", rbv1.ReservationPending),
		leased("expired", "running", "p-uid", rbv1.ReservationExpired),
	}
	fixed := leased("fixed", "running", "p-uid", rbv1.ReservationActive)
	fixed.Status.Lease = nil
	deleting := leased("deleting", "running", "p-uid", rbv1.ReservationActive)
	deleting.DeletionTimestamp = &metav1.Time{Time: time.Now()}
	objs = append(objs, fixed, deleting)
	for i := range 5 {
		objs = append(objs, leased(fmt.Sprintf("more-%d", i), "running", "p-uid", rbv1.ReservationActive))
	}
	c := fake.NewClientBuilder().WithScheme(testScheme(t)).WithObjects(objs...).WithStatusSubresource(objs...).Build()

	b := &scriptedBroker{}
	var mu sync.Mutex
	var enqueued []string
	w := &Renewer{Client: c, Broker: b, Pods: pods, MaxBatch: 3, Log: testr.New(t),
		Enqueue: func(k types.NamespacedName) { mu.Lock(); enqueued = append(enqueued, k.Name); mu.Unlock() }}
	n := w.Round(context.Background(), nil, time.Now().Add(time.Second))
	assert.Equal(t, 7, n, "active, reserved and the five more")
	var all []string
	for _, batch := range b.batches {
		assert.LessOrEqual(t, len(batch), 3)
		all = append(all, batch...)
	}
	slices.Sort(all)
	assert.Equal(t, []string{"id-active", "id-more-0", "id-more-1", "id-more-2", "id-more-3", "id-more-4", "id-reserved"}, all)
	assert.Len(t, b.batches, 3, "7 ids in batches of 3")

	// Only the Reservations of pods just bound.
	b.batches = nil
	n = w.Round(context.Background(), map[types.NamespacedName]struct{}{{Namespace: "default", Name: "active"}: {}, {Namespace: "default", Name: "unbound"}: {}},
		time.Now().Add(time.Second))
	assert.Equal(t, 1, n)
	assert.Equal(t, [][]string{{"id-active"}}, b.batches)

	// Refused: the reconciler is told.
	b.renew = func(ids []string) (api.RenewResponse, error) {
		out := api.RenewResponse{}
		for _, id := range ids {
			if id == "id-more-2" {
				out.Refused = append(out.Refused, api.RefusedRenewal{ID: id, Reason: api.RenewEnded, Error: "expired"})
				continue
			}
			out.Renewed = append(out.Renewed, api.RenewedLease{ID: id, RemainingMs: 120_000})
		}
		return out, nil
	}
	assert.Equal(t, 6, w.Round(context.Background(), nil, time.Now().Add(time.Second)))
	assert.Equal(t, []string{"more-2"}, enqueued)

	// Unreachable, then back: tried again within the round's deadline.
	failures := 2
	b.renew = func(ids []string) (api.RenewResponse, error) {
		if failures > 0 {
			failures--
			return api.RenewResponse{}, &brokerclient.APIError{StatusCode: http.StatusServiceUnavailable, Reason: api.ReasonUnavailable}
		}
		b.renew = nil
		return b.Renew(context.Background(), ids)
	}
	w2 := &Renewer{Client: c, Broker: b, Pods: pods, MinBackoff: 10 * time.Millisecond, Log: testr.New(t)}
	assert.Equal(t, 7, w2.Round(context.Background(), nil, time.Now().Add(time.Second)), "renewed after two failed calls")

	// Not retried past the deadline, nor when retrying cannot help.
	b.renew = func([]string) (api.RenewResponse, error) {
		return api.RenewResponse{}, &brokerclient.APIError{StatusCode: http.StatusNotFound, Reason: api.ReasonNotFound}
	}
	calls := b.calls["renew"]
	assert.Zero(t, w2.Round(context.Background(), nil, time.Now().Add(time.Second)))
	assert.Equal(t, calls+1, b.calls["renew"], "a 404 (a broker without renewals) is not retried")
	b.renew = func([]string) (api.RenewResponse, error) {
		return api.RenewResponse{}, errors.New("connection refused")
	}
	began := time.Now()
	w2.Round(context.Background(), nil, time.Now().Add(100*time.Millisecond))
	assert.Less(t, time.Since(began), time.Second)
}

// TestPodGone: a Reservation is deleted (so released) as soon as its pod
// Succeeded, Failed or was deleted; a Reservation made by hand for a pod
// that does not exist (yet) is kept.
func TestPodGone(t *testing.T) {
	for _, tc := range []struct {
		name    string
		pods    podMap
		api     []client.Object // pods on the API server
		owned   bool
		deleted bool
	}{
		{"running", podMap{"default/web": {UID: "p-uid", NodeName: "n", Phase: corev1.PodRunning}}, nil, true, false},
		{"succeeded", podMap{"default/web": {UID: "p-uid", NodeName: "n", Phase: corev1.PodSucceeded}}, nil, true, true},
		{"failed", podMap{"default/web": {UID: "p-uid", NodeName: "n", Phase: corev1.PodFailed}}, nil, true, true},
		{"deleted", podMap{}, nil, true, true},
		{"not in the cache yet", podMap{}, []client.Object{&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "web", UID: "p-uid"}}}, true, false},
		{"replaced", podMap{"default/web": {UID: "new-uid", Phase: corev1.PodPending}},
			[]client.Object{&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "web", UID: "new-uid"}}}, true, true},
		{"by hand, no pod yet", podMap{}, nil, false, false},
		{"by hand, pod succeeded", podMap{"default/web": {UID: "any", NodeName: "n", Phase: corev1.PodSucceeded}}, nil, false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			uid := types.UID("")
			if tc.owned {
				uid = "p-uid"
			}
			rsv := leased("rsv", "web", uid, rbv1.ReservationActive)
			scheme := testScheme(t)
			require.NoError(t, corev1.AddToScheme(scheme))
			c := fake.NewClientBuilder().WithScheme(scheme).WithObjects(rsv).WithStatusSubresource(rsv).Build()
			apiReader := fake.NewClientBuilder().WithScheme(scheme).WithObjects(tc.api...).Build()
			r := &Reconciler{Client: c, Broker: &fakeBroker{at: api.Reservation{ID: "id-rsv", Phase: "Active", Lease: "2m0s", RemainingMs: 1}},
				Recorder: events.NewFakeRecorder(10), Pods: tc.pods, APIReader: apiReader}
			_, err := r.Reconcile(context.Background(), ctrl.Request{NamespacedName: client.ObjectKeyFromObject(rsv)})
			require.NoError(t, err)
			var got rbv1.Reservation
			err = c.Get(context.Background(), client.ObjectKeyFromObject(rsv), &got)
			require.NoError(t, err, "the finalizer holds it until released")
			assert.Equal(t, tc.deleted, !got.DeletionTimestamp.IsZero())
		})
	}
}
