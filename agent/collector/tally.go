package collector

import (
	"k8s.io/apimachinery/pkg/types"
)

// The running totals. Every informer event changes them by one pod's or one
// node's contribution, so an event costs O(1) (a namespace that becomes or
// stops being a tenant namespace, which is rare, costs one pass over the pods).
//
// Accounting rules (docs/architecture.md, section 2.3):
//   - A node is counted when it is Ready, schedulable (not cordoned) and not
//     virtual; its capacity and allocatable are summed.
//   - A pod is active when it is bound to a node and not terminal.
//   - An active pod is local unless its namespace is a tenant namespace (its
//     pods run on reservations the broker already accounts for).
//   - Allocated sums the local pods of counted nodes only: pods on virtual
//     nodes are not local usage, and pods on a NotReady or cordoned node take
//     nothing from the capacity offered, since that node's capacity is not
//     offered. Pods are summed per node, so a node that starts or stops
//     counting moves its pods in or out of the totals in O(1).
//   - Per node (the broker's per-node fit, nodes.go), every active pod counts,
//     tenant pods included: the broker debits a reservation's node only until
//     the reservation is listed, and the reservations listed are those of the
//     tenant pods and placeholders bound to a node here (reservation-id
//     annotation), as "<requester>/<id>" (ids are scoped per requester).
//   - A reservation's placeholder and its tenant pods on one node count once:
//     the larger of the two, resource by resource (the tenant pod preempts its
//     placeholder, which may still be terminating).

// totals are what the collector measures.
type totals struct {
	capacity, allocatable, allocated amounts
	nodes, pods                      int
}

type podEntry struct {
	node, namespace string
	requests        amounts
	local           bool   // not in a tenant namespace: added to the node's use
	reservation     string // the broker reservation it consumes, if a tenant pod says so
	placeholder     bool   // the provider's placeholder of that reservation
}

// holdKey is one reservation's pods on one node.
type holdKey struct{ node, namespace, reservation string }

// holdUse sums them: placeholders and tenant pods apart; the node counts
// the larger.
type holdUse struct {
	placeholder, tenant amounts
	pods                int
}

func (h *holdUse) counted() amounts {
	var out amounts
	for i := range out {
		out[i] = max(h.placeholder[i], h.tenant[i])
	}
	return out
}

type nodeEntry struct {
	counted               bool
	capacity, allocatable amounts
}

// nodeUse sums the active pods bound to one node (known or not yet seen):
// local ones, and tenant ones (not local usage, but they take room on it).
type nodeUse struct {
	requests   amounts
	pods       int
	tenant     amounts
	tenantPods int
}

type tally struct {
	nodes   map[string]nodeEntry
	use     map[string]*nodeUse
	pods    map[types.UID]podEntry
	tenants map[string]bool
	// requesters: the requester of each tenant namespace, when known.
	requesters map[string]string
	holds      map[holdKey]*holdUse
	totals     totals
	// reservations counts the active tenant pods and placeholders of each
	// listed reservation, "<requester>/<id>".
	reservations map[string]int
	// nodesChanged: a counted node's figures or the reservations changed
	// since the last look (the totals may not have).
	nodesChanged bool
}

func newTally() *tally {
	return &tally{
		nodes:        map[string]nodeEntry{},
		use:          map[string]*nodeUse{},
		pods:         map[types.UID]podEntry{},
		tenants:      map[string]bool{},
		requesters:   map[string]string{},
		holds:        map[holdKey]*holdUse{},
		reservations: map[string]int{},
	}
}

// setPod records a pod's current state.
func (t *tally) setPod(u *podUsage) {
	old, had := t.pods[u.UID]
	if !u.Active {
		if had {
			t.unapply(old)
			delete(t.pods, u.UID)
		}
		return
	}
	e := podEntry{node: u.NodeName, namespace: u.Namespace, requests: u.Requests, local: !t.tenants[u.Namespace],
		reservation: u.Reservation, placeholder: u.Placeholder}
	if had {
		if old == e {
			return
		}
		t.unapply(old)
	}
	t.pods[u.UID] = e
	t.apply(e)
}

// deletePod forgets a pod.
func (t *tally) deletePod(uid types.UID) {
	if old, had := t.pods[uid]; had {
		t.unapply(old)
		delete(t.pods, uid)
	}
}

func (t *tally) apply(e podEntry) {
	u := t.use[e.node]
	if u == nil {
		u = &nodeUse{}
		t.use[e.node] = u
	}
	counted := t.nodes[e.node].counted
	if counted {
		t.nodesChanged = true
	}
	if !e.local {
		t.addTenant(u, e, 1)
		u.tenantPods++
		return
	}
	u.requests.add(e.requests)
	u.pods++
	if counted {
		t.totals.allocated.add(e.requests)
		t.totals.pods++
	}
}

func (t *tally) unapply(e podEntry) {
	u := t.use[e.node]
	if u == nil {
		return // cannot happen: apply created it
	}
	counted := t.nodes[e.node].counted
	if counted {
		t.nodesChanged = true
	}
	if !e.local {
		t.addTenant(u, e, -1)
		u.tenantPods--
	} else {
		u.requests.sub(e.requests)
		u.pods--
		if counted {
			t.totals.allocated.sub(e.requests)
			t.totals.pods--
		}
	}
	if u.pods <= 0 && u.tenantPods <= 0 {
		delete(t.use, e.node)
	}
}

// addTenant adds (sign 1) or takes away (-1) a tenant pod's use of its
// node: a pod of a reservation through its holdUse, which counts the larger
// of the reservation's placeholder and tenant pods there.
func (t *tally) addTenant(u *nodeUse, e podEntry, sign int) {
	if e.reservation == "" {
		if sign > 0 {
			u.tenant.add(e.requests)
		} else {
			u.tenant.sub(e.requests)
		}
		return
	}
	t.nodesChanged = true
	key := holdKey{e.node, e.namespace, e.reservation}
	h := t.holds[key]
	if h == nil {
		h = &holdUse{}
		t.holds[key] = h
	}
	u.tenant.sub(h.counted())
	part := &h.tenant
	if e.placeholder {
		part = &h.placeholder
	}
	if sign > 0 {
		part.add(e.requests)
	} else {
		part.sub(e.requests)
	}
	h.pods += sign
	u.tenant.add(h.counted())
	if h.pods <= 0 {
		delete(t.holds, key)
	}
	if listed, ok := t.listedID(e.namespace, e.reservation); ok {
		if t.reservations[listed] += sign; t.reservations[listed] <= 0 {
			delete(t.reservations, listed)
		}
	}
}

// listedID is how a reservation is listed: "<requester>/<id>"; not at all
// when the namespace's requester is unknown (the broker then keeps debiting
// its node, which is conservative).
func (t *tally) listedID(namespace, id string) (string, bool) {
	requester := t.requesters[namespace]
	return requester + "/" + id, requester != ""
}

// setNode records a node's current state.
func (t *tally) setNode(n *nodeCapacity) {
	e := nodeEntry{counted: n.Counted, capacity: n.Capacity, allocatable: n.Allocatable}
	old, had := t.nodes[n.Name]
	if had && old == e {
		return
	}
	if had && old.counted {
		t.uncount(n.Name, old)
	}
	t.nodes[n.Name] = e
	if e.counted {
		t.count(n.Name, e)
	}
	if e.counted || (had && old.counted) {
		t.nodesChanged = true
	}
}

// deleteNode forgets a node; the pods still bound to it stay in its use
// until they are deleted, and count again if a node of that name returns.
func (t *tally) deleteNode(name string) {
	if old, had := t.nodes[name]; had {
		if old.counted {
			t.uncount(name, old)
			t.nodesChanged = true
		}
		delete(t.nodes, name)
	}
}

func (t *tally) count(name string, e nodeEntry) {
	t.totals.capacity.add(e.capacity)
	t.totals.allocatable.add(e.allocatable)
	t.totals.nodes++
	if u := t.use[name]; u != nil {
		t.totals.allocated.add(u.requests)
		t.totals.pods += u.pods
	}
}

func (t *tally) uncount(name string, e nodeEntry) {
	t.totals.capacity.sub(e.capacity)
	t.totals.allocatable.sub(e.allocatable)
	t.totals.nodes--
	if u := t.use[name]; u != nil {
		t.totals.allocated.sub(u.requests)
		t.totals.pods -= u.pods
	}
}

// setTenant records whether a namespace is a tenant namespace. A change
// moves that namespace's pods out of (or back into) local usage.
func (t *tally) setTenant(namespace string, tenant bool, requester string) {
	if !tenant {
		requester = ""
	}
	if t.tenants[namespace] == tenant && t.requesters[namespace] == requester {
		return
	}
	// Out with the namespace's pods, as they were counted; in again as now.
	var moved []types.UID
	for uid, e := range t.pods {
		if e.namespace == namespace {
			t.unapply(e)
			moved = append(moved, uid)
		}
	}
	if tenant {
		t.tenants[namespace] = true
	} else {
		delete(t.tenants, namespace)
	}
	if requester != "" {
		t.requesters[namespace] = requester
	} else {
		delete(t.requesters, namespace)
	}
	for _, uid := range moved {
		e := t.pods[uid]
		e.local = !tenant
		t.apply(e)
		t.pods[uid] = e
	}
}
