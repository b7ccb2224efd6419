package main

import (
	"fmt"
	"io"
	"sort"
	"strconv"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/apimachinery/pkg/util/duration"

	"github.com/fluidos-project/resource-broker/broker/api"
	"github.com/fluidos-project/resource-broker/broker/client"
)

func newReservationsCommand(g *globalOptions) *cobra.Command {
	var role string
	cmd := &cobra.Command{
		Use:     "reservations",
		Aliases: []string{"reservation", "resv"},
		Short:   "List this cluster's live reservations",
		Long: `reservations lists the live reservations of the cluster whose certificate
is in --cert-dir: those it asked for (--role requester), those it provides
(--role provider), or both (the default).`,
		Example: `  rbctl reservations
  rbctl reservations --role provider --cert-dir .certs/clusters/paris -o json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			switch role {
			case "", client.RoleRequester, client.RoleProvider:
			default:
				return fmt.Errorf("--role %q: must be requester or provider", role)
			}
			c, err := g.client()
			if err != nil {
				return err
			}
			list, err := c.Reservations(cmd.Context(), role)
			if err != nil {
				return err
			}
			sort.Slice(list, func(i, j int) bool {
				if !list[i].CreatedAt.Equal(list[j].CreatedAt) {
					return list[i].CreatedAt.Before(list[j].CreatedAt)
				}
				return list[i].ID < list[j].ID
			})
			if done, err := g.printStructured(cmd.OutOrStdout(), list); done {
				return err
			}
			return printReservations(cmd.OutOrStdout(), list)
		},
	}
	cmd.Flags().StringVar(&role, "role", "", "only the reservations where this cluster is the requester or the provider")
	return cmd
}

// printReservations shows each reservation's lease length ("-": a fixed
// duration, never renewed) and the time it still lives unless renewed, as
// the broker measured it on its own clock when it answered (remainingMs):
// never the broker's expiresAt against this machine's clock.
func printReservations(out io.Writer, list []api.Reservation) error {
	w := newTabWriter(out)
	row(w, "ID", "PHASE", "REQUESTER", "PROVIDER", "CPU", "MEMORY", "SCORE", "LEASE", "REMAINING")
	for _, r := range list {
		lease := "-"
		if d, err := time.ParseDuration(r.Lease); err == nil && r.Lease != "" {
			lease = duration.HumanDuration(d)
		}
		remaining := "-"
		if r.Phase == "Reserved" || r.Phase == "Active" {
			remaining = duration.HumanDuration(time.Duration(r.RemainingMs) * time.Millisecond)
		}
		row(w, r.ID, r.Phase, r.Requester, r.Provider, cores(r.Resources.CPU), bytesHuman(r.Resources.Memory),
			strconv.FormatFloat(r.Score, 'f', 2, 64), lease, remaining)
	}
	return w.Flush()
}
