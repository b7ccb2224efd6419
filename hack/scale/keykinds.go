package main

import (
	"context"
	"maps"
	"slices"
	"sort"
	"strings"

	"github.com/redis/go-redis/v9"
)

// keyKind is the kind of a broker key: its name after the prefix up to the
// next ':' ("resv", "events", "by-target"), or the first two parts for the
// candidate index ("idx:free"), so that a kind sums one layout's keys
// (docs/redis.md) over every cluster and reservation.
func keyKind(key string) string {
	_, rest, ok := strings.Cut(key, "}:")
	if !ok {
		return key
	}
	parts := strings.SplitN(rest, ":", 3)
	if parts[0] == "idx" && len(parts) > 1 {
		return "idx:" + parts[1]
	}
	return parts[0]
}

// KindMemory is what the keys of one kind hold (MEMORY USAGE, every nested
// value counted: SAMPLES 0) and how Redis encodes them.
type KindMemory struct {
	Kind      string         `json:"kind"`
	Keys      int            `json:"keys"`
	Bytes     int64          `json:"bytes"`
	Encodings map[string]int `json:"encodings"`
}

// clientsKind is the kind that stands for the clients' buffers (INFO
// memory mem_clients_normal): what the calls in flight hold at the instant.
const clientsKind = "(client buffers)"

// memoryByKind reads every broker key's MEMORY USAGE and OBJECT ENCODING,
// summed per kind, and the clients' buffers. It scans the whole keyspace: a
// second or two at 100,000 leases, run between the steps, not in the
// measured window.
func memoryByKind(ctx context.Context, rdb *redis.Client) (map[string]*KindMemory, error) {
	clients, err := memoryField(ctx, rdb, "mem_clients_normal")
	if err != nil {
		return nil, err
	}
	out := map[string]*KindMemory{clientsKind: {Kind: clientsKind, Bytes: clients}}
	var cursor uint64
	for {
		keys, next, err := rdb.Scan(ctx, cursor, "rb:*", 1000).Result()
		if err != nil {
			return nil, err
		}
		pipe := rdb.Pipeline()
		usage := make([]*redis.IntCmd, len(keys))
		enc := make([]*redis.StringCmd, len(keys))
		for i, k := range keys {
			usage[i] = pipe.MemoryUsage(ctx, k, 0)
			enc[i] = pipe.ObjectEncoding(ctx, k)
		}
		_, _ = pipe.Exec(ctx) // a key gone since the scan answers nil: skipped below
		for i, k := range keys {
			n, err := usage[i].Result()
			if err != nil {
				continue
			}
			kind := keyKind(k)
			m := out[kind]
			if m == nil {
				m = &KindMemory{Kind: kind, Encodings: map[string]int{}}
				out[kind] = m
			}
			m.Keys++
			m.Bytes += n
			m.Encodings[enc[i].Val()]++
		}
		cursor = next
		if cursor == 0 {
			return out, nil
		}
	}
}

// LeaseMemory is one kind's share of the memory the fill added: what its
// keys grew by, per live lease.
type LeaseMemory struct {
	KindMemory
	BytesAdded    int64   `json:"bytesAdded"`
	BytesPerLease float64 `json:"bytesPerLease"`
}

// leaseMemory is the growth of each kind from before to after the fill,
// per live lease, the largest first; what neither the keys' MEMORY USAGE
// nor the clients' buffers account for (Redis' keyspace and expiry tables,
// the Lua scripts' memory) is the kind "(other)", from used_memory.
func leaseMemory(before, after map[string]*KindMemory, usedBefore, usedAfter, leases int64) []LeaseMemory {
	var out []LeaseMemory
	var summed int64
	kinds := maps.Clone(after)
	maps.Insert(kinds, maps.All(before))
	for _, kind := range slices.Sorted(maps.Keys(kinds)) {
		a := after[kind]
		if a == nil { // every key of the kind went during the fill
			a = &KindMemory{Kind: kind}
		}
		added := a.Bytes
		if b := before[kind]; b != nil {
			added -= b.Bytes
		}
		summed += added
		if added == 0 {
			continue
		}
		out = append(out, LeaseMemory{KindMemory: *a, BytesAdded: added, BytesPerLease: float64(added) / float64(leases)})
	}
	other := usedAfter - usedBefore - summed
	out = append(out, LeaseMemory{KindMemory: KindMemory{Kind: "(other)"}, BytesAdded: other, BytesPerLease: float64(other) / float64(leases)})
	sort.SliceStable(out, func(i, j int) bool { return out[i].BytesAdded > out[j].BytesAdded })
	return out
}
