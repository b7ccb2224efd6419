// Package follower keeps the agent in step with the broker without polling:
// it follows the cluster's event stream, routes requester events to the
// Reservation reconciler and turns provider events into ProviderInstructions,
// and after every (re)connection resynchronises from the broker's lists, so a
// missed event never leaves anything behind.
package follower

import (
	"context"
	"errors"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/fluidos-project/resource-broker/agent/metrics"
	"github.com/fluidos-project/resource-broker/agent/provider"
	"github.com/fluidos-project/resource-broker/agent/reservation"
	rbv1 "github.com/fluidos-project/resource-broker/api/v1alpha1"
	"github.com/fluidos-project/resource-broker/broker/api"
	brokerclient "github.com/fluidos-project/resource-broker/broker/client"
	"github.com/fluidos-project/resource-broker/internal/backoff"
)

// Broker is what the follower needs of the broker client.
type Broker interface {
	OpenEvents(ctx context.Context, since string) (*brokerclient.EventStream, error)
	Reservations(ctx context.Context, role string) ([]api.Reservation, error)
}

// Follower is a manager.Runnable; it runs on the leader only.
type Follower struct {
	Broker    Broker
	Client    client.Client
	ClusterID string
	// Namespace holds this agent's ProviderInstructions.
	Namespace string
	// Reservations is asked to look again at a Reservation the broker changed.
	Reservations *reservation.Reconciler
	// Recorder records the end of provided reservations on their instructions (optional).
	Recorder events.EventRecorder
	// MaxBackoff bounds the wait between reconnections (default 10s).
	MaxBackoff time.Duration
	// OnConnect, if set, is called after each successful resync (tests, metrics).
	OnConnect func()
	// APIReader reads the pods of preempted reservations (the manager's
	// cache holds only reservation pods); nil: Client.
	APIReader client.Reader
}

// NeedLeaderElection keeps one follower per cluster.
func (f *Follower) NeedLeaderElection() bool { return true }

// Start follows the stream until ctx ends.
func (f *Follower) Start(ctx context.Context) error {
	logger := log.FromContext(ctx).WithName("follower")
	if f.MaxBackoff == 0 {
		f.MaxBackoff = 10 * time.Second
	}
	since, first := "", backoff.Exponential(250*time.Millisecond, f.MaxBackoff)
	retry := first
	for ctx.Err() == nil {
		err := f.follow(ctx, &since, func() { retry = first })
		if ctx.Err() != nil {
			return nil
		}
		wait := retry.Step()
		// A broker that refused the stream (429: this cluster has too many
		// open) says when to come back.
		var ae *brokerclient.APIError
		if errors.As(err, &ae) && ae.RetryAfter > wait {
			wait = ae.RetryAfter
		}
		logger.Info("broker event stream interrupted, reconnecting", "error", err.Error(), "in", wait)
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(wait):
		}
	}
	return nil
}

// follow opens the stream, resyncs, then handles events until the stream
// breaks; each event handled calls healthy. The stream is open before the
// resync reads the lists, so an event that happens in between is seen
// (perhaps twice: handling is idempotent).
func (f *Follower) follow(ctx context.Context, since *string, healthy func()) error {
	stream, err := f.Broker.OpenEvents(ctx, *since)
	if err != nil {
		return err
	}
	defer stream.Close()
	if err := f.resync(ctx); err != nil {
		return err
	}
	metrics.StreamConnected.Set(1)
	defer metrics.StreamConnected.Set(0)
	if f.OnConnect != nil {
		f.OnConnect()
	}
	for {
		id, e, err := stream.Next()
		if err != nil {
			if last := stream.LastEventID(); last != "" {
				*since = last
			}
			return err
		}
		metrics.StreamEvents.WithLabelValues(e.Type).Inc()
		if err := f.handle(ctx, e); err != nil {
			return err // not advancing since: the event is handled again after reconnecting
		}
		*since = id
		healthy()
	}
}

func (f *Follower) handle(ctx context.Context, e api.Event) error {
	if e.Provider == f.ClusterID {
		if err := f.provide(ctx, e.Reservation, e.Requester, e.Phase, e.Resources, e.Node); err != nil {
			return err
		}
	}
	if e.Requester == f.ClusterID {
		rsv, err := reservation.Lookup(ctx, f.Client, e.Reservation)
		if err != nil {
			return err
		}
		switch {
		case rsv != nil && e.Type == api.EventPreempted:
			if err := f.preempted(ctx, rsv, e); err != nil {
				return err
			}
			f.Reservations.Enqueue(types.NamespacedName{Namespace: rsv.Namespace, Name: rsv.Name})
		case rsv != nil:
			f.Reservations.Enqueue(types.NamespacedName{Namespace: rsv.Namespace, Name: rsv.Name})
		case e.Type == api.EventCapacityAvailable:
			// The broker still keeps a request of ours waiting, but its
			// Reservation is gone (deleted while this agent was down):
			// withdraw it so that it holds no lower priority back.
			if _, err := f.Reservations.Broker.Release(ctx, e.Reservation); err != nil && !brokerclient.IsNotFound(err) {
				return err
			}
		}
	}
	return nil
}

// provide records a reservation this cluster provides, or marks its end
// (the tenant reconciler evicts its pods after a grace): the provider learns
// that a reservation ended from the broker only, never from a clock.
func (f *Follower) provide(ctx context.Context, id, requester, phase string, res api.Quantities, node string) error {
	pi := provider.InstructionFor(f.Namespace, id, requester, res, node)
	if phase == string(rbv1.ReservationReserved) || phase == string(rbv1.ReservationActive) {
		err := f.Client.Create(ctx, pi)
		if apierrors.IsAlreadyExists(err) {
			return nil
		}
		if err == nil {
			log.FromContext(ctx).Info("providing capacity", "reservation", id, "requester", requester, "node", node)
		}
		return err
	}
	if err := f.Client.Get(ctx, client.ObjectKeyFromObject(pi), pi); err != nil {
		return client.IgnoreNotFound(err)
	}
	reason, msg := provider.EndedReleased, "the requester released the reservation"
	if phase == string(rbv1.ReservationExpired) {
		reason, msg = provider.EndedLeaseLapsed, "the reservation expired at the broker (its lease was not renewed, or its duration is over)"
	}
	return provider.MarkEnded(ctx, f.Client, f.Recorder, pi, reason, msg)
}

// resync makes the local objects match the broker's lists: what it lists
// live is provided, and an instruction it no longer lists has ended.
func (f *Follower) resync(ctx context.Context) error {
	provided, err := f.Broker.Reservations(ctx, brokerclient.RoleProvider)
	if err != nil {
		return err
	}
	live := map[string]bool{} // instruction names
	for _, r := range provided {
		if r.Phase == string(rbv1.ReservationReserved) || r.Phase == string(rbv1.ReservationActive) {
			live[provider.InstructionName(r.Requester, r.ID)] = true
		}
		if err := f.provide(ctx, r.ID, r.Requester, r.Phase, r.Resources, r.Node); err != nil {
			return err
		}
	}
	var pis rbv1.ProviderInstructionList
	if err := f.Client.List(ctx, &pis, client.InNamespace(f.Namespace)); err != nil {
		return err
	}
	for i := range pis.Items {
		pi := &pis.Items[i]
		canonical := provider.InstructionName(pi.Spec.Requester, pi.Spec.ReservationID)
		switch {
		case live[pi.Name]:
		case pi.Name != canonical && live[canonical]:
			// Named by an older agent (by the bare id): the instruction of
			// the same reservation under its new name replaces it.
			if err := client.IgnoreNotFound(f.Client.Delete(ctx, pi)); err != nil {
				return err
			}
		default:
			if err := provider.MarkEnded(ctx, f.Client, f.Recorder, pi, provider.EndedNotListed,
				"the broker no longer lists the reservation as live"); err != nil {
				return err
			}
		}
	}
	var rsvs rbv1.ReservationList
	if err := f.Client.List(ctx, &rsvs); err != nil {
		return err
	}
	for _, r := range rsvs.Items {
		if r.Status.Phase == rbv1.ReservationReserved || r.Status.Phase == rbv1.ReservationActive {
			f.Reservations.Enqueue(types.NamespacedName{Namespace: r.Namespace, Name: r.Name})
		}
	}
	return nil
}
