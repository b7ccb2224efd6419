package testbed

import (
	"context"
	"fmt"
	"net"
	"os"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fluidos-project/resource-broker/internal/embedredis"
	"github.com/fluidos-project/resource-broker/internal/redistest"
	redismanifest "github.com/fluidos-project/resource-broker/manifests/redis"
)

// Redis is the bed's redis-server, as manifests/redis configures it: AOF
// persistence (appendonly yes, appendfsync everysec), so that a restart keeps
// the broker's state, protected mode on, and the ACL of
// manifests/redis/users.acl, under which the brokers connect as its limited
// user (plus an administrator for the bed's own reads). With
// RedisEnv=embedded it is an in-process miniredis instead (see
// redis_embedded.go), without users.
type Redis struct {
	Addr string // 127.0.0.1:<port>
	Dir  string // data directory (appendonlydir/); empty when Embedded
	// Users: the ACL file, the brokers' password file and the administrator;
	// nil when Embedded.
	Users *redistest.Users
	// Embedded: an in-process miniredis, not redis-server (the demo's
	// fallback): in memory only; Kill and Restart fail.
	Embedded bool
	*Process

	srv *embedredis.Server // when Embedded, once started
}

func newRedis(dir, logPath string) (*Redis, error) {
	if EmbeddedRedisFromEnv() {
		return newEmbeddedRedis(logPath), nil
	}
	bin, err := redistest.Binary()
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	users, err := redistest.WriteUsers(dir)
	if err != nil {
		return nil, err
	}
	return &Redis{Dir: dir, Users: users, Process: &Process{Name: "redis-server", Path: bin, LogPath: logPath}}, nil
}

func (r *Redis) start(ctx context.Context) error {
	if r.Embedded {
		return r.startEmbedded()
	}
	var last error
	for range 3 { // a free port can be taken before redis binds it
		if r.Addr == "" {
			ports, err := FreePorts(1)
			if err != nil {
				return err
			}
			r.Addr = net.JoinHostPort("127.0.0.1", strconv.Itoa(ports[0]))
		}
		_, port, _ := net.SplitHostPort(r.Addr)
		r.Args = append([]string{"--port", port, "--bind", "127.0.0.1", "--dir", r.Dir,
			"--save", "", "--appendonly", "yes", "--appendfsync", "everysec"}, r.Users.ServerArgs()...)
		if last = r.Start(); last != nil {
			return last
		}
		if last = r.waitReady(ctx); last == nil {
			return nil
		}
		_ = r.Kill()
		if !r.portInUse() {
			return last
		}
		r.Addr = ""
	}
	return last
}

func (r *Redis) waitReady(ctx context.Context) error {
	o := r.adminOptions()
	o.MaxRetries = -1
	c := redis.NewClient(o)
	defer c.Close()
	deadline := time.Now().Add(15 * time.Second)
	for {
		err := c.Ping(ctx).Err()
		if err == nil {
			return nil
		}
		select {
		case <-r.Exited():
			return fmt.Errorf("redis-server %w:\n%s", errExited, r.Tail(20))
		default:
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("redis-server did not answer PING within 15s: %w", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// AdminClient returns a new client of the administrator (every command,
// every key); the caller closes it.
func (r *Redis) AdminClient() *redis.Client {
	o := r.adminOptions()
	o.PoolSize = 32
	return redis.NewClient(o)
}

func (r *Redis) adminOptions() *redis.Options {
	if r.Embedded {
		return &redis.Options{Addr: r.Addr}
	}
	return r.Users.AdminOptions(r.Addr)
}

// BrokerFlags are rb-broker's flags to connect as the limited user (none
// for the embedded server), with the grant keys every replica shares.
func (r *Redis) BrokerFlags() []string {
	if r.Embedded {
		return r.Users.GrantKeyFlags()
	}
	return r.Users.BrokerFlags()
}

// Denials lists what the ACL refused the brokers' user since Redis started
// (ACL LOG): a command or key manifests/redis/users.acl lacks. Nothing for
// the embedded server, or when Redis does not answer.
func (r *Redis) Denials() []string {
	if r == nil || r.Embedded || r.Addr == "" {
		return nil
	}
	o := r.adminOptions()
	o.MaxRetries = -1
	c := redis.NewClient(o)
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	entries, err := c.ACLLog(ctx, 128).Result()
	if err != nil {
		return nil
	}
	var out []string
	for _, e := range entries {
		if e.Username == redismanifest.BrokerUser {
			out = append(out, fmt.Sprintf("Redis refused the brokers' user %s: %s %q (%d times): manifests/redis/users.acl lacks it",
				e.Username, e.Reason, e.Object, e.Count))
		}
	}
	return out
}

// Restart kills redis-server (SIGKILL, as a crash) and starts it again on the
// same port and data directory; it returns when it answers PING, that is
// when it has loaded its append-only file. An embedded Redis cannot restart.
func (r *Redis) Restart(ctx context.Context) error {
	return r.RestartAfter(ctx, 0)
}

// RestartAfter is Restart with redis-server down for the given time between
// the kill and the start.
func (r *Redis) RestartAfter(ctx context.Context, down time.Duration) error {
	if r.Embedded {
		return errEmbeddedRestart
	}
	if err := r.Kill(); err != nil {
		return err
	}
	// The port is free once the process is gone; wait for the kernel to agree.
	for i := 0; i < 200; i++ {
		c, err := net.DialTimeout("tcp", r.Addr, 20*time.Millisecond)
		if err != nil {
			break
		}
		c.Close()
		time.Sleep(10 * time.Millisecond)
	}
	time.Sleep(down)
	if err := r.Start(); err != nil {
		return err
	}
	return r.waitReady(ctx)
}
