package virtualkubelet

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/cache"
)

// readiness is the node's Ready condition as the probe last judged it.
type readiness struct {
	status          corev1.ConditionStatus
	reason, message string
	since           metav1.Time
}

func (r readiness) ready() bool { return r.status == corev1.ConditionTrue }

func (n *providerNode) probeSoon() {
	select {
	case n.probeNow <- struct{}{}:
	default:
	}
}

// probeLoop checks the provider's API with the tenant token every ProbePeriod.
func (n *providerNode) probeLoop(ctx context.Context) {
	t := time.NewTicker(n.b.cfg.ProbePeriod)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-n.probeNow:
		}
		n.probe(ctx)
	}
}

// probe judges the Ready condition: a namespaced request with the token tells
// reachability and access apart. A rejected token makes the node NotReady at
// once (and the grant is read again); a provider that does not answer is
// judged by how long ago it last did (unanswered, lost.go).
func (n *providerNode) probe(ctx context.Context) {
	rc := n.currentRemote()
	if rc == nil {
		if !n.withinGrace(time.Now()) && !n.isLost() {
			n.setReady(corev1.ConditionFalse, ReasonWaitingCredentials, fmt.Sprintf("no grant from %s yet", n.provider))
		}
		return
	}
	if _, expires := rc.token.get(); !expires.IsZero() && time.Now().After(expires) {
		n.setReady(corev1.ConditionFalse, ReasonCredentialsExpired, fmt.Sprintf("the token granted by %s expired at %s and no newer grant was found",
			n.provider, expires.Format(time.RFC3339)))
		n.refreshNow()
		return
	}
	pctx, cancel := context.WithTimeout(ctx, min(n.b.cfg.ProbePeriod, 5*time.Second))
	defer cancel()
	_, err := rc.client.CoreV1().Pods(rc.namespace).List(pctx, metav1.ListOptions{Limit: 1})
	if ctx.Err() != nil {
		return
	}
	switch {
	case err == nil:
		was := n.isReady()
		n.answered()
		if !was.ready() && was.reason != ReasonWaitingCredentials {
			n.reconnect(ctx, rc)
		}
		n.setReady(corev1.ConditionTrue, ReasonReachable, fmt.Sprintf("%s's API server answers at %s", n.provider, rc.endpoint))
		n.returned(ctx)
	case apierrors.IsUnauthorized(err):
		n.answered()
		n.setReady(corev1.ConditionFalse, ReasonCredentialsDenied, fmt.Sprintf("%s rejects the granted token: %v", n.provider, err))
		n.returned(ctx)
		n.refreshNow()
	case apierrors.IsForbidden(err):
		n.answered()
		n.setReady(corev1.ConditionFalse, ReasonAccessRevoked, fmt.Sprintf("%s revoked access to namespace %s: %v", n.provider, rc.namespace, err))
		n.returned(ctx)
		n.refreshNow()
	default:
		n.unanswered(ctx, rc, err)
	}
}

// reconnect replaces the provider's informer after an outage: a fresh one
// lists at once (the old one's reflector may be backing off for up to 30 s),
// and the copies the old one knew that the fresh list lacks were deleted
// meanwhile, which the pod handler hears of as it would from a watch.
func (n *providerNode) reconnect(ctx context.Context, old *remoteCluster) {
	fresh, err := old.reconnect(n.ctx, n.b.cfg.ClusterID, n.pods.remoteEvents(), n.log)
	if err != nil {
		n.log.Error(err, "reconnecting to the provider")
		return
	}
	sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if !cache.WaitForCacheSync(sctx.Done(), fresh.synced) {
		fresh.stop()
		return
	}
	n.mu.Lock()
	if n.remote != old { // a new grant came in meanwhile
		n.mu.Unlock()
		fresh.stop()
		return
	}
	n.remote = fresh
	n.mu.Unlock()
	old.stop()
	known, _ := old.pods.List(everything)
	for _, p := range known {
		if _, err := fresh.pods.Get(p.Name); apierrors.IsNotFound(err) {
			n.pods.remoteGone(p)
		}
	}
	n.objects.resync() // the copies of ConfigMaps and Secrets deleted meanwhile
	n.log.Info("reconnected to the provider", "copies", len(known))
}

func (n *providerNode) setReady(status corev1.ConditionStatus, reason, message string) {
	n.mu.Lock()
	r := &n.ready
	transition := r.status != status
	changed := transition || r.reason != reason || r.message != message
	if transition {
		r.since = metav1.Now()
	}
	r.status, r.reason, r.message = status, reason, message
	n.mu.Unlock()
	if !changed {
		return
	}
	n.log.Info("virtual node readiness", "ready", status, "reason", reason, "message", message)
	n.push()
}

// isReady reports the Ready condition.
func (n *providerNode) isReady() readiness {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.ready
}
