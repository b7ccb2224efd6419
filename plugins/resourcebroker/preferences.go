package resourcebroker

import (
	"cmp"
	"slices"

	v1 "k8s.io/api/core/v1"

	brokerv1alpha1 "github.com/fluidos-project/resource-broker/api/v1alpha1"
)

// MaxProviderPreferences is how many preference terms a reservation carries
// (the broker's bound).
const MaxProviderPreferences = 8

// providerPreferences reads the pod's preferred node affinity as the
// broker's provider preferences (ordered spillover: a pod that prefers
// topology.kubernetes.io/region=eu-south with weight 80 and
// broker.fluidos.eu/provider In [paris] with weight 20 is placed in
// eu-south when a provider there fits, else at paris, else anywhere). A
// term becomes one preference when each of its expressions is one the
// broker can match: a provider label (ProviderSelectorLabels) In one value,
// or broker.fluidos.eu/provider In cluster ids. Other terms stay what they
// are for local nodes, a score, and are left out; so are all but the
// MaxProviderPreferences of highest weight.
func providerPreferences(pod *v1.Pod) []brokerv1alpha1.ProviderPreference {
	a := pod.Spec.Affinity
	if a == nil || a.NodeAffinity == nil {
		return nil
	}
	var out []brokerv1alpha1.ProviderPreference
	for _, t := range a.NodeAffinity.PreferredDuringSchedulingIgnoredDuringExecution {
		if p, ok := preferenceOf(t); ok {
			out = append(out, p)
		}
	}
	// Stable: equal weights keep the pod's order, which the broker keeps too.
	slices.SortStableFunc(out, func(a, b brokerv1alpha1.ProviderPreference) int { return cmp.Compare(b.Weight, a.Weight) })
	if len(out) > MaxProviderPreferences {
		out = out[:MaxProviderPreferences]
	}
	return out
}

// preferenceOf converts one preferred term, if the broker can match it.
func preferenceOf(t v1.PreferredSchedulingTerm) (brokerv1alpha1.ProviderPreference, bool) {
	p := brokerv1alpha1.ProviderPreference{Weight: t.Weight}
	if t.Weight < 1 || t.Weight > 100 || len(t.Preference.MatchFields) > 0 || len(t.Preference.MatchExpressions) == 0 {
		return p, false
	}
	for _, e := range t.Preference.MatchExpressions {
		switch {
		case e.Operator != v1.NodeSelectorOpIn || len(e.Values) == 0:
			return p, false
		case e.Key == brokerv1alpha1.ProviderLabel:
			if p.Clusters != nil || len(e.Values) > 64 {
				return p, false
			}
			p.Clusters = slices.Clone(e.Values)
		case providerSelectorLabels.Has(e.Key) && len(e.Values) == 1:
			if p.MatchLabels == nil {
				p.MatchLabels = map[string]string{}
			}
			if prev, ok := p.MatchLabels[e.Key]; ok && prev != e.Values[0] {
				return p, false // matches no node
			}
			p.MatchLabels[e.Key] = e.Values[0]
		default:
			return p, false
		}
	}
	return p, true
}
