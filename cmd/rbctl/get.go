package main

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/duration"
	"k8s.io/utils/ptr"
	ctrlclient "sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/fluidos-project/resource-broker/api/v1alpha1"
	"github.com/fluidos-project/resource-broker/broker/api"
	"github.com/fluidos-project/resource-broker/broker/client"
)

func newGetCommand(g *globalOptions) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "get",
		Short: "Display clusters or reservations, as kubectl get",
		Long: `get lists the clusters the broker knows or the reservations of a member,
or shows one by name.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return errors.New("say what to get: rbctl get clusters or rbctl get reservations")
		},
	}
	cmd.AddCommand(newGetClustersCommand(g), newGetReservationsCommand(g))
	return cmd
}

func newGetClustersCommand(g *globalOptions) *cobra.Command {
	p := &printFlags{}
	cmd := &cobra.Command{
		Use:     "clusters [NAME]",
		Aliases: []string{"cluster", "cl"},
		Short:   "List the clusters advertised to the broker, or show one",
		Long: `clusters lists every cluster the broker knows, live or stale, with its free
and allocatable CPU, memory and GPUs, its price per core-hour and how long ago
it last advertised; NAME is a cluster id. Any member may list them.`,
		Example: `  rbctl get clusters --context rome
  rbctl get clusters paris -o yaml
  rbctl get clusters -o jsonpath='{.items[?(@.live)].clusterID}'`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := p.validate(); err != nil {
				return err
			}
			c, err := g.client(cmd.Context())
			if err != nil {
				return err
			}
			var clusters []api.Cluster
			if len(args) == 1 {
				cl, err := c.Cluster(cmd.Context(), args[0])
				if client.IsNotFound(err) {
					return fmt.Errorf("cluster %q not found at the broker", args[0])
				}
				if err != nil {
					return err
				}
				clusters = []api.Cluster{cl}
			} else if clusters, err = c.Clusters(cmd.Context()); err != nil {
				return err
			}
			sort.Slice(clusters, func(i, j int) bool { return clusters[i].ClusterID < clusters[j].ClusterID })
			l := clusterListing(clusters, time.Now())
			l.single = len(args) == 1
			return p.print(cmd.OutOrStdout(), cmd.ErrOrStderr(), l)
		},
	}
	p.addFlags(cmd)
	return cmd
}

func clusterListing(clusters []api.Cluster, now time.Time) listing {
	l := listing{kind: "cluster", table: &metav1.Table{ColumnDefinitions: columns(
		"NAME", "LIVE", "CPU(FREE/ALLOC)", "MEMORY(FREE/ALLOC)", "GPU", "PRICE/CORE-H", "LAST-SEEN",
		"PRICE/GIB-H+", "RESERVED-CPU+", "LABELS+")}}
	for _, c := range clusters {
		res := c.Resources
		free, reserved := api.Quantities{}, api.Quantities{}
		if res.Available != nil {
			free = *res.Available
		}
		if res.Reserved != nil {
			reserved = *res.Reserved
		}
		live := "no"
		if c.Live {
			live = "yes"
		}
		gpu := "-"
		if res.Allocatable.GPU != nil && !res.Allocatable.GPU.IsZero() {
			gpu = count(free.GPU) + "/" + count(res.Allocatable.GPU)
		}
		price, priceMem := "-", "-"
		if p := c.Prices; p != nil {
			if p.CPU != nil {
				price = strings.TrimSpace(decimal(p.CPU) + " " + p.Currency)
			}
			if p.Memory != nil {
				priceMem = strings.TrimSpace(decimal(p.Memory) + " " + p.Currency)
			}
		}
		labels := "<none>"
		if len(c.Labels) > 0 {
			labels = labelsString(c.Labels)
		}
		l.table.Rows = append(l.table.Rows, tableRow(c.ClusterID, live,
			cores(free.CPU)+"/"+cores(res.Allocatable.CPU),
			bytesHuman(free.Memory)+"/"+bytesHuman(res.Allocatable.Memory),
			gpu, price, ago(now, c.SeenAt), priceMem, cores(reserved.CPU), labels))
		l.names = append(l.names, c.ClusterID)
		l.items = append(l.items, c)
	}
	return l
}

type getReservationsOptions struct {
	role          string
	allNamespaces bool
}

func newGetReservationsCommand(g *globalOptions) *cobra.Command {
	p := &printFlags{}
	o := &getReservationsOptions{}
	cmd := &cobra.Command{
		Use:     "reservations [NAME]",
		Aliases: []string{"reservation", "resv"},
		Short:   "List a member's reservations, or show one",
		Long: `reservations lists the reservations of the member rbctl acts as.

With a kubeconfig, the member is the requester and its reservations are its
Reservation objects (of -n's namespace, or all with -A), shown with what the
broker says of them; NAME is a Reservation's name. --role provider lists
instead the live reservations the member provides, named by the broker's id
(the requester's object is in the requester's cluster).

With --cert-dir (and no --context), the broker's live reservations of the
member are listed, both roles unless --role says one, named by the broker's
id.`,
		Example: `  rbctl get reservations --context rome -n demo
  rbctl get reservations -A -o wide
  rbctl get reservations --context paris --role provider
  rbctl get reservation big-x7k2p -n demo -o jsonpath='{.provider}'`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := p.validate(); err != nil {
				return err
			}
			switch o.role {
			case "", client.RoleRequester, client.RoleProvider:
			default:
				return fmt.Errorf("--role %q: must be requester or provider", o.role)
			}
			rows, err := o.rows(cmd.Context(), g, args)
			if err != nil {
				return err
			}
			l := reservationListing(rows, o.allNamespaces)
			l.single = len(args) == 1
			return p.print(cmd.OutOrStdout(), cmd.ErrOrStderr(), l)
		},
	}
	cmd.Flags().StringVar(&o.role, "role", "", "requester or provider: the reservations this member asked for, or those it provides")
	cmd.Flags().BoolVarP(&o.allNamespaces, "all-namespaces", "A", false, "the Reservation objects of every namespace")
	p.addFlags(cmd)
	return cmd
}

// reservationRow is a reservation as the broker has it, with the requester's
// Reservation object when rbctl read it.
type reservationRow struct {
	api.Reservation
	object *v1alpha1.Reservation
}

func (o *getReservationsOptions) rows(ctx context.Context, g *globalOptions, args []string) ([]reservationRow, error) {
	c, err := g.client(ctx)
	if err != nil {
		return nil, err
	}
	if !g.useKube() || o.role == client.RoleProvider {
		if o.allNamespaces {
			return nil, errors.New("-A lists Reservation objects: it needs a kubeconfig and the requester's view (not --role provider)")
		}
		if len(args) == 1 { // the broker's id
			var r api.Reservation
			if o.role == client.RoleProvider {
				r, err = findProvided(ctx, c, args[0])
			} else {
				r, err = c.Reservation(ctx, args[0])
			}
			if client.IsNotFound(err) {
				return nil, fmt.Errorf("reservation %q not found at the broker", args[0])
			}
			return []reservationRow{{Reservation: r}}, err
		}
		list, err := c.Reservations(ctx, o.role)
		if err != nil {
			return nil, err
		}
		sort.Slice(list, func(i, j int) bool {
			if !list[i].CreatedAt.Equal(list[j].CreatedAt) {
				return list[i].CreatedAt.Before(list[j].CreatedAt)
			}
			return list[i].ID < list[j].ID
		})
		rows := make([]reservationRow, len(list))
		for i, r := range list {
			rows[i] = reservationRow{Reservation: r}
		}
		return rows, nil
	}

	kc, err := g.kubeClient()
	if err != nil {
		return nil, err
	}
	var objects []v1alpha1.Reservation
	if len(args) == 1 {
		obj, err := g.reservationByName(ctx, kc, args[0])
		if obj == nil {
			return nil, err
		}
		objects = []v1alpha1.Reservation{*obj}
	} else {
		var list v1alpha1.ReservationList
		var opts []ctrlclient.ListOption
		if !o.allNamespaces {
			ns, err := g.namespace()
			if err != nil {
				return nil, err
			}
			opts = append(opts, ctrlclient.InNamespace(ns))
		}
		if err := kc.List(ctx, &list, opts...); err != nil {
			return nil, fmt.Errorf("listing Reservation objects: %w", err)
		}
		objects = list.Items
		sort.Slice(objects, func(i, j int) bool {
			a, b := objects[i], objects[j]
			if a.Namespace != b.Namespace {
				return a.Namespace < b.Namespace
			}
			return a.Name < b.Name
		})
	}
	// One call for the live ones; an object whose reservation has ended is
	// shown with its own status.
	live, err := c.Reservations(ctx, client.RoleRequester)
	if err != nil {
		return nil, err
	}
	byID := make(map[string]api.Reservation, len(live))
	for _, r := range live {
		byID[r.ID] = r
	}
	rows := make([]reservationRow, 0, len(objects))
	for i := range objects {
		obj := &objects[i]
		r, ok := byID[obj.Status.ReservationID]
		if !ok && obj.Status.ReservationID != "" && len(args) == 1 {
			if r, err = c.Reservation(ctx, obj.Status.ReservationID); err == nil {
				ok = true
			} else if !client.IsNotFound(err) {
				return nil, err
			}
		}
		if !ok {
			r = api.Reservation{ID: obj.Status.ReservationID, Phase: string(obj.Status.Phase), Provider: obj.Status.Provider,
				Requester: c.Identity(), Resources: api.Quantities{CPU: ptr.To(obj.Spec.Resources[corev1.ResourceCPU]),
					Memory: ptr.To(obj.Spec.Resources[corev1.ResourceMemory])}}
		}
		rows = append(rows, reservationRow{Reservation: r, object: obj})
	}
	return rows, nil
}

// findProvided finds a live reservation the member provides by the broker's
// id: reading it needs its requester, which the list has.
func findProvided(ctx context.Context, c *client.Client, id string) (api.Reservation, error) {
	list, err := c.Reservations(ctx, client.RoleProvider)
	if err != nil {
		return api.Reservation{}, err
	}
	for _, r := range list {
		if r.ID == id {
			return c.ProvidedReservation(ctx, r.Requester, id)
		}
	}
	return api.Reservation{}, &client.APIError{StatusCode: 404, Reason: api.ReasonNotFound, Message: "no live reservation " + id + " provided by " + c.Identity()}
}

func reservationListing(rows []reservationRow, withNamespace bool) listing {
	names := []string{"NAME", "PHASE", "REQUESTER", "PROVIDER", "CPU", "MEMORY", "SCORE", "REMAINING",
		"ID+", "LEASE+", "PRICE/H+", "VIRTUAL-NODE+", "GROUP+", "PREEMPTED-BY+"}
	if withNamespace {
		names = append([]string{"NAMESPACE"}, names...)
	}
	l := listing{kind: "reservation", table: &metav1.Table{ColumnDefinitions: columns(names...)}}
	for _, r := range rows {
		name, node := r.ID, "-"
		if r.object != nil {
			name = r.object.Name
			if r.object.Status.VirtualNode != "" {
				node = r.object.Status.VirtualNode
			}
		}
		lease := "-"
		if d, err := time.ParseDuration(r.Lease); err == nil && r.Lease != "" {
			lease = duration.HumanDuration(d)
		}
		remaining, score, price := "-", "-", "-"
		if r.Phase == "Reserved" || r.Phase == "Active" {
			remaining = duration.HumanDuration(time.Duration(r.RemainingMs) * time.Millisecond)
		}
		if !r.CreatedAt.IsZero() { // the broker's record, not only the object's status
			score, price = fmt.Sprintf("%.2f", r.Score), money(r.Price, "")
		}
		cells := []string{name, orDash(r.Phase), orDash(r.Requester), orDash(r.Provider), cores(r.Resources.CPU),
			bytesHuman(r.Resources.Memory), score, remaining, orDash(r.ID), lease, price, node,
			orDash(firstOf(r.Group, r.SpreadGroup)), orDash(r.PreemptedBy)}
		if withNamespace {
			ns := "-"
			if r.object != nil {
				ns = r.object.Namespace
			}
			cells = append([]string{ns}, cells...)
		}
		l.table.Rows = append(l.table.Rows, tableRow(cells...))
		l.names = append(l.names, name)
		l.items = append(l.items, r.Reservation)
	}
	return l
}

// firstOf returns the first of values that is not empty.
func firstOf(values ...string) string {
	for _, v := range values {
		if v != "" {
			return v
		}
	}
	return ""
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
