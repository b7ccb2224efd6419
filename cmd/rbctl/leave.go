package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/spf13/cobra"
	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrlclient "sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/fluidos-project/resource-broker/internal/certdir"
)

type leaveOptions struct {
	g             *globalOptions
	brokerContext string
	force         bool
}

func newLeaveCommand(g *globalOptions) *cobra.Command {
	o := &leaveOptions{g: g}
	cmd := &cobra.Command{
		Use:   "leave",
		Short: "Undo rbctl join: delete the member's certificate Secret and its request",
		Long: `leave undoes rbctl join for the member cluster of --context: it deletes
its Secret resource-broker/rb-agent-tls and, with --broker-context, its
CertificateSigningRequest in the broker's cluster.

It first asks the broker, as the member, for the member's live reservations
and refuses while there are any (as requester or provider): end them first
(delete the pods that borrow, drain what the member provides), or --force.

The broker keeps the member's last advertisement: it shows the cluster as
stale once the member stops advertising (remove its agent) and no longer
chooses it. The certificate is not revoked: it stays valid until it expires
(leave prints when); rotate the members' CA to cut it off sooner.`,
		Example: `  rbctl leave --context paris --broker-context rome`,
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return o.run(cmd.Context(), cmd.OutOrStdout())
		},
	}
	cmd.Flags().StringVar(&o.brokerContext, "broker-context", "", "kubeconfig context of the broker's cluster, to delete the member's CertificateSigningRequest")
	cmd.Flags().BoolVar(&o.force, "force", false, "leave even if the member has live reservations, or the broker cannot be asked")
	return cmd
}

func (o *leaveOptions) run(ctx context.Context, out io.Writer) error {
	if *o.g.kube.Context == "" {
		return errors.New("--context is required: the kubeconfig context of the member that leaves")
	}
	member, err := o.g.kubeClient()
	if err != nil {
		return err
	}
	key := ctrlclient.ObjectKey{Namespace: o.g.agentNamespace, Name: agentSecretName}
	var secret corev1.Secret
	if err := member.Get(ctx, key, &secret); err != nil {
		if apierrors.IsNotFound(err) {
			return fmt.Errorf("context %q has no Secret %s: not a member (nothing to undo)", *o.g.kube.Context, key)
		}
		return err
	}
	leaf, err := leafOf(secret.Data[certdir.CertFile])
	if err != nil {
		return fmt.Errorf("Secret %s: %w", key, err)
	}
	id := leaf.Subject.CommonName

	if err := o.checkNoReservations(ctx, id); err != nil {
		if !o.force {
			return err
		}
		fmt.Fprintf(out, "leaving anyway (--force): %v\n", err)
	}

	if err := member.Delete(ctx, &secret, ctrlclient.Preconditions{UID: &secret.UID}); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("deleting Secret %s: %w", key, err)
	}
	fmt.Fprintf(out, "secret/%s deleted from namespace %s of context %q (cluster id %q)\n", agentSecretName, key.Namespace, *o.g.kube.Context, id)

	if o.brokerContext != "" {
		cfg, err := o.g.restConfigFor(o.brokerContext)
		if err != nil {
			return fmt.Errorf("--broker-context: %w", err)
		}
		broker, err := newKubeClient(cfg)
		if err != nil {
			return err
		}
		csr := &certificatesv1.CertificateSigningRequest{ObjectMeta: metav1.ObjectMeta{Name: csrName(id)}}
		switch err := broker.Delete(ctx, csr); {
		case apierrors.IsNotFound(err):
			fmt.Fprintf(out, "certificatesigningrequest/%s: none in context %q\n", csr.Name, o.brokerContext)
		case err != nil:
			return fmt.Errorf("deleting CertificateSigningRequest %s: %w", csr.Name, err)
		default:
			fmt.Fprintf(out, "certificatesigningrequest/%s deleted from context %q\n", csr.Name, o.brokerContext)
		}
	}
	fmt.Fprintf(out, "the certificate (serial %x) stays valid until %s: there is no revocation; the broker shows %q as stale once its agent stops advertising\n",
		leaf.SerialNumber, leaf.NotAfter.UTC().Format(time.RFC3339), id)
	fmt.Fprintf(out, "remove the agent: kubectl --context %s delete -k <the member's agent overlay>\n", *o.g.kube.Context)
	return nil
}

// checkNoReservations asks the broker, as the member, whether it still
// holds or provides live reservations.
func (o *leaveOptions) checkNoReservations(ctx context.Context, id string) error {
	c, err := o.g.client(ctx)
	if err != nil {
		return fmt.Errorf("cannot ask the broker for %q's live reservations: %w", id, err)
	}
	list, err := c.Reservations(ctx, "")
	if err != nil {
		return fmt.Errorf("cannot ask the broker for %q's live reservations: %w", id, err)
	}
	if len(list) == 0 {
		return nil
	}
	var requested, provided []string
	for _, r := range list {
		if r.Requester == id {
			requested = append(requested, r.ID)
		}
		if r.Provider == id {
			provided = append(provided, r.ID)
		}
	}
	return fmt.Errorf("%q still has %d live reservations (%s): end them first, or --force",
		id, len(list), describeRoles(requested, provided))
}

func describeRoles(requested, provided []string) string {
	var parts []string
	if len(requested) > 0 {
		parts = append(parts, "as requester: "+strings.Join(requested, ", "))
	}
	if len(provided) > 0 {
		parts = append(parts, "as provider: "+strings.Join(provided, ", "))
	}
	return strings.Join(parts, "; ")
}
