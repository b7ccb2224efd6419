package main

import (
	"errors"
	"time"

	"github.com/spf13/cobra"

	"github.com/fluidos-project/resource-broker/internal/rbctl/get"
	"github.com/fluidos-project/resource-broker/internal/rbctl/member"
	"github.com/fluidos-project/resource-broker/internal/rbctl/output"
)

func newGetCommand(g *member.Options) *cobra.Command {
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

func newGetClustersCommand(g *member.Options) *cobra.Command {
	p := &output.Flags{}
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
			if err := p.Validate(); err != nil {
				return err
			}
			l, err := get.Clusters(cmd.Context(), g, args, time.Now())
			if err != nil {
				return err
			}
			return p.Print(cmd.OutOrStdout(), cmd.ErrOrStderr(), l)
		},
	}
	p.AddFlags(cmd.Flags())
	return cmd
}

func newGetReservationsCommand(g *member.Options) *cobra.Command {
	p := &output.Flags{}
	o := get.ReservationsOptions{Member: g}
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
			if err := p.Validate(); err != nil {
				return err
			}
			o.Names = args
			l, err := get.Reservations(cmd.Context(), o)
			if err != nil {
				return err
			}
			return p.Print(cmd.OutOrStdout(), cmd.ErrOrStderr(), l)
		},
	}
	cmd.Flags().StringVar(&o.Role, "role", "", "requester or provider: the reservations this member asked for, or those it provides")
	cmd.Flags().BoolVarP(&o.AllNamespaces, "all-namespaces", "A", false, "the Reservation objects of every namespace")
	p.AddFlags(cmd.Flags())
	return cmd
}
