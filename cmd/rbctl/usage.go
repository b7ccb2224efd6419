package main

import (
	"github.com/spf13/cobra"

	"github.com/fluidos-project/resource-broker/internal/rbctl/member"
	"github.com/fluidos-project/resource-broker/internal/rbctl/output"
	"github.com/fluidos-project/resource-broker/internal/rbctl/usage"
)

func newUsageCommand(g *member.Options) *cobra.Command {
	p := &output.Flags{}
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
			if err := p.Validate(); err != nil {
				return err
			}
			c, err := g.BrokerClient(cmd.Context())
			if err != nil {
				return err
			}
			list, err := c.Usage(cmd.Context())
			if err != nil {
				return err
			}
			return p.Print(cmd.OutOrStdout(), cmd.ErrOrStderr(), usage.Listing(list))
		},
	}
	p.AddFlags(cmd.Flags())
	return cmd
}
