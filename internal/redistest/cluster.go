package redistest

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"

	redismanifest "github.com/fluidos-project/resource-broker/manifests/redis"
)

// Cluster is a running Redis Cluster of primaries, with or without a
// replica each, every node a redis-server of this package (same users,
// protected mode, ACL check at cleanup), its slots assigned by `redis-cli
// --cluster create`.
type Cluster struct {
	Primaries []*Server
	// Replicas[i] replicates Primaries[i] (StartClusterWithReplicas).
	Replicas []*Server
	Users    *Users
	t        testing.TB
}

// StartCluster runs a Redis Cluster of n primaries for t, whose broker's
// user may use the keys of the given cells (redismanifest.CellsACL), and
// returns once every primary says cluster_state:ok. It stops them at
// cleanup.
func StartCluster(t testing.TB, n int, cells []string) *Cluster {
	t.Helper()
	return startCluster(t, n, false, cells)
}

// StartClusterWithReplicas is StartCluster with one replica per primary; it
// returns once every replica's link to its primary is up.
func StartClusterWithReplicas(t testing.TB, n int, cells []string) *Cluster {
	t.Helper()
	return startCluster(t, n, true, cells)
}

func startCluster(t testing.TB, n int, withReplicas bool, cells []string) *Cluster {
	t.Helper()
	bin, err := Binary()
	if err != nil {
		t.Fatal(err)
	}
	cli, err := exec.LookPath(filepath.Join(filepath.Dir(bin), "redis-cli"))
	if err != nil {
		if cli, err = exec.LookPath("redis-cli"); err != nil {
			t.Fatalf("redis-cli not found next to %s nor on PATH: %v", bin, err)
		}
	}
	c := &Cluster{t: t}
	if c.Users, err = writeUsers(t.TempDir(), func(pw string) string { return redismanifest.CellsACL(pw, cells) }); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < n; i++ {
		c.Primaries = append(c.Primaries, c.startNode(bin))
	}
	addrs := make([]string, n)
	for i, s := range c.Primaries {
		addrs[i] = s.Addr
	}
	create := exec.Command(cli, append(append([]string{"--user", AdminUser, "--cluster", "create"}, addrs...),
		"--cluster-replicas", "0", "--cluster-yes")...)
	create.Env = append(os.Environ(), "REDISCLI_AUTH="+c.Users.AdminPassword) // not on the command line
	if out, err := create.CombinedOutput(); err != nil {
		t.Fatalf("redis-cli --cluster create: %v\n%s", err, out)
	}
	c.waitOK()
	if withReplicas {
		for _, p := range c.Primaries {
			c.Replicas = append(c.Replicas, c.addReplica(bin, cli, p))
		}
	}
	return c
}

// addReplica starts a node and makes it primary's replica (`redis-cli
// --cluster add-node --cluster-slave`), then waits until it has synced.
func (c *Cluster) addReplica(bin, cli string, primary *Server) *Server {
	c.t.Helper()
	ctx := context.Background()
	r := c.startNode(bin)
	a := redis.NewClient(c.Users.AdminOptions(primary.Addr))
	defer a.Close()
	id, err := a.ClusterMyID(ctx).Result()
	if err != nil {
		c.t.Fatalf("cluster myid of %s: %v", primary.Addr, err)
	}
	add := exec.Command(cli, "--user", AdminUser, "--cluster", "add-node", r.Addr, primary.Addr,
		"--cluster-slave", "--cluster-master-id", id)
	add.Env = append(os.Environ(), "REDISCLI_AUTH="+c.Users.AdminPassword)
	if out, err := add.CombinedOutput(); err != nil {
		c.t.Fatalf("redis-cli --cluster add-node %s as replica of %s: %v\n%s", r.Addr, primary.Addr, err, out)
	}
	ra := redis.NewClient(c.Users.AdminOptions(r.Addr))
	defer ra.Close()
	deadline := time.Now().Add(30 * time.Second)
	for {
		info, err := ra.Info(ctx, "replication").Result()
		if err == nil && strings.Contains(info, "master_link_status:up") && strings.Contains(info, "master_port:"+primaryPort(primary.Addr)) {
			return r
		}
		if time.Now().After(deadline) {
			c.t.Fatalf("replica %s of %s not synced within 30s: %v\n%s", r.Addr, primary.Addr, err, info)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func primaryPort(addr string) string {
	_, port, _ := net.SplitHostPort(addr)
	return port
}

// startNode starts one cluster-enabled redis-server on a free port, with a
// free port for its cluster bus (not the default port+10000, which may be
// taken or out of range).
func (c *Cluster) startNode(bin string) *Server {
	c.t.Helper()
	var lastErr error
	for attempt := 0; attempt < 5; attempt++ { // a free port can be taken before we bind it
		port, err := freePort()
		if err != nil {
			c.t.Fatal(err)
		}
		bus, err := freePort()
		if err != nil {
			c.t.Fatal(err)
		}
		s := &Server{Dir: c.t.TempDir(), Users: c.Users, t: c.t, Addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(port))}
		s.args = append([]string{"--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
			"--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf", "--cluster-port", strconv.Itoa(bus),
			"--cluster-node-timeout", "2000", "--repl-diskless-sync-delay", "0",
			// A replica (or a primary demoted by a failover) syncs as the administrator.
			"--masteruser", AdminUser, "--masterauth", c.Users.AdminPassword}, c.Users.ServerArgs()...)
		if lastErr = s.start(bin); lastErr == nil {
			c.t.Cleanup(func() {
				s.checkDenials()
				s.Stop()
			})
			return s
		}
	}
	c.t.Fatalf("start redis-server (cluster node): %v", lastErr)
	return nil
}

// waitOK waits until every primary still running says cluster_state:ok (the
// slot map has reached them all).
func (c *Cluster) waitOK() {
	c.t.Helper()
	ctx := context.Background()
	deadline := time.Now().Add(30 * time.Second)
	for _, s := range c.Primaries {
		a := redis.NewClient(c.Users.AdminOptions(s.Addr))
		for {
			info, err := a.ClusterInfo(ctx).Result()
			if err == nil && strings.Contains(info, "cluster_state:ok") {
				break
			}
			if time.Now().After(deadline) {
				a.Close()
				c.t.Fatalf("redis cluster node %s not ok within 30s: %v\n%s", s.Addr, err, info)
			}
			time.Sleep(50 * time.Millisecond)
		}
		a.Close()
	}
}

// clusterOptions are the client options of a user for this cluster.
func (c *Cluster) clusterOptions(o *redis.Options) *redis.ClusterOptions {
	addrs := make([]string, len(c.Primaries))
	for i, s := range c.Primaries {
		addrs[i] = s.Addr
	}
	return &redis.ClusterOptions{Addrs: addrs, Username: o.Username, Password: o.Password,
		DisableIdentity: o.DisableIdentity, MaintNotificationsConfig: o.MaintNotificationsConfig}
}

// Client returns a new cluster client of the broker's user, closed at
// cleanup: the client to give the broker's code.
func (c *Cluster) Client() *redis.ClusterClient {
	o := c.clusterOptions(c.Users.BrokerOptions(""))
	o.PoolSize = 64
	o.MaintNotificationsConfig = &maintnotifications.Config{Mode: maintnotifications.ModeDisabled}
	rdb := redis.NewClusterClient(o)
	c.t.Cleanup(func() { _ = rdb.Close() })
	return rdb
}

// AdminClient returns a new cluster client of the administrator, closed at
// cleanup.
func (c *Cluster) AdminClient() *redis.ClusterClient {
	rdb := redis.NewClusterClient(c.clusterOptions(c.Users.AdminOptions("")))
	c.t.Cleanup(func() { _ = rdb.Close() })
	return rdb
}

// PrimaryOf returns the address of the primary that holds key's slot, as
// CLUSTER SLOTS of the first primary says.
func (c *Cluster) PrimaryOf(key string) (string, error) {
	ctx := context.Background()
	a := redis.NewClient(c.Users.AdminOptions(c.Primaries[0].Addr))
	defer a.Close()
	slot, err := a.ClusterKeySlot(ctx, key).Result()
	if err != nil {
		return "", err
	}
	ranges, err := a.ClusterSlots(ctx).Result()
	if err != nil {
		return "", err
	}
	for _, r := range ranges {
		if int64(r.Start) <= slot && slot <= int64(r.End) && len(r.Nodes) > 0 {
			return r.Nodes[0].Addr, nil
		}
	}
	return "", fmt.Errorf("no primary holds slot %d of %q", slot, key)
}
