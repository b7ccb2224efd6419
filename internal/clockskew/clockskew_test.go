package clockskew_test

import (
	"context"
	"net"
	"os"
	"os/exec"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fluidos-project/resource-broker/internal/clockskew"
	"github.com/fluidos-project/resource-broker/internal/redistest"
)

// TestRedisTimeSkewed: a real redis-server under the library answers TIME
// (and Lua's redis.call('TIME')) an hour behind this process's clock, and
// still serves commands (no deadlock at start-up, unlike libfaketime).
func TestRedisTimeSkewed(t *testing.T) {
	lib, err := clockskew.Build(t.TempDir())
	if err != nil {
		t.Fatal(err) // .ci/run installs gcc: a missing compiler is a failure, not a skip
	}
	bin, err := redistest.Binary()
	if err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := strconv.Itoa(l.Addr().(*net.TCPAddr).Port)
	l.Close()
	cmd := exec.Command(bin, "--port", port, "--bind", "127.0.0.1", "--save", "", "--dir", t.TempDir())
	cmd.Env = append(os.Environ(), clockskew.Env(lib, -time.Hour)...)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:" + port, MaxRetries: -1})
	defer rdb.Close()
	ctx := context.Background()
	deadline := time.Now().Add(10 * time.Second)
	for rdb.Ping(ctx).Err() != nil {
		if time.Now().After(deadline) {
			t.Fatal("redis-server under the library did not answer PING within 10s")
		}
		time.Sleep(20 * time.Millisecond)
	}
	for _, read := range []func() (time.Time, error){
		func() (time.Time, error) { return rdb.Time(ctx).Result() },
		func() (time.Time, error) {
			v, err := rdb.Eval(ctx, "local t = redis.call('TIME') return t[1]", nil).Int64()
			return time.Unix(v, 0), err
		},
	} {
		at, err := read()
		if err != nil {
			t.Fatal(err)
		}
		if skew := time.Since(at); skew < 59*time.Minute || skew > 61*time.Minute {
			t.Fatalf("redis-server's clock is %v behind ours, want an hour", skew)
		}
	}
	if err := rdb.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
}
