package main

import (
	"os"

	"github.com/spf13/cobra"

	"github.com/fluidos-project/resource-broker/internal/version"
)

// newRootCommand builds the rbctl command tree. Each subcommand lives in its
// own file and is registered here as a sibling.
func newRootCommand() *cobra.Command {
	root := &cobra.Command{
		Use:   "rbctl",
		Short: "rbctl operates and inspects the resource broker",
		// Errors are printed once by main; a usage dump after a runtime
		// error (e.g. an invalid cluster id) hides the message.
		SilenceErrors: true,
		SilenceUsage:  true,
	}
	g := &globalOptions{}
	pf := root.PersistentFlags()
	pf.StringVar(&g.brokerURL, "broker-url", envOr("RB_BROKER_URL", defaultBrokerURL),
		"broker API URL (env RB_BROKER_URL)")
	pf.StringVar(&g.certDir, "cert-dir", envOr("RB_CERT_DIR", defaultCertDir),
		"directory with this cluster's tls.crt, tls.key and the broker's ca.crt, as written by rbctl certs (env RB_CERT_DIR)")
	pf.StringVarP(&g.output, "output", "o", outputTable, "output format of broker commands: table, json or yaml")
	root.AddCommand(
		newCertsCommand(),
		newClustersCommand(g),
		newReservationsCommand(g),
		newExplainCommand(g),
		newUsageCommand(g),
	)
	version.AddFlag(root)
	return root
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}
