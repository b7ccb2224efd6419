package provider

import (
	"context"
	"errors"
	"net/http"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	rbv1 "github.com/fluidos-project/resource-broker/api/v1alpha1"
	"github.com/fluidos-project/resource-broker/broker/api"
	brokerclient "github.com/fluidos-project/resource-broker/broker/client"
)

func fakeClient(objs ...client.Object) client.Client {
	s := runtime.NewScheme()
	_ = clientgoscheme.AddToScheme(s)
	_ = rbv1.AddToScheme(s)
	return fake.NewClientBuilder().WithScheme(s).WithObjects(objs...).WithStatusSubresource(&rbv1.ProviderInstruction{}).Build()
}

func heartbeatLease(requester string, renewed time.Time, seconds int32) *coordinationv1.Lease {
	return &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Namespace: TenantNamespace(requester), Name: rbv1.RequesterHeartbeatLease},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To(requester), LeaseDurationSeconds: ptr.To(seconds),
			RenewTime: &metav1.MicroTime{Time: renewed}},
	}
}

// TestRequestersHeard: a requester is heard while its heartbeat Lease
// changes within its duration, as this agent's clock sees it; a Lease seen
// for the first time is trusted by its renewTime; no Lease, not heard.
func TestRequestersHeard(t *testing.T) {
	ctx := context.Background()
	c := fakeClient()
	require.NoError(t, c.Create(ctx, heartbeatLease("oslo", time.Now().Add(-time.Hour), 1)))
	require.NoError(t, c.Create(ctx, heartbeatLease("rome", time.Now(), 1)))
	w := &Requesters{Client: c, Reader: c}
	assert.True(t, w.Heard(ctx, "rome"), "renewed just now")
	assert.False(t, w.Heard(ctx, "oslo"), "first seen an hour after its renewal")
	assert.False(t, w.Heard(ctx, "milan"), "no heartbeat at all")

	time.Sleep(1100 * time.Millisecond)
	assert.False(t, w.Heard(ctx, "rome"), "unchanged for longer than its duration")
	var l coordinationv1.Lease
	require.NoError(t, c.Get(ctx, client.ObjectKey{Namespace: "rb-rome", Name: rbv1.RequesterHeartbeatLease}, &l))
	l.Spec.RenewTime = &metav1.MicroTime{Time: time.Now().Add(-time.Hour)} // a requester whose clock is an hour behind
	require.NoError(t, c.Update(ctx, &l))
	assert.True(t, w.Heard(ctx, "rome"), "changed: heard again, whatever its clock says")
}

// renewals is the broker: the requesters not in renewing are quiet.
type renewals struct {
	mu       sync.Mutex
	earlier  bool            // a broker without QuietRequesters: 404
	failing  map[string]bool // RenewFor fails for these
	renewing map[string]bool
	asked    [][]string // the requesters of each QuietRequesters call
	seen     map[string][]string
}

func (r *renewals) QuietRequesters(_ context.Context, requesters []string) ([]string, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.asked = append(r.asked, slices.Sorted(slices.Values(requesters)))
	if r.earlier {
		return nil, &brokerclient.APIError{StatusCode: http.StatusNotFound, Reason: api.ReasonNotFound, Message: "no route for POST /api/v2/renewals/quiet"}
	}
	var quiet []string
	for _, q := range requesters {
		if !r.renewing[q] {
			quiet = append(quiet, q)
		}
	}
	return quiet, nil
}

func (r *renewals) RenewFor(_ context.Context, requester string, ids []string) (api.RenewResponse, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.failing[requester] {
		return api.RenewResponse{}, errors.New("broker unavailable")
	}
	if r.seen == nil {
		r.seen = map[string][]string{}
	}
	r.seen[requester] = append(r.seen[requester], ids...)
	out := api.RenewResponse{}
	for _, id := range ids {
		out.Renewed = append(out.Renewed, api.RenewedLease{ID: id, RemainingMs: 1000})
	}
	return out, nil
}

func instruction(requester, id string, ended bool, endedAt time.Time, reason string) *rbv1.ProviderInstruction {
	pi := &rbv1.ProviderInstruction{
		ObjectMeta: metav1.ObjectMeta{Namespace: "resource-broker", Name: InstructionName(requester, id), UID: types.UID("uid-" + requester + "-" + id)},
		Spec:       rbv1.ProviderInstructionSpec{Requester: requester, ReservationID: id},
	}
	if ended {
		pi.Status.EndedAt = &metav1.MicroTime{Time: endedAt}
		meta.SetStatusCondition(&pi.Status.Conditions, metav1.Condition{Type: rbv1.ConditionEnded, Status: metav1.ConditionTrue, Reason: reason})
	}
	return pi
}

func tenantPod(requester, id string, role string, phase corev1.PodPhase) *corev1.Pod {
	labels := map[string]string{rbv1.ReservationLabel: id}
	if role != "" {
		labels[rbv1.RoleLabel] = role
	}
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: TenantNamespace(requester), Name: id + "-" + role, Labels: labels},
		Status: corev1.PodStatus{Phase: phase}}
}

// TestRequestersVouch: for a requester heard here, the live reservations
// whose pods run here are renewed at the broker; a reservation with only a
// placeholder or a finished pod, an ended one, and the reservations of a
// requester not heard are not.
func TestRequestersVouch(t *testing.T) {
	c := fakeClient(
		heartbeatLease("rome", time.Now(), 60),
		instruction("rome", "runs", false, time.Time{}, ""), tenantPod("rome", "runs", "", corev1.PodRunning),
		instruction("rome", "held", false, time.Time{}, ""), tenantPod("rome", "held", rbv1.RolePlaceholder, corev1.PodRunning),
		instruction("rome", "done", false, time.Time{}, ""), tenantPod("rome", "done", "", corev1.PodSucceeded),
		instruction("rome", "ended", true, time.Now(), EndedLeaseLapsed), tenantPod("rome", "ended", "", corev1.PodRunning),
		instruction("oslo", "quiet", false, time.Time{}, ""), tenantPod("oslo", "quiet", "", corev1.PodRunning),
	)
	b := &renewals{}
	w := &Requesters{Client: c, Reader: c, Broker: b, Namespace: "resource-broker"}
	require.NoError(t, w.vouch(context.Background()))
	assert.Equal(t, map[string][]string{"rome": {"runs"}}, b.seen)
	assert.Equal(t, [][]string{{"rome"}}, b.asked, "only the requesters heard are named")
}

// TestRequestersVouchQuietOnly: one call names every requester heard; only
// those the broker finds quiet are renewed.
func TestRequestersVouchQuietOnly(t *testing.T) {
	c := fakeClient(
		heartbeatLease("rome", time.Now(), 60), instruction("rome", "a", false, time.Time{}, ""), tenantPod("rome", "a", "", corev1.PodRunning),
		heartbeatLease("oslo", time.Now(), 60), instruction("oslo", "b", false, time.Time{}, ""), tenantPod("oslo", "b", "", corev1.PodRunning),
		heartbeatLease("lima", time.Now(), 60), instruction("lima", "c", false, time.Time{}, ""), tenantPod("lima", "c", "", corev1.PodRunning),
		instruction("lima", "d", false, time.Time{}, ""), tenantPod("lima", "d", "", corev1.PodRunning),
	)
	b := &renewals{renewing: map[string]bool{"rome": true, "oslo": true}}
	w := &Requesters{Client: c, Reader: c, Broker: b, Namespace: "resource-broker"}
	require.NoError(t, w.vouch(context.Background()))
	assert.Equal(t, [][]string{{"lima", "oslo", "rome"}}, b.asked)
	require.Contains(t, b.seen, "lima")
	assert.ElementsMatch(t, []string{"c", "d"}, b.seen["lima"])
	assert.Len(t, b.seen, 1, "rome and oslo renew their own leases")

	// A broker of an earlier release answers 404: each requester heard is
	// renewed for, as that broker expects.
	b = &renewals{earlier: true, renewing: map[string]bool{"rome": true}}
	w.Broker = b
	require.NoError(t, w.vouch(context.Background()))
	assert.Len(t, b.seen, 3)

	// One requester's renewal fails: the others are renewed all the same.
	b = &renewals{failing: map[string]bool{"lima": true}}
	w.Broker = b
	err := w.vouch(context.Background())
	require.ErrorContains(t, err, "renewing for lima")
	assert.Len(t, b.seen, 2, "rome and oslo renewed")
}

// TestHoldEviction: Released is never held; a lapse while the requester is
// heard is held; a mass expiry (3 or more within a minute, of several
// requesters or most of one's) is held until MassExpiryHold after the end;
// a lone lapse is not held.
func TestHoldEviction(t *testing.T) {
	ctx := context.Background()
	now := time.Now()
	t.Run("lone lapse", func(t *testing.T) {
		c := fakeClient(instruction("rome", "a", true, now, EndedLeaseLapsed), instruction("rome", "b", false, time.Time{}, ""),
			instruction("rome", "c", false, time.Time{}, ""))
		r := &TenantReconciler{Client: c, Namespace: "resource-broker", Requesters: &Requesters{Client: c, Reader: c}}
		hold, err := r.holdEviction(ctx, instruction("rome", "a", true, now, EndedLeaseLapsed), EndedLeaseLapsed, now)
		require.NoError(t, err)
		assert.Zero(t, hold)
	})
	t.Run("requester heard", func(t *testing.T) {
		c := fakeClient(heartbeatLease("rome", now, 60))
		r := &TenantReconciler{Client: c, Namespace: "resource-broker", Requesters: &Requesters{Client: c, Reader: c}}
		pi := instruction("rome", "a", true, now, EndedLeaseLapsed)
		hold, err := r.holdEviction(ctx, pi, EndedLeaseLapsed, now)
		require.NoError(t, err)
		assert.Equal(t, heardRecheck, hold)
		hold, err = r.holdEviction(ctx, pi, EndedReleased, now)
		require.NoError(t, err)
		assert.Zero(t, hold, "released: never held")
	})
	t.Run("mass expiry of one requester", func(t *testing.T) {
		c := fakeClient(instruction("rome", "a", true, now, EndedLeaseLapsed), instruction("rome", "b", true, now.Add(-10*time.Second), EndedNotListed),
			instruction("rome", "c", true, now.Add(5*time.Second), EndedLeaseLapsed), instruction("rome", "d", false, time.Time{}, ""))
		r := &TenantReconciler{Client: c, Namespace: "resource-broker", MassExpiryHold: time.Minute}
		hold, err := r.holdEviction(ctx, instruction("rome", "a", true, now, EndedLeaseLapsed), EndedLeaseLapsed, now)
		require.NoError(t, err)
		assert.InDelta(t, time.Minute.Seconds(), hold.Seconds(), 2, "held until a minute after the end")
		hold, err = r.holdEviction(ctx, instruction("rome", "a", true, now, EndedLeaseLapsed), EndedLeaseLapsed, now.Add(-2*time.Minute))
		require.NoError(t, err)
		assert.Zero(t, hold, "the hold is over")
		r.MassExpiryHold = -1
		hold, err = r.holdEviction(ctx, instruction("rome", "a", true, now, EndedLeaseLapsed), EndedLeaseLapsed, now)
		require.NoError(t, err)
		assert.Zero(t, hold, "never held when turned off")
	})
	t.Run("a few of many", func(t *testing.T) {
		objs := []client.Object{}
		for _, id := range []string{"a", "b", "c"} {
			objs = append(objs, instruction("rome", id, true, now, EndedLeaseLapsed))
		}
		for _, id := range []string{"d", "e", "f", "g"} {
			objs = append(objs, instruction("rome", id, false, time.Time{}, ""))
		}
		r := &TenantReconciler{Client: fakeClient(objs...), Namespace: "resource-broker"}
		hold, err := r.holdEviction(ctx, instruction("rome", "a", true, now, EndedLeaseLapsed), EndedLeaseLapsed, now)
		require.NoError(t, err)
		assert.Zero(t, hold, "3 of 7 of one requester: not most of them")
	})
	t.Run("several requesters", func(t *testing.T) {
		c := fakeClient(instruction("rome", "a", true, now, EndedLeaseLapsed), instruction("oslo", "b", true, now, EndedLeaseLapsed),
			instruction("milan", "c", true, now, EndedLeaseLapsed), instruction("rome", "d", false, time.Time{}, ""),
			instruction("rome", "e", false, time.Time{}, ""))
		r := &TenantReconciler{Client: c, Namespace: "resource-broker"}
		hold, err := r.holdEviction(ctx, instruction("rome", "a", true, now, EndedLeaseLapsed), EndedLeaseLapsed, now)
		require.NoError(t, err)
		assert.Greater(t, hold, time.Duration(0), "three requesters' leases at once")
	})
}
