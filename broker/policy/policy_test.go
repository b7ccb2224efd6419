package policy_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fluidos-project/resource-broker/broker/model"
	"github.com/fluidos-project/resource-broker/broker/policy"
)

const sample = `
apiVersion: broker.fluidos.eu/v1alpha1
kind: BrokerPolicy
requesters:
  default:
    maxReservations: 200
    maxResources: {cpu: "64", memory: 256Gi, gpu: "4"}
    maxPriority: 1000
    reservesPerSecond: 20
    reserveBurst: 40
  clusters:
    rome: {maxResources: {cpu: "128"}, reservesPerSecond: 2.5}
providers:
  default:
    maxCapacity: {cpu: "512", memory: 2Ti, gpu: "16", storage: 10Ti}
    prices:
      currencies: [EUR]
      cpu: {min: "0.005", max: "1"}
    labels:
      maxLabels: 3
      allowedKeys: [region, zone, "fluidos.eu/*"]
  clusters:
    paris:
      maxCapacity: {cpu: "64"}
      labels: {allowedValues: {region: [eu-west]}}
`

func ptr[T any](v T) *T { return &v }

func TestLimits(t *testing.T) {
	p, err := policy.Parse([]byte(sample))
	require.NoError(t, err)
	// An override sets only what it names: rome keeps the default memory,
	// gpu, count, ceiling and burst.
	assert.Equal(t, model.Limits{Reservations: ptr[int64](200), CPU: ptr[int64](128_000), Memory: ptr[int64](256 << 30),
		GPU: ptr[int64](4), Priority: ptr[int32](1000), Rate: 2.5, Burst: 40}, p.Limits("rome"))
	assert.Equal(t, model.Limits{Reservations: ptr[int64](200), CPU: ptr[int64](64_000), Memory: ptr[int64](256 << 30),
		GPU: ptr[int64](4), Priority: ptr[int32](1000), Rate: 20, Burst: 40}, p.Limits("lyon"), "the default")
	assert.Equal(t, []string{"paris", "rome"}, p.Clusters())

	// Without a burst, one second's worth of calls.
	p, err = policy.Parse([]byte("apiVersion: broker.fluidos.eu/v1alpha1\nkind: BrokerPolicy\nrequesters: {default: {reservesPerSecond: 2.5}}\n"))
	require.NoError(t, err)
	assert.Equal(t, model.Limits{Rate: 2.5, Burst: 3}, p.Limits("rome"))

	d := policy.Default()
	assert.Equal(t, model.Limits{Rate: 100, Burst: 200, Priority: ptr[int32](policy.HighestUserDefinablePriority)}, d.Limits("rome"),
		"without a file: a rate and the users' highest priority, no quota")
	assert.NoError(t, d.CheckAdvertisement("paris", model.Advertisement{Allocatable: model.Resources{CPU: 1 << 40}}), "no bounds")
}

// TestPreferences: a requester's default preferences are the default's
// unless its override names its own (an empty list: none).
func TestPreferences(t *testing.T) {
	p, err := policy.Parse([]byte(`apiVersion: broker.fluidos.eu/v1alpha1
kind: BrokerPolicy
requesters:
  default:
    maxReservations: 10
    preferences: [{weight: 100, matchLabels: {region: eu-south}}, {weight: 50, clusters: [paris]}]
  clusters:
    rome: {preferences: [{weight: 7, clusters: [lyon], matchLabels: {tier: gold}}]}
    oslo: {preferences: []}
    milan: {maxReservations: 3}
`))
	require.NoError(t, err)
	def := []model.Preference{{Weight: 100, Labels: map[string]string{"region": "eu-south"}}, {Weight: 50, Clusters: []string{"paris"}}}
	assert.Equal(t, def, p.Preferences("lyon"))
	assert.Equal(t, def, p.Preferences("milan"), "an override that names no preferences keeps the default's")
	assert.Equal(t, []model.Preference{{Weight: 7, Labels: map[string]string{"tier": "gold"}, Clusters: []string{"lyon"}}}, p.Preferences("rome"))
	assert.Empty(t, p.Preferences("oslo"))
	assert.Empty(t, policy.Default().Preferences("rome"))
}

func TestCheckAdvertisement(t *testing.T) {
	p, err := policy.Parse([]byte(sample))
	require.NoError(t, err)
	good := model.Advertisement{
		Capacity: model.Resources{CPU: 64_000, Memory: 128 << 30}, Allocatable: model.Resources{CPU: 60_000, Memory: 120 << 30},
		Prices: model.Prices{CPU: 30_000, Currency: "EUR"}, Labels: map[string]string{"region": "eu-west", "fluidos.eu/tier": "gold"},
	}
	require.NoError(t, p.CheckAdvertisement("paris", good))
	require.NoError(t, p.CheckAdvertisement("berlin", good))

	for _, c := range []struct {
		name, cluster string
		change        func(*model.Advertisement)
		bound, msg    string
	}{
		{"capacity over the cluster's bound", "paris", func(a *model.Advertisement) { a.Capacity.CPU = 10_000_000 },
			"providers.clusters[paris].maxCapacity.cpu", "advertised capacity cpu 10k exceeds the most allowed, 64"},
		{"the default bound for another", "berlin", func(a *model.Advertisement) { a.Allocatable.CPU, a.Capacity.CPU = 600_000, 600_000 },
			"providers.default.maxCapacity.cpu", "advertised capacity cpu 600 exceeds the most allowed, 512"},
		{"a node over it", "paris", func(a *model.Advertisement) {
			a.Nodes = []model.NodeCapacity{{Name: "n1", Allocatable: model.Resources{Memory: 3 << 40}}}
		}, "providers.default.maxCapacity.memory", "node n1: advertised allocatable memory 3Ti exceeds the most allowed, 2Ti"},
		{"a free price", "paris", func(a *model.Advertisement) { a.Prices.CPU = 0 },
			"providers.default.prices.cpu.min", "advertised price of cpu 0 is below the least allowed, 5m"},
		{"a dear price", "paris", func(a *model.Advertisement) { a.Prices.CPU = 2_000_000 },
			"providers.default.prices.cpu.max", "advertised price of cpu 2 exceeds the most allowed, 1"},
		{"another currency", "paris", func(a *model.Advertisement) { a.Prices.Currency = "USD" },
			"providers.default.prices.currencies", `advertised currency "USD" is not one of EUR`},
		{"a key not allowed", "paris", func(a *model.Advertisement) { a.Labels = map[string]string{"gpu-model": "h100"} },
			"providers.default.labels.allowedKeys", "label gpu-model is not allowed (allowed: region, zone, fluidos.eu/*)"},
		{"a value not allowed", "paris", func(a *model.Advertisement) { a.Labels = map[string]string{"region": "us-east"} },
			"providers.clusters[paris].labels.allowedValues[region]", "label region=us-east is not allowed (allowed values: eu-west)"},
		{"too many labels", "berlin", func(a *model.Advertisement) {
			a.Labels = map[string]string{"region": "a", "zone": "b", "fluidos.eu/a": "c", "fluidos.eu/b": "d"}
		}, "providers.default.labels.maxLabels", "4 labels advertised, at most 3 allowed"},
	} {
		t.Run(c.name, func(t *testing.T) {
			ad := good
			c.change(&ad)
			err := p.CheckAdvertisement(c.cluster, ad)
			var be *model.BoundError
			require.ErrorAs(t, err, &be)
			assert.Equal(t, c.bound, be.Bound)
			assert.Equal(t, c.msg, be.Message)
		})
	}
}

// TestParseErrors: every mistake is refused at start, naming its field.
func TestParseErrors(t *testing.T) {
	head := "apiVersion: broker.fluidos.eu/v1alpha1\nkind: BrokerPolicy\n"
	for _, c := range []struct{ name, yaml, want string }{
		{"unknown field", head + "requesters: {default: {maxReservation: 3}}", `unknown field "requesters.default.maxReservation"`},
		{"miscased field", head + "requesters: {default: {MaxReservations: 3}}", `unknown field "requesters.default.MaxReservations"`},
		{"duplicate field", head + "requesters:\n  default: {maxReservations: 3}\n  default: {maxReservations: 4}\n", `key "default" already set`},
		{"wrong kind", "apiVersion: broker.fluidos.eu/v1alpha1\nkind: Policy\n", `kind: Unsupported value: "Policy"`},
		{"no apiVersion", "kind: BrokerPolicy\n", `apiVersion: Unsupported value: ""`},
		{"negative count", head + "requesters: {default: {maxReservations: -1}}", "requesters.default.maxReservations: Invalid value: -1: must not be negative"},
		{"bad quantity", head + "requesters: {default: {maxResources: {cpu: lots}}}", "quantities must match the regular expression"},
		{"fractional gpu", head + "requesters: {clusters: {rome: {maxResources: {gpu: 500m}}}}", `requesters.clusters[rome].maxResources.gpu: Invalid value: "500m": must be a whole number of devices`},
		{"cpu the scripts cannot hold exactly", head + "requesters: {default: {maxResources: {cpu: 9007199254740993m}}}",
			`requesters.default.maxResources.cpu: Invalid value: "9007199254740993m": is above the largest amount the broker holds exactly (9007199254740991m)`},
		{"capacity bound the scripts cannot hold exactly", head + "providers: {default: {maxCapacity: {memory: 8Pi}}}",
			`providers.default.maxCapacity.memory: Invalid value: "8Pi": is above the largest amount the broker holds exactly (9007199254740991)`},
		{"requester storage", head + "requesters: {default: {maxResources: {storage: 1Gi}}}", "requesters.default.maxResources.storage: Forbidden"},
		{"zero rate", head + "requesters: {default: {reservesPerSecond: 0}}", "requesters.default.reservesPerSecond: Invalid value: 0: must be a positive number"},
		{"burst without rate", head + "requesters: {clusters: {rome: {reserveBurst: 5}}}", "requesters.clusters[rome].reservesPerSecond: Required value: reserveBurst needs a rate"},
		{"bad cluster id", head + "providers: {clusters: {Paris_1: {}}}", `providers.clusters[Paris_1]: Invalid value: "Paris_1": a cluster id`},
		{"bad currency", head + "providers: {default: {prices: {currencies: [euro]}}}", `providers.default.prices.currencies[0]: Invalid value: "euro"`},
		{"min above max", head + "providers:\n  default: {prices: {cpu: {max: \"0.5\"}}}\n  clusters: {paris: {prices: {cpu: {min: \"1\"}}}}\n",
			"providers.clusters[paris].prices.cpu: Invalid value: \"min 1 (providers.clusters[paris].prices.cpu.min), max 500m (providers.default.prices.cpu.max)\": the minimum exceeds the maximum"},
		{"bad label key", head + "providers: {default: {labels: {allowedKeys: [\"no spaces\"]}}}", `providers.default.labels.allowedKeys[0]: Invalid value: "no spaces"`},
		{"preference weight", head + "requesters: {default: {preferences: [{weight: 0, clusters: [paris]}]}}", "requesters.default.preferences[0].weight: 0, must be 1 to 100"},
		{"empty preference", head + "requesters: {clusters: {rome: {preferences: [{weight: 5, clusters: [paris]}, {weight: 5}]}}}", "requesters.clusters[rome].preferences[1]: an empty term"},
		{"preference cluster id", head + "requesters: {clusters: {rome: {preferences: [{weight: 5, clusters: [Paris]}]}}}", `requesters.clusters[rome].preferences[0].clusters[0]: invalid cluster id "Paris"`},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := policy.Parse([]byte(c.yaml))
			require.Error(t, err)
			assert.Contains(t, err.Error(), c.want)
		})
	}

	dir := t.TempDir()
	path := filepath.Join(dir, "policy.yaml")
	require.NoError(t, os.WriteFile(path, []byte(head+"requesters: {default: {maxReservations: -1}}"), 0o600))
	_, err := policy.Load(path)
	assert.ErrorContains(t, err, "policy file "+path+": requesters.default.maxReservations")
	_, err = policy.Load(filepath.Join(dir, "missing.yaml"))
	assert.ErrorContains(t, err, "no such file")
}
