package resourcebroker

import (
	"cmp"
	"encoding/json"
	"fmt"
	"slices"

	v1 "k8s.io/api/core/v1"

	brokerv1alpha1 "github.com/fluidos-project/resource-broker/api/v1alpha1"
)

// MaxProviderPreferences is how many preference terms a reservation carries
// (the broker's bound).
const MaxProviderPreferences = 8

// PreferencesAnnotation on a namespace holds the provider preferences of its
// pods that have none of their own (no preferred node affinity the broker
// can match): a JSON list of terms as in spec.providerPreferences, e.g.
// [{"weight":80,"matchLabels":{"topology.kubernetes.io/region":"eu-south"}},{"weight":20,"clusters":["paris"]}].
const PreferencesAnnotation = "broker.fluidos.eu/provider-preferences"

// namespacePreferences reads the namespace's provider preferences (none:
// nil); a malformed annotation is an error, and no preferences.
func (pl *ResourceBroker) namespacePreferences(namespace string) ([]brokerv1alpha1.ProviderPreference, error) {
	if pl.nsLister == nil {
		return nil, nil
	}
	ns, err := pl.nsLister.Get(namespace)
	if err != nil {
		return nil, nil // not in the cache yet: as if none
	}
	return parsePreferences(ns.Annotations[PreferencesAnnotation])
}

// parsePreferences decodes and checks a PreferencesAnnotation value, by the
// bounds of spec.providerPreferences, and orders the terms as the pod's.
func parsePreferences(raw string) ([]brokerv1alpha1.ProviderPreference, error) {
	if raw == "" {
		return nil, nil
	}
	var terms []brokerv1alpha1.ProviderPreference
	if err := json.Unmarshal([]byte(raw), &terms); err != nil {
		return nil, fmt.Errorf("annotation %s: %w", PreferencesAnnotation, err)
	}
	if len(terms) > MaxProviderPreferences {
		return nil, fmt.Errorf("annotation %s: %d terms, at most %d", PreferencesAnnotation, len(terms), MaxProviderPreferences)
	}
	for i, t := range terms {
		switch {
		case t.Weight < 1 || t.Weight > 100:
			return nil, fmt.Errorf("annotation %s: term %d: weight %d, want 1 to 100", PreferencesAnnotation, i, t.Weight)
		case len(t.MatchLabels) == 0 && len(t.Clusters) == 0:
			return nil, fmt.Errorf("annotation %s: term %d names neither matchLabels nor clusters", PreferencesAnnotation, i)
		case len(t.MatchLabels) > 16 || len(t.Clusters) > 64:
			return nil, fmt.Errorf("annotation %s: term %d: at most 16 matchLabels and 64 clusters", PreferencesAnnotation, i)
		}
	}
	byWeight(terms)
	return terms, nil
}

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
	byWeight(out)
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

// byWeight orders terms by weight, highest first; stable: equal weights
// keep the order given, which the broker keeps too.
func byWeight(terms []brokerv1alpha1.ProviderPreference) {
	slices.SortStableFunc(terms, func(a, b brokerv1alpha1.ProviderPreference) int { return cmp.Compare(b.Weight, a.Weight) })
}
