package virtualkubelet

import (
	"context"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	rbv1 "github.com/fluidos-project/resource-broker/api/v1alpha1"
)

// Defaults of Config.HeartbeatPeriod, how often the bridge renews its
// heartbeat Lease at a provider, and Config.HeartbeatLease, the lease it
// claims, after which the provider may take the requester for gone: those
// of the reservations' own leases (agent/reservation), so a provider hears
// the requester exactly as long as the broker would.
const (
	DefaultHeartbeatPeriod = 30 * time.Second
	DefaultHeartbeatLease  = 2 * time.Minute
)

// heartbeatLoop renews the Lease rbv1.RequesterHeartbeatLease in the tenant
// namespace at the provider while the node runs. The provider reads it as
// "the requester is alive" even when the requester cannot reach the broker:
// it then renews the requester's leases itself and evicts nothing. A Lease,
// not the bridge's own traffic, because an idle bridge sends nothing and the
// provider's agent does not see the API server's traffic; the provider judges
// freshness by its own clock when it sees the Lease change, so clock skew
// between clusters does not matter.
func (n *providerNode) heartbeatLoop(ctx context.Context) {
	t := time.NewTicker(n.b.cfg.HeartbeatPeriod)
	defer t.Stop()
	for {
		if rc := n.currentRemote(); rc != nil {
			if err := heartbeat(ctx, rc, n.b.cfg.ClusterID, n.b.cfg.HeartbeatLease); err != nil && ctx.Err() == nil {
				n.log.V(1).Info("heartbeat lease not renewed", "err", err.Error())
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// heartbeat creates or renews the heartbeat Lease in rc's namespace.
func heartbeat(ctx context.Context, rc *remoteCluster, holder string, lease time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	leases := rc.client.CoordinationV1().Leases(rc.namespace)
	now := metav1.NowMicro()
	l, err := leases.Get(ctx, rbv1.RequesterHeartbeatLease, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		_, err = leases.Create(ctx, &coordinationv1.Lease{
			ObjectMeta: metav1.ObjectMeta{Name: rbv1.RequesterHeartbeatLease, Namespace: rc.namespace,
				Labels: map[string]string{rbv1.ManagedByLabel: rbv1.ManagedByValue}},
			Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To(holder), LeaseDurationSeconds: ptr.To(int32(max(lease.Seconds(), 1))),
				AcquireTime: &now, RenewTime: &now},
		}, metav1.CreateOptions{})
		return err
	}
	if err != nil {
		return err
	}
	l.Spec.HolderIdentity, l.Spec.RenewTime = ptr.To(holder), &now
	l.Spec.LeaseDurationSeconds = ptr.To(int32(max(lease.Seconds(), 1)))
	_, err = leases.Update(ctx, l, metav1.UpdateOptions{})
	return err
}
