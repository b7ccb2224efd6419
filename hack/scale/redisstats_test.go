package main

import (
	"context"
	"testing"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fluidos-project/resource-broker/internal/redistest"
)

func TestTail(t *testing.T) {
	logged := make([]int32, 0, 200)
	for i := range 200 {
		logged = append(logged, int32(100+i)) // 100..299 µs
	}
	logged[10], logged[20], logged[30] = 5000, 2500, 3000
	p99, long := tail(logged)
	assert.EqualValues(t, 2500, p99, "the 198th of 200: the shortest of the three longest")
	assert.EqualValues(t, 10500, long, "the three calls of at least 2 ms")
	p99, long = tail(nil)
	assert.Zero(t, p99)
	assert.Zero(t, long)
}

// TestLatencyMonitor: a script that holds a real redis-server 15 ms is
// recorded as a "command" event of the second it ran in, and reading the
// monitor turns it off.
func TestLatencyMonitor(t *testing.T) {
	ctx := context.Background()
	rdb := redistest.Start(t).AdminClient()
	require.NoError(t, startLatencyMonitor(ctx, rdb, 2))
	const busy = `local t0 = redis.call('TIME')
local function us(t) return tonumber(t[1]) * 1000000 + tonumber(t[2]) end
while us(redis.call('TIME')) - us(t0) < 15000 do end
return 1`
	require.NoError(t, rdb.Eval(ctx, busy, nil).Err())
	stalls, err := readLatencyMonitor(ctx, rdb)
	require.NoError(t, err)
	require.NotEmpty(t, stalls)
	var command StallStats
	for _, st := range stalls {
		if st.Event == "command" {
			command = st
		}
	}
	assert.EqualValues(t, 1, command.Seconds, "%+v", stalls)
	assert.GreaterOrEqual(t, command.MaxMs, int64(15))
	assert.Equal(t, command.MaxMs, command.SumMs)
	threshold, err := rdb.ConfigGet(ctx, "latency-monitor-threshold").Result()
	require.NoError(t, err)
	assert.Equal(t, "0", threshold["latency-monitor-threshold"])
}

// TestAuditMethods counts decisions by method from a real audit stream,
// leaving out the entries that are not decisions.
func TestAuditMethods(t *testing.T) {
	ctx := context.Background()
	rdb := redistest.Start(t).AdminClient()
	add := func(fields ...any) {
		require.NoError(t, rdb.XAdd(ctx, &redis.XAddArgs{Stream: "audit", Values: fields}).Err())
	}
	add("outcome", "reserved", "method", "hint", "examined", "7")
	add("outcome", "reserved", "method", "threshold", "examined", "400")
	add("outcome", "deferred", "blocked_by", "x")
	add("outcome", "reserved", "method", "hint", "examined", "5")
	got, err := auditMethods(ctx, rdb, "audit", 10)
	require.NoError(t, err)
	assert.Equal(t, []MethodStats{{Method: "hint", Decisions: 2, Examined: 12}, {Method: "threshold", Decisions: 1, Examined: 400}}, got)
	got, err = auditMethods(ctx, rdb, "audit", 1)
	require.NoError(t, err)
	assert.Equal(t, []MethodStats{{Method: "hint", Decisions: 1, Examined: 5}}, got, "the newest entry only")
}
