package main

import (
	"fmt"
	"io"
	"sort"
	"strconv"
	"time"

	"github.com/spf13/cobra"

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
			return printReservations(cmd.OutOrStdout(), list, time.Now())
		},
	}
	cmd.Flags().StringVar(&role, "role", "", "only the reservations where this cluster is the requester or the provider")
	return cmd
}

func printReservations(out io.Writer, list []api.Reservation, now time.Time) error {
	w := newTabWriter(out)
	row(w, "ID", "PHASE", "REQUESTER", "PROVIDER", "CPU", "MEMORY", "SCORE", "EXPIRES")
	for _, r := range list {
		row(w, r.ID, r.Phase, r.Requester, r.Provider, cores(r.Resources.CPU), bytesHuman(r.Resources.Memory),
			strconv.FormatFloat(r.Score, 'f', 2, 64), until(now, r.ExpiresAt))
	}
	return w.Flush()
}
