package store

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
)

// CheckInvariant verifies the accounting invariant for every cluster and
// resource: the reserved counter equals the sum of the live reservations to
// that cluster, and no cluster is overbooked (reserved <= allocatable -
// allocated, i.e. free >= 0). It reads without locking, so call it when no
// writes are in flight (tests, audits of a quiet broker).
func (s *Store) CheckInvariant(ctx context.Context) error {
	clusters, err := s.Clusters(ctx)
	if err != nil {
		return err
	}
	var errs []error
	for _, c := range clusters {
		live, err := s.LiveReservations(ctx, "by-target", c.ID)
		if err != nil {
			return err
		}
		var sum Resources
		for _, r := range live {
			if !r.Live() {
				errs = append(errs, fmt.Errorf("cluster %s: index holds reservation %s in phase %s", c.ID, r.ID, r.Phase))
			}
			sum = sum.Add(r.Resources)
		}
		if sum != c.Reserved {
			errs = append(errs, fmt.Errorf("cluster %s: reserved counter %+v != sum of live reservations %+v", c.ID, c.Reserved, sum))
		}
		if f := c.Free(); f.CPU < 0 || f.Memory < 0 || f.GPU < 0 || f.Storage < 0 {
			// Only an advertisement that shrank below what is reserved may do this;
			// a reservation never does.
			errs = append(errs, fmt.Errorf("cluster %s: overbooked, free %+v", c.ID, f))
		}
	}
	if err := s.checkIndex(ctx, clusters); err != nil { // errors say "index: ..."

		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// CheckIndex verifies that the candidate index agrees with the cluster hashes
// (CheckInvariant includes it). Like CheckInvariant, call it on a quiet broker.
func (s *Store) CheckIndex(ctx context.Context) error {
	clusters, err := s.Clusters(ctx)
	if err != nil {
		return err
	}
	return s.checkIndex(ctx, clusters)
}

// checkIndex verifies that the candidate index agrees with the cluster hashes
// for every cluster it holds as live.
func (s *Store) checkIndex(ctx context.Context, clusters []Cluster) error {
	live, err := s.rdb.ZRange(ctx, s.Key("idx:live"), 0, -1).Result()
	if err != nil {
		return err
	}
	byID := make(map[string]Cluster, len(clusters))
	for _, c := range clusters {
		byID[c.ID] = c
	}
	var errs []error
	for _, id := range live {
		c, ok := byID[id]
		if !ok {
			errs = append(errs, fmt.Errorf("index: %s is live but has no cluster hash", id))
			continue
		}
		free, alloc := c.Free(), c.Allocatable
		want := map[string]float64{}
		for _, r := range []struct {
			name        string
			free, alloc int64
		}{{"cpu", free.CPU, alloc.CPU}, {"mem", free.Memory, alloc.Memory}, {"gpu", free.GPU, alloc.GPU}, {"sto", free.Storage, alloc.Storage}} {
			want["idx:free:"+r.name] = float64(r.free)
			want["idx:alloc:"+r.name] = float64(r.alloc)
			h := 0.0
			if r.alloc > 0 {
				h = float64(r.free) / float64(r.alloc)
			}
			want["idx:hfree:"+r.name] = h
		}
		want["idx:hfree:cm"] = (want["idx:hfree:cpu"] + want["idx:hfree:mem"]) / 2
		want["idx:price:cpu"] = float64(c.Prices.CPU)
		want["idx:price:mem"] = float64(c.Prices.Memory)
		want["idx:price:gpu"] = float64(c.Prices.GPU)
		for _, r := range pricePerCoreRatios {
			// float64(...) rounds the product before the sum, as Lua does (no fused multiply-add).
			want["idx:pcm:"+strconv.FormatFloat(r, 'g', -1, 64)] = float64(c.Prices.CPU) + float64(r*float64(c.Prices.Memory))
		}
		for key, w := range want {
			got, err := s.rdb.ZScore(ctx, s.Key(key), id).Result()
			if err != nil {
				errs = append(errs, fmt.Errorf("index: %s of %s: %w", key, id, err))
			} else if got != w {
				errs = append(errs, fmt.Errorf("index: %s of %s is %v, the hash says %v", key, id, got, w))
			}
		}
		wantRec := []float64{float64(alloc.CPU), float64(free.CPU), float64(alloc.Memory), float64(free.Memory),
			float64(alloc.GPU), float64(free.GPU), float64(alloc.Storage), float64(free.Storage),
			float64(c.Prices.CPU), float64(c.Prices.Memory), float64(c.Prices.GPU)}
		if raw, err := s.rdb.HGet(ctx, s.Key("idx:rec"), id).Result(); err != nil {
			errs = append(errs, fmt.Errorf("index: record of %s: %w", id, err))
		} else if got, err := decodeRecord(raw); err != nil || !slices.Equal(got, wantRec) {
			errs = append(errs, fmt.Errorf("index: record of %s is %v (%v), the hash says %v", id, got, err, wantRec))
		}
		for k, v := range c.Labels {
			if in, err := s.rdb.SIsMember(ctx, s.Key("idx:label:", k, "=", v), id).Result(); err != nil || !in {
				errs = append(errs, fmt.Errorf("index: %s not in the set of label %s=%s (%v)", id, k, v, err))
			}
		}
	}
	return errors.Join(errs...)
}

// pricePerCoreRatios are the GiB-per-core ratios of the idx:pcm sets (lib.lua RATIOS).
var pricePerCoreRatios = []float64{0, 0.5, 1, 2, 4, 8, 16, 32, 64}

// decodeRecord reads an idx:rec record: 11 little-endian doubles, or a JSON
// array where the scripts run without Lua's struct library.
func decodeRecord(raw string) ([]float64, error) {
	var out []float64
	if strings.HasSuffix(raw, "]") { // a double ending in 0x5d would be above 1e140
		err := json.Unmarshal([]byte(raw), &out)
		return out, err
	}
	if len(raw) != 11*8 {
		return nil, fmt.Errorf("record of %d bytes", len(raw))
	}
	for i := 0; i < len(raw); i += 8 {
		out = append(out, math.Float64frombits(binary.LittleEndian.Uint64([]byte(raw[i:i+8]))))
	}
	return out, nil
}

// Add returns r + o.
func (r Resources) Add(o Resources) Resources {
	return Resources{CPU: r.CPU + o.CPU, Memory: r.Memory + o.Memory, GPU: r.GPU + o.GPU, Storage: r.Storage + o.Storage}
}
