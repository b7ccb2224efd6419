package main

import (
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/fluidos-project/resource-broker/broker/api"
	brokerclient "github.com/fluidos-project/resource-broker/broker/client"
)

// member is one simulated cluster: a provider that advertises its nodes and
// a requester that holds leases, with its own client certificate (CN = id)
// and its own client, used by it alone.
type member struct {
	id     string
	client *brokerclient.Client
	nodes  []node
	labels map[string]string
	price  string // EUR per core-hour

	// advertised is when the broker last stored its advertisement or took
	// its heartbeat (Unix ns).
	advertised atomic.Int64

	// digest names the advertisement the broker holds ("": none) and
	// storedCPU, storedMem its nodes' used figures: the member sends a
	// heartbeat while its figures stay within the band of them, as
	// agent/publisher does. Used by the member's own loop only.
	digest               string
	storedCPU, storedMem []int64

	mu   sync.Mutex
	rng  *rand.Rand
	next int                // the next reservation's number
	live map[string]*member // leases the broker granted and the member holds -> their provider
	// hosted are, as a provider, the leases placed on it: requester -> ids
	// (--vouch renews them for their requesters).
	hosted    map[string]map[string]struct{}
	uncertain map[string]struct{} // reserve calls that failed in transit: the broker may hold them
	// releasing are release calls that failed in transit and are tried
	// again at the end: the broker may have ended them already.
	releasing map[string]struct{}
}

// memberLabel is the label naming a member, which it carries with
// --fill-pinned: real clusters carry labels of their own name too (Liqo's
// cluster id), and a selector on it leaves one candidate.
const memberLabel = "scale.resource-broker.io/member"

// node is one advertised node: its size and what its own pods use (base),
// to which each advertisement adds a little; the base moves when pods come
// and go (move). minCPU and minMem are the lowest base it had.
type node struct {
	name                   string
	cpuMilli, memory, gpus int64
	baseCPU, baseMem       int64
	minCPU, minMem         int64
}

// nodeShapes are the node sizes of the simulated clusters.
var nodeShapes = []struct{ cpu, memGi, gpus int64 }{
	{16, 64, 0}, {32, 128, 0}, {64, 256, 0}, {32, 256, 0}, {48, 192, 4},
}

func newMember(id string, nodes int, seed uint64) *member {
	m := &member{id: id, rng: rand.New(rand.NewPCG(seed, 0x5ca1e)), live: map[string]*member{}, hosted: map[string]map[string]struct{}{}, uncertain: map[string]struct{}{},
		releasing: map[string]struct{}{}}
	m.labels = map[string]string{"topology.kubernetes.io/region": []string{"eu-west", "eu-south", "eu-central"}[m.rng.IntN(3)]}
	m.price = fmt.Sprintf("0.0%d", 1+m.rng.IntN(5))
	shape := m.rng.IntN(len(nodeShapes)) // one shape per cluster, GPUs on some
	for i := range nodes {
		s := nodeShapes[shape]
		cpu, mem := s.cpu*1000, s.memGi<<30
		// Its own pods use 20 to 50 %.
		used := 0.2 + 0.3*m.rng.Float64()
		base := node{name: fmt.Sprintf("%s-n%02d", id, i), cpuMilli: cpu, memory: mem, gpus: s.gpus,
			baseCPU: int64(float64(cpu) * used), baseMem: int64(float64(mem) * used)}
		base.minCPU, base.minMem = base.baseCPU, base.baseMem
		m.nodes = append(m.nodes, base)
	}
	return m
}

// advertisement is what the member's agent would publish now, with its
// nodes' used cpu and memory. With churn, each node's own pods use up to
// 3 % of the node more than their base, as a real cluster's figures move
// from one measurement to the next, and, with probability moves, pods came
// or went: one node's base moves by 8-12 % of the node, past the band of
// the advertisement the broker holds. Without churn, every node at its
// lowest base: the most free any advertisement offered, so that the
// broker's debits, each made against a free no larger, cannot exceed it
// (CheckInvariant's overbooking test).
func (m *member) advertisement(churn bool, moves float64) (api.Advertisement, []int64, []int64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if churn && m.rng.Float64() < moves {
		m.move(&m.nodes[m.rng.IntN(len(m.nodes))])
	}
	var capCPU, capMem, capGPU, usedCPU, usedMem int64
	nodes := make([]api.NodeResources, len(m.nodes))
	cpus, mems := make([]int64, len(m.nodes)), make([]int64, len(m.nodes))
	for i, n := range m.nodes {
		cpu, mem := n.minCPU, n.minMem
		if churn {
			cpu = n.baseCPU + int64(m.rng.Float64()*0.03*float64(n.cpuMilli))
			mem = n.baseMem + int64(m.rng.Float64()*0.03*float64(n.memory))
		}
		cpus[i], mems[i] = cpu, mem
		nodes[i] = api.NodeResources{Name: n.name, Allocatable: quantities(n.cpuMilli, n.memory, n.gpus), Allocated: quantities(cpu, mem, 0)}
		capCPU, capMem, capGPU = capCPU+n.cpuMilli, capMem+n.memory, capGPU+n.gpus
		usedCPU, usedMem = usedCPU+cpu, usedMem+mem
	}
	total := quantities(capCPU, capMem, capGPU)
	return api.Advertisement{
		ClusterName: m.id, Endpoint: "https://" + m.id + ".example:6443", Labels: m.labels,
		Resources: api.ClusterResources{Capacity: total, Allocatable: total, Allocated: quantities(usedCPU, usedMem, 0), Nodes: nodes},
		Prices:    &api.Prices{Currency: "EUR", CPU: mustQ(m.price), Memory: mustQ("0.004"), GPU: mustQ("1.2")},
	}, cpus, mems
}

// move shifts n's base by 8-12 % of the node, up or down, within 10-70 %
// of it: pods started or ended there.
func (m *member) move(n *node) {
	shift := 0.08 + 0.04*m.rng.Float64()
	if m.rng.IntN(2) == 0 {
		shift = -shift
	}
	clamp := func(base, size int64) int64 {
		v := float64(base) + shift*float64(size)
		return int64(min(max(v, 0.1*float64(size)), 0.7*float64(size)))
	}
	n.baseCPU, n.baseMem = clamp(n.baseCPU, n.cpuMilli), clamp(n.baseMem, n.memory)
	n.minCPU, n.minMem = min(n.minCPU, n.baseCPU), min(n.minMem, n.baseMem)
}

// band is the agent's (agent/publisher DefaultBand): a heartbeat stands for
// the advertisement stored while every used figure stays within 5 % of its
// node's allocatable of it.
const band = 0.05

// withinBand tells whether the figures cpus, mems are within the band of
// those the broker holds (nothing else of the member's advertisement moves).
func (m *member) withinBand(cpus, mems []int64) bool { return m.covers(cpus, mems, false) }

// offersNoMore is agent/publisher's: the broker's copy offers no more than
// the member has now, give or take the band (figures that fell by any
// amount), so a heartbeat may keep it live while its advertisement is shed.
func (m *member) offersNoMore(cpus, mems []int64) bool { return m.covers(cpus, mems, true) }

func (m *member) covers(cpus, mems []int64, fallen bool) bool {
	if m.digest == "" || len(m.storedCPU) != len(cpus) {
		return false
	}
	for i, n := range m.nodes {
		dc, dm := cpus[i]-m.storedCPU[i], mems[i]-m.storedMem[i]
		if fallen {
			dc, dm = max(dc, 0), max(dm, 0)
		}
		if float64(max(dc, -dc)) > band*float64(n.cpuMilli) || float64(max(dm, -dm)) > band*float64(n.memory) {
			return false
		}
	}
	return true
}

// Request sizes: a pod's requests, small ones the most common.
var (
	requestCPU    = []string{"100m", "100m", "250m", "250m", "500m", "500m", "1", "1", "2", "4"}
	requestMemory = []string{"128Mi", "256Mi", "512Mi", "512Mi", "1Gi", "1Gi", "2Gi", "4Gi", "8Gi"}
)

// request is the member's next lease request, lease and hold time as the
// agent asks for a pod's reservation; one in fifty asks for 1 or 2 GPUs,
// only when gpus.
func (m *member) request(lease time.Duration, gpus bool) api.ReservationRequest {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.next++
	id := fmt.Sprintf("%s-r%d", m.id, m.next)
	q := api.Quantities{CPU: mustQ(requestCPU[m.rng.IntN(len(requestCPU))]), Memory: mustQ(requestMemory[m.rng.IntN(len(requestMemory))])}
	if m.rng.IntN(50) == 0 && gpus {
		q.GPU = resource.NewQuantity(int64(1+m.rng.IntN(2)), resource.DecimalSI)
	}
	return api.ReservationRequest{ID: id, Resources: q, Duration: lease.String(), Lease: lease.String(), Owner: "default/pod-" + id}
}

// hasGPUs says whether m's nodes have GPUs (one shape of five).
func (m *member) hasGPUs() bool { return m.nodes[0].gpus > 0 }

// selector selects m alone (by memberLabel, with --fill-pinned).
func (m *member) selector() *api.LabelSelector {
	return &api.LabelSelector{MatchLabels: map[string]string{memberLabel: m.id}}
}

// hold records lease id, placed on provider.
func (m *member) hold(id string, provider *member) {
	m.mu.Lock()
	m.live[id] = provider
	m.mu.Unlock()
	provider.host(m.id, id, true)
}

// drop forgets a lease and says whether the member held it, and where.
func (m *member) drop(id string) (provider *member, held bool) {
	m.mu.Lock()
	provider, held = m.live[id]
	delete(m.live, id)
	m.mu.Unlock()
	if held {
		provider.host(m.id, id, false)
	}
	return provider, held
}

// host records (or, with on false, forgets) requester's lease id placed on
// m, a provider; m nil (a provider not known) records nothing.
func (m *member) host(requester, id string, on bool) {
	if m == nil {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	ids := m.hosted[requester]
	switch {
	case on && ids == nil:
		m.hosted[requester] = map[string]struct{}{id: {}}
	case on:
		ids[id] = struct{}{}
	default:
		delete(ids, id)
		if len(ids) == 0 {
			delete(m.hosted, requester)
		}
	}
}

// hostedIDs are, as a provider, the leases placed on m by requester.
func (m *member) hostedIDs() map[string][]string {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make(map[string][]string, len(m.hosted))
	for requester, ids := range m.hosted {
		for id := range ids {
			out[requester] = append(out[requester], id)
		}
	}
	return out
}

// released says whether a release of id failed in transit (the broker
// may have done it), and forgets it.
func (m *member) released(id string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	_, ok := m.releasing[id]
	delete(m.releasing, id)
	return ok
}

func (m *member) markUncertain(id string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.uncertain[id] = struct{}{}
}

func (m *member) liveIDs() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	ids := make([]string, 0, len(m.live))
	for id := range m.live {
		ids = append(ids, id)
	}
	return ids
}

func quantities(cpuMilli, memory, gpus int64) api.Quantities {
	q := api.Quantities{CPU: resource.NewMilliQuantity(cpuMilli, resource.DecimalSI), Memory: resource.NewQuantity(memory, resource.BinarySI)}
	if gpus > 0 {
		q.GPU = resource.NewQuantity(gpus, resource.DecimalSI)
	}
	return q
}

func mustQ(s string) *resource.Quantity {
	q := resource.MustParse(s)
	return &q
}
