package store

import (
	"context"
	"fmt"
	"strconv"
)

// RedisMemory is what Redis holds against its maxmemory (INFO memory).
type RedisMemory struct {
	// Used is what Redis counts against maxmemory: used_memory less its
	// replication and AOF buffers (mem_not_counted_for_evict).
	Used int64
	// Max is maxmemory; 0: none, Redis takes what the machine gives it.
	Max int64
}

// Headroom is how many more bytes Redis takes before it refuses writes (0
// at or past maxmemory); meaningless without a maxmemory.
func (m RedisMemory) Headroom() int64 { return max(m.Max-m.Used, 0) }

// Share is Used as a share of maxmemory (1: full); 0 without a maxmemory.
func (m RedisMemory) Share() float64 {
	if m.Max <= 0 {
		return 0
	}
	return float64(m.Used) / float64(m.Max)
}

// RedisMemory reads how far Redis is from its maxmemory, past which it
// refuses every write (the broker's Redis runs with noeviction). On a Redis
// Cluster, the primary that holds this store's keys (its cell's).
func (s *Store) RedisMemory(ctx context.Context) (RedisMemory, error) {
	node, err := s.primary(ctx)
	if err != nil {
		return RedisMemory{}, err
	}
	info, err := node.InfoMap(ctx, "memory").Result()
	if err != nil {
		return RedisMemory{}, err
	}
	mem := info["Memory"]
	used, err := strconv.ParseInt(mem["used_memory"], 10, 64)
	if err != nil {
		return RedisMemory{}, fmt.Errorf("INFO memory: used_memory: %w", err)
	}
	limit, err := strconv.ParseInt(mem["maxmemory"], 10, 64)
	if err != nil {
		return RedisMemory{}, fmt.Errorf("INFO memory: maxmemory: %w", err)
	}
	uncounted, _ := strconv.ParseInt(mem["mem_not_counted_for_evict"], 10, 64) // absent before Redis 4
	return RedisMemory{Used: used - uncounted, Max: limit}, nil
}
