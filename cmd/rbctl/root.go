package main

import (
	"os"

	"github.com/spf13/cobra"
	"k8s.io/cli-runtime/pkg/genericclioptions"
	"k8s.io/utils/ptr"

	"github.com/fluidos-project/resource-broker/internal/rbctl/member"
	"github.com/fluidos-project/resource-broker/internal/version"
)

// newRootCommand builds the rbctl command tree. Each subcommand lives in its
// own file and is registered here as a sibling; what each does is in its
// package under internal/rbctl.
func newRootCommand() *cobra.Command {
	root := &cobra.Command{
		Use:   "rbctl",
		Short: "rbctl operates and inspects the resource broker",
		Long: `rbctl operates and inspects the resource broker.

It talks to the broker as one member cluster, with that cluster's client
certificate. With a kubeconfig (--kubeconfig, --context, as kubectl) it reads
the certificate from the member's Secret resource-broker/rb-agent-tls and the
broker's URL from the member's agent, and names reservations by their
Reservation objects; --cert-dir and --broker-url name a certificate directory
and the broker instead.`,
		// Errors are printed once by main; a usage dump after a runtime
		// error (e.g. an invalid cluster id) hides the message.
		SilenceErrors: true,
		SilenceUsage:  true,
	}
	// The persistent flags: where the member's identity and the broker are.
	g := &member.Options{Kube: &genericclioptions.ConfigFlags{
		KubeConfig: ptr.To(""), Context: ptr.To(""), Namespace: ptr.To(""), Timeout: ptr.To("0"),
	}}
	pf := root.PersistentFlags()
	g.Kube.AddFlags(pf)
	pf.StringVar(&g.BrokerURL, "broker-url", os.Getenv("RB_BROKER_URL"),
		"broker API URL (env RB_BROKER_URL; default: the BROKER_URL of the member's agent, with a kubeconfig)")
	pf.StringVar(&g.CertDir, "cert-dir", os.Getenv("RB_CERT_DIR"),
		"directory with a member's tls.crt, tls.key and the broker's ca.crt, as written by rbctl certs, instead of the member's Secret (env RB_CERT_DIR)")
	pf.StringVar(&g.AgentNamespace, "agent-namespace", member.DefaultAgentNamespace,
		"namespace of the member's agent and of its Secret "+member.SecretName)
	root.AddCommand(
		newCertsCommand(),
		newJoinCommand(g),
		newLeaveCommand(g),
		newGetCommand(g),
		newDescribeCommand(g),
		newUsageCommand(g),
		newVersionCommand(),
	)
	root.AddCommand(deprecatedCommands(g)...)
	version.AddFlag(root)
	return root
}
