package resourcebroker

import (
	"testing"

	"github.com/stretchr/testify/assert"
	v1 "k8s.io/api/core/v1"

	brokerv1alpha1 "github.com/fluidos-project/resource-broker/api/v1alpha1"
)

func TestProviderPreferences(t *testing.T) {
	in := func(key string, values ...string) v1.NodeSelectorRequirement {
		return v1.NodeSelectorRequirement{Key: key, Operator: v1.NodeSelectorOpIn, Values: values}
	}
	term := func(w int32, exprs ...v1.NodeSelectorRequirement) v1.PreferredSchedulingTerm {
		return v1.PreferredSchedulingTerm{Weight: w, Preference: v1.NodeSelectorTerm{MatchExpressions: exprs}}
	}
	pod := func(terms ...v1.PreferredSchedulingTerm) *v1.Pod {
		return &v1.Pod{Spec: v1.PodSpec{Affinity: &v1.Affinity{NodeAffinity: &v1.NodeAffinity{PreferredDuringSchedulingIgnoredDuringExecution: terms}}}}
	}
	region := v1.LabelTopologyRegion
	for _, tc := range []struct {
		name string
		pod  *v1.Pod
		want []brokerv1alpha1.ProviderPreference
	}{
		{"none", &v1.Pod{}, nil},
		{"by weight, highest first; equal weights in the pod's order",
			pod(term(20, in(brokerv1alpha1.ProviderLabel, "paris")), term(80, in(region, "eu-south")), term(20, in(region, "eu-west"))),
			[]brokerv1alpha1.ProviderPreference{
				{Weight: 80, MatchLabels: map[string]string{region: "eu-south"}},
				{Weight: 20, Clusters: []string{"paris"}},
				{Weight: 20, MatchLabels: map[string]string{region: "eu-west"}},
			}},
		{"labels and clusters in one term",
			pod(term(50, in(region, "eu-west"), in(brokerv1alpha1.ProviderLabel, "paris", "lyon"))),
			[]brokerv1alpha1.ProviderPreference{{Weight: 50, MatchLabels: map[string]string{region: "eu-west"}, Clusters: []string{"paris", "lyon"}}}},
		{"terms the broker cannot match are left out",
			pod(term(90, in("disktype", "ssd")),
				term(80, v1.NodeSelectorRequirement{Key: region, Operator: v1.NodeSelectorOpNotIn, Values: []string{"eu-west"}}),
				term(70, in(region, "eu-west", "eu-south")),
				term(60, in(region, "eu-west"), in(region, "eu-south")),
				term(10, in(region, "eu-central"))),
			[]brokerv1alpha1.ProviderPreference{{Weight: 10, MatchLabels: map[string]string{region: "eu-central"}}}},
	} {
		t.Run(tc.name, func(t *testing.T) { assert.Equal(t, tc.want, providerPreferences(tc.pod)) })
	}
	var many []v1.PreferredSchedulingTerm
	for w := int32(1); w <= 10; w++ {
		many = append(many, term(w, in(brokerv1alpha1.ProviderLabel, "c")))
	}
	got := providerPreferences(pod(many...))
	assert.Len(t, got, MaxProviderPreferences)
	assert.Equal(t, int32(10), got[0].Weight)
	assert.Equal(t, int32(3), got[len(got)-1].Weight, "the lowest weights left out")
}

func TestParsePreferences(t *testing.T) {
	got, err := parsePreferences(`[{"weight":20,"clusters":["paris"]},{"weight":80,"matchLabels":{"topology.kubernetes.io/region":"eu-south"}}]`)
	assert.NoError(t, err)
	assert.Equal(t, []brokerv1alpha1.ProviderPreference{
		{Weight: 80, MatchLabels: map[string]string{v1.LabelTopologyRegion: "eu-south"}},
		{Weight: 20, Clusters: []string{"paris"}},
	}, got)
	got, err = parsePreferences("")
	assert.NoError(t, err)
	assert.Nil(t, got)
	for raw, want := range map[string]string{
		`{"weight":1}`:                    "cannot unmarshal",
		`[{"weight":0,"clusters":["a"]}]`: "term 0: weight 0, want 1 to 100",
		`[{"weight":5}]`:                  "term 0 names neither matchLabels nor clusters",
		`[{"weight":5,"clusters":["a"]},{"weight":5,"clusters":["a"]},{"weight":5,"clusters":["a"]},{"weight":5,"clusters":["a"]},{"weight":5,"clusters":["a"]},{"weight":5,"clusters":["a"]},{"weight":5,"clusters":["a"]},{"weight":5,"clusters":["a"]},{"weight":5,"clusters":["a"]}]`: "9 terms, at most 8",
	} {
		_, err := parsePreferences(raw)
		assert.ErrorContains(t, err, want, raw)
	}
}
