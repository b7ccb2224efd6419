package main

import (
	"bytes"
	"encoding/base64"
	"os"
	"path/filepath"
	"runtime/debug"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	logsapi "k8s.io/component-base/logs/api/v1"

	"github.com/fluidos-project/resource-broker/internal/version"
)

// The tests run the command many times in one process; the logging
// configuration, the same every time, is applied once.
func init() { logsapi.ReapplyHandling = logsapi.ReapplyHandlingIgnoreUnchanged }

func TestInvalidFlagsRefuseToStart(t *testing.T) {
	dir := t.TempDir()
	write := func(name, body string) string {
		path := filepath.Join(dir, name)
		require.NoError(t, os.WriteFile(path, []byte(body), 0o600))
		return path
	}
	shortKey := write("short.key", "c2hvcnQ=\n")
	goodKey := write("grant.key", "# the sealing key first\n"+base64.StdEncoding.EncodeToString(make([]byte, 32))+"\n")
	badPolicy := write("policy.yaml", "apiVersion: broker.fluidos.eu/v1alpha1\nkind: BrokerPolicy\nrequesters: {default: {maxReservations: -1}}\n")
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--weight-resources=0.5"}, "must be non-negative and sum to 1"},
		{[]string{"--weight-resources=1.2", "--weight-cost=-0.2"}, "must be non-negative and sum to 1"},
		{[]string{"--stale-threshold=0s"}, "--stale-threshold must be positive"},
		{[]string{"--default-duration=48h"}, "exceeds --max-duration"},
		{[]string{"--redis-sentinel-master=mymaster"}, "go together"},
		{[]string{"--redis-url=mysql://x"}, "--redis-url"},
		{[]string{"--gc-percent=-2"}, "--gc-percent"},
		{[]string{"--max-streams-per-cluster=0", "--grant-key-file=" + goodKey}, "--max-streams-per-cluster must be at least 1"},
		{[]string{"--max-ended-per-member=0", "--grant-key-file=" + goodKey}, "--max-ended-per-member must be at least 1"},
		{[]string{"--shutdown-timeout=0s", "--grant-key-file=" + goodKey}, "--shutdown-timeout"},
		{[]string{"--shutdown-delay=-1s", "--grant-key-file=" + goodKey}, "--shutdown-delay"},
		{[]string{"--cert-dir=/nonexistent", "--grant-key-file=" + goodKey}, "/nonexistent"},
		{[]string{"extra-arg"}, "unknown command"},
		{[]string{"--redis-url=redis://127.0.0.1:1/0"}, "--grant-key-file is required"},
		{[]string{"--grant-key-file=" + filepath.Join(dir, "missing")}, "--grant-key-file: open " + filepath.Join(dir, "missing")},
		{[]string{"--grant-key-file=" + shortKey}, "--grant-key-file: " + shortKey + ": line 1: 5 bytes, want 32"},
		{[]string{"--policy-file=" + badPolicy}, "--policy-file: policy file " + badPolicy + ": requesters.default.maxReservations: Invalid value: -1"},
		{[]string{"--retention=0s"}, "--retention must be positive"},
		{[]string{"--redis-wait-replicas=-1"}, "--redis-wait-replicas must not be negative"},
		{[]string{"--redis-wait-timeout=3s"}, "--redis-wait-timeout must be positive and less than the Redis read timeout (3s), got 3s"},
		{[]string{"--audit-retention=-1s"}, "--audit-retention must be positive"},
		{[]string{"--dashboard-operators=alice, bob"}, `--dashboard-operators: " bob" is not a certificate common name`},
		{[]string{"--redis-cluster-addrs=r0:6379", "--redis-sentinel-master=m", "--redis-sentinel-addrs=s:26379"}, "--redis-cluster-addrs and --redis-sentinel-master exclude each other"},
		{[]string{"--redis-cluster-addrs=r0"}, `--redis-cluster-addrs: "r0" is not host:port`},
		{[]string{"--redis-cluster-addrs=r0:6379", "--redis-url=redis://x:6379/2"}, "a Redis Cluster has database 0 only"},
		{[]string{"--cells=eu,eu"}, `--cells: cells: cell "eu" named twice`},
		{[]string{"--cells=e{u}"}, `--cells: cells: cell name "e{u}"`},
		{[]string{"--cell-label=not a label"}, `--cell-label "not a label"`},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			cmd := newCommand()
			cmd.SetArgs(tc.args)
			err := cmd.Execute()
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.want)
		})
	}
}

func TestTuneGC(t *testing.T) {
	defer debug.SetGCPercent(debug.SetGCPercent(100))
	defer debug.SetMemoryLimit(debug.SetMemoryLimit(-1))
	old := memoryMaxFile
	defer func() { memoryMaxFile = old }()
	memoryMaxFile = filepath.Join(t.TempDir(), "memory.max")

	t.Setenv("GOGC", "")
	t.Setenv("GOMEMLIMIT", "")
	require.NoError(t, os.WriteFile(memoryMaxFile, []byte("268435456\n"), 0o644))
	gogc, limit := tuneGC(400)
	assert.Equal(t, "400", gogc)
	assert.Equal(t, int64(268435456/10*9), limit)
	assert.Equal(t, 400, debug.SetGCPercent(400))
	assert.Equal(t, limit, debug.SetMemoryLimit(-1))

	require.NoError(t, os.WriteFile(memoryMaxFile, []byte("max\n"), 0o644))
	_, limit = tuneGC(400)
	assert.Zero(t, limit, "no container limit, no soft limit")

	t.Setenv("GOGC", "150") // the environment wins
	t.Setenv("GOMEMLIMIT", "100MiB")
	require.NoError(t, os.WriteFile(memoryMaxFile, []byte("268435456\n"), 0o644))
	gogc, limit = tuneGC(400)
	assert.Empty(t, gogc)
	assert.Zero(t, limit)
}

func TestVersion(t *testing.T) {
	var out bytes.Buffer
	cmd := newCommand()
	cmd.SetOut(&out)
	cmd.SetArgs([]string{"--version"}) // and nothing else: it quits before checking the flags
	require.NoError(t, cmd.Execute())
	assert.Equal(t, "rb-broker "+version.Get().String()+"\n", out.String())
}
