package api_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/fluidos-project/resource-broker/broker/api"
	"github.com/fluidos-project/resource-broker/broker/model"
)

// TestMaxQuantity: the bound in the API's units is 2^53-1 in the store's
// unit of each resource.
func TestMaxQuantity(t *testing.T) {
	for res, want := range map[string]string{
		"cpu": "9007199254740991m", "memory": "9007199254740991", "gpu": "9007199254740991", "storage": "9007199254740991",
	} {
		q := model.MaxQuantity(res)
		assert.Equal(t, want, q.String(), res)
	}
	most := int64(model.MaxAmount)
	assert.Equal(t, most, int64(float64(most)), "a double holds 2^53-1")
	assert.NotEqual(t, most+2, int64(float64(most+2)), "but not 2^53+1")
}

// TestToResourcesExactRange: each resource is accepted up to 2^53-1 in the
// store's unit and refused one unit above, naming the field and the bound;
// quantities far beyond int64 are refused the same way (never converted).
func TestToResourcesExactRange(t *testing.T) {
	ok := []struct {
		res, q string
		want   int64
	}{
		{"cpu", "9007199254740991m", model.MaxAmount},
		{"cpu", "9007199254740.991", model.MaxAmount},
		{"cpu", "9007199254740990.5m", model.MaxAmount}, // rounded up, still exact
		{"memory", "9007199254740991", model.MaxAmount},
		{"gpu", "9007199254740991", model.MaxAmount},
		{"storage", "9007199254740991", model.MaxAmount},
		{"storage", "7Pi", 7 << 50},
	}
	for _, c := range ok {
		got, err := quantities(c.res, c.q).ToResources("f")
		require.NoError(t, err, "%s %s", c.res, c.q)
		assert.Equal(t, c.want, amountOf(got, c.res), "%s %s", c.res, c.q)
	}

	for _, c := range []struct{ res, q, want string }{
		{"cpu", "9007199254740992m", "f.cpu: 9007199254740992m is above the largest amount the broker holds exactly (9007199254740991m)"},
		{"cpu", "9007199254740993m", "f.cpu: 9007199254740993m is above the largest amount the broker holds exactly (9007199254740991m)"},
		{"cpu", "9007199254740991.5m", "f.cpu: 9007199254740991500u is above"},
		{"cpu", "9007199254741", "f.cpu: 9007199254741 is above"},
		{"cpu", "1e30", "f.cpu: 1e30 is above"},
		{"memory", "8Pi", "f.memory: 8Pi is above the largest amount the broker holds exactly (9007199254740991)"},
		{"memory", "9007199254740992", "f.memory: 9007199254740992 is above"},
		{"gpu", "9007199254740992", "f.gpu: 9007199254740992 is above"},
		{"storage", "1Ei", "f.storage: 1Ei is above"},
	} {
		_, err := quantities(c.res, c.q).ToResources("f")
		require.Error(t, err, "%s %s", c.res, c.q)
		assert.Contains(t, err.Error(), c.want)
	}
}

// TestAdvertisementExactRange: the bound holds in every place an
// advertisement carries an amount, the nodes' figures included, and the
// error names the place.
func TestAdvertisementExactRange(t *testing.T) {
	ok := api.Quantities{CPU: resource.NewQuantity(8, resource.DecimalSI), Memory: resource.NewQuantity(1<<30, resource.BinarySI)}
	big := api.Quantities{CPU: resource.NewMilliQuantity(model.MaxAmount+2, resource.DecimalSI), Memory: ok.Memory}
	most := api.Quantities{CPU: resource.NewMilliQuantity(model.MaxAmount, resource.DecimalSI), Memory: ok.Memory}
	node := func(q api.Quantities) []api.NodeResources {
		return []api.NodeResources{{Name: "n0", Allocatable: ok, Allocated: api.Quantities{}}, {Name: "n1", Allocatable: q, Allocated: api.Quantities{}}}
	}
	for _, c := range []struct {
		name string
		res  api.ClusterResources
		want string
	}{
		{"capacity", api.ClusterResources{Capacity: big, Allocatable: ok}, "resources.capacity.cpu"},
		{"allocatable", api.ClusterResources{Capacity: ok, Allocatable: big}, "resources.allocatable.cpu"},
		{"allocated", api.ClusterResources{Capacity: ok, Allocatable: ok, Allocated: big}, "resources.allocated.cpu"},
		{"a node", api.ClusterResources{Capacity: ok, Allocatable: ok, Nodes: node(big)}, "resources.nodes[1].allocatable.cpu"},
	} {
		_, err := api.Advertisement{Resources: c.res}.ToStore()
		require.Error(t, err, c.name)
		assert.Contains(t, err.Error(), c.want+": 9007199254740993m is above the largest amount the broker holds exactly (9007199254740991m)", c.name)

		_, err = api.V1Advertisement{Resources: api.V1Resources{Capacity: c.res.Capacity, Allocatable: c.res.Allocatable, Allocated: c.res.Allocated}}.ToStore()
		if c.res.Nodes == nil {
			assert.ErrorContains(t, err, c.want, "v1 %s", c.name)
		}
	}

	ad, err := api.Advertisement{Resources: api.ClusterResources{Capacity: most, Allocatable: most, Allocated: most, Nodes: node(most)}}.ToStore()
	require.NoError(t, err)
	assert.Equal(t, int64(model.MaxAmount), ad.Allocatable.CPU)
	assert.Equal(t, int64(model.MaxAmount), ad.Nodes[1].Allocatable.CPU)
}

// TestRequestsExactRange: v2 and v1 reservations and group members are
// bounded as advertisements are.
func TestRequestsExactRange(t *testing.T) {
	big := api.Quantities{CPU: resource.NewQuantity(1, resource.DecimalSI), Memory: resource.NewQuantity(model.MaxAmount+1, resource.DecimalSI)}
	const above = ": 9007199254740992 is above the largest amount the broker holds exactly (9007199254740991)"
	_, err := api.ReservationRequest{ID: "r1", Resources: big}.ToStore("rome", limits)
	assert.ErrorContains(t, err, "resources.memory"+above)
	_, err = api.V1ReservationRequest{RequestedResources: big}.ToStore("r1", "rome", limits)
	assert.ErrorContains(t, err, "requestedResources.memory"+above)
	_, err = api.GroupRequest{Group: "g", MinMember: 1, Members: []api.GroupMember{{ID: "m-1", Resources: big}}}.ToStore("rome", limits)
	assert.ErrorContains(t, err, "members[m-1].resources.memory"+above)

	most := api.Quantities{CPU: resource.NewQuantity(1, resource.DecimalSI), Memory: resource.NewQuantity(model.MaxAmount, resource.BinarySI)}
	r, err := api.ReservationRequest{ID: "r1", Resources: most}.ToStore("rome", limits)
	require.NoError(t, err)
	assert.Equal(t, int64(model.MaxAmount), r.Resources.Memory)
}

func quantities(res, s string) api.Quantities {
	q := resource.MustParse(s)
	switch res {
	case "cpu":
		return api.Quantities{CPU: &q}
	case "memory":
		return api.Quantities{Memory: &q}
	case "gpu":
		return api.Quantities{GPU: &q}
	}
	return api.Quantities{Storage: &q}
}

func amountOf(r model.Resources, res string) int64 {
	return map[string]int64{"cpu": r.CPU, "memory": r.Memory, "gpu": r.GPU, "storage": r.Storage}[res]
}
