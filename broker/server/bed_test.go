package server_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/fluidos-project/resource-broker/broker/api"
	"github.com/fluidos-project/resource-broker/broker/server"
	"github.com/fluidos-project/resource-broker/broker/store"
	"github.com/fluidos-project/resource-broker/internal/devcerts"
	"github.com/fluidos-project/resource-broker/internal/redistest"
)

// bed is one broker on a real redis-server, served over real mutual TLS on
// loopback, with a client certificate per cluster.
type bed struct {
	t      *testing.T
	rdb    *redis.Client
	store  *store.Store
	url    string
	health string
	ca     *devcerts.CA

	mu      sync.Mutex
	clients map[string]*http.Client
}

func newBed(t *testing.T, cfg store.Config, lim api.Limits) *bed {
	t.Helper()
	rdb := redistest.Start(t).Client()
	st := store.New(rdb, cfg)
	ca, err := devcerts.NewCA("test CA")
	require.NoError(t, err)
	pair, err := ca.IssueServer("rb-broker", []string{"127.0.0.1"})
	require.NoError(t, err)
	dir := filepath.Join(t.TempDir(), "broker")
	require.NoError(t, devcerts.WriteTLSDir(dir, pair, ca.CertPEM))
	tlsConfig, err := server.TLSConfig(dir)
	require.NoError(t, err)

	apiLn, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	healthLn, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv := server.New(server.Config{Store: st, Limits: lim, Log: testr.New(t), EventBlock: 500 * time.Millisecond})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- srv.Run(ctx, server.RunOptions{APIListener: apiLn, TLSConfig: tlsConfig, HealthListener: healthLn, ExpiryInterval: 50 * time.Millisecond})
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			require.NoError(t, err)
		case <-time.After(15 * time.Second):
			t.Error("broker did not stop")
		}
	})
	b := &bed{t: t, rdb: rdb, store: st, ca: ca, clients: map[string]*http.Client{},
		url: "https://" + apiLn.Addr().String(), health: "http://" + healthLn.Addr().String()}
	require.Eventually(t, func() bool {
		resp, err := http.Get(b.health + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	}, 10*time.Second, 20*time.Millisecond)
	return b
}

// client returns a keep-alive HTTPS client presenting a certificate with CN=cn.
func (b *bed) client(cn string) *http.Client {
	b.mu.Lock()
	defer b.mu.Unlock()
	if c, ok := b.clients[cn]; ok {
		return c
	}
	pair, err := b.ca.IssueClient(cn)
	require.NoError(b.t, err)
	cert, err := pair.TLSCertificate()
	require.NoError(b.t, err)
	c := b.httpClient(&tls.Config{RootCAs: b.ca.Pool(), Certificates: []tls.Certificate{cert}})
	b.clients[cn] = c
	return c
}

func (b *bed) httpClient(cfg *tls.Config) *http.Client {
	tr := &http.Transport{TLSClientConfig: cfg, MaxIdleConnsPerHost: 256, IdleConnTimeout: time.Minute}
	b.t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr, Timeout: 30 * time.Second}
}

// do sends body (marshalled unless it is a string or []byte) as cn and returns the status and the body.
func (b *bed) do(cn, method, path string, body any) (int, []byte) {
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
	req, err := http.NewRequest(method, b.url+path, rd)
	require.NoError(b.t, err)
	resp, err := b.client(cn).Do(req)
	require.NoError(b.t, err)
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	require.NoError(b.t, err)
	return resp.StatusCode, data
}

// decode unmarshals a response body, failing the test with the body on error.
func decode[T any](t *testing.T, data []byte) T {
	t.Helper()
	var v T
	require.NoError(t, json.Unmarshal(data, &v), "body: %s", data)
	return v
}

// advertise publishes a cluster through the v2 API.
func (b *bed) advertise(id string, cpu, memory, gpu string, pricePerCore string, labels map[string]string) {
	b.t.Helper()
	q := quantities(cpu, memory, gpu)
	body := api.Advertisement{
		ClusterName: id, Endpoint: "https://" + id + ".example:6443", Labels: labels,
		Resources: api.ClusterResources{Capacity: q, Allocatable: q, Allocated: quantities("0", "0", "")},
		Prices:    &api.Prices{Currency: "EUR", CPU: mustQ(pricePerCore), Memory: mustQ("0.004")},
	}
	code, data := b.do(id, http.MethodPut, "/api/v2/clusters/"+id+"/advertisement", body)
	require.Equal(b.t, http.StatusOK, code, "%s", data)
}

// snapshot returns every rb:* key with a type-aware dump of its value.
func (b *bed) snapshot() map[string]string {
	b.t.Helper()
	ctx := context.Background()
	keys, err := b.rdb.Keys(ctx, "rb:*").Result()
	require.NoError(b.t, err)
	sort.Strings(keys)
	out := map[string]string{}
	for _, k := range keys {
		typ := b.rdb.Type(ctx, k).Val()
		var v any
		switch typ {
		case "hash":
			v = b.rdb.HGetAll(ctx, k).Val()
		case "zset":
			v = b.rdb.ZRangeWithScores(ctx, k, 0, -1).Val()
		case "set":
			m := b.rdb.SMembers(ctx, k).Val()
			sort.Strings(m)
			v = m
		case "stream":
			v = b.rdb.XRange(ctx, k, "-", "+").Val()
		default:
			v = b.rdb.Dump(ctx, k).Val()
		}
		data, _ := json.Marshal(v)
		out[k] = typ + " " + string(data)
	}
	return out
}
