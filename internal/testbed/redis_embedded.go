package testbed

import (
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/fluidos-project/resource-broker/internal/embedredis"
)

// RedisEnv is the environment variable that, set to RedisEmbedded, makes the
// bed run an in-process miniredis (internal/embedredis) instead of a
// redis-server subprocess: the demo's fallback on a machine without
// redis-server. It keeps nothing on disk, and Redis.Kill and Redis.Restart
// fail. The tests leave it unset: they prove behaviour on the real server only.
const RedisEnv = "RB_TESTBED_REDIS"

// RedisEmbedded is the value of RedisEnv that selects the embedded server.
const RedisEmbedded = "embedded"

// EmbeddedRedisFromEnv tells whether RedisEnv asks for the embedded server.
func EmbeddedRedisFromEnv() bool { return os.Getenv(RedisEnv) == RedisEmbedded }

var (
	errEmbeddedRestart = errors.New("redis: the embedded in-process Redis (miniredis) cannot be restarted: " +
		"it keeps no data on disk; use redis-server (unset " + RedisEnv + ")")
	errEmbeddedKill = errors.New("redis: the embedded in-process Redis (miniredis) cannot be killed as a crash; " +
		"use redis-server (unset " + RedisEnv + ")")
)

// newEmbeddedRedis prepares an embedded server. Its Process is never started:
// it only names the log, which says what runs (Bed.DumpLogs prints it).
func newEmbeddedRedis(logPath string) *Redis {
	return &Redis{Embedded: true, Process: &Process{Name: "redis (embedded miniredis)", LogPath: logPath}}
}

func (r *Redis) startEmbedded() error {
	srv, err := embedredis.Start()
	if err != nil {
		return fmt.Errorf("start the embedded Redis: %w", err)
	}
	r.srv, r.Addr = srv, srv.Addr
	line := fmt.Sprintf("=== %s: embedded in-process Redis (miniredis) on %s, not redis-server: "+
		"data in memory only, no restart; behaviour on it proves nothing about Redis\n",
		time.Now().Format(time.RFC3339Nano), r.Addr)
	if err := os.WriteFile(r.LogPath, []byte(line), 0o644); err != nil {
		srv.Close()
		return err
	}
	return nil
}

// Kill ends redis-server at once (SIGKILL), as a crash would; the embedded
// server cannot crash on demand and says so.
func (r *Redis) Kill() error {
	if r.Embedded {
		return errEmbeddedKill
	}
	return r.Process.Kill()
}

// Stop asks redis-server to end and kills it after grace; the embedded server
// is closed at once (its data is gone).
func (r *Redis) Stop(grace time.Duration) error {
	if r.Embedded {
		r.Close()
		return nil
	}
	return r.Process.Stop(grace)
}

// Close stops the embedded server (idempotent; nothing for redis-server,
// which Bed.Close stops). Bed.Close does not know about the embedded server
// yet: a program that uses it calls Close after Bed.Close.
func (r *Redis) Close() {
	if r.srv != nil {
		r.srv.Close()
	}
}
