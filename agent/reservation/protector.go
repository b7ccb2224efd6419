package reservation

import (
	"context"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/fluidos-project/resource-broker/agent/metrics"
	rbv1 "github.com/fluidos-project/resource-broker/api/v1alpha1"
	"github.com/fluidos-project/resource-broker/broker/api"
)

// DefaultProtectInterval is Protector.Interval's default: well within the
// minute a report holds at the broker.
const DefaultProtectInterval = 10 * time.Second

// ProtectBroker is what the Protector needs of the broker client.
type ProtectBroker interface {
	Protect(ctx context.Context, ids []string) (api.ProtectResponse, error)
}

// Protector reports to the broker, every Interval, which of this cluster's
// live reservations hold a pod that a PodDisruptionBudget protects now (its
// status allows no disruption): the broker never preempts those. A report
// replaces the previous one and holds a minute at the broker.
type Protector struct {
	Client   client.Client // Reservations and PodDisruptionBudgets (cached)
	Pods     client.Reader // the pods (the manager caches only reservation pods)
	Broker   ProtectBroker
	Interval time.Duration
	Log      logr.Logger
}

// NeedLeaderElection: one report per cluster.
func (p *Protector) NeedLeaderElection() bool { return true }

// Start reports until ctx ends.
func (p *Protector) Start(ctx context.Context) error {
	if p.Interval <= 0 {
		p.Interval = DefaultProtectInterval
	}
	t := time.NewTicker(p.Interval)
	defer t.Stop()
	for {
		ids, err := p.Protected(ctx)
		if err == nil {
			_, err = p.Broker.Protect(ctx, ids)
			metrics.BrokerCalls.WithLabelValues("protect", outcome(err)).Inc()
		}
		if err != nil && ctx.Err() == nil {
			p.Log.Info("could not report the reservations disruption budgets protect; the broker forgets the last report after a minute", "error", err.Error())
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// Protected lists the broker ids of the live reservations whose pod a
// PodDisruptionBudget of its namespace selects and allows no disruption now.
func (p *Protector) Protected(ctx context.Context) ([]string, error) {
	var rsvs rbv1.ReservationList
	if err := p.Client.List(ctx, &rsvs); err != nil {
		return nil, err
	}
	byNamespace := map[string][]*rbv1.Reservation{}
	for i := range rsvs.Items {
		r := &rsvs.Items[i]
		if r.Spec.PodName != "" && isLive(r.Status.Phase) {
			byNamespace[r.Namespace] = append(byNamespace[r.Namespace], r)
		}
	}
	var ids []string
	for ns, rs := range byNamespace {
		var pdbs policyv1.PodDisruptionBudgetList
		if err := p.Client.List(ctx, &pdbs, client.InNamespace(ns)); err != nil {
			return nil, err
		}
		var blocking []labels.Selector
		for _, pdb := range pdbs.Items {
			if pdb.Status.DisruptionsAllowed > 0 || pdb.Spec.Selector == nil {
				continue
			}
			sel, err := metav1.LabelSelectorAsSelector(pdb.Spec.Selector)
			if err != nil || sel.Empty() {
				continue // an empty selector selects no pod (policy/v1)
			}
			blocking = append(blocking, sel)
		}
		if len(blocking) == 0 {
			continue
		}
		for _, r := range rs {
			var pod corev1.Pod
			if err := p.Pods.Get(ctx, client.ObjectKey{Namespace: ns, Name: r.Spec.PodName}, &pod); err != nil {
				if client.IgnoreNotFound(err) != nil {
					return nil, err
				}
				continue
			}
			for _, sel := range blocking {
				if sel.Matches(labels.Set(pod.Labels)) {
					ids = append(ids, string(r.UID))
					break
				}
			}
		}
	}
	return ids, nil
}
