package main

import (
	"github.com/spf13/cobra"

	"github.com/fluidos-project/resource-broker/internal/rbctl/leave"
	"github.com/fluidos-project/resource-broker/internal/rbctl/member"
)

func newLeaveCommand(g *member.Options) *cobra.Command {
	o := leave.Options{Member: g}
	cmd := &cobra.Command{
		Use:   "leave",
		Short: "Undo rbctl join: the broker forgets the member; its certificate Secret and request go",
		Long: `leave undoes rbctl join for the member cluster of --context, in this order:

1. it asks the broker, as the member, for the member's live reservations and
   refuses while there are any (as requester or provider): end them first
   (delete the pods that borrow, drain what the member provides), or --force;
2. it scales the member's agent (Deployment resource-broker/rb-agent) to 0
   and waits for its pods to go, so that nothing advertises the member again;
3. the broker forgets the member (DELETE /api/v2/clusters/<id>, as the
   member): its advertisement, nodes and index entries go and it is no
   candidate any more;
4. it deletes the member's Secret resource-broker/rb-agent-tls and, with
   --broker-context, its CertificateSigningRequest in the broker's cluster.

The certificate is not revoked: it stays valid until it expires (leave prints
when); rotate the members' CA to cut it off sooner. Remove the agent's
manifests afterwards; rbctl join and applying them again makes it a member
again.`,
		Example: `  rbctl leave --context paris --broker-context rome`,
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return leave.Leave(cmd.Context(), o, cmd.OutOrStdout())
		},
	}
	cmd.Flags().StringVar(&o.BrokerContext, "broker-context", "", "kubeconfig context of the broker's cluster, to delete the member's CertificateSigningRequest")
	cmd.Flags().BoolVar(&o.Force, "force", false, "leave even if the member has live reservations, or the broker cannot be asked")
	return cmd
}
