package server_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fluidos-project/resource-broker/broker/api"
	"github.com/fluidos-project/resource-broker/broker/model"
	"github.com/fluidos-project/resource-broker/broker/server"
	"github.com/fluidos-project/resource-broker/broker/store"
	"github.com/fluidos-project/resource-broker/internal/brokertest"
	"github.com/fluidos-project/resource-broker/internal/certauthority"
	"github.com/fluidos-project/resource-broker/internal/certdir"
	"github.com/fluidos-project/resource-broker/internal/redistest"
	redismanifest "github.com/fluidos-project/resource-broker/manifests/redis"
)

// sentinelMaster is the name the Sentinels know the primary by.
const sentinelMaster = "rb-redis"

// sentinelSet is a Redis primary, its replica and three Sentinels on
// loopback, as manifests/redis-sentinel deploys them: every server loads the
// ACL of manifests/redis (the replica and the Sentinels log in as the tests'
// administrator), and the primary refuses writes without a replica
// (min-replicas-to-write).
type sentinelSet struct {
	t         *testing.T
	dir       string
	users     *redistest.Users
	servers   map[string]*exec.Cmd // redis-server by address
	sentinels []string
	// waitOnly: the primary takes writes without replicas (no
	// min-replicas-to-write): only the broker's WAIT holds them back.
	waitOnly bool
}

func startSentinelSet(t *testing.T) *sentinelSet {
	t.Helper()
	if _, err := exec.LookPath("redis-sentinel"); err != nil {
		t.Fatal("redis-sentinel not found on PATH: apt-get install -y redis-sentinel (.ci/run installs it)")
	}
	s := newSentinelSet(t)
	primary := s.startServer(freeLoopback(t), "")
	s.startServer(freeLoopback(t), primary)
	for i := 0; i < 3; i++ {
		s.startSentinel(freeLoopback(t), primary)
	}
	// A failover needs the Sentinels to know each other and the replica
	// (they learn both through the primary's hello channel).
	require.Eventually(t, func() bool {
		for _, addr := range s.sentinels {
			sc := redis.NewSentinelClient(&redis.Options{Addr: addr})
			peers, err1 := sc.Sentinels(context.Background(), sentinelMaster).Result()
			replicas, err2 := sc.Replicas(context.Background(), sentinelMaster).Result()
			sc.Close()
			if err1 != nil || err2 != nil || len(peers) != 2 || len(replicas) != 1 {
				return false
			}
		}
		return true
	}, 30*time.Second, 100*time.Millisecond, "the Sentinels never found each other and the replica")
	s.waitReplicaOnline(primary)
	return s
}

// waitReplicaOnline waits until primary streams to a replica: until then it
// refuses writes (min-replicas-to-write).
func (s *sentinelSet) waitReplicaOnline(primary string) {
	c := redis.NewClient(s.users.AdminOptions(primary))
	defer c.Close()
	require.Eventually(s.t, func() bool {
		info, err := c.Info(context.Background(), "replication").Result()
		return err == nil && strings.Contains(info, "state=online")
	}, 30*time.Second, 20*time.Millisecond, "the replica never caught up with %s", primary)
}

func newSentinelSet(t *testing.T) *sentinelSet {
	s := &sentinelSet{t: t, dir: t.TempDir(), servers: map[string]*exec.Cmd{}}
	var err error
	s.users, err = redistest.WriteUsers(s.dir)
	require.NoError(t, err)
	return s
}

// freeLoopback returns a loopback address with a port free now.
func freeLoopback(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	return ln.Addr().String()
}

// startServer runs redis-server on addr, a replica of replicaOf unless empty.
func (s *sentinelSet) startServer(addr, replicaOf string) string {
	host, port, _ := net.SplitHostPort(addr)
	dir := filepath.Join(s.dir, "redis-"+port)
	require.NoError(s.t, os.MkdirAll(dir, 0o700))
	args := append([]string{"--port", port, "--bind", host, "--dir", dir, "--save", "", "--appendonly", "no",
		"--masteruser", redistest.AdminUser, "--masterauth", s.users.AdminPassword, "--repl-diskless-sync-delay", "0"}, s.users.ServerArgs()...)
	if !s.waitOnly {
		args = append(args, "--min-replicas-to-write", "1", "--min-replicas-max-lag", "10")
	}
	if replicaOf != "" {
		h, p, _ := net.SplitHostPort(replicaOf)
		args = append(args, "--replicaof", h, p)
	}
	cmd := s.run("redis-server", dir, args...)
	s.servers[addr] = cmd
	c := redis.NewClient(s.users.AdminOptions(addr))
	defer c.Close()
	require.Eventually(s.t, func() bool { return c.Ping(context.Background()).Err() == nil }, 10*time.Second, 10*time.Millisecond)
	return addr
}

func (s *sentinelSet) startSentinel(addr, primary string) {
	host, port, _ := net.SplitHostPort(addr)
	ph, pp, _ := net.SplitHostPort(primary)
	dir := filepath.Join(s.dir, "sentinel-"+port)
	require.NoError(s.t, os.MkdirAll(dir, 0o700))
	conf := filepath.Join(dir, "sentinel.conf") // Sentinel rewrites it: its own file
	require.NoError(s.t, os.WriteFile(conf, []byte(fmt.Sprintf(`port %[1]s
bind %[2]s
dir %[3]s
sentinel monitor %[4]s %[5]s %[6]s 2
sentinel auth-user %[4]s %[7]s
sentinel auth-pass %[4]s %[8]s
sentinel down-after-milliseconds %[4]s 1000
sentinel failover-timeout %[4]s 10000
sentinel parallel-syncs %[4]s 1
`, port, host, dir, sentinelMaster, ph, pp, redistest.AdminUser, s.users.AdminPassword)), 0o600))
	s.run("redis-sentinel", dir, conf)
	s.sentinels = append(s.sentinels, addr)
	c := redis.NewSentinelClient(&redis.Options{Addr: addr})
	defer c.Close()
	require.Eventually(s.t, func() bool { return c.Ping(context.Background()).Err() == nil }, 10*time.Second, 10*time.Millisecond)
}

// run starts a process logging to dir/log, killed at cleanup.
func (s *sentinelSet) run(bin, dir string, args ...string) *exec.Cmd {
	log, err := os.Create(filepath.Join(dir, "log"))
	require.NoError(s.t, err)
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = log, log
	require.NoError(s.t, cmd.Start())
	go func() { _ = cmd.Wait(); log.Close() }()
	s.t.Cleanup(func() { _ = cmd.Process.Kill() })
	return cmd
}

// primary asks a Sentinel for the current primary's address.
func (s *sentinelSet) primary() (string, error) {
	c := redis.NewSentinelClient(&redis.Options{Addr: s.sentinels[0]})
	defer c.Close()
	hp, err := c.GetMasterAddrByName(context.Background(), sentinelMaster).Result()
	if err != nil {
		return "", err
	}
	return net.JoinHostPort(hp[0], hp[1]), nil
}

// client is the broker's Redis client, as rb-broker makes it with
// --redis-sentinel-master and --redis-sentinel-addrs.
func (s *sentinelSet) client() redis.UniversalClient {
	c := redis.NewFailoverClient(&redis.FailoverOptions{MasterName: sentinelMaster, SentinelAddrs: s.sentinels,
		Username: redismanifest.BrokerUser, Password: s.users.BrokerPassword, PoolSize: 64, MaxRetries: 1, DisableIdentity: true})
	s.t.Cleanup(func() { _ = c.Close() })
	return c
}

// sentinelBroker is a broker over the Sentinel set, served over mutual TLS.
type sentinelBroker struct {
	t       *testing.T
	url     string
	ca      *certauthority.CA
	store   *store.Store
	mu      sync.Mutex
	clients map[string]*http.Client
}

func startSentinelBroker(t *testing.T, set *sentinelSet, rdb redis.UniversalClient) *sentinelBroker {
	keys, err := store.LoadGrantKeys(set.users.GrantKeyFile)
	require.NoError(t, err)
	st := store.New(rdb, store.Config{Replicas: 1, GrantKeys: keys})
	require.NoError(t, st.LoadScripts(context.Background()))
	ca, err := certauthority.NewCA("test CA")
	require.NoError(t, err)
	pair, err := ca.IssueServer("rb-broker", []string{"127.0.0.1"})
	require.NoError(t, err)
	dir := filepath.Join(t.TempDir(), "broker")
	require.NoError(t, certdir.WriteAtomic(dir, brokertest.TLSFiles(pair, ca.CertPEM)))
	log := testr.NewWithInterface(t, testr.Options{})
	certs, err := server.LoadCerts(dir, server.DefaultCertCheckInterval, log)
	require.NoError(t, err)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv := server.New(server.Config{Store: st, Log: log})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- srv.Run(ctx, server.RunOptions{APIListener: ln, Certs: certs, ExpiryInterval: 200 * time.Millisecond})
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			assert.NoError(t, err)
		case <-time.After(15 * time.Second):
			t.Error("broker did not stop")
		}
	})
	return &sentinelBroker{t: t, url: "https://" + ln.Addr().String(), ca: ca, store: st, clients: map[string]*http.Client{}}
}

// client is an HTTPS client presenting a certificate with CN=cn.
func (b *sentinelBroker) client(cn string) *http.Client {
	b.mu.Lock()
	defer b.mu.Unlock()
	c, ok := b.clients[cn]
	if !ok {
		pair, err := b.ca.IssueClient(cn)
		require.NoError(b.t, err)
		cert, err := pair.TLSCertificate()
		require.NoError(b.t, err)
		tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: b.ca.Pool(), Certificates: []tls.Certificate{cert}}, MaxIdleConnsPerHost: 64}
		b.t.Cleanup(tr.CloseIdleConnections)
		c = &http.Client{Transport: tr, Timeout: 10 * time.Second}
		b.clients[cn] = c
	}
	return c
}

// do sends body as cn: the status (0 when no answer came) and the body.
func (b *sentinelBroker) do(cn, method, path string, body any) (int, []byte) {
	c := b.client(cn)
	var rd io.Reader
	if body != nil {
		data, err := json.Marshal(body)
		require.NoError(b.t, err)
		rd = bytes.NewReader(data)
	}
	req, err := http.NewRequest(method, b.url+path, rd)
	require.NoError(b.t, err)
	resp, err := c.Do(req)
	if err != nil {
		return 0, []byte(err.Error())
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, data
}

// failoverLoad is what the requesters of TestFaultsSentinelFailover were
// answered, and when.
type failoverLoad struct {
	mu       sync.Mutex
	live     map[string]string // requester/id -> provider: answered 201 (or 200, a replay), not released
	released map[string]bool   // answered 200 to a release
	// releasing: a release was sent but not answered 200 (a failover or
	// the end of the test cut it short): it may or may not have happened.
	releasing map[string]bool
	statuses  map[int]int // every answer's status (0: no answer)
	lost      []string    // an answered lease that a renewal said was not found
	// lastOK: the last answer to a write before killedAt; firstOKAfter: the
	// first to a write sent after it.
	killedAt, lastOK, firstOKAfter time.Time
}

func (l *failoverLoad) answered(code int, sent time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.statuses[code]++
	if code < 200 || code > 299 {
		return
	}
	now := time.Now()
	switch {
	case l.killedAt.IsZero():
		l.lastOK = now
	case l.firstOKAfter.IsZero() && sent.After(l.killedAt):
		l.firstOKAfter = now
	}
}

// TestFaultsSentinelFailover: under reservation load through the broker's
// API (reserve, renew, release, advertise, over mutual TLS), the Redis
// primary is killed (SIGKILL) and Sentinel promotes the replica; the killed
// server comes back as a replica of the new primary, as a restarted pod
// does. No reservation the broker acknowledged is lost, no release it
// acknowledged is undone, and the books balance (store.CheckInvariant: no
// provider overbooked). Logs the time from the kill to the first
// acknowledged write.
func TestFaultsSentinelFailover(t *testing.T) {
	set := startSentinelSet(t)
	b := startSentinelBroker(t, set, set.client())
	ctx := context.Background()
	q := brokertest.Quantities("24", "96Gi", "")
	advertise := func(id string) int {
		code, _ := b.do(id, http.MethodPut, "/api/v2/clusters/"+id+"/advertisement", api.Advertisement{ClusterName: id,
			Resources: api.ClusterResources{Capacity: q, Allocatable: q, Allocated: brokertest.Quantities("0", "0", "")},
			Prices:    &api.Prices{Currency: "EUR", CPU: brokertest.MustQ("0.03"), Memory: brokertest.MustQ("0.004")}})
		return code
	}
	providers := []string{"paris", "berlin"}
	for _, p := range providers {
		require.Equal(t, http.StatusOK, advertise(p))
	}

	load := &failoverLoad{live: map[string]string{}, released: map[string]bool{}, releasing: map[string]bool{}, statuses: map[int]int{}}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	// retry sends a request until it is answered other than 503 (or
	// nothing), as agents retry; it gives up when the test stops.
	retry := func(send func() (int, []byte)) (int, []byte) {
		for {
			sent := time.Now()
			code, data := send()
			load.answered(code, sent)

			if code != 0 && code != http.StatusServiceUnavailable {
				return code, data
			}
			select {
			case <-stop:
				return code, data
			case <-time.After(50 * time.Millisecond):
			}
		}
	}
	wg.Add(1)
	go func() { // the providers' agents keep advertising
		defer wg.Done()
		for {
			for _, p := range providers {
				retry(func() (int, []byte) { return advertise(p), nil })
			}
			select {
			case <-stop:
				return
			case <-time.After(200 * time.Millisecond):
			}
		}
	}()
	// 12 requesters keep up to 6 one-CPU leases each: 72 CPUs wanted of 48,
	// so requests are refused (409) as well, and every decision is a fit.
	for w := range 12 {
		requester := fmt.Sprintf("req-%d", w)
		wg.Add(1)
		go func() {
			defer wg.Done()
			var mine []string
			for n := 0; ; n++ {
				select {
				case <-stop:
					return
				default:
				}
				id := fmt.Sprintf("r-%d", n)
				code, data := retry(func() (int, []byte) {
					return b.do(requester, http.MethodPost, "/api/v2/reservations", reservationLease(id, "1", "1Gi", "2m"))
				})
				if code == http.StatusCreated || code == http.StatusOK {
					r := brokertest.Decode[api.Reservation](t, data)
					load.mu.Lock()
					load.live[requester+"/"+id] = r.Provider
					load.mu.Unlock()
					mine = append(mine, id)
				}
				if n%4 == 3 && len(mine) > 0 {
					code, data := retry(func() (int, []byte) {
						return b.do(requester, http.MethodPost, "/api/v2/renewals", api.RenewRequest{IDs: mine})
					})
					if code == http.StatusOK {
						for _, r := range brokertest.Decode[api.RenewResponse](t, data).Refused {
							load.mu.Lock()
							load.lost = append(load.lost, requester+"/"+r.ID+" ("+r.Reason+")")
							load.mu.Unlock()
						}
					}
				}
				if len(mine) >= 6 || (code == http.StatusConflict && len(mine) > 0) {
					victim := requester + "/" + mine[0]
					load.mu.Lock()
					delete(load.live, victim)
					load.releasing[victim] = true
					load.mu.Unlock()
					code, _ := retry(func() (int, []byte) {
						return b.do(requester, http.MethodDelete, "/api/v2/reservations/"+mine[0], nil)
					})
					if code == http.StatusOK {
						mine = mine[1:]
						load.mu.Lock()
						delete(load.releasing, victim)
						load.released[victim] = true
						load.mu.Unlock()
					}
				}
			}
		}()
	}

	acked := func() int {
		load.mu.Lock()
		defer load.mu.Unlock()
		return len(load.live) + len(load.released)
	}
	require.Eventually(t, func() bool { return acked() >= 300 }, 60*time.Second, 10*time.Millisecond, "no load")
	old, err := set.primary()
	require.NoError(t, err)
	load.mu.Lock()
	load.killedAt = time.Now()
	before := len(load.live) + len(load.released)
	load.mu.Unlock()
	require.NoError(t, set.servers[old].Process.Signal(syscall.SIGKILL))

	// The Sentinels promote the replica; the killed server restarts as a
	// replica of it (as manifests/redis-sentinel's init container makes it).
	var promoted string
	require.Eventually(t, func() bool {
		promoted, err = set.primary()
		return err == nil && promoted != old
	}, 60*time.Second, 50*time.Millisecond, "no failover")
	failover := time.Since(load.killedAt)
	set.startServer(old, promoted)

	require.Eventually(t, func() bool {
		load.mu.Lock()
		defer load.mu.Unlock()
		return !load.firstOKAfter.IsZero() && time.Since(load.firstOKAfter) > 2*time.Second
	}, 60*time.Second, 20*time.Millisecond, "the broker never served again")
	afterKill := acked()
	close(stop)
	wg.Wait()

	load.mu.Lock()
	defer load.mu.Unlock()
	t.Logf("acknowledged: %d reservations and releases before the kill, %d in all; answers by status %v", before, len(load.live)+len(load.released), load.statuses)
	assert.Greater(t, afterKill, before, "nothing acknowledged after the failover")
	t.Logf("failover: Sentinel named a new primary %s after the kill, the broker answered again %s after it (%s after its last answer before it)",
		failover.Round(time.Millisecond), load.firstOKAfter.Sub(load.killedAt).Round(time.Millisecond), load.firstOKAfter.Sub(load.lastOK).Round(time.Millisecond))
	assert.Empty(t, load.lost, "renewals refused for acknowledged leases")

	lost, undone := 0, 0
	for qid, provider := range load.live {
		requester, id, _ := model.SplitQualifiedID(qid)
		r, err := b.store.Reservation(ctx, requester, id)
		if err != nil || r.Phase != model.PhaseReserved && r.Phase != model.PhaseActive || r.Target != provider {
			lost++
			t.Errorf("acknowledged reservation %s on %s: %+v, %v", qid, provider, r, err)
		}
	}
	for qid := range load.released {
		requester, id, _ := model.SplitQualifiedID(qid)
		r, err := b.store.Reservation(ctx, requester, id)
		if err != nil || r.Phase != model.PhaseReleased {
			undone++
			t.Errorf("acknowledged release of %s undone: %+v, %v", qid, r, err)
		}
	}
	t.Logf("acknowledged grants lost: %d, acknowledged releases undone: %d", lost, undone)
	require.NoError(t, b.store.CheckInvariant(ctx), "overbooking or books out of balance after the failover")
	for _, p := range providers {
		c, err := b.store.Cluster(ctx, p)
		require.NoError(t, err)
		assert.LessOrEqual(t, c.Reserved.CPU, c.Allocatable.CPU-c.Allocated.CPU, "%s overbooked", p)
	}
	assert.Equal(t, 0, lost+undone)
}

// TestFaultsReplicaLost: a decision no replica acknowledges in time (the
// replica is frozen) is not acknowledged: 503 with Retry-After. Retried as
// it was once the replica is back, it is answered with the decision made the
// first time (idempotent), now replicated.
func TestFaultsReplicaLost(t *testing.T) {
	set := newSentinelSet(t)
	set.waitOnly = true
	primary := set.startServer(freeLoopback(t), "")
	replica := set.startServer(freeLoopback(t), primary)
	set.waitReplicaOnline(primary)
	rdb := redis.NewClient(set.users.BrokerOptions(primary))
	t.Cleanup(func() { _ = rdb.Close() })
	b := startSentinelBroker(t, set, rdb)
	q := brokertest.Quantities("8", "32Gi", "")
	code, data := b.do("paris", http.MethodPut, "/api/v2/clusters/paris/advertisement", api.Advertisement{ClusterName: "paris",
		Resources: api.ClusterResources{Capacity: q, Allocatable: q, Allocated: brokertest.Quantities("0", "0", "")}})
	require.Equal(t, http.StatusOK, code, "%s", data)
	code, data = b.do("rome", http.MethodPost, "/api/v2/reservations", reservation("r1", "1", "1Gi"))
	require.Equal(t, http.StatusCreated, code, "%s", data)

	require.NoError(t, set.servers[replica].Process.Signal(syscall.SIGSTOP))
	t.Cleanup(func() { _ = set.servers[replica].Process.Signal(syscall.SIGCONT) })
	start := time.Now()
	resp, err := b.client("rome").Post(b.url+"/api/v2/reservations", "application/json",
		bytes.NewReader(mustJSON(t, reservation("r2", "2", "1Gi"))))
	require.NoError(t, err)
	data, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	require.Equal(t, http.StatusServiceUnavailable, resp.StatusCode, "%s", data)
	assert.Equal(t, "1", resp.Header.Get("Retry-After"))
	e := brokertest.Decode[api.Error](t, data)
	assert.Equal(t, api.ReasonUnavailable, e.Reason)
	assert.Contains(t, e.Error, "not replicated: 0 of 1 replicas acknowledged within 1s")
	assert.GreaterOrEqual(t, time.Since(start), store.DefaultReplicaTimeout, "it waited for the replica")

	require.NoError(t, set.servers[replica].Process.Signal(syscall.SIGCONT))
	code, data = b.do("rome", http.MethodPost, "/api/v2/reservations", reservation("r2", "2", "1Gi"))
	require.Equal(t, http.StatusOK, code, "the decision of the first try: %s", data)
	r := brokertest.Decode[api.Reservation](t, data)
	assert.Equal(t, "paris", r.Provider)
	assert.Equal(t, "2", r.Resources.CPU.String())
	// On the replica: a failover now would keep it.
	rc := redis.NewClient(set.users.AdminOptions(replica))
	defer rc.Close()
	phase, err := rc.HGet(context.Background(), b.store.Key("resv:", model.QualifiedID("rome", "r2")), "phase").Result()
	require.NoError(t, err)
	assert.Equal(t, model.PhaseReserved, phase)
	require.NoError(t, b.store.CheckInvariant(context.Background()))
}

func mustJSON(t *testing.T, v any) []byte {
	data, err := json.Marshal(v)
	require.NoError(t, err)
	return data
}
