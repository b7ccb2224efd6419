// Package describe is rbctl describe reservation: a reservation's request
// and the broker's decision (the provider it chose, its score, the best
// candidates it compared and why the winner won), with the Reservation
// object's conditions and events when rbctl reads it from a kubeconfig.
package describe

import (
	"context"
	"fmt"
	"io"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	eventsv1 "k8s.io/api/events/v1"
	ctrlclient "sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/fluidos-project/resource-broker/api/v1alpha1"
	"github.com/fluidos-project/resource-broker/broker/api"
	"github.com/fluidos-project/resource-broker/broker/client"
	"github.com/fluidos-project/resource-broker/internal/rbctl/member"
	"github.com/fluidos-project/resource-broker/internal/rbctl/output"
)

// Options say which reservation to describe.
type Options struct {
	Member *member.Options
	// Role is provider when Name is the broker's id of a reservation the
	// member provides; else empty or requester.
	Role string
	// Name is the Reservation object's name with a kubeconfig, else the
	// broker's id.
	Name string
}

// Reservation writes the description of the reservation of o to out.
func Reservation(ctx context.Context, o Options, out io.Writer, now time.Time) error {
	if err := member.ValidateRole(o.Role); err != nil {
		return err
	}
	c, err := o.Member.BrokerClient(ctx)
	if err != nil {
		return err
	}
	var (
		r      api.Reservation
		obj    *v1alpha1.Reservation
		events []eventsv1.Event
	)
	switch {
	case o.Role == client.RoleProvider:
		r, err = member.ProvidedReservation(ctx, c, o.Name)
	case o.Member.UseKube():
		kc, kerr := o.Member.KubeClient()
		if kerr != nil {
			return kerr
		}
		if obj, err = o.Member.ReservationByName(ctx, kc, o.Name); obj == nil {
			return err
		}
		if events, err = eventsOf(ctx, kc, obj); err != nil {
			return err
		}
		if obj.Status.ReservationID != "" {
			r, err = c.Reservation(ctx, obj.Status.ReservationID)
		}
	default:
		r, err = c.Reservation(ctx, o.Name)
	}
	if client.IsNotFound(err) && obj == nil {
		return fmt.Errorf("reservation %q not found at the broker", o.Name)
	}
	if err != nil && !client.IsNotFound(err) {
		return err
	}
	// Currencies come with the clusters; without them prices are bare numbers.
	currency := map[string]string{}
	if clusters, err := c.Clusters(ctx); err == nil {
		for _, cl := range clusters {
			if cl.Prices != nil {
				currency[cl.ClusterID] = cl.Prices.Currency
			}
		}
	}
	return Print(out, obj, r, currency, events, now)
}

// eventsOf lists the events about obj, oldest first. events.k8s.io reads
// those recorded with either events API.
func eventsOf(ctx context.Context, kc ctrlclient.Client, obj *v1alpha1.Reservation) ([]eventsv1.Event, error) {
	var list eventsv1.EventList
	if err := kc.List(ctx, &list, ctrlclient.InNamespace(obj.Namespace)); err != nil {
		return nil, fmt.Errorf("listing the events of %s/%s: %w", obj.Namespace, obj.Name, err)
	}
	var out []eventsv1.Event
	for _, e := range list.Items {
		if e.Regarding.UID == obj.UID {
			out = append(out, e)
		}
	}
	sort.SliceStable(out, func(i, j int) bool { return eventTime(out[i]).Before(eventTime(out[j])) })
	return out, nil
}

// eventTime is when an event last happened, whichever API recorded it.
func eventTime(e eventsv1.Event) time.Time {
	switch {
	case e.Series != nil:
		return e.Series.LastObservedTime.Time
	case !e.DeprecatedLastTimestamp.IsZero():
		return e.DeprecatedLastTimestamp.Time
	case !e.EventTime.IsZero():
		return e.EventTime.Time
	}
	return e.CreationTimestamp.Time
}

// Print writes the object (if any), the broker's decision (if the broker
// has the reservation: r.ID set) and the object's conditions and events;
// prices are in currency of their cluster, ages taken at now.
func Print(out io.Writer, obj *v1alpha1.Reservation, r api.Reservation, currency map[string]string, events []eventsv1.Event, now time.Time) error {
	if obj != nil {
		w := newTabWriter(out)
		field := func(name, value string) { row(w, name+":", value) }
		field("Name", obj.Name)
		field("Namespace", obj.Namespace)
		field("Pod", output.OrDash(obj.Spec.PodName))
		field("Phase", output.OrDash(string(obj.Status.Phase)))
		if obj.Status.VirtualNode != "" {
			field("Virtual Node", obj.Status.VirtualNode)
		}
		if obj.Status.Message != "" {
			field("Message", obj.Status.Message)
		}
		if err := w.Flush(); err != nil {
			return err
		}
		fmt.Fprintln(out)
	}
	if r.ID != "" && !r.CreatedAt.IsZero() {
		if err := printDecision(out, r, currency, now); err != nil {
			return err
		}
	} else if obj != nil {
		fmt.Fprintf(out, "Decision: the broker has no record of it (id %q)\n", obj.Status.ReservationID)
	}
	if obj == nil {
		return nil
	}

	fmt.Fprintln(out, "\nConditions:")
	if len(obj.Status.Conditions) == 0 {
		fmt.Fprintln(out, "  <none>")
	} else {
		w := newTabWriter(out)
		row(w, "  TYPE", "STATUS", "REASON", "AGE", "MESSAGE")
		for _, c := range obj.Status.Conditions {
			row(w, "  "+c.Type, string(c.Status), c.Reason, output.Ago(now, c.LastTransitionTime.Time), c.Message)
		}
		if err := w.Flush(); err != nil {
			return err
		}
	}

	fmt.Fprintln(out, "\nEvents:")
	if len(events) == 0 {
		_, err := fmt.Fprintln(out, "  <none>")
		return err
	}
	w := newTabWriter(out)
	row(w, "  TYPE", "REASON", "AGE", "FROM", "MESSAGE")
	for _, e := range events {
		from := e.ReportingController
		if from == "" {
			from = e.DeprecatedSource.Component
		}
		age := output.Ago(now, eventTime(e))
		if n := count32(e); n > 1 {
			age = fmt.Sprintf("%s (x%d)", age, n)
		}
		row(w, "  "+e.Type, e.Reason, age, output.OrDash(from), e.Note)
	}
	return w.Flush()
}

// count32 is how many times an event happened, whichever API recorded it.
func count32(e eventsv1.Event) int32 {
	if e.Series != nil {
		return e.Series.Count
	}
	return e.DeprecatedCount
}

func newTabWriter(w io.Writer) *tabwriter.Writer {
	return tabwriter.NewWriter(w, 0, 8, 3, ' ', 0)
}

// row writes one tab-separated row.
func row(w io.Writer, cells ...string) {
	fmt.Fprintln(w, strings.Join(cells, "\t"))
}
