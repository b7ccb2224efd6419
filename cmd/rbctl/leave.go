package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/spf13/cobra"
	appsv1 "k8s.io/api/apps/v1"
	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"
	ctrlclient "sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/fluidos-project/resource-broker/broker/client"

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
	if err := o.stopAgent(ctx, member, out); err != nil {
		return err
	}
	if err := o.forget(ctx, id, out); err != nil {
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
	fmt.Fprintf(out, "the certificate (serial %x) stays valid until %s: there is no revocation\n",
		leaf.SerialNumber, leaf.NotAfter.UTC().Format(time.RFC3339))
	fmt.Fprintf(out, "remove the agent: kubectl --context %s delete -k <the member's agent overlay>\n", *o.g.kube.Context)
	return nil
}

// stopAgent scales the member's agent to 0 and waits for its pods to go: a
// running agent would advertise the member again after the broker forgot it.
func (o *leaveOptions) stopAgent(ctx context.Context, member ctrlclient.Client, out io.Writer) error {
	key := ctrlclient.ObjectKey{Namespace: o.g.agentNamespace, Name: agentDeploymentName}
	var d appsv1.Deployment
	if err := member.Get(ctx, key, &d); err != nil {
		if apierrors.IsNotFound(err) {
			return nil // no agent: nothing advertises the member
		}
		return fmt.Errorf("reading the member's agent: %w", err)
	}
	if d.Spec.Replicas == nil || *d.Spec.Replicas > 0 {
		patch := ctrlclient.MergeFrom(d.DeepCopy())
		d.Spec.Replicas = ptr.To[int32](0)
		if err := member.Patch(ctx, &d, patch); err != nil {
			return fmt.Errorf("scaling deployment %s to 0: %w", key, err)
		}
	}
	selector, err := metav1.LabelSelectorAsSelector(d.Spec.Selector)
	if err != nil {
		return fmt.Errorf("deployment %s: %w", key, err)
	}
	var pods corev1.PodList
	err = wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, agentStopTimeout, true, func(ctx context.Context) (bool, error) {
		err := member.List(ctx, &pods, ctrlclient.InNamespace(key.Namespace), ctrlclient.MatchingLabelsSelector{Selector: selector})
		return err == nil && len(pods.Items) == 0, err
	})
	if err != nil {
		return fmt.Errorf("deployment %s still has %d pods after %s: %w", key, len(pods.Items), agentStopTimeout, err)
	}
	fmt.Fprintf(out, "deployment/%s scaled to 0 in namespace %s of context %q: nothing advertises the member any more\n", key.Name, key.Namespace, *o.g.kube.Context)
	return nil
}

// agentStopTimeout bounds the wait for the agent's pods to go (their grace
// period is 30s).
const agentStopTimeout = 90 * time.Second

// forget has the broker forget the member, as the member.
func (o *leaveOptions) forget(ctx context.Context, id string, out io.Writer) error {
	c, err := o.g.client(ctx)
	if err != nil {
		return fmt.Errorf("cannot ask the broker to forget %q: %w", id, err)
	}
	switch err := c.Leave(ctx, id); {
	case client.IsNotFound(err):
		fmt.Fprintf(out, "the broker holds no advertisement of %q (nothing to forget)\n", id)
	case err != nil:
		return fmt.Errorf("the broker did not forget %q: %w", id, err)
	default:
		fmt.Fprintf(out, "the broker forgot %q: its advertisement, nodes and index entries are gone\n", id)
	}
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
