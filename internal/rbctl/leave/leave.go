// Package leave undoes rbctl join for a member: it refuses while the member
// has live reservations (unless forced), stops the member's agent, has the
// broker forget the member, and deletes the member's Secret and its
// CertificateSigningRequest. The certificate is not revoked.
package leave

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

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
	"github.com/fluidos-project/resource-broker/internal/rbctl/join"
	"github.com/fluidos-project/resource-broker/internal/rbctl/member"
)

// Options are what rbctl leave is given.
type Options struct {
	// Member is the cluster that leaves (its --context).
	Member *member.Options
	// BrokerContext, if set, is the broker's cluster, where the member's
	// request is deleted.
	BrokerContext string
	// Force leaves despite live reservations or a broker that cannot be asked.
	Force bool
}

// Leave undoes the member's join, reporting each step to out.
func Leave(ctx context.Context, o Options, out io.Writer) error {
	memberContext := o.Member.Context()
	if memberContext == "" {
		return errors.New("--context is required: the kubeconfig context of the member that leaves")
	}
	kc, err := o.Member.KubeClient()
	if err != nil {
		return err
	}
	key := ctrlclient.ObjectKey{Namespace: o.Member.AgentNamespace, Name: member.SecretName}
	var secret corev1.Secret
	if err := kc.Get(ctx, key, &secret); err != nil {
		if apierrors.IsNotFound(err) {
			return fmt.Errorf("context %q has no Secret %s: not a member (nothing to undo)", memberContext, key)
		}
		return err
	}
	leaf, err := join.ParseCertificate(secret.Data[certdir.CertFile])
	if err != nil {
		return fmt.Errorf("Secret %s: %w", key, err)
	}
	id := leaf.Subject.CommonName

	if err := o.checkNoReservations(ctx, id); err != nil {
		if !o.Force {
			return err
		}
		fmt.Fprintf(out, "leaving anyway (--force): %v\n", err)
	}
	if err := o.stopAgent(ctx, kc, out); err != nil {
		return err
	}
	if err := o.forget(ctx, id, out); err != nil {
		if !o.Force {
			return err
		}
		fmt.Fprintf(out, "leaving anyway (--force): %v\n", err)
	}

	if err := kc.Delete(ctx, &secret, ctrlclient.Preconditions{UID: &secret.UID}); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("deleting Secret %s: %w", key, err)
	}
	fmt.Fprintf(out, "secret/%s deleted from namespace %s of context %q (cluster id %q)\n", member.SecretName, key.Namespace, memberContext, id)

	if o.BrokerContext != "" {
		if err := o.deleteRequest(ctx, id, out); err != nil {
			return err
		}
	}
	fmt.Fprintf(out, "the certificate (serial %x) stays valid until %s: there is no revocation\n",
		leaf.SerialNumber, leaf.NotAfter.UTC().Format(time.RFC3339))
	fmt.Fprintf(out, "remove the agent: kubectl --context %s delete -k <the member's agent overlay>\n", memberContext)
	return nil
}

// deleteRequest deletes the member's CertificateSigningRequest in the
// broker's cluster.
func (o *Options) deleteRequest(ctx context.Context, id string, out io.Writer) error {
	cfg, err := o.Member.RESTConfigFor(o.BrokerContext)
	if err != nil {
		return fmt.Errorf("--broker-context: %w", err)
	}
	broker, err := member.NewKubeClient(cfg)
	if err != nil {
		return err
	}
	csr := &certificatesv1.CertificateSigningRequest{ObjectMeta: metav1.ObjectMeta{Name: join.CSRName(id)}}
	switch err := broker.Delete(ctx, csr); {
	case apierrors.IsNotFound(err):
		fmt.Fprintf(out, "certificatesigningrequest/%s: none in context %q\n", csr.Name, o.BrokerContext)
	case err != nil:
		return fmt.Errorf("deleting CertificateSigningRequest %s: %w", csr.Name, err)
	default:
		fmt.Fprintf(out, "certificatesigningrequest/%s deleted from context %q\n", csr.Name, o.BrokerContext)
	}
	return nil
}

// stopAgent scales the member's agent to 0 and waits for its pods to go: a
// running agent would advertise the member again after the broker forgot it.
func (o *Options) stopAgent(ctx context.Context, kc ctrlclient.Client, out io.Writer) error {
	key := ctrlclient.ObjectKey{Namespace: o.Member.AgentNamespace, Name: member.AgentDeployment}
	var d appsv1.Deployment
	if err := kc.Get(ctx, key, &d); err != nil {
		if apierrors.IsNotFound(err) {
			return nil // no agent: nothing advertises the member
		}
		return fmt.Errorf("reading the member's agent: %w", err)
	}
	if d.Spec.Replicas == nil || *d.Spec.Replicas > 0 {
		patch := ctrlclient.MergeFrom(d.DeepCopy())
		d.Spec.Replicas = ptr.To[int32](0)
		if err := kc.Patch(ctx, &d, patch); err != nil {
			return fmt.Errorf("scaling deployment %s to 0: %w", key, err)
		}
	}
	selector, err := metav1.LabelSelectorAsSelector(d.Spec.Selector)
	if err != nil {
		return fmt.Errorf("deployment %s: %w", key, err)
	}
	var pods corev1.PodList
	err = wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, agentStopTimeout, true, func(ctx context.Context) (bool, error) {
		err := kc.List(ctx, &pods, ctrlclient.InNamespace(key.Namespace), ctrlclient.MatchingLabelsSelector{Selector: selector})
		return err == nil && len(pods.Items) == 0, err
	})
	if err != nil {
		return fmt.Errorf("deployment %s still has %d pods after %s: %w", key, len(pods.Items), agentStopTimeout, err)
	}
	fmt.Fprintf(out, "deployment/%s scaled to 0 in namespace %s of context %q: nothing advertises the member any more\n", key.Name, key.Namespace, o.Member.Context())
	return nil
}

// agentStopTimeout bounds the wait for the agent's pods to go (their grace
// period is 30s).
const agentStopTimeout = 90 * time.Second

// forget has the broker forget the member, as the member.
func (o *Options) forget(ctx context.Context, id string, out io.Writer) error {
	c, err := o.Member.BrokerClient(ctx)
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
func (o *Options) checkNoReservations(ctx context.Context, id string) error {
	c, err := o.Member.BrokerClient(ctx)
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
