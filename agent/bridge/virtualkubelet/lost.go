package virtualkubelet

import (
	"context"
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
)

// A provider whose API server stops answering the probe is not lost at
// once: brief glitches (a restarting API server, a network blip, a busy
// machine) must not flap the node and the pods on it. The node stays Ready
// while the last answer is younger than ProviderLostGrace. Past it the node
// reads as Kubernetes' node lifecycle controller marks a node it cannot hear:
// Ready=Unknown and the node.kubernetes.io/unreachable taints (NoSchedule:
// nothing new is bound there; NoExecute: what Kubernetes' taint manager acts
// on, after the pods' own tolerations, 300 s by default). ProviderLostReplaceAfter
// after the last answer the bridge does not wait for those tolerations: it
// deletes the pods bound to the node at once (force, as the pod garbage
// collector does for pods on a node that is gone), so that their controllers
// create replacements, which the scheduler places through the broker (which
// no longer offers the provider once its advertisements are stale), and
// their reservations end. Pods that must never run twice (a StatefulSet's,
// or annotated AnnotationReplaceOnLoss: "false") are kept: their copy may
// still run at the provider. When the provider answers again the node is
// Ready and untainted, and the copies whose pods are gone are deleted
// (reconnect, remoteChanged).

// AnnotationReplaceOnLoss set to "false" on a pod keeps it on its node when
// the provider is lost: it is never replaced while its copy may still run.
const AnnotationReplaceOnLoss = "broker.fluidos.eu/replace-on-provider-loss"

// Reasons of the Events about a lost provider (on the node and its pods).
const (
	EventProviderLost     = "ProviderLost"
	EventProviderReturned = "ProviderReturned"
	EventPodReplaced      = "ReplacedForLostProvider"
	EventPodKept          = "KeptOnLostProvider"
)

// podsReplaced counts the pods deleted for a lost provider.
var podsReplaced = prometheus.NewCounterVec(prometheus.CounterOpts{
	Name: "rb_agent_lost_provider_pods_replaced_total",
	Help: "Pods deleted from a lost provider's virtual node so that their controllers replace them elsewhere, by provider.",
}, []string{"provider"})

func init() { ctrlmetrics.Registry.MustRegister(podsReplaced) }

var unreachableTaints = []corev1.Taint{
	{Key: corev1.TaintNodeUnreachable, Effect: corev1.TaintEffectNoSchedule},
	{Key: corev1.TaintNodeUnreachable, Effect: corev1.TaintEffectNoExecute},
}

// answered records that the provider's API server answered just now.
func (n *providerNode) answered() {
	n.mu.Lock()
	n.lastContact = time.Now()
	n.mu.Unlock()
}

// withinGrace: the provider answered less than the grace ago.
func (n *providerNode) withinGrace(now time.Time) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return !n.lastContact.IsZero() && now.Sub(n.lastContact) < n.b.cfg.ProviderLostGrace
}

// isLost: the node is Ready=Unknown for want of answers.
func (n *providerNode) isLost() bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return !n.lostSince.IsZero()
}

// unanswered judges a probe the provider's API server did not answer.
func (n *providerNode) unanswered(ctx context.Context, rc *remoteCluster, err error) {
	now := time.Now()
	n.mu.Lock()
	last := n.lastContact
	n.mu.Unlock()
	cfg := n.b.cfg
	switch {
	case last.IsZero():
		// Never reached: nothing of ours runs there through this node.
		n.setReady(corev1.ConditionFalse, ReasonUnreachable, fmt.Sprintf("%s's API server at %s: %v", n.provider, rc.endpoint, err))
		return
	case now.Sub(last) < cfg.ProviderLostGrace:
		n.log.V(1).Info("the provider's API server did not answer; within the grace", "lastContact", last, "grace", cfg.ProviderLostGrace, "error", err.Error())
		return
	}
	n.log.V(1).Info("the provider's API server did not answer", "lastContact", last, "error", err.Error())
	n.markLost(ctx, rc, last)
	if now.Sub(last) >= cfg.ProviderLostReplaceAfter {
		n.replacePods(ctx, last)
	}
}

// markLost makes the node Ready=Unknown and taints it unreachable; the
// taints are written again on the next probe if this fails.
func (n *providerNode) markLost(ctx context.Context, rc *remoteCluster, last time.Time) {
	cfg := n.b.cfg
	n.setReady(corev1.ConditionUnknown, ReasonUnreachable, fmt.Sprintf(
		"%s's API server at %s has not answered since %s (last contact); pods that may run twice are replaced from %s",
		n.provider, rc.endpoint, last.UTC().Format(time.RFC3339), last.Add(cfg.ProviderLostReplaceAfter).UTC().Format(time.RFC3339)))
	node, changed, err := n.setUnreachableTaints(ctx, true)
	if err != nil {
		n.log.Error(err, "tainting the lost provider's node")
		return
	}
	n.mu.Lock()
	first := n.lostSince.IsZero()
	if first {
		n.lostSince = time.Now()
	}
	n.mu.Unlock()
	if first || changed {
		n.log.Info("provider lost: node tainted unreachable", "lastContact", last, "replaceAt", last.Add(cfg.ProviderLostReplaceAfter))
		n.b.recorder.Eventf(node, nil, corev1.EventTypeWarning, EventProviderLost, "Taint",
			"%s has not answered since %s: node unreachable; pods that may run twice are replaced from %s",
			n.provider, last.UTC().Format(time.RFC3339), last.Add(cfg.ProviderLostReplaceAfter).UTC().Format(time.RFC3339))
	}
}

// returned: the provider answers again; the taints of a lost node go.
func (n *providerNode) returned(ctx context.Context) {
	n.mu.Lock()
	since := n.lostSince
	n.mu.Unlock()
	if since.IsZero() {
		return
	}
	node, _, err := n.setUnreachableTaints(ctx, false)
	if err != nil {
		n.log.Error(err, "untainting the provider's node") // again on the next probe
		return
	}
	n.mu.Lock()
	n.lostSince, n.told = time.Time{}, nil
	n.mu.Unlock()
	n.log.Info("provider answers again: node untainted", "lostFor", time.Since(since).Round(time.Second))
	n.b.recorder.Eventf(node, nil, corev1.EventTypeNormal, EventProviderReturned, "Untaint",
		"%s answers again after %s unreachable", n.provider, time.Since(since).Round(time.Second))
}

// setUnreachableTaints adds (on) or removes the unreachable taints, keeping
// every other taint; changed tells whether it wrote.
func (n *providerNode) setUnreachableTaints(ctx context.Context, on bool) (*corev1.Node, bool, error) {
	nodes := n.b.local.CoreV1().Nodes()
	var out *corev1.Node
	changed := false
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		node, err := nodes.Get(ctx, n.name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		var taints []corev1.Taint
		for _, t := range node.Spec.Taints {
			if t.Key != corev1.TaintNodeUnreachable || on {
				taints = append(taints, t)
			}
		}
		if on {
			now := metav1.Now()
			for _, want := range unreachableTaints {
				if !hasTaint(taints, want) {
					if want.Effect == corev1.TaintEffectNoExecute {
						want.TimeAdded = &now
					}
					taints = append(taints, want)
				}
			}
		}
		if len(taints) == len(node.Spec.Taints) {
			out = node
			return nil
		}
		node.Spec.Taints = taints
		out, err = nodes.Update(ctx, node, metav1.UpdateOptions{FieldManager: FieldManager})
		changed = err == nil
		return err
	})
	return out, changed, err
}

func hasTaint(taints []corev1.Taint, want corev1.Taint) bool {
	for i := range taints {
		if taints[i].MatchTaint(&want) {
			return true
		}
	}
	return false
}

// replacePods deletes the pods on the lost node that may run twice, at once,
// and tells (once per pod) why the others stay.
func (n *providerNode) replacePods(ctx context.Context, last time.Time) {
	if !n.localSynced() {
		return
	}
	pods, err := n.localPods.List(everything)
	if err != nil {
		return
	}
	for _, p := range pods {
		if !holdsNode(p) {
			continue
		}
		if why := neverTwice(p); why != "" {
			if p.DeletionTimestamp == nil && n.tell(p.UID) {
				n.b.recorder.Eventf(p, nil, corev1.EventTypeWarning, EventPodKept, "Replace",
					"%s has not answered since %s; not replaced: %s, and its copy there may still run. It stays until %s answers; "+
						"delete it with --force --grace-period=0 once you know the copy is gone", n.provider, last.UTC().Format(time.RFC3339), why, n.provider)
			}
			continue
		}
		n.b.recorder.Eventf(p, nil, corev1.EventTypeWarning, EventPodReplaced, "Delete",
			"%s has not answered since %s: deleted so that its controller replaces it elsewhere; its copy there is deleted when %s answers again",
			n.provider, last.UTC().Format(time.RFC3339), n.provider)
		err := n.b.local.CoreV1().Pods(p.Namespace).Delete(ctx, p.Name, metav1.DeleteOptions{
			GracePeriodSeconds: ptr.To[int64](0), Preconditions: metav1.NewUIDPreconditions(string(p.UID))})
		switch {
		case err == nil:
			podsReplaced.WithLabelValues(n.provider).Inc()
			n.log.Info("deleted a pod of the lost provider to be replaced", "pod", types.NamespacedName{Namespace: p.Namespace, Name: p.Name}, "lastContact", last)
		case apierrors.IsNotFound(err) || apierrors.IsConflict(err):
		default:
			n.log.Error(err, "deleting a pod of the lost provider", "pod", types.NamespacedName{Namespace: p.Namespace, Name: p.Name}) // again on the next probe
		}
	}
}

// tell is true the first time it is asked about uid during a loss.
func (n *providerNode) tell(uid types.UID) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.told[uid] {
		return false
	}
	if n.told == nil {
		n.told = map[types.UID]bool{}
	}
	n.told[uid] = true
	return true
}

// neverTwice says why a pod must not be replaced while its copy may run
// ("" if it may be).
func neverTwice(p *corev1.Pod) string {
	if p.Annotations[AnnotationReplaceOnLoss] == "false" {
		return "annotated " + AnnotationReplaceOnLoss + `: "false"`
	}
	if ref := metav1.GetControllerOf(p); ref != nil && ref.Kind == "StatefulSet" {
		return "owned by StatefulSet " + ref.Name
	}
	return ""
}

// resumeReadiness takes over the node an earlier run of the agent left: a
// Ready node stays Ready for a grace from now (the previous run heard from
// the provider recently, or the node would not say Ready), and a lost one
// stays lost, its replacement still due from its last contact.
func (n *providerNode) resumeReadiness(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	node, err := n.b.local.CoreV1().Nodes().Get(ctx, n.name, metav1.GetOptions{})
	if err != nil {
		return // none yet (or unreadable): start from scratch
	}
	for _, c := range node.Status.Conditions {
		if c.Type != corev1.NodeReady || c.Reason == "" {
			continue
		}
		r := readiness{status: c.Status, reason: c.Reason, message: c.Message, since: c.LastTransitionTime}
		switch {
		case c.Status == corev1.ConditionTrue && c.Reason == ReasonReachable:
			n.ready, n.lastContact = r, time.Now()
		case c.Status == corev1.ConditionUnknown && c.Reason == ReasonUnreachable:
			// It was declared lost a grace after its last contact.
			n.ready, n.lastContact, n.lostSince = r, c.LastTransitionTime.Add(-n.b.cfg.ProviderLostGrace), c.LastTransitionTime.Time
		}
		if n.ready.status != corev1.ConditionFalse {
			n.log.Info("resuming the virtual node", "ready", c.Status, "reason", c.Reason, "since", c.LastTransitionTime)
		}
	}
	if n.lostSince.IsZero() && (hasTaint(node.Spec.Taints, unreachableTaints[0]) || hasTaint(node.Spec.Taints, unreachableTaints[1])) {
		n.lostSince = time.Now() // left by an earlier run: removed at the first answer
	}
}
