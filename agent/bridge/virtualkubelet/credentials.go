package virtualkubelet

import (
	"context"
	"time"

	"github.com/fluidos-project/resource-broker/broker/api"
	"github.com/fluidos-project/resource-broker/internal/backoff"
)

func (n *providerNode) refreshNow() {
	select {
	case n.refresh <- struct{}{}:
	default:
	}
}

// credentialsLoop keeps a valid grant: it reads the grants of the active
// reservations from the broker and takes the one that lasts longest, then
// reads again halfway to its expiry (the provider renews grants after two
// thirds of their lifetime), or at once when the provider rejects the token.
func (n *providerNode) credentialsLoop(ctx context.Context) {
	first := backoff.Exponential(time.Second, 30*time.Second)
	retry := first
	for ctx.Err() == nil {
		var next time.Duration
		g, from, err := n.fetchGrantFrom(ctx)
		switch {
		case err != nil:
			next = retry.Step()
			n.log.Info("cannot read the provider's grant from the broker", "error", err.Error(), "retryIn", next)
		case g == nil:
			next = retry.Step()
		default:
			retry = first
			if err := n.useGrant(g); err != nil {
				n.log.Error(err, "cannot use the provider's grant")
				next = 5 * time.Second
				break
			}
			n.mu.Lock()
			n.grantOf = from
			n.mu.Unlock()
			next = refreshIn(g.ExpiresAt, n.b.cfg.ProbePeriod)
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(next):
		case <-n.refresh:
		}
	}
}

// refreshIn: halfway to expiry, no sooner than floor, no later than 30 minutes.
func refreshIn(expires time.Time, floor time.Duration) time.Duration {
	if expires.IsZero() {
		return 30 * time.Minute
	}
	return min(max(time.Until(expires)/2, floor), 30*time.Minute)
}

// fetchGrant reads the grants of (up to 5 of) the newest active reservations.
func (n *providerNode) fetchGrant(ctx context.Context) (*api.Grant, error) {
	g, _, err := n.fetchGrantFrom(ctx)
	return g, err
}

// fetchGrantFrom is fetchGrant, also naming the reservation the grant is of.
func (n *providerNode) fetchGrantFrom(ctx context.Context) (*api.Grant, string, error) {
	ids := n.activeIDs()
	if len(ids) > 5 {
		ids = ids[:5]
	}
	var best *api.Grant
	var bestID string
	var lastErr error
	for _, id := range ids {
		rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		at, err := n.b.cfg.Grants.Reservation(rctx, id)
		cancel()
		if err != nil {
			lastErr = err
			continue
		}
		if g := at.Grant; g != nil && g.Token != "" && (best == nil || g.ExpiresAt.After(best.ExpiresAt)) {
			best, bestID = g, id
		}
	}
	if best == nil {
		return nil, "", lastErr
	}
	return best, bestID, nil
}

// useGrant takes a grant: a new token for the same access is swapped in
// place; another endpoint, CA or namespace gets a new connection.
func (n *providerNode) useGrant(g *api.Grant) error {
	n.mu.Lock()
	rc := n.remote
	n.mu.Unlock()
	if rc != nil && rc.sameAccess(g) {
		if old, _ := rc.token.get(); old != g.Token {
			n.log.V(1).Info("provider credentials refreshed", "expires", g.ExpiresAt)
			rc.token.set(g.Token, g.ExpiresAt)
			n.probeSoon()
		}
		return nil
	}
	fresh, err := newRemoteCluster(n.ctx, g, n.b.cfg.ClusterID, n.pods.remoteEvents(), n.log)
	if err != nil {
		return err
	}
	n.mu.Lock()
	n.remote = fresh
	n.mu.Unlock()
	if rc != nil {
		rc.stop()
	}
	n.log.Info("connected to the provider", "endpoint", g.Endpoint, "namespace", g.Namespace, "expires", g.ExpiresAt)
	n.objects.resync()
	n.probeSoon()
	return nil
}
