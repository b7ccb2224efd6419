package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sort"
	"time"

	"github.com/spf13/cobra"
	eventsv1 "k8s.io/api/events/v1"
	ctrlclient "sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/fluidos-project/resource-broker/api/v1alpha1"
	"github.com/fluidos-project/resource-broker/broker/api"
	"github.com/fluidos-project/resource-broker/broker/client"
)

func newDescribeCommand(g *globalOptions) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "describe",
		Short: "Show the details of a reservation, as kubectl describe",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return errors.New("say what to describe: rbctl describe reservation NAME")
		},
	}
	cmd.AddCommand(newDescribeReservationCommand(g))
	return cmd
}

func newDescribeReservationCommand(g *globalOptions) *cobra.Command {
	var role string
	cmd := &cobra.Command{
		Use:     "reservation NAME",
		Aliases: []string{"reservations", "resv"},
		Short:   "Show a reservation: the broker's decision, why this cluster, its events",
		Long: `reservation shows a reservation's request and the broker's decision: the
provider it chose, its score and the best candidates it compared, with their
resource score, cost score and the price of the request on each; then, with
a kubeconfig, the Reservation object's conditions and its events.

NAME is the Reservation object's name in -n's namespace; with --cert-dir
(and no --context), or --role provider, it is the broker's id. Only the
requester and the provider of a reservation may read it.`,
		Example: `  rbctl describe reservation big-x7k2p --context rome -n demo
  rbctl describe reservation 6d0c1f7e-... --context paris --role provider`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			switch role {
			case "", client.RoleRequester, client.RoleProvider:
			default:
				return fmt.Errorf("--role %q: must be requester or provider", role)
			}
			ctx := cmd.Context()
			c, err := g.client(ctx)
			if err != nil {
				return err
			}
			var (
				r      api.Reservation
				obj    *v1alpha1.Reservation
				events []eventsv1.Event
			)
			switch {
			case role == client.RoleProvider:
				r, err = findProvided(ctx, c, args[0])
			case g.useKube():
				kc, kerr := g.kubeClient()
				if kerr != nil {
					return kerr
				}
				if obj, err = g.reservationByName(ctx, kc, args[0]); obj == nil {
					return err
				}
				if events, err = eventsOf(ctx, kc, obj); err != nil {
					return err
				}
				if obj.Status.ReservationID != "" {
					r, err = c.Reservation(ctx, obj.Status.ReservationID)
				}
			default:
				r, err = c.Reservation(ctx, args[0])
			}
			if client.IsNotFound(err) && obj == nil {
				return fmt.Errorf("reservation %q not found at the broker", args[0])
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
			return printDescription(cmd.OutOrStdout(), obj, r, currency, events, time.Now())
		},
	}
	cmd.Flags().StringVar(&role, "role", "", "provider: NAME is the broker's id of a reservation this member provides")
	return cmd
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

// printDescription writes the object (if any), the broker's decision (if the
// broker has the reservation) and the object's conditions and events.
func printDescription(out io.Writer, obj *v1alpha1.Reservation, r api.Reservation, currency map[string]string, events []eventsv1.Event, now time.Time) error {
	if obj != nil {
		w := newTabWriter(out)
		field := func(name, value string) { row(w, name+":", value) }
		field("Name", obj.Name)
		field("Namespace", obj.Namespace)
		field("Pod", orDash(obj.Spec.PodName))
		field("Phase", orDash(string(obj.Status.Phase)))
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
		if err := printExplanation(out, r, currency, now); err != nil {
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
			row(w, "  "+c.Type, string(c.Status), c.Reason, ago(now, c.LastTransitionTime.Time), c.Message)
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
		age := ago(now, eventTime(e))
		if n := count32(e); n > 1 {
			age = fmt.Sprintf("%s (x%d)", age, n)
		}
		row(w, "  "+e.Type, e.Reason, age, orDash(from), e.Note)
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
