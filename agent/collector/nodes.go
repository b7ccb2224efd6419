package collector

import (
	"cmp"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
)

// The node summary: which nodes the advertisement lists for the broker's
// per-node fit (docs/architecture.md). A reservation is granted only if one
// listed node can hold it, so the summary must contain the nodes that can
// hold the most, and stay small at 5,000 nodes:
//
//   - the SummaryPerResource nodes with the most free of each resource (cpu,
//     memory, GPUs, ephemeral storage; nodes with none free of a GPU or
//     storage are not ranked for it): several large nodes, so that the broker
//     can place many reservations between two advertisements;
//   - then the nodes no other node matches or beats in every resource (the
//     skyline), most free cpu first, up to SummaryMax in all. A node that
//     another beats in every resource holds nothing that one cannot hold, so
//     when the whole skyline fits (Measurement.NodeSummaryExact) a request
//     is refused for node fit only if no node at all can hold it. Otherwise a
//     request is refused only when none of the 16 largest by each resource,
//     nor the listed skyline nodes, holds it.
//
// Free is allocatable - the requests of every active pod bound to the node,
// tenant pods included, and never below zero (a node its pods overrun is
// full: its allocated is sent capped at allocatable).

// Bounds of the node summary and of the reservations listed.
const (
	// SummaryPerResource: this many nodes with the most free of each resource.
	SummaryPerResource = 16
	// SummaryMax bounds the nodes listed (the broker takes at most 100).
	SummaryMax = 96
	// MaxListedReservations and listedBytes bound the reservation ids listed
	// (the broker takes at most 1,000; the advertisement must stay well
	// within the broker's 64 KiB body limit). Ids beyond are not listed: the
	// broker keeps debiting their nodes itself, which is conservative.
	MaxListedReservations = 1000
	listedBytes           = 16 << 10
)

// NodeMeasurement is one node of the summary: what it offers and what the
// pods bound to it request, tenant pods included, capped at allocatable.
type NodeMeasurement struct {
	Name                   string
	Allocatable, Allocated corev1.ResourceList
}

// nodeFree is a counted node's figures in integer units.
type nodeFree struct {
	name              string
	alloc, used, free amounts
}

// countedNodes lists the counted nodes with their usage, tenant pods included.
func (t *tally) countedNodes() []nodeFree {
	out := make([]nodeFree, 0, t.totals.nodes)
	for name, e := range t.nodes {
		if !e.counted {
			continue
		}
		n := nodeFree{name: name, alloc: e.allocatable}
		if u := t.use[name]; u != nil {
			n.used = u.requests
			n.used.add(u.tenant)
		}
		for i := range n.used {
			n.used[i] = max(0, min(n.used[i], n.alloc[i]))
			n.free[i] = n.alloc[i] - n.used[i]
		}
		out = append(out, n)
	}
	return out
}

// summarize picks the nodes to list (see above), in name order, and tells
// whether the whole skyline is among them.
func summarize(nodes []nodeFree, perResource, maxNodes int) ([]nodeFree, bool) {
	var out []nodeFree
	picked := map[string]bool{}
	add := func(n nodeFree) {
		if !picked[n.name] && len(out) < maxNodes {
			picked[n.name] = true
			out = append(out, n)
		}
	}
	ranked := make([]nodeFree, 0, len(nodes))
	for r := range len(amounts{}) {
		ranked = ranked[:0]
		for _, n := range nodes {
			// Every node is ranked by cpu and memory, so a cluster whose nodes
			// are all full still lists some (and is not judged on its totals).
			if n.free[r] > 0 || r == idxCPU || r == idxMemory {
				ranked = append(ranked, n)
			}
		}
		slices.SortFunc(ranked, func(a, b nodeFree) int {
			if c := cmp.Compare(b.free[r], a.free[r]); c != 0 {
				return c
			}
			return strings.Compare(a.name, b.name)
		})
		for _, n := range ranked[:min(perResource, len(ranked))] {
			add(n)
		}
	}

	// The skyline, in lexicographic order of free (cpu, memory, gpu,
	// storage), largest first, then by name: whatever weakly dominates a node
	// comes before it, so comparing with the skyline found so far suffices.
	byFree := slices.Clone(nodes)
	slices.SortFunc(byFree, func(a, b nodeFree) int {
		for i := range a.free {
			if c := cmp.Compare(b.free[i], a.free[i]); c != 0 {
				return c
			}
		}
		return strings.Compare(a.name, b.name)
	})
	var sky []nodeFree
	exact := true
	for _, n := range byFree {
		if slices.ContainsFunc(sky, func(s nodeFree) bool { return dominates(s.free, n.free) }) {
			continue
		}
		if !picked[n.name] && len(out) >= maxNodes {
			exact = false
			break
		}
		sky = append(sky, n)
		add(n)
	}
	slices.SortFunc(out, func(a, b nodeFree) int { return strings.Compare(a.name, b.name) })
	return out, exact
}

// dominates: a has at least b's amount of every resource.
func dominates(a, b amounts) bool {
	for i := range a {
		if a[i] < b[i] {
			return false
		}
	}
	return true
}

// listedReservations are the reservation ids to list, sorted (a stable
// subset when there are too many), within the bounds above.
func (t *tally) listedReservations() []string {
	ids := make([]string, 0, len(t.reservations))
	for id := range t.reservations {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	size := 0
	for i, id := range ids {
		size += len(id) + 3 // quotes and comma in JSON
		if i == MaxListedReservations || size > listedBytes {
			return ids[:i]
		}
	}
	return ids
}
