package main

import (
	"errors"
	"time"

	"github.com/spf13/cobra"

	"github.com/fluidos-project/resource-broker/internal/rbctl/describe"
	"github.com/fluidos-project/resource-broker/internal/rbctl/member"
)

func newDescribeCommand(g *member.Options) *cobra.Command {
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

func newDescribeReservationCommand(g *member.Options) *cobra.Command {
	o := describe.Options{Member: g}
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
			o.Name = args[0]
			return describe.Reservation(cmd.Context(), o, cmd.OutOrStdout(), time.Now())
		},
	}
	cmd.Flags().StringVar(&o.Role, "role", "", "provider: NAME is the broker's id of a reservation this member provides")
	return cmd
}
