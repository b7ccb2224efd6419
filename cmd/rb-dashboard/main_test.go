package main

import (
	"context"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fluidos-project/resource-broker/internal/brokertest"
)

// TestProxyServesTheBrokersDashboard runs rb-dashboard's run against a real
// broker (real redis-server, mutual TLS) with an operator's certificate
// directory: the pages come through, and nothing but reads of /dashboard/.
func TestProxyServesTheBrokersDashboard(t *testing.T) {
	b := brokertest.Start(t, brokertest.Options{Operators: []string{"ops"}})
	b.Advertise("paris", "8", "32Gi", "", "0.02", nil)
	certDir := b.ClusterCertDir("ops") // a client certificate with CN=ops, and the CA
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close())

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- run(ctx, b.URL, certDir, addr) }()
	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-done)
	})
	client := &http.Client{Timeout: 10 * time.Second, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	get := func(method, path string) (int, string) {
		var resp *http.Response
		require.Eventually(t, func() bool {
			req, _ := http.NewRequest(method, "http://"+addr+path, nil)
			resp, err = client.Do(req)
			return err == nil
		}, 10*time.Second, 20*time.Millisecond)
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		return resp.StatusCode, string(body)
	}
	code, body := get(http.MethodGet, "/dashboard/")
	assert.Equal(t, http.StatusOK, code, body)
	assert.Contains(t, body, `data-cluster="paris"`)
	code, _ = get(http.MethodGet, "/")
	assert.Equal(t, http.StatusFound, code, "/ leads to the dashboard")
	code, _ = get(http.MethodPost, "/dashboard/")
	assert.Equal(t, http.StatusMethodNotAllowed, code)
	code, body = get(http.MethodGet, "/api/v2/clusters")
	assert.Equal(t, http.StatusNotFound, code, "the proxy forwards no API call: %s", body)
}

func TestBadFlags(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--cert-dir=/x", "--broker-url=http://broker:8443"}, `--broker-url "http://broker:8443": want https://host:port`},
		{[]string{"--broker-url=https://broker:8443"}, "--cert-dir is required"},
		{[]string{"--cert-dir=/nonexistent"}, "--cert-dir: "},
	} {
		cmd := newCommand()
		cmd.SetArgs(tc.args)
		err := cmd.Execute()
		require.Error(t, err, strings.Join(tc.args, " "))
		assert.Contains(t, err.Error(), tc.want)
	}
}
