// Package usage is the table of rbctl usage: what each member holds as a
// requester (live reservations, CPU, memory, GPUs) against the limits the
// operator set for it, its priority ceiling and its rate of reserve calls,
// and the ended reservations the broker keeps of it.
package usage

import (
	"strconv"

	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/fluidos-project/resource-broker/broker/api"
	"github.com/fluidos-project/resource-broker/internal/rbctl/output"
)

// Listing is the table of the members' usage; "-" is no limit.
func Listing(list []api.MemberUsage) output.Listing {
	out := output.Listing{Kind: "member", Table: &metav1.Table{ColumnDefinitions: output.Columns(
		"MEMBER", "RESERVATIONS", "CPU", "MEMORY", "GPU", "MAX-PRIORITY", "RESERVES/S", "ENDED")}}
	for _, u := range list {
		l := u.Limits
		maxRes := api.Quantities{}
		if l.MaxResources != nil {
			maxRes = *l.MaxResources
		}
		reservations := strconv.FormatInt(u.Reservations, 10) + "/" + orNone(l.MaxReservations != nil, func() string { return strconv.FormatInt(*l.MaxReservations, 10) })
		against := func(used, max *resource.Quantity, render func(*resource.Quantity) string) string {
			return render(used) + "/" + orNone(max != nil, func() string { return render(max) })
		}
		priority := orNone(l.MaxPriority != nil, func() string { return strconv.FormatInt(int64(*l.MaxPriority), 10) })
		rate := orNone(l.ReservesPerSecond != "", func() string { return l.ReservesPerSecond + " (burst " + strconv.Itoa(l.ReserveBurst) + ")" })
		out.Table.Rows = append(out.Table.Rows, output.Row(u.Cluster, reservations, against(u.Resources.CPU, maxRes.CPU, output.Cores),
			against(u.Resources.Memory, maxRes.Memory, output.Bytes), against(u.Resources.GPU, maxRes.GPU, output.Count), priority, rate, strconv.FormatInt(u.EndedReservations, 10)))
		out.Names = append(out.Names, u.Cluster)
		out.Items = append(out.Items, u)
	}
	return out
}

// orNone renders a limit, or "-" when there is none.
func orNone(set bool, render func() string) string {
	if !set {
		return "-"
	}
	return render()
}
