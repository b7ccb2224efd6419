package main

import (
	"time"

	"github.com/spf13/cobra"

	"github.com/fluidos-project/resource-broker/internal/rbctl/join"
	"github.com/fluidos-project/resource-broker/internal/rbctl/member"
)

func newJoinCommand(g *member.Options) *cobra.Command {
	o := join.Options{Member: g}
	cmd := &cobra.Command{
		Use:   "join",
		Short: "Make a cluster a member: its client certificate, by a CSR the broker's side approves",
		Long: `join gives the member cluster of --context its identity at the broker: a
client certificate with CN = --cluster-id, signed by the CA the broker trusts
for members, in the member's Secret resource-broker/rb-agent-tls, which its
agent mounts (manifests/agent).

The key is made by rbctl and goes only into the member's Secret. Its
certificate signing request goes to the broker's cluster (--broker-context)
as a CertificateSigningRequest rb-member-<cluster id> with signer
` + join.SignerName + `, for the operator of the broker to approve and
sign with the CA: rbctl join approve. With --ca-dir (the CA directory of
rbctl certs) join approves and signs the request itself: one command for an
operator of both clusters.

The CA the member trusts for the broker (ca.crt of its Secret) is that of
--ca-dir, or --broker-ca-file, or else ca.crt of the ConfigMap
resource-broker/rb-broker-ca in the broker's cluster, which rbctl join
approve publishes.`,
		Example: `  # An operator of both clusters, holding the CA:
  rbctl join --context paris --cluster-id paris --broker-context rome --ca-dir rb-install/certs/ca

  # The member's operator asks; the broker's operator approves:
  rbctl join --context paris --cluster-id paris --broker-context rome
  rbctl join approve paris --context rome --ca-dir rb-install/certs/ca`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return join.Join(cmd.Context(), o, cmd.OutOrStdout())
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.ClusterID, "cluster-id", "", "the member's cluster id: its certificate's CN (a DNS-1123 label)")
	f.StringVar(&o.BrokerContext, "broker-context", "", "kubeconfig context of the broker's cluster, where the request is approved")
	f.StringVar(&o.BrokerNamespace, "broker-namespace", member.DefaultAgentNamespace, "the broker's namespace, of its ConfigMap "+join.CAConfigMap)
	f.StringVar(&o.CADir, "ca-dir", "", "directory with the members' CA (ca.crt, ca.key, as rbctl certs writes it): approve and sign at once")
	f.StringVar(&o.CAFile, "broker-ca-file", "", "PEM file of the CA the member trusts for the broker (default: ca.crt of ConfigMap "+join.CAConfigMap+")")
	f.DurationVar(&o.Validity, "duration", 365*24*time.Hour, "how long the certificate is valid")
	f.DurationVar(&o.Timeout, "timeout", 10*time.Minute, "how long to wait for the request to be approved and signed")
	f.BoolVar(&o.Overwrite, "overwrite", false, "replace the member's Secret if it has one (a new key and certificate)")
	cmd.AddCommand(newJoinApproveCommand(g))
	return cmd
}

func newJoinApproveCommand(g *member.Options) *cobra.Command {
	o := join.ApproveOptions{Member: g}
	cmd := &cobra.Command{
		Use:   "approve CLUSTER_ID",
		Short: "Approve and sign a member's join request, in the broker's cluster",
		Long: `approve approves the CertificateSigningRequest rb-member-<CLUSTER_ID> of the
cluster of --context (the broker's) and signs it with the members' CA of
--ca-dir, after checking that it asks for a client certificate with
CN = CLUSTER_ID and nothing else. A request approved with kubectl
certificate approve is signed the same way. It publishes the CA's
certificate (never its key) in the ConfigMap resource-broker/rb-broker-ca,
where the member's rbctl join reads it.`,
		Example: `  rbctl join approve paris --context rome --ca-dir rb-install/certs/ca`,
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			o.ClusterID = args[0]
			return join.Approve(cmd.Context(), o, cmd.OutOrStdout())
		},
	}
	cmd.Flags().StringVar(&o.CADir, "ca-dir", "", "directory with the members' CA (ca.crt, ca.key)")
	cmd.Flags().StringVar(&o.BrokerNamespace, "broker-namespace", member.DefaultAgentNamespace, "the broker's namespace, where the CA is published (ConfigMap "+join.CAConfigMap+")")
	cmd.Flags().DurationVar(&o.Validity, "duration", 365*24*time.Hour, "the longest validity to sign for (the request's expirationSeconds, if shorter, wins)")
	return cmd
}
