// Package reference holds the test-only variants of the broker's scripts:
// the full scan that the candidate index of reserve.lua is tested and
// benchmarked against. Only tests and benchmarks import it, so the broker's
// binary never carries it.
package reference

import (
	_ "embed"
	"strings"

	"github.com/redis/go-redis/v9"

	"github.com/fluidos-project/resource-broker/broker/scripts"
)

//go:embed scan.lua
var scan string

// hook is the line of reserve.lua that the full scan replaces.
const hook = "local reference_scan = nil\n"

// ReserveFullScan is reserve.lua deciding every request by reading every live
// cluster's hashes (decision method "scan") instead of the candidate index:
// same KEYS, ARGV and reply.
var ReserveFullScan = func() *redis.Script {
	src := scripts.Source("reserve")
	if strings.Count(src, hook) != 1 {
		panic("reference: reserve.lua must declare " + strings.TrimSpace(hook) + " exactly once")
	}
	return redis.NewScript(strings.Replace(src, hook, scan+"\n", 1))
}()
