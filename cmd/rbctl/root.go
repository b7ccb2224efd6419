package main

import "github.com/spf13/cobra"

// newRootCommand builds the rbctl command tree. Each subcommand lives in its
// own file and is registered here as a sibling (certs today; clusters,
// reservations and explain later).
func newRootCommand() *cobra.Command {
	root := &cobra.Command{
		Use:   "rbctl",
		Short: "rbctl operates and inspects the resource broker",
		// Errors are printed once by main; a usage dump after a runtime
		// error (e.g. an invalid cluster id) hides the message.
		SilenceErrors: true,
		SilenceUsage:  true,
	}
	root.AddCommand(
		newCertsCommand(),
	)
	return root
}
