// Package brokertest runs a real broker for tests: rb-broker's server on a
// real redis-server, over real mutual TLS on loopback, with a client
// certificate per cluster issued by a throw-away CA.
package brokertest

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"runtime/pprof"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/fluidos-project/resource-broker/broker/api"
	"github.com/fluidos-project/resource-broker/broker/dashboard"
	"github.com/fluidos-project/resource-broker/broker/server"
	"github.com/fluidos-project/resource-broker/broker/store"
	"github.com/fluidos-project/resource-broker/internal/certauthority"
	"github.com/fluidos-project/resource-broker/internal/certdir"
	"github.com/fluidos-project/resource-broker/internal/redistest"
)

// Broker is one running broker.
type Broker struct {
	t     testing.TB
	Redis *redistest.Server
	// RDB is an administrator's client of the broker's Redis, for what a
	// test inspects or breaks (INFO, SCRIPT FLUSH, ...); the broker's store
	// (Store) connects as the limited user of manifests/redis/users.acl.
	RDB   *redis.Client
	Store *store.Store
	// Cells and Cluster are those of a broker started by StartCells (Redis,
	// RDB and Snapshot are then unset); Store is its default cell's.
	Cells   *store.Cells
	Cluster *redistest.Cluster
	URL     string // https://127.0.0.1:<port>, the mutual-TLS API
	Health  string // http://127.0.0.1:<port>, /healthz /readyz /metrics
	CA      *certauthority.CA
	Dir     string // holds broker/ (the server's cert dir) and clusters/<id>/ once ClusterCertDir is called
	// Dashboard is the broker's web dashboard when Options.Operators name operators.
	Dashboard *dashboard.Dashboard

	mu      sync.Mutex
	clients map[string]*http.Client
}

// Options tune the broker; zero values take the defaults of store.Config and api.Limits.
type Options struct {
	Store          store.Config
	Limits         api.Limits
	ExpiryInterval time.Duration // default 50ms
	EventKeepAlive time.Duration // default 500ms
	// MaxStreamsPerCluster: server.Config's (0: its default; negative: no bound).
	MaxStreamsPerCluster int
	// MaxListsPerCluster: server.Config's (0: its default; negative: no bound).
	MaxListsPerCluster int
	// CertCheckInterval: how often, at most, the broker reads its certificate
	// directory (Dir/broker) again; default server.DefaultCertCheckInterval.
	CertCheckInterval time.Duration
	// Operators, when set, serve the web dashboard (broker/dashboard) to
	// these client certificates' common names, sampling the capacity history
	// every DashboardSample (default dashboard.DefaultSampleInterval).
	Operators       []string
	DashboardSample time.Duration
}

// Start runs a broker for t and stops it at cleanup.
func Start(t testing.TB, o Options) *Broker {
	t.Helper()
	rs := redistest.Start(t)
	if o.Store.GrantKeys == nil { // those of the rb-broker processes of StartProcess too
		keys, err := store.LoadGrantKeys(rs.Users.GrantKeyFile)
		require.NoError(t, err)
		o.Store.GrantKeys = keys
	}
	b := start(t, o, server.Config{Store: store.New(rs.Client(), o.Store)})
	b.Redis, b.RDB = rs, rs.AdminClient()
	return b
}

// StartCells runs a broker for t over a three-primary Redis Cluster
// (redistest.StartCluster), its federation split into the named cells by
// rule, and stops it at cleanup.
func StartCells(t testing.TB, o Options, names []string, rule store.CellRule) *Broker {
	t.Helper()
	rc := redistest.StartCluster(t, 3, names)
	if o.Store.GrantKeys == nil {
		keys, err := store.LoadGrantKeys(rc.Users.GrantKeyFile)
		require.NoError(t, err)
		o.Store.GrantKeys = keys
	}
	cells, err := store.NewCells(rc.Client(), o.Store, names, rule)
	require.NoError(t, err)
	b := start(t, o, server.Config{Cells: cells})
	b.Cells, b.Cluster = cells, rc
	return b
}

// start runs the server of cfg (its Store or Cells) with o.
func start(t testing.TB, o Options, cfg server.Config) *Broker {
	t.Helper()
	if o.ExpiryInterval == 0 {
		o.ExpiryInterval = 50 * time.Millisecond
	}
	if o.EventKeepAlive == 0 {
		o.EventKeepAlive = 500 * time.Millisecond
	}
	if o.CertCheckInterval == 0 {
		o.CertCheckInterval = server.DefaultCertCheckInterval
	}
	st := cfg.Store
	if cfg.Cells != nil {
		st = cfg.Cells.Cell(cfg.Cells.Default())
	}
	ca, err := certauthority.NewCA("test CA")
	require.NoError(t, err)
	pair, err := ca.IssueServer("rb-broker", []string{"127.0.0.1"})
	require.NoError(t, err)
	base := t.TempDir()
	dir := filepath.Join(base, "broker")
	// As the kubelet mounts the broker's Secret (..data links): RotateServer
	// updates it the same way.
	require.NoError(t, certdir.WriteAtomic(dir, TLSFiles(pair, ca.CertPEM)))
	log := testr.NewWithInterface(t, testr.Options{})
	certs, err := server.LoadCerts(dir, o.CertCheckInterval, log)
	require.NoError(t, err)

	apiLn, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	healthLn, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	cfg.Limits, cfg.Log, cfg.EventKeepAlive = o.Limits, log, o.EventKeepAlive
	cfg.MaxStreamsPerCluster, cfg.MaxListsPerCluster = o.MaxStreamsPerCluster, o.MaxListsPerCluster
	ctx, cancel := context.WithCancel(context.Background())
	var dash *dashboard.Dashboard
	if len(o.Operators) > 0 {
		dash, err = dashboard.New(dashboard.Config{Store: st, Cells: cfg.Cells, Operators: o.Operators, Log: log.WithName("dashboard"), SampleInterval: o.DashboardSample})
		require.NoError(t, err)
		cfg.Dashboard = dash
		go dash.Run(ctx)
	}
	srv := server.New(cfg)
	done := make(chan error, 1)
	// The broker's goroutines (its connections' included: they inherit the
	// labels) carry the pprof label rb=broker, so that a CPU profile of a test
	// or benchmark splits the broker from its clients:
	// go tool pprof -tagfocus rb=broker.
	go pprof.Do(ctx, pprof.Labels("rb", "broker"), func(ctx context.Context) {
		done <- srv.Run(ctx, server.RunOptions{APIListener: apiLn, Certs: certs, HealthListener: healthLn, ExpiryInterval: o.ExpiryInterval})
	})
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			require.NoError(t, err)
		case <-time.After(15 * time.Second):
			t.Error("broker did not stop")
		}
	})
	b := &Broker{t: t, Store: st, CA: ca, Dir: base, clients: map[string]*http.Client{}, Dashboard: dash,
		URL: "https://" + apiLn.Addr().String(), Health: "http://" + healthLn.Addr().String()}
	require.Eventually(t, func() bool {
		resp, err := http.Get(b.Health + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	}, 10*time.Second, 20*time.Millisecond)
	return b
}

// Client returns a keep-alive HTTPS client presenting a certificate with CN=cn.
func (b *Broker) Client(cn string) *http.Client {
	b.mu.Lock()
	defer b.mu.Unlock()
	if c, ok := b.clients[cn]; ok {
		return c
	}
	pair, err := b.CA.IssueClient(cn)
	require.NoError(b.t, err)
	cert, err := pair.TLSCertificate()
	require.NoError(b.t, err)
	c := b.HTTPClient(&tls.Config{RootCAs: b.CA.Pool(), Certificates: []tls.Certificate{cert}})
	b.clients[cn] = c
	return c
}

// HTTPClient returns a keep-alive HTTPS client with the given TLS configuration.
func (b *Broker) HTTPClient(cfg *tls.Config) *http.Client {
	tr := &http.Transport{TLSClientConfig: cfg, MaxIdleConnsPerHost: 256, IdleConnTimeout: time.Minute}
	b.t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr, Timeout: 30 * time.Second}
}

// Do sends body (marshalled unless it is a string or []byte) as cn and returns the status and the body.
func (b *Broker) Do(cn, method, path string, body any) (int, []byte) {
	b.t.Helper()
	var rd io.Reader
	switch v := body.(type) {
	case nil:
	case string:
		rd = bytes.NewBufferString(v)
	case []byte:
		rd = bytes.NewReader(v)
	default:
		data, err := json.Marshal(v)
		require.NoError(b.t, err)
		rd = bytes.NewReader(data)
	}
	req, err := http.NewRequest(method, b.URL+path, rd)
	require.NoError(b.t, err)
	resp, err := b.Client(cn).Do(req)
	require.NoError(b.t, err)
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	require.NoError(b.t, err)
	return resp.StatusCode, data
}

// Decode unmarshals a response body, failing the test with the body on error.
func Decode[T any](t testing.TB, data []byte) T {
	t.Helper()
	var v T
	require.NoError(t, json.Unmarshal(data, &v), "body: %s", data)
	return v
}

// Advertise publishes a cluster through the v2 API: everything allocatable,
// nothing allocated, priced per core-hour in EUR.
func (b *Broker) Advertise(id string, cpu, memory, gpu string, pricePerCore string, labels map[string]string) {
	b.t.Helper()
	q := Quantities(cpu, memory, gpu)
	body := api.Advertisement{
		ClusterName: id, Endpoint: "https://" + id + ".example:6443", Labels: labels,
		Resources: api.ClusterResources{Capacity: q, Allocatable: q, Allocated: Quantities("0", "0", "")},
		Prices:    &api.Prices{Currency: "EUR", CPU: MustQ(pricePerCore), Memory: MustQ("0.004")},
	}
	code, data := b.Do(id, http.MethodPut, "/api/v2/clusters/"+id+"/advertisement", body)
	require.Equal(b.t, http.StatusOK, code, "%s", data)
}

// Snapshot returns every rb:* key with a type-aware dump of its value, to
// prove that a refused call changed nothing.
func (b *Broker) Snapshot() map[string]string {
	b.t.Helper()
	ctx := context.Background()
	keys, err := b.RDB.Keys(ctx, "rb:*").Result()
	require.NoError(b.t, err)
	sort.Strings(keys)
	out := map[string]string{}
	for _, k := range keys {
		if strings.HasSuffix(k, ":clock") {
			continue // the expiry loop's heartbeat (lib.lua last_outage), written every second
		}
		typ := b.RDB.Type(ctx, k).Val()
		var v any
		switch typ {
		case "hash":
			v = b.RDB.HGetAll(ctx, k).Val()
		case "zset":
			v = b.RDB.ZRangeWithScores(ctx, k, 0, -1).Val()
		case "set":
			m := b.RDB.SMembers(ctx, k).Val()
			sort.Strings(m)
			v = m
		case "stream":
			v = b.RDB.XRange(ctx, k, "-", "+").Val()
		default:
			v = b.RDB.Dump(ctx, k).Val()
		}
		data, _ := json.Marshal(v)
		out[k] = typ + " " + string(data)
	}
	return out
}

// ClusterCertDir writes a client certificate for cluster id in the cert-manager
// layout (tls.crt, tls.key, ca.crt) and returns its directory.
// TLSFiles are a certificate directory's files: the pair and ca.crt.
func TLSFiles(p certauthority.Pair, caPEM []byte) map[string][]byte {
	return map[string][]byte{certdir.CertFile: p.CertPEM, certdir.KeyFile: p.KeyPEM, certdir.CAFile: caPEM}
}

// RotateServer replaces the broker's certificate directory (Dir/broker) as
// the kubelet updates a mounted Secret: pair is the new serving key pair,
// caPEM the CAs the broker trusts for client certificates.
func (b *Broker) RotateServer(pair certauthority.Pair, caPEM []byte) {
	b.t.Helper()
	require.NoError(b.t, certdir.WriteAtomic(filepath.Join(b.Dir, "broker"), TLSFiles(pair, caPEM)))
}

func (b *Broker) ClusterCertDir(id string) string {
	b.t.Helper()
	pair, err := b.CA.IssueClient(id)
	require.NoError(b.t, err)
	dir := filepath.Join(b.Dir, "clusters", id)
	require.NoError(b.t, certauthority.WriteTLSDir(dir, pair, b.CA.CertPEM))
	return dir
}

// MustQ parses a quantity.
func MustQ(s string) *resource.Quantity {
	q := resource.MustParse(s)
	return &q
}

// Quantities builds wire quantities; gpu may be empty.
func Quantities(cpu, memory, gpu string) api.Quantities {
	q := api.Quantities{CPU: MustQ(cpu), Memory: MustQ(memory)}
	if gpu != "" {
		q.GPU = MustQ(gpu)
	}
	return q
}
