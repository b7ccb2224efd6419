package policy_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fluidos-project/resource-broker/broker/model"
	"github.com/fluidos-project/resource-broker/broker/policy"
)

func TestMemberRates(t *testing.T) {
	assert.Equal(t, policy.DefaultMemberRates, policy.Default().Rates("rome"), "on without a file")

	p, err := policy.Parse([]byte(`apiVersion: broker.fluidos.eu/v1alpha1
kind: BrokerPolicy
requesters: {default: {reservesPerSecond: 5}}
members:
  default:
    advertisements: {perSecond: "2", burst: "4"}
    renewalBytes: {perSecond: 1Mi}
  clusters:
    bulk:
      renewedIDs: {perSecond: 10k, burst: 100k}
      writes: {perSecond: "0"}
`))
	require.NoError(t, err)
	want := policy.DefaultMemberRates
	want.Advertisements = model.Rate{PerSecond: 2, Burst: 4}
	want.RenewalBytes = model.Rate{PerSecond: 1 << 20, Burst: 1 << 20} // one second's worth
	assert.Equal(t, want, p.Rates("rome"), "a file that sets some rates keeps the defaults of the others")

	want.RenewedIDs = model.Rate{PerSecond: 10_000, Burst: 100_000}
	want.Writes = model.Rate{PerSecond: 0, Burst: 1} // no limit
	assert.Equal(t, want, p.Rates("bulk"), "an override sets only what it names, over the file's default")
	assert.Contains(t, p.Clusters(), "bulk")

	half, err := policy.Parse([]byte("apiVersion: broker.fluidos.eu/v1alpha1\nkind: BrokerPolicy\nmembers: {default: {protections: {perSecond: 500m}}}\n"))
	require.NoError(t, err)
	assert.Equal(t, model.Rate{PerSecond: 0.5, Burst: 1}, half.Rates("rome").Protections, "a fraction per second, a burst of at least 1")
}

func TestMemberRatesErrors(t *testing.T) {
	for body, mention := range map[string]string{
		"members: {default: {renewals: {perSecond: -1}}}":              "members.default.renewals.perSecond",
		"members: {default: {renewals: {perSecond: 1, burst: 0}}}":     "members.default.renewals.burst",
		"members: {clusters: {Bad_ID: {renewals: {perSecond: 1}}}}":    "members.clusters[Bad_ID]",
		"members: {default: {renewal: {perSecond: 1}}}":                `unknown field "members.default.renewal"`,
		"members: {default: {advertisements: {burst: 2}}}":             "perSecond",
		"members: {default: {writes: {perSecond: 1, burst: 1, x: 2}}}": `unknown field "members.default.writes.x"`,
	} {
		_, err := policy.Parse([]byte("apiVersion: broker.fluidos.eu/v1alpha1\nkind: BrokerPolicy\n" + body))
		if assert.Error(t, err, body) {
			assert.Contains(t, err.Error(), mention, body)
		}
	}
}
