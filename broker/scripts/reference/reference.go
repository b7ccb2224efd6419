// Package reference holds the test-only variants of the broker's scripts:
// the full scan that the candidate index of reserve.lua is tested and
// benchmarked against. Only tests and benchmarks import it, so the broker's
// binary never carries it.
package reference

import (
	_ "embed"

	"github.com/redis/go-redis/v9"

	"github.com/fluidos-project/resource-broker/broker/scripts"
)

//go:embed scan.lua
var scan string

// ReserveFullScan is reserve.lua deciding every request by reading every live
// cluster's hashes (decision method "scan") instead of the candidate index:
// same KEYS, ARGV and reply.
var ReserveFullScan = redis.NewScript(scripts.Compose("reserve", map[string]string{"reserve_candidates": scan}))
