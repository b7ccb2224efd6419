package main

import (
	"strconv"

	"github.com/spf13/cobra"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/fluidos-project/resource-broker/broker/api"
)

func newUsageCommand(g *globalOptions) *cobra.Command {
	p := &printFlags{}
	cmd := &cobra.Command{
		Use:   "usage",
		Short: "Show what each member holds as a requester, against its limits",
		Long: `usage lists, for each member cluster, its live reservations and the CPU,
memory and GPUs they hold, each against the limit the operator set for it
(the broker's --policy-file; "-": no limit), its priority ceiling and its
rate of reserve calls. A member at one of its limits is refused more (429
LimitExceeded) until some of its reservations end; it never holds others
back.`,
		Example: `  rbctl usage
  rbctl usage -o yaml`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := p.validate(); err != nil {
				return err
			}
			c, err := g.client(cmd.Context())
			if err != nil {
				return err
			}
			list, err := c.Usage(cmd.Context())
			if err != nil {
				return err
			}
			return p.print(cmd.OutOrStdout(), cmd.ErrOrStderr(), usageListing(list))
		},
	}
	p.addFlags(cmd)
	return cmd
}

func usageListing(list []api.MemberUsage) listing {
	out := listing{kind: "member", table: &metav1.Table{ColumnDefinitions: columns(
		"MEMBER", "RESERVATIONS", "CPU", "MEMORY", "GPU", "MAX-PRIORITY", "RESERVES/S")}}
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
		out.table.Rows = append(out.table.Rows, tableRow(u.Cluster, reservations, against(u.Resources.CPU, maxRes.CPU, cores),
			against(u.Resources.Memory, maxRes.Memory, bytesHuman), against(u.Resources.GPU, maxRes.GPU, count), priority, rate))
		out.names = append(out.names, u.Cluster)
		out.items = append(out.items, u)
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
