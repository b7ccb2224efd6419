package reservation

import (
	"context"
	"fmt"
	"slices"
	"strings"

	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/fluidos-project/resource-broker/agent/metrics"
	rbv1 "github.com/fluidos-project/resource-broker/api/v1alpha1"
	"github.com/fluidos-project/resource-broker/broker/api"
)

// Gangs. A Reservation with spec.group is one member of a gang (the pods of
// a scheduler-plugins PodGroup): its members are asked for together, in one
// all-or-nothing broker call (POST /api/v2/groups), once spec.group.minMember
// of them exist in the namespace. Every member's reconcile makes the same
// call with the same members (the broker replays a decided group), and
// mirrors its own part of the answer; the broker's events for the members
// bring the others. A member the broker placed beyond minMember's count but
// could not fit is asked for alone.

// GroupIndex indexes Reservations by their gang, <namespace>/<spec.group.name>.
const GroupIndex = "spec.group.name"

// ReasonWaitingForGroup: a member waits for the other members of its gang
// to exist before the gang is asked for.
const ReasonWaitingForGroup = "WaitingForGroup"

// GroupBroker is what the reconciler needs of the broker client for gangs.
type GroupBroker interface {
	ReserveGroup(ctx context.Context, g api.GroupRequest) (api.Group, error)
}

func indexGroup(o client.Object) []string {
	if g := o.(*rbv1.Reservation).Spec.Group; g != nil {
		return []string{o.GetNamespace() + "/" + g.Name}
	}
	return nil
}

// groupName is the gang's name at the broker: unique per requester.
func groupName(rsv *rbv1.Reservation) string {
	return rsv.Namespace + "/" + rsv.Spec.Group.Name
}

// reserveGroup asks for rsv's gang (req is rsv's own request) and settles
// rsv's part of the answer.
func (r *Reconciler) reserveGroup(ctx context.Context, rsv *rbv1.Reservation, req api.ReservationRequest) (ctrl.Result, error) {
	gb, ok := r.Broker.(GroupBroker)
	if !ok {
		return r.fail(ctx, rsv, "Invalid", "this agent's broker client cannot reserve groups")
	}
	members, err := r.groupMembers(ctx, rsv)
	if err != nil {
		return ctrl.Result{}, err
	}
	name, minMember := groupName(rsv), int(rsv.Spec.Group.MinMember)
	if len(members) < minMember {
		msg := fmt.Sprintf("group %s has %d of the %d members it needs; the group is asked for once they exist", name, len(members), minMember)
		if err := r.refused(ctx, rsv, rbv1.ReservationPending, ReasonWaitingForGroup, msg, msg); err != nil {
			return ctrl.Result{}, err
		}
		return ctrl.Result{RequeueAfter: r.WaitingRetry}, nil
	}
	g := api.GroupRequest{Group: name, MinMember: minMember, Duration: req.Duration, Lease: req.Lease,
		Selector: req.Selector, Owner: name, Priority: req.Priority, Spread: req.Spread}
	for _, m := range members {
		mreq, err := r.requestFor(m)
		if err != nil {
			return r.fail(ctx, rsv, "Invalid", fmt.Sprintf("member %s of group %s: %v", m.Name, name, err))
		}
		g.Members = append(g.Members, api.GroupMember{ID: mreq.ID, Resources: mreq.Resources})
	}
	rsv.Status.Attempts++
	answer, err := gb.ReserveGroup(ctx, g)
	metrics.BrokerCalls.WithLabelValues("reserve_group", outcome(err)).Inc()
	if err != nil {
		return r.settle(ctx, rsv, api.Reservation{}, err)
	}
	for _, d := range answer.Reservations {
		if d.ID == string(rsv.UID) {
			return r.settle(ctx, rsv, d, nil)
		}
	}
	// Not placed with the gang (beyond minMember): on its own, as any reservation.
	single, err := r.Broker.Reserve(ctx, req)
	metrics.BrokerCalls.WithLabelValues("reserve", outcome(err)).Inc()
	return r.settle(ctx, rsv, single, err)
}

// groupMembers lists the members of rsv's gang that are still wanted (not
// being deleted, not ended or refused), by name: the same list from every
// member's reconcile.
func (r *Reconciler) groupMembers(ctx context.Context, rsv *rbv1.Reservation) ([]*rbv1.Reservation, error) {
	var list rbv1.ReservationList
	if err := r.Client.List(ctx, &list, client.InNamespace(rsv.Namespace),
		client.MatchingFields{GroupIndex: groupName(rsv)}); err != nil {
		return nil, err
	}
	var out []*rbv1.Reservation
	for i := range list.Items {
		m := &list.Items[i]
		switch {
		case !m.DeletionTimestamp.IsZero():
		case m.Status.Phase == rbv1.ReservationReleased, m.Status.Phase == rbv1.ReservationExpired,
			m.Status.Phase == rbv1.ReservationFailed && m.Status.Reason != api.ReasonNoCapacity:
		default:
			out = append(out, m)
		}
	}
	slices.SortFunc(out, func(a, b *rbv1.Reservation) int { return strings.Compare(a.Name, b.Name) })
	return out, nil
}
