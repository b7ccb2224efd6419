package store_test

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fluidos-project/resource-broker/broker/model"
	"github.com/fluidos-project/resource-broker/broker/store"
)

const zoneKey = "topology.kubernetes.io/zone"

func inZone(ad model.Advertisement, zone string) model.Advertisement {
	ad.Labels = map[string]string{zoneKey: zone}
	return ad
}

func replica(i int, sp *model.Spread) model.ReserveRequest {
	r := request(fmt.Sprintf("web-%d", i), "lyon", 1000, 1, 0)
	r.Spread = sp
	return r
}

// TestSpreadZones: 6 replicas with a zone constraint (maxSkew 1,
// DoNotSchedule) land 3 and 3 in two zones, though the biggest provider
// (zone a) would hold them all; the audit says what the first fit would
// have chosen. With zone b full, a seventh replica goes to zone a (a skew
// of 1), an eighth is refused (it would make a skew of 2) and says why;
// with ScheduleAnyway it goes to zone a. A released replica no longer counts.
func TestSpreadZones(t *testing.T) {
	ctx := context.Background()
	s := newStore(t, store.Config{})
	advertise(t, s, "paris", inZone(withNodes(30_000, node("p1", 16000, 16000, 0)), "a"))
	advertise(t, s, "rome", inZone(withNodes(30_000, node("r1", 4000, 2000, 0)), "b"))
	advertise(t, s, "milan", inZone(withNodes(30_000, node("m1", 2000, 1000, 0)), "b"))
	sp := &model.Spread{Group: "shop/app=web", TopologyKey: zoneKey, MaxSkew: 1, WhenUnsatisfiable: model.DoNotSchedule}
	zones := map[string]int{}
	for i := range 6 {
		d, err := s.Reserve(ctx, replica(i, sp))
		require.NoError(t, err, "replica %d", i)
		assert.Equal(t, "shop/app=web", d.Reservation.Spread)
		zones[map[string]string{"paris": "a", "rome": "b", "milan": "b"}[d.Reservation.Target]]++
	}
	assert.Equal(t, map[string]int{"a": 3, "b": 3}, zones)
	a := lastAudit(t, s)
	assert.Equal(t, "spread", a["method"])
	var audit struct {
		FirstFit []string       `json:"first_fit"`
		Chosen   []string       `json:"chosen"`
		Domains  map[string]int `json:"domains"`
	}
	require.NoError(t, json.Unmarshal([]byte(a["spread"].(string)), &audit))
	assert.Equal(t, []string{"paris"}, audit.FirstFit, "without spread: the biggest")
	assert.NotEqual(t, []string{"paris"}, audit.Chosen)
	assert.Equal(t, map[string]int{"a": 3, "b": 3}, audit.Domains)
	require.NoError(t, s.CheckInvariant(ctx))

	d, err := s.Reserve(ctx, replica(6, sp)) // zone b is full (3 CPUs, 3 taken)
	require.NoError(t, err)
	assert.Equal(t, "paris", d.Reservation.Target)
	_, err = s.Reserve(ctx, replica(7, sp))
	var nf *store.NoFitError
	require.ErrorAs(t, err, &nf)
	assert.Equal(t, int64(1), nf.Rejected["spread_max_skew"], "paris, in zone a, would make a skew of 2")

	anyway := *sp
	anyway.WhenUnsatisfiable = model.ScheduleAnyway
	d, err = s.Reserve(ctx, replica(8, &anyway))
	require.NoError(t, err)
	assert.Equal(t, "paris", d.Reservation.Target)

	// A released replica leaves the count: 7 left.
	for _, id := range []string{"web-8"} {
		_, err := s.Release(ctx, "lyon", id, "lyon")
		require.NoError(t, err)
	}
	counts, err := admin(t, s).HGetAll(ctx, s.Key("spread:lyon/shop/app=web")).Result()
	require.NoError(t, err)
	total := 0
	for _, v := range counts {
		var n int
		fmt.Sscan(v, &n)
		total += n
	}
	assert.Equal(t, 7, total)
	require.NoError(t, s.CheckInvariant(ctx))
}

// TestSpreadSharePolicy: with the broker's share policy at one half, 4
// replicas without a topology constraint go 2 and 2 on two providers
// instead of all on the biggest.
func TestSpreadSharePolicy(t *testing.T) {
	ctx := context.Background()
	s := newStore(t, store.Config{MaxOwnerShare: 0.5})
	advertise(t, s, "paris", withNodes(30_000, node("p1", 16000, 16000, 0)))
	advertise(t, s, "rome", withNodes(30_000, node("r1", 8000, 8000, 0)))
	targets := map[string]int{}
	for i := range 4 {
		d, err := s.Reserve(ctx, replica(i, &model.Spread{Group: "shop/web"}))
		require.NoError(t, err)
		targets[d.Reservation.Target]++
	}
	assert.Equal(t, map[string]int{"paris": 2, "rome": 2}, targets)
	require.NoError(t, s.CheckInvariant(ctx))
}
