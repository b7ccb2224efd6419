package server_test

import (
	"context"
	"net/http"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/fluidos-project/resource-broker/broker/api"
	"github.com/fluidos-project/resource-broker/internal/brokertest"
)

// Preferences through the API (real broker, real redis-server, mutual TLS):
// ordered spillover decided by reserve.lua, its outcome in the reply and
// the audit, the policy's defaults, and the refusals at the edge.

// preferenceFederation advertises four providers of 16 cores: berlin the
// cheapest (the decision's choice without preferences), paris the dearest
// (region eu-west, tier gold), lyon (eu-west), and naples (eu-south), too
// small for any request of these tests.
func preferenceFederation(t *testing.T, b *brokertest.Broker) {
	t.Helper()
	b.Advertise("berlin", "16", "64Gi", "", "0.02", map[string]string{"region": "eu-central"})
	b.Advertise("paris", "16", "64Gi", "", "0.05", map[string]string{"region": "eu-west", "tier": "gold"})
	b.Advertise("lyon", "16", "64Gi", "", "0.04", map[string]string{"region": "eu-west"})
	b.Advertise("naples", "1", "4Gi", "", "0.01", map[string]string{"region": "eu-south"})
}

// reserveWith posts reservation id of 2 cores as cn with prefs and selector
// (nil: none), expects it placed, releases it (so that every decision of a
// test sees the same free capacity) and returns it with its audit entry.
func reserveWith(t *testing.T, b *brokertest.Broker, cn, id string, selector map[string]string, prefs []api.Preference) (api.Reservation, map[string]any) {
	t.Helper()
	req := reservation(id, "2", "4Gi")
	req.Preferences = prefs
	if selector != nil {
		req.Selector = &api.LabelSelector{MatchLabels: selector}
	}
	code, data := b.Do(cn, http.MethodPost, "/api/v2/reservations", req)
	require.Equal(t, http.StatusCreated, code, "%s", data)
	r := brokertest.Decode[api.Reservation](t, data)
	entries, err := b.RDB.XRevRangeN(context.Background(), b.Store.Key("audit"), "+", "-", 1).Result()
	require.NoError(t, err)
	require.Len(t, entries, 1)
	require.Equal(t, id, entries[0].Values["reservation"])
	code, data = b.Do(cn, http.MethodDelete, "/api/v2/reservations/"+id, nil)
	require.Equal(t, http.StatusOK, code, "%s", data)
	return r, entries[0].Values
}

// wonBy asserts that term (its index as given) of weight placed r, after
// the terms tried before it, as the reply and the audit say.
func wonBy(t *testing.T, r api.Reservation, audit map[string]any, term int, weight int32, tried []int, auditTried string) {
	t.Helper()
	require.NotNil(t, r.Preference, "the reply says how the preferences placed it")
	require.NotNil(t, r.Preference.Term, "a term won: %+v", r.Preference)
	require.Equal(t, term, *r.Preference.Term)
	require.Equal(t, weight, r.Preference.Weight)
	require.Equal(t, tried, r.Preference.Tried)
	require.False(t, r.Preference.NoneFitting)
	require.Equal(t, strconv.Itoa(term), audit["preference"])
	require.Equal(t, strconv.Itoa(int(weight)), audit["preference_weight"])
	require.Equal(t, auditTried, audit["preferences_tried"])
}

// noneFitting asserts that no term of r had a fitting provider.
func noneFitting(t *testing.T, r api.Reservation, audit map[string]any, tried []int, auditTried string) {
	t.Helper()
	require.NotNil(t, r.Preference)
	require.True(t, r.Preference.NoneFitting, "%+v", r.Preference)
	require.Nil(t, r.Preference.Term)
	require.Equal(t, tried, r.Preference.Tried)
	require.Equal(t, "none", audit["preference"])
	require.NotContains(t, audit, "preference_weight")
	require.Equal(t, auditTried, audit["preferences_tried"])
}

func TestPreferencesOrderThePlacement(t *testing.T) {
	b := brokertest.Start(t, brokertest.Options{})
	preferenceFederation(t, b)

	// Without preferences the cheapest wins; the reply and audit say nothing of preferences.
	r, audit := reserveWith(t, b, "rome", "plain", nil, nil)
	require.Equal(t, "berlin", r.Provider)
	require.Nil(t, r.Preference)
	require.NotContains(t, audit, "preference")

	t.Run("the preferred provider wins though dearer", func(t *testing.T) {
		r, audit := reserveWith(t, b, "rome", "dearer", nil, []api.Preference{{Weight: 100, MatchLabels: map[string]string{"tier": "gold"}}})
		require.Equal(t, "paris", r.Provider)
		wonBy(t, r, audit, 0, 100, []int{0}, "0")
		require.Len(t, r.Candidates, 1, "scored among the term's fitting providers only")
	})
	t.Run("a term too small for the request gives way to the next", func(t *testing.T) {
		r, audit := reserveWith(t, b, "rome", "next", nil, []api.Preference{
			{Weight: 100, MatchLabels: map[string]string{"region": "eu-south"}},
			{Weight: 50, MatchLabels: map[string]string{"region": "eu-west"}},
		})
		require.Equal(t, "lyon", r.Provider, "the cheaper of the second term's two")
		wonBy(t, r, audit, 1, 50, []int{0, 1}, "0,1")
	})
	t.Run("no term fits: the best provider overall", func(t *testing.T) {
		r, audit := reserveWith(t, b, "rome", "overall", nil, []api.Preference{
			{Weight: 100, MatchLabels: map[string]string{"region": "eu-south"}},
			{Weight: 50, MatchLabels: map[string]string{"region": "mars"}},
			{Weight: 70, Clusters: []string{"naples", "gone"}},
		})
		require.Equal(t, "berlin", r.Provider)
		noneFitting(t, r, audit, []int{0, 2, 1}, "0,2,1")
	})
	t.Run("by cluster name, highest weight first", func(t *testing.T) {
		r, audit := reserveWith(t, b, "rome", "named", nil, []api.Preference{
			{Weight: 10, Clusters: []string{"paris"}},
			{Weight: 90, Clusters: []string{"lyon", "rome"}},
		})
		require.Equal(t, "lyon", r.Provider)
		wonBy(t, r, audit, 1, 90, []int{1}, "1")
	})
	t.Run("equal weights in the order given", func(t *testing.T) {
		r, audit := reserveWith(t, b, "rome", "ties", nil, []api.Preference{
			{Weight: 40, Clusters: []string{"paris"}},
			{Weight: 40, Clusters: []string{"lyon"}},
		})
		require.Equal(t, "paris", r.Provider)
		wonBy(t, r, audit, 0, 40, []int{0}, "0")
	})
	t.Run("labels and clusters: listed and labelled", func(t *testing.T) {
		// berlin is listed but not in eu-west, paris in eu-west but not listed.
		r, audit := reserveWith(t, b, "rome", "both", nil, []api.Preference{
			{Weight: 100, MatchLabels: map[string]string{"region": "eu-west"}, Clusters: []string{"berlin", "lyon"}},
		})
		require.Equal(t, "lyon", r.Provider)
		wonBy(t, r, audit, 0, 100, []int{0}, "0")
	})
	t.Run("a term conflicting with the selector matches nothing", func(t *testing.T) {
		eu := map[string]string{"region": "eu-west"}
		r, audit := reserveWith(t, b, "rome", "conflict", eu, []api.Preference{
			{Weight: 100, MatchLabels: map[string]string{"region": "eu-central"}}, // berlin, which the selector excludes
			{Weight: 50, Clusters: []string{"berlin", "paris"}},
		})
		require.Equal(t, "paris", r.Provider, "the second term, within the selector")
		wonBy(t, r, audit, 1, 50, []int{0, 1}, "0,1")

		r, audit = reserveWith(t, b, "rome", "conflict-only", eu, []api.Preference{
			{Weight: 100, MatchLabels: map[string]string{"region": "eu-central"}},
		})
		require.Equal(t, "lyon", r.Provider, "none fitting: the selector's best")
		noneFitting(t, r, audit, []int{0}, "0")
	})
	t.Run("a replay answers the first decision", func(t *testing.T) {
		req := reservation("replayed", "2", "4Gi")
		req.Preferences = []api.Preference{{Weight: 100, Clusters: []string{"paris"}}}
		for range 2 {
			code, data := b.Do("rome", http.MethodPost, "/api/v2/reservations", req)
			require.Contains(t, []int{http.StatusOK, http.StatusCreated}, code, "%s", data)
			r := brokertest.Decode[api.Reservation](t, data)
			require.Equal(t, "paris", r.Provider)
			require.NotNil(t, r.Preference)
			require.Equal(t, 0, *r.Preference.Term)
		}
		code, data := b.Do("rome", http.MethodGet, "/api/v2/reservations/replayed", nil)
		require.Equal(t, http.StatusOK, code)
		require.Equal(t, 100, int(brokertest.Decode[api.Reservation](t, data).Preference.Weight))
	})
	require.NoError(t, b.Store.CheckInvariant(context.Background()))
}

// TestPreferencesPolicyDefaults: a requester's default preferences (the
// policy's default, or its own override) place the requests that carry
// none; a request's own replace them.
func TestPreferencesPolicyDefaults(t *testing.T) {
	b := startWithPolicy(t, `requesters:
  default:
    preferences: [{weight: 100, clusters: [paris]}]
  clusters:
    rome:
      preferences:
      - {weight: 100, matchLabels: {region: eu-south}}
      - {weight: 60, clusters: [lyon]}
    oslo: {preferences: []}
`)
	preferenceFederation(t, b)

	r, audit := reserveWith(t, b, "milan", "default", nil, nil)
	require.Equal(t, "paris", r.Provider, "the policy's default preferences")
	wonBy(t, r, audit, 0, 100, []int{0}, "0")

	r, audit = reserveWith(t, b, "rome", "override", nil, nil)
	require.Equal(t, "lyon", r.Provider, "rome's own defaults: naples (eu-south) is too small, then lyon")
	wonBy(t, r, audit, 1, 60, []int{0, 1}, "0,1")

	r, audit = reserveWith(t, b, "rome", "own", nil, []api.Preference{{Weight: 5, Clusters: []string{"berlin"}}})
	require.Equal(t, "berlin", r.Provider, "the request's preferences replace the defaults")
	wonBy(t, r, audit, 0, 5, []int{0}, "0")

	r, _ = reserveWith(t, b, "oslo", "cleared", nil, nil)
	require.Equal(t, "berlin", r.Provider, "an override of no preferences clears the default")
	require.Nil(t, r.Preference)
}

// TestPreferencesRefusedAtTheEdge: invalid preferences are refused with a
// 400 naming the field, and nothing is written to Redis; so are a group's.
func TestPreferencesRefusedAtTheEdge(t *testing.T) {
	b := brokertest.Start(t, brokertest.Options{})
	preferenceFederation(t, b)
	ok := api.Preference{Weight: 1, Clusters: []string{"paris"}}
	nine := make([]api.Preference, 9)
	for i := range nine {
		nine[i] = ok
	}
	before := b.Snapshot()
	for _, tc := range []struct {
		name  string
		prefs []api.Preference
		want  string
	}{
		{"weight 0", []api.Preference{ok, {Weight: 0, Clusters: []string{"paris"}}}, "preferences[1].weight: 0, must be 1 to 100"},
		{"weight 101", []api.Preference{{Weight: 101, Clusters: []string{"paris"}}}, "preferences[0].weight: 101, must be 1 to 100"},
		{"nine terms", nine, "preferences: 9 terms, at most 8"},
		{"bad label key", []api.Preference{{Weight: 5, MatchLabels: map[string]string{"not a key": "x"}}}, `preferences[0].matchLabels: key "not a key"`},
		{"bad label value", []api.Preference{ok, ok, {Weight: 5, MatchLabels: map[string]string{"region": "eu west"}}}, "preferences[2].matchLabels[region]"},
		{"bad cluster id", []api.Preference{{Weight: 5, Clusters: []string{"paris", "Not_A_Label"}}}, `preferences[0].clusters[1]: invalid cluster id "Not_A_Label"`},
		{"empty term", []api.Preference{ok, {Weight: 5}}, "preferences[1]: an empty term"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req := reservation("refused", "2", "4Gi")
			req.Preferences = tc.prefs
			code, data := b.Do("rome", http.MethodPost, "/api/v2/reservations", req)
			require.Equal(t, http.StatusBadRequest, code, "%s", data)
			e := brokertest.Decode[api.Error](t, data)
			require.Equal(t, api.ReasonBadRequest, e.Reason)
			require.Contains(t, e.Error, tc.want)
		})
	}
	t.Run("a group", func(t *testing.T) {
		code, data := b.Do("rome", http.MethodPost, "/api/v2/groups", api.GroupRequest{
			Group: "gang", MinMember: 1, Preferences: []api.Preference{ok},
			Members: []api.GroupMember{{ID: "m0", Resources: brokertest.Quantities("1", "1Gi", "")}},
		})
		require.Equal(t, http.StatusBadRequest, code, "%s", data)
		require.Contains(t, brokertest.Decode[api.Error](t, data).Error, "preferences: groups do not take preferences yet")
	})
	require.Equal(t, before, b.Snapshot(), "a refused request writes nothing")
}
