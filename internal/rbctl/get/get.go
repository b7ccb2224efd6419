// Package get is what rbctl get lists: the clusters the broker knows, and
// the reservations of the member rbctl acts as (its Reservation objects with
// what the broker says of them, or the broker's own records), each as a
// table of output.Listing built by a pure function of the api types.
package get

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/duration"
	"k8s.io/utils/ptr"
	ctrlclient "sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/fluidos-project/resource-broker/api/v1alpha1"
	"github.com/fluidos-project/resource-broker/broker/api"
	"github.com/fluidos-project/resource-broker/broker/client"
	"github.com/fluidos-project/resource-broker/internal/rbctl/member"
	"github.com/fluidos-project/resource-broker/internal/rbctl/output"
)

// Clusters lists the clusters the broker knows, by cluster id, or the one of
// names (at most one) as a single item.
func Clusters(ctx context.Context, m *member.Options, names []string, now time.Time) (output.Listing, error) {
	c, err := m.BrokerClient(ctx)
	if err != nil {
		return output.Listing{}, err
	}
	var clusters []api.Cluster
	if len(names) == 1 {
		cl, err := c.Cluster(ctx, names[0])
		if client.IsNotFound(err) {
			return output.Listing{}, fmt.Errorf("cluster %q not found at the broker", names[0])
		}
		if err != nil {
			return output.Listing{}, err
		}
		clusters = []api.Cluster{cl}
	} else if clusters, err = c.Clusters(ctx); err != nil {
		return output.Listing{}, err
	}
	sort.Slice(clusters, func(i, j int) bool { return clusters[i].ClusterID < clusters[j].ClusterID })
	l := ClusterListing(clusters, now)
	l.Single = len(names) == 1
	return l, nil
}

// ClusterListing is the table of clusters, ages taken at now.
func ClusterListing(clusters []api.Cluster, now time.Time) output.Listing {
	l := output.Listing{Kind: "cluster", Table: &metav1.Table{ColumnDefinitions: output.Columns(
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
			gpu = output.Count(free.GPU) + "/" + output.Count(res.Allocatable.GPU)
		}
		price, priceMem := "-", "-"
		if p := c.Prices; p != nil {
			if p.CPU != nil {
				price = strings.TrimSpace(output.Decimal(p.CPU) + " " + p.Currency)
			}
			if p.Memory != nil {
				priceMem = strings.TrimSpace(output.Decimal(p.Memory) + " " + p.Currency)
			}
		}
		labels := "<none>"
		if len(c.Labels) > 0 {
			labels = output.Labels(c.Labels)
		}
		l.Table.Rows = append(l.Table.Rows, output.Row(c.ClusterID, live,
			output.Cores(free.CPU)+"/"+output.Cores(res.Allocatable.CPU),
			output.Bytes(free.Memory)+"/"+output.Bytes(res.Allocatable.Memory),
			gpu, price, output.Ago(now, c.SeenAt), priceMem, output.Cores(reserved.CPU), labels))
		l.Names = append(l.Names, c.ClusterID)
		l.Items = append(l.Items, c)
	}
	return l
}

// ReservationsOptions say which reservations to list.
type ReservationsOptions struct {
	Member *member.Options
	// Role is requester, provider, or empty: both with --cert-dir, the
	// requester's Reservation objects with a kubeconfig.
	Role          string
	AllNamespaces bool
	// Names is what was asked for by name: none (all), or one Reservation
	// object's name (the broker's id without a kubeconfig or as provider).
	Names []string
}

// Reservations lists the reservations of the member, as the broker has
// them, with the requester's Reservation objects when rbctl reads them.
func Reservations(ctx context.Context, o ReservationsOptions) (output.Listing, error) {
	if err := member.ValidateRole(o.Role); err != nil {
		return output.Listing{}, err
	}
	rows, err := o.rows(ctx)
	if err != nil {
		return output.Listing{}, err
	}
	l := ReservationListing(rows, o.AllNamespaces)
	l.Single = len(o.Names) == 1
	return l, nil
}

// ReservationRow is a reservation as the broker has it, with the
// requester's Reservation object when rbctl read it.
type ReservationRow struct {
	api.Reservation
	Object *v1alpha1.Reservation
}

func (o *ReservationsOptions) rows(ctx context.Context) ([]ReservationRow, error) {
	c, err := o.Member.BrokerClient(ctx)
	if err != nil {
		return nil, err
	}
	if !o.Member.UseKube() || o.Role == client.RoleProvider {
		return o.brokerRows(ctx, c)
	}
	kc, err := o.Member.KubeClient()
	if err != nil {
		return nil, err
	}
	objects, err := o.objects(ctx, kc)
	if err != nil {
		return nil, err
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
	rows := make([]ReservationRow, 0, len(objects))
	for i := range objects {
		obj := &objects[i]
		r, ok := byID[obj.Status.ReservationID]
		if !ok && obj.Status.ReservationID != "" && len(o.Names) == 1 {
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
		rows = append(rows, ReservationRow{Reservation: r, Object: obj})
	}
	return rows, nil
}

// brokerRows are the broker's live reservations of the member, named by
// the broker's id.
func (o *ReservationsOptions) brokerRows(ctx context.Context, c *client.Client) ([]ReservationRow, error) {
	if o.AllNamespaces {
		return nil, errors.New("-A lists Reservation objects: it needs a kubeconfig and the requester's view (not --role provider)")
	}
	if len(o.Names) == 1 { // the broker's id
		var (
			r   api.Reservation
			err error
		)
		if o.Role == client.RoleProvider {
			r, err = member.ProvidedReservation(ctx, c, o.Names[0])
		} else {
			r, err = c.Reservation(ctx, o.Names[0])
		}
		if client.IsNotFound(err) {
			return nil, fmt.Errorf("reservation %q not found at the broker", o.Names[0])
		}
		return []ReservationRow{{Reservation: r}}, err
	}
	list, err := c.Reservations(ctx, o.Role)
	if err != nil {
		return nil, err
	}
	sort.Slice(list, func(i, j int) bool {
		if !list[i].CreatedAt.Equal(list[j].CreatedAt) {
			return list[i].CreatedAt.Before(list[j].CreatedAt)
		}
		return list[i].ID < list[j].ID
	})
	rows := make([]ReservationRow, len(list))
	for i, r := range list {
		rows[i] = ReservationRow{Reservation: r}
	}
	return rows, nil
}

// objects are the Reservation objects asked for: the one named, or those of
// -n's namespace (every namespace with -A), by namespace and name.
func (o *ReservationsOptions) objects(ctx context.Context, kc ctrlclient.Client) ([]v1alpha1.Reservation, error) {
	if len(o.Names) == 1 {
		obj, err := o.Member.ReservationByName(ctx, kc, o.Names[0])
		if obj == nil {
			return nil, err
		}
		return []v1alpha1.Reservation{*obj}, nil
	}
	var list v1alpha1.ReservationList
	var opts []ctrlclient.ListOption
	if !o.AllNamespaces {
		ns, err := o.Member.Namespace()
		if err != nil {
			return nil, err
		}
		opts = append(opts, ctrlclient.InNamespace(ns))
	}
	if err := kc.List(ctx, &list, opts...); err != nil {
		return nil, fmt.Errorf("listing Reservation objects: %w", err)
	}
	objects := list.Items
	sort.Slice(objects, func(i, j int) bool {
		a, b := objects[i], objects[j]
		if a.Namespace != b.Namespace {
			return a.Namespace < b.Namespace
		}
		return a.Name < b.Name
	})
	return objects, nil
}

// ReservationListing is the table of reservations, with a NAMESPACE column
// first when withNamespace.
func ReservationListing(rows []ReservationRow, withNamespace bool) output.Listing {
	names := []string{"NAME", "PHASE", "REQUESTER", "PROVIDER", "CPU", "MEMORY", "SCORE", "REMAINING",
		"ID+", "LEASE+", "PRICE/H+", "VIRTUAL-NODE+", "GROUP+", "PREEMPTED-BY+"}
	if withNamespace {
		names = append([]string{"NAMESPACE"}, names...)
	}
	l := output.Listing{Kind: "reservation", Table: &metav1.Table{ColumnDefinitions: output.Columns(names...)}}
	for _, r := range rows {
		name, node := r.ID, "-"
		if r.Object != nil {
			name = r.Object.Name
			if r.Object.Status.VirtualNode != "" {
				node = r.Object.Status.VirtualNode
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
			score, price = output.Score(r.Score), output.Money(r.Price, "")
		}
		cells := []string{name, output.OrDash(r.Phase), output.OrDash(r.Requester), output.OrDash(r.Provider), output.Cores(r.Resources.CPU),
			output.Bytes(r.Resources.Memory), score, remaining, output.OrDash(r.ID), lease, price, node,
			output.OrDash(firstOf(r.Group, r.SpreadGroup)), output.OrDash(r.PreemptedBy)}
		if withNamespace {
			ns := "-"
			if r.Object != nil {
				ns = r.Object.Namespace
			}
			cells = append([]string{ns}, cells...)
		}
		l.Table.Rows = append(l.Table.Rows, output.Row(cells...))
		l.Names = append(l.Names, name)
		l.Items = append(l.Items, r.Reservation)
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
