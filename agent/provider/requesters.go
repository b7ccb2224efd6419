package provider

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/go-logr/logr"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	rbv1 "github.com/fluidos-project/resource-broker/api/v1alpha1"
	"github.com/fluidos-project/resource-broker/broker/api"
	brokerclient "github.com/fluidos-project/resource-broker/broker/client"
)

// DefaultVouchPeriod is how often a provider renews, at the broker, the
// leases of the requesters it still hears: a quarter of the default lease
// (2 min), as often as the requesters renew them themselves.
const DefaultVouchPeriod = 30 * time.Second

// LeaseRenewer renews a requester's leases placed on this provider
// (broker/client Client.RenewFor), for the requesters that have gone quiet
// (Client.QuietRequesters).
type LeaseRenewer interface {
	QuietRequesters(ctx context.Context, requesters []string) ([]string, error)
	RenewFor(ctx context.Context, requester string, ids []string) (api.RenewResponse, error)
}

// Requesters tells whether this provider still hears a requester, by the
// heartbeat Lease the requester's bridge renews in its tenant namespace
// (rbv1.RequesterHeartbeatLease), and, as a manager Runnable, renews at the
// broker the leases of the requesters it hears whose pods run here. So a
// requester cut off from the broker but not from this provider keeps its
// reservations, and the broker's books keep counting its pods.
//
// Freshness is judged on this agent's clock: the Lease is fresh while it
// changed less than its leaseDurationSeconds ago, as seen here; the first
// time a Lease is seen (after a restart), its renewTime is trusted when it
// is within one duration of this clock.
type Requesters struct {
	Client    client.Client // ProviderInstructions and pods (the manager's cache)
	Reader    client.Reader // the Leases, read from the API server (not cached)
	Broker    LeaseRenewer
	Namespace string // this agent's ProviderInstructions
	Period    time.Duration
	Log       logr.Logger

	mu   sync.Mutex
	seen map[string]beat // requester -> the last change of its Lease seen here
}

type beat struct {
	resourceVersion string
	changed         time.Time
}

// Heard tells whether requester's heartbeat Lease was renewed within its
// duration, as seen now.
func (w *Requesters) Heard(ctx context.Context, requester string) bool {
	var l coordinationv1.Lease
	err := w.Reader.Get(ctx, client.ObjectKey{Namespace: TenantNamespace(requester), Name: rbv1.RequesterHeartbeatLease}, &l)
	now := time.Now()
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.seen == nil {
		w.seen = map[string]beat{}
	}
	if err != nil {
		if apierrors.IsNotFound(err) {
			delete(w.seen, requester)
		}
		return false
	}
	duration := 40 * time.Second
	if d := l.Spec.LeaseDurationSeconds; d != nil && *d > 0 {
		duration = time.Duration(*d) * time.Second
	}
	b, known := w.seen[requester]
	switch {
	case !known:
		b = beat{resourceVersion: l.ResourceVersion, changed: now.Add(-duration)}
		if rt := l.Spec.RenewTime; rt != nil && now.Sub(rt.Time).Abs() < duration {
			b.changed = rt.Time
		}
	case b.resourceVersion != l.ResourceVersion:
		b = beat{resourceVersion: l.ResourceVersion, changed: now}
	}
	w.seen[requester] = b
	return now.Sub(b.changed) < duration
}

// Start renews every Period until ctx ends.
func (w *Requesters) Start(ctx context.Context) error {
	period := w.Period
	if period <= 0 {
		period = DefaultVouchPeriod
	}
	t := time.NewTicker(period)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		if err := w.vouch(ctx); err != nil && ctx.Err() == nil {
			w.Log.Error(err, "renewing the leases of the requesters heard here")
		}
	}
}

// NeedLeaderElection: only the leader acts for the cluster.
func (w *Requesters) NeedLeaderElection() bool { return true }

// vouch renews, for each requester heard that the broker finds quiet (it
// stopped renewing its own leases), its live reservations whose pods run
// here: the leases the requester itself renews (a reservation whose pod
// never came ends at its hold time, as it would without this).
func (w *Requesters) vouch(ctx context.Context) error {
	var list rbv1.ProviderInstructionList
	if err := w.Client.List(ctx, &list, client.InNamespace(w.Namespace)); err != nil {
		return err
	}
	running, err := w.runningReservations(ctx)
	if err != nil {
		return err
	}
	byRequester := map[string][]string{}
	for i := range list.Items {
		pi := &list.Items[i]
		if IsEnded(pi) || !running[pi.Spec.Requester+"/"+pi.Spec.ReservationID] {
			continue
		}
		byRequester[pi.Spec.Requester] = append(byRequester[pi.Spec.Requester], pi.Spec.ReservationID)
	}
	var heard []string
	for requester := range byRequester {
		if w.Heard(ctx, requester) {
			heard = append(heard, requester)
		}
	}
	// While a requester renews its leases itself, this provider's renewals
	// are not needed: one call names every requester heard, and only those
	// the broker finds quiet are renewed, so a provider hosting many
	// requesters costs the broker one call a period, not one per requester.
	for names := range slices.Chunk(heard, api.MaxQuietRequesters) {
		quiet, err := w.Broker.QuietRequesters(ctx, names)
		if brokerclient.IsNotFound(err) {
			// A broker of an earlier release (a rolling update): it has no
			// such call, and gates each provider's renewal itself.
			quiet, err = names, nil
		}
		if err != nil {
			return err
		}
		// One requester's failed renewal does not hold the others' back.
		var errs []error
		for _, requester := range quiet {
			if err := w.renewFor(ctx, requester, byRequester[requester]); err != nil {
				errs = append(errs, fmt.Errorf("renewing for %s: %w", requester, err))
			}
		}
		if err := errors.Join(errs...); err != nil {
			return err
		}
	}
	return nil
}

// renewFor renews ids of requester, in batches the API takes.
func (w *Requesters) renewFor(ctx context.Context, requester string, ids []string) error {
	for batch := range slices.Chunk(ids, api.MaxRenewBatch) {
		out, err := w.Broker.RenewFor(ctx, requester, batch)
		if err != nil {
			return err
		}
		// RequesterRenews: it renewed itself since it was found quiet.
		itself := 0
		for _, r := range out.Refused {
			if r.Reason == api.RenewRequesterRenews {
				itself++
			}
		}
		w.Log.V(1).Info("renewed the leases of a quiet requester heard here", "requester", requester,
			"renewed", len(out.Renewed), "renewedByRequester", itself, "refused", len(out.Refused)-itself)
	}
	return nil
}

// runningReservations are the "<requester>/<id>" of the reservations with a
// tenant pod (not a placeholder) that has not ended.
func (w *Requesters) runningReservations(ctx context.Context) (map[string]bool, error) {
	var pods corev1.PodList
	if err := w.Client.List(ctx, &pods, client.HasLabels{rbv1.ReservationLabel}); err != nil {
		return nil, err
	}
	out := map[string]bool{}
	for i := range pods.Items {
		p := &pods.Items[i]
		if p.Labels[rbv1.RoleLabel] == rbv1.RolePlaceholder || p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
			continue
		}
		requester := p.Namespace[len(rbv1.TenantNamespacePrefix):]
		if len(p.Namespace) <= len(rbv1.TenantNamespacePrefix) || TenantNamespace(requester) != p.Namespace {
			continue
		}
		out[requester+"/"+p.Labels[rbv1.ReservationLabel]] = true
	}
	return out, nil
}
