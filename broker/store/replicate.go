package store

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"time"

	"github.com/redis/go-redis/v9"
)

// Durable answers across a Redis failover.
//
// Redis replicates asynchronously: a primary answers a script before any
// replica holds its writes, and Sentinel may promote a replica that never got
// them. A reservation the broker had acknowledged would be gone, and its
// capacity granted again. So with Config.Replicas every script call is
// followed, on the same connection, by WAIT: the store returns a script's
// reply only once that many replicas acknowledged its writes, and
// ErrNotReplicated otherwise (the API answers 503 with Retry-After; a retry
// of the same request is idempotent).
//
// WAIT rather than the primary's min-replicas-to-write alone: that setting
// refuses writes only once no replica has acknowledged for
// min-replicas-max-lag seconds (at least one), so the writes of the last
// second before a crash could still be lost. manifests/redis-sentinel sets it
// as well, so that a primary cut off from its replica refuses writes at once
// (NOREPLICAS, also ErrNotReplicated) instead of every call waiting out
// Config.ReplicaTimeout.

// DefaultReplicaTimeout is how long a script's reply waits for the replicas
// by default (Config.ReplicaTimeout).
const DefaultReplicaTimeout = time.Second

// ErrNotReplicated means a script's writes did not reach Config.Replicas
// replicas in time (or the primary refused to write without them): the
// broker must not acknowledge it. The writes may still be on the primary;
// every operation is idempotent, so the caller retries.
var ErrNotReplicated = errors.New("not replicated")

// NotReplicatedRetryAfter is the retry hint of an ErrNotReplicated answer:
// about the time Sentinel takes to promote a replica, or a replica to catch up.
const NotReplicatedRetryAfter = time.Second

// replicationMark is the key a replicated call writes after its script: a
// script that wrote nothing (a retried request answered from what an earlier
// call stored) would leave WAIT nothing of this call's to wait for, while
// that earlier call's writes might not be replicated yet. Writing after the
// script makes WAIT cover every write the primary took before it.
const replicationMark = "replicated"

// eval runs a script with the prefix as KEYS[1] and, with Config.Replicas,
// waits for the replicas (see above).
func (s *Store) eval(ctx context.Context, sc *redis.Script, args ...any) (any, error) {
	keys := []string{s.cfg.Prefix}
	if s.cfg.Replicas <= 0 {
		return sc.Run(ctx, s.rdb, keys, args...).Result()
	}
	v, err := s.evalReplicated(ctx, sc.EvalSha, keys, args)
	if redis.HasErrorPrefix(err, "NOSCRIPT") { // a promoted replica has no script cache
		v, err = s.evalReplicated(ctx, sc.Eval, keys, args)
	}
	return v, err
}

// evalReplicated sends the script, the mark and WAIT in one pipeline (one
// connection: WAIT waits for the writes of its own connection). On a Redis
// Cluster the pipeline goes to the primary of the prefix's slot itself: a
// cluster client's pipeline sends a command without a key, WAIT, to any
// node, where it would wait for nothing of ours.
func (s *Store) evalReplicated(ctx context.Context, send func(context.Context, redis.Scripter, []string, ...any) *redis.Cmd,
	keys []string, args []any) (any, error) {
	conn, err := s.primary(ctx)
	if err != nil {
		return nil, err
	}
	v, err := s.pipelineReplicated(ctx, conn, send, keys, args)
	if cc, ok := s.rdb.(*redis.ClusterClient); ok && slotMayHaveMoved(err) {
		// A failover or a resharding: the cluster client learns the new
		// slot map in the background, and the caller's retry (503) goes
		// to the new primary.
		cc.ReloadState(ctx)
	}
	return v, err
}

// primary is the connection to the node that holds this store's keys: the
// client itself, or on a Redis Cluster the primary of the prefix's slot (a
// command without a key, WAIT or INFO, would otherwise go to any node).
func (s *Store) primary(ctx context.Context) (redis.Cmdable, error) {
	if cc, ok := s.rdb.(*redis.ClusterClient); ok {
		return cc.MasterForKey(ctx, s.cfg.Prefix)
	}
	return s.rdb, nil
}

// slotMayHaveMoved tells whether err says the primary we asked no longer
// serves the slot: a redirection (MOVED, ASK), a node that is a replica now
// (READONLY) or a cluster without that slot (CLUSTERDOWN), or a node that
// cannot be reached.
func slotMayHaveMoved(err error) bool {
	if err == nil {
		return false
	}
	if _, ok := redis.IsMovedError(err); ok {
		return true
	}
	if _, ok := redis.IsAskError(err); ok {
		return true
	}
	var netErr net.Error
	return redis.HasErrorPrefix(err, "READONLY") || redis.HasErrorPrefix(err, "CLUSTERDOWN") ||
		errors.As(err, &netErr) || errors.Is(err, io.EOF)
}

func (s *Store) pipelineReplicated(ctx context.Context, conn redis.Cmdable, send func(context.Context, redis.Scripter, []string, ...any) *redis.Cmd,
	keys []string, args []any) (any, error) {
	var script *redis.Cmd
	var acked *redis.Cmd
	_, _ = conn.Pipelined(ctx, func(p redis.Pipeliner) error {
		script = send(ctx, p, keys, args...)
		p.Set(ctx, s.Key(replicationMark), "1", 0)
		acked = p.Do(ctx, "wait", s.cfg.Replicas, s.cfg.ReplicaTimeout.Milliseconds())
		return nil
	})
	v, err := script.Result()
	if redis.HasErrorPrefix(err, "NOREPLICAS") {
		return nil, fmt.Errorf("%w: the primary refuses writes without replicas: %v", ErrNotReplicated, err)
	}
	if err != nil {
		return nil, err
	}
	n, err := acked.Int64()
	if err != nil {
		return nil, fmt.Errorf("wait for replicas: %w", err)
	}
	if n < int64(s.cfg.Replicas) {
		return nil, fmt.Errorf("%w: %d of %d replicas acknowledged within %s", ErrNotReplicated, n, s.cfg.Replicas, s.cfg.ReplicaTimeout)
	}
	return v, nil
}
