package publisher

import (
	"slices"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/resource"

	rbv1 "github.com/fluidos-project/resource-broker/api/v1alpha1"
)

// DefaultBand is Config.Band's default: a node's used cpu, memory or
// storage may drift by up to 5 % of its allocatable before the broker is
// sent the new figures.
const DefaultBand = 0.05

// withinBand tells whether the broker's copy of the advertisement, sent,
// still stands for now, so that a heartbeat naming it may replace it: the
// same identity, endpoint, labels, prices, capacity and allocatable, the
// same nodes with the same allocatable, the same reservations listed, the
// same GPUs used; and every used cpu, memory and storage figure, of each
// node and of the whole cluster, within band (a fraction) of its
// allocatable of what was sent. A negative band never holds.
func withinBand(sent, now rbv1.AdvertisementSpec, band float64) bool {
	return covers(sent, now, band, false)
}

// offersNoMore tells whether the broker's copy, sent, offers no more than
// the cluster has now, give or take band: as withinBand, except that a used
// figure (GPUs included) may also have fallen by any amount, pods having
// ended. While the broker is too busy to store the new figures, a heartbeat
// naming sent keeps the cluster a candidate on figures no more generous
// than a heartbeat within the band would leave; one whose used figures rose
// past the band must wait for its advertisement, or go stale.
func offersNoMore(sent, now rbv1.AdvertisementSpec, band float64) bool {
	return covers(sent, now, band, true)
}

// covers is withinBand, and with fallen offersNoMore.
func covers(sent, now rbv1.AdvertisementSpec, band float64, fallen bool) bool {
	if band < 0 || sent.ClusterID != now.ClusterID || sent.Endpoint != now.Endpoint ||
		!equality.Semantic.DeepEqual(sent.Labels, now.Labels) || !equality.Semantic.DeepEqual(sent.Prices, now.Prices) ||
		!equality.Semantic.DeepEqual(sent.Capacity, now.Capacity) || !equality.Semantic.DeepEqual(sent.Allocatable, now.Allocatable) ||
		!sameSet(sent.ReservationsOnNodes, now.ReservationsOnNodes) || len(sent.Nodes) != len(now.Nodes) {
		return false
	}
	if !usedWithinBand(listAmounts(sent.Allocatable), listAmounts(sent.Allocated), listAmounts(now.Allocated), band, fallen) {
		return false
	}
	byName := make(map[string]rbv1.NodeResources, len(sent.Nodes))
	for _, n := range sent.Nodes {
		byName[n.Name] = n
	}
	for _, n := range now.Nodes {
		was, ok := byName[n.Name]
		if !ok || !equality.Semantic.DeepEqual(was.Allocatable, n.Allocatable) ||
			!usedWithinBand(was.Allocatable, was.Allocated, n.Allocated, band, fallen) {
			return false
		}
	}
	return true
}

// usedWithinBand: GPUs used are the same count, cpu, memory and storage
// moved by at most band of their allocatable; with fallen, any of them may
// also have fallen by any amount.
func usedWithinBand(alloc, was, now rbv1.NodeAmounts, band float64, fallen bool) bool {
	if gpusWas, gpusNow := value(was.GPU, false), value(now.GPU, false); gpusNow > gpusWas || (gpusNow < gpusWas && !fallen) {
		return false
	}
	for _, r := range []struct {
		alloc, was, now *resource.Quantity
		milli           bool
	}{
		{alloc.CPU, was.CPU, now.CPU, true},
		{alloc.Memory, was.Memory, now.Memory, false},
		{alloc.EphemeralStorage, was.EphemeralStorage, now.EphemeralStorage, false},
	} {
		moved := value(r.now, r.milli) - value(r.was, r.milli)
		if fallen {
			moved = max(moved, 0)
		}
		if float64(max(moved, -moved)) > band*float64(value(r.alloc, r.milli)) {
			return false
		}
	}
	return true
}

// listAmounts takes a ResourceList's amounts as a node's.
func listAmounts(l corev1.ResourceList) rbv1.NodeAmounts {
	get := func(name corev1.ResourceName) *resource.Quantity {
		if q, ok := l[name]; ok {
			return &q
		}
		return nil
	}
	return rbv1.NodeAmounts{CPU: get(corev1.ResourceCPU), Memory: get(corev1.ResourceMemory),
		GPU: get(rbv1.ResourceGPU), EphemeralStorage: get(corev1.ResourceEphemeralStorage)}
}

// value is q in units (millicores for cpu), 0 when absent.
func value(q *resource.Quantity, milli bool) int64 {
	switch {
	case q == nil:
		return 0
	case milli:
		return q.MilliValue()
	}
	return q.Value()
}

func sameSet(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	a, b = slices.Clone(a), slices.Clone(b)
	slices.Sort(a)
	slices.Sort(b)
	return slices.Equal(a, b)
}
