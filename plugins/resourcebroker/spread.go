package resourcebroker

import (
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	brokerv1alpha1 "github.com/fluidos-project/resource-broker/api/v1alpha1"
)

// spreadOf turns the pod's first topologySpreadConstraint over a label that
// providers advertise (ProviderSelectorLabels: zone, region, ...) into its
// Reservation's spread: the broker then spreads the replicas that constraint
// selects over the providers' domains, as kube-scheduler spreads them over
// the nodes' (the virtual nodes carry their provider's labels, so
// PodTopologySpread's own filter agrees). nil: no such constraint.
// The replicas counted together are the constraint's: the pods of the
// namespace its label selector matches.
func spreadOf(pod *v1.Pod) *brokerv1alpha1.ReservationSpread {
	for _, c := range pod.Spec.TopologySpreadConstraints {
		if !providerSelectorLabels.Has(c.TopologyKey) || c.LabelSelector == nil {
			continue
		}
		sel, err := metav1.LabelSelectorAsSelector(c.LabelSelector)
		if err != nil {
			continue // the API server validated it; nothing to spread by otherwise
		}
		when := string(c.WhenUnsatisfiable)
		if when == "" {
			when = string(v1.DoNotSchedule)
		}
		return &brokerv1alpha1.ReservationSpread{Group: pod.Namespace + "/" + sel.String() + "/" + c.TopologyKey,
			TopologyKey: c.TopologyKey, MaxSkew: max(c.MaxSkew, 1), WhenUnsatisfiable: when}
	}
	return nil
}
