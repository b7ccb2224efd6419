package store

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/fluidos-project/resource-broker/broker/model"
)

// BenchmarkViewHint measures what a replica spends proposing one decision's
// candidates from a view of 10,000 clusters (50 nodes each: a node summary
// on every record), for the requests of the simulator (hack/scale).
func BenchmarkViewHint(b *testing.B) {
	rng := rand.New(rand.NewPCG(1, 2))
	v := newClusterView()
	for i := range 10000 {
		var r viewRecord
		r.id = fmt.Sprintf("c%05d", i)
		cores := float64([]int{16, 32, 64}[rng.IntN(3)] * 50)
		used := 0.2 + 0.3*rng.Float64()
		for res, alloc := range []float64{cores * 1000, cores * 4 * (1 << 30), 0, 100 * (1 << 30)} {
			r.f[recAlloc+2*res], r.f[recFree+2*res] = alloc, alloc*(1-used)
			r.f[recTop+res], r.f[recMax+res] = alloc/50*(1-used), alloc/50*(1-used)
		}
		r.f[recPrice], r.f[recPrice+1] = float64(10000*(1+rng.IntN(5))), 4000
		r.f[recNodes] = 50
		r.labels = map[string]string{"topology.kubernetes.io/region": []string{"eu-west", "eu-south", "eu-central"}[rng.IntN(3)]}
		v.pos[r.id] = len(v.recs)
		v.recs = append(v.recs, r)
	}
	reqs := make([]model.ReserveRequest, 64)
	for i := range reqs {
		reqs[i] = model.ReserveRequest{Requester: "c00001", Resources: model.Resources{
			CPU: []int64{100, 250, 500, 1000, 2000, 4000}[rng.IntN(6)], Memory: int64(128<<20) << rng.IntN(7)}}
	}
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		if _, ok := v.hint(reqs[i%len(reqs)], 0.7, 0.3, 5); !ok {
			b.Fatal("no hint")
		}
	}
}
