package main

import (
	"github.com/spf13/cobra"

	"github.com/fluidos-project/resource-broker/internal/rbctl/certs"
)

func newCertsCommand() *cobra.Command {
	o := certs.Options{}
	cmd := &cobra.Command{
		Use:   "certs",
		Short: "Write a CA and mutual-TLS certificates for the broker and clusters",
		Long: `certs writes a certificate authority, a server certificate for
the broker and one client certificate per cluster (CN = cluster id):

  <out>/ca/ca.crt, <out>/ca/ca.key
  <out>/broker/{tls.crt,tls.key,ca.crt}
  <out>/clusters/<id>/{tls.crt,tls.key,ca.crt}

The tls.crt/tls.key/ca.crt directories have the layout of a cert-manager
Secret. If <out>/ca already exists its CA is reused, so clusters can be
added later without reissuing the others; rbctl join --ca-dir signs the
members' certificates with it. ca.key is the CA's private key, unencrypted,
with mode 0600: keep <out>/ca where only the CA's operators can read it.`,
		Example: `  rbctl certs
  rbctl certs --out .certs --clusters madrid`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return certs.Write(o, cmd.OutOrStdout())
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.Out, "out", ".certs", "output directory")
	f.StringSliceVar(&o.Clusters, "clusters", []string{"rome", "paris", "berlin"},
		"cluster ids to issue client certificates for (DNS-1123 labels)")
	f.StringSliceVar(&o.BrokerHosts, "broker-hosts", certs.DefaultBrokerHosts,
		"DNS names and IP addresses put in the broker server certificate")
	return cmd
}
