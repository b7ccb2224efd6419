package main

import (
	"github.com/spf13/cobra"

	"github.com/fluidos-project/resource-broker/internal/rbctl/member"
)

// deprecatedCommands are the commands of rbctl before get and describe,
// kept for a release so that scripts keep working: cobra says what replaces
// each when it runs.
func deprecatedCommands(g *member.Options) []*cobra.Command {
	alias := func(cmd *cobra.Command, use, instead string) *cobra.Command {
		cmd.Use, cmd.Aliases, cmd.Example = use, nil, ""
		cmd.Hidden = true
		cmd.Deprecated = "use " + instead
		return cmd
	}
	return []*cobra.Command{
		alias(newGetClustersCommand(g), "clusters", "rbctl get clusters"),
		alias(newGetReservationsCommand(g), "reservations", "rbctl get reservations"),
		alias(newDescribeReservationCommand(g), "explain ID", "rbctl describe reservation"),
	}
}
