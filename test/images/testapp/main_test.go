package main

import (
	"encoding/json"
	"encoding/pem"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// newTest serves newHandler with env as the environment; exits receives the
// codes it exits with.
func newTest(t *testing.T, env map[string]string) (srv *httptest.Server, exits chan int) {
	t.Helper()
	exits = make(chan int, 1)
	srv = httptest.NewServer(logRequests(newHandler(
		func(k string) string { return env[k] },
		func(code int) { exits <- code },
	)))
	t.Cleanup(srv.Close)
	return srv, exits
}

func do(t *testing.T, method, url string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, url, http.NoBody)
	require.NoError(t, err)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(b)
}

func TestIdentity(t *testing.T) {
	srv, _ := newTest(t, map[string]string{
		"CLUSTER_NAME":  "rome",
		"NODE_NAME":     "rome-1",
		"POD_NAME":      "web-0",
		"POD_NAMESPACE": "shop",
		"HOST_IP":       "10.0.0.7",
		"POD_IP":        "10.244.1.9",
	})
	resp, err := http.Get(srv.URL + "/")
	require.NoError(t, err)
	defer resp.Body.Close()
	assert.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Equal(t, "application/json", resp.Header.Get("Content-Type"))
	var got map[string]string
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&got))
	hostname, _ := os.Hostname()
	assert.Equal(t, map[string]string{
		"cluster":   "rome",
		"node":      "rome-1",
		"pod":       "web-0",
		"namespace": "shop",
		"hostIP":    "10.0.0.7",
		"podIP":     "10.244.1.9",
		"hostname":  hostname,
	}, got)
}

func TestIdentityUnset(t *testing.T) {
	srv, _ := newTest(t, nil)
	code, body := do(t, http.MethodGet, srv.URL+"/")
	assert.Equal(t, http.StatusOK, code)
	assert.Contains(t, body, `"cluster":"","node":"","pod":"","namespace":""`)
	assert.Contains(t, body, `"hostIP":"","podIP":""`)
}

func TestRoutes(t *testing.T) {
	srv, _ := newTest(t, nil)
	for _, tc := range []struct {
		method, path string
		code         int
		body         string
	}{
		{http.MethodGet, "/healthz", http.StatusOK, "ok"},
		{http.MethodGet, "/nowhere", http.StatusNotFound, ""},
		{http.MethodGet, "/burn?cpu=1&seconds=1", http.StatusMethodNotAllowed, ""},
		{http.MethodGet, "/exit?code=0", http.StatusMethodNotAllowed, ""},
		{http.MethodPost, "/", http.StatusMethodNotAllowed, ""},
	} {
		code, body := do(t, tc.method, srv.URL+tc.path)
		assert.Equal(t, tc.code, code, "%s %s", tc.method, tc.path)
		if tc.body != "" {
			assert.Equal(t, tc.body, body, "%s %s", tc.method, tc.path)
		}
	}
}

func TestBurn(t *testing.T) {
	srv, _ := newTest(t, nil)
	for _, q := range []string{
		"",
		"cpu=1",
		"seconds=1",
		"cpu=abc&seconds=1",
		"cpu=0&seconds=1",
		"cpu=-1&seconds=1",
		"cpu=8.5&seconds=1",
		"cpu=NaN&seconds=1",
		"cpu=Inf&seconds=1",
		"cpu=1&seconds=0",
		"cpu=1&seconds=-5",
		"cpu=1&seconds=1.5",
		"cpu=1&seconds=3601",
		"cpu=1&seconds=x",
	} {
		code, body := do(t, http.MethodPost, srv.URL+"/burn?"+q)
		assert.Equal(t, http.StatusBadRequest, code, "burn?%s", q)
		assert.NotEmpty(t, body, "burn?%s: the 400 says why", q)
	}

	// A hundredth of a core for a second: accepted, and cheap.
	code, body := do(t, http.MethodPost, srv.URL+"/burn?cpu=0.01&seconds=1")
	assert.Equal(t, http.StatusAccepted, code)
	assert.Contains(t, body, "burning 0.01 cores for 1 s")
}

func TestExit(t *testing.T) {
	srv, exits := newTest(t, nil)
	for _, q := range []string{"", "code=", "code=x", "code=-1", "code=256", "code=1.5"} {
		code, body := do(t, http.MethodPost, srv.URL+"/exit?"+q)
		assert.Equal(t, http.StatusBadRequest, code, "exit?%s", q)
		assert.NotEmpty(t, body, "exit?%s: the 400 says why", q)
	}
	select {
	case c := <-exits:
		t.Fatalf("exited with %d on bad input", c)
	default:
	}

	code, body := do(t, http.MethodPost, srv.URL+"/exit?code=3")
	assert.Equal(t, http.StatusOK, code)
	assert.Contains(t, body, "exiting with code 3")
	select {
	case c := <-exits:
		assert.Equal(t, 3, c)
	case <-time.After(5 * time.Second):
		t.Fatal("did not exit")
	}
}

func TestGetPrintsTheBody(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/missing" {
			http.NotFound(w, r)
			return
		}
		_, _ = io.WriteString(w, "hello")
	}))
	defer srv.Close()
	var out, errOut strings.Builder
	if code := request("get", srv.URL+"/", &out, &errOut); code != 0 || out.String() != "hello" {
		t.Fatalf("get: code %d, out %q, err %q", code, out.String(), errOut.String())
	}
	out.Reset()
	if code := request("get", srv.URL+"/missing", &out, &errOut); code != 1 || !strings.Contains(errOut.String(), "404") {
		t.Fatalf("get of a 404: code %d, err %q", code, errOut.String())
	}
	if code := request("get", "http://127.0.0.1:1/", &out, &errOut); code != 1 {
		t.Fatalf("get of a closed port: code %d", code)
	}
}

func TestPostAndReadiness(t *testing.T) {
	srv := httptest.NewServer(newHandler(func(string) string { return "" }, func(int) {}))
	defer srv.Close()
	var out, errOut strings.Builder
	if code := request("get", srv.URL+"/readyz", &out, &errOut); code != 0 || out.String() != "ready" {
		t.Fatalf("readyz at start: code %d, out %q, err %q", code, out.String(), errOut.String())
	}
	if code := request("post", srv.URL+"/ready?ready=false", &out, &errOut); code != 0 {
		t.Fatalf("post ready=false: code %d, err %q", code, errOut.String())
	}
	errOut.Reset()
	if code := request("get", srv.URL+"/readyz", &out, &errOut); code != 1 || !strings.Contains(errOut.String(), "503") {
		t.Fatalf("readyz once unready: code %d, err %q", code, errOut.String())
	}
	if code := request("post", srv.URL+"/ready?ready=maybe", &out, &errOut); code != 1 || !strings.Contains(errOut.String(), "400") {
		t.Fatalf("post ready=maybe: code %d, err %q", code, errOut.String())
	}
	if code := request("post", srv.URL+"/ready?ready=true", &out, &errOut); code != 0 {
		t.Fatalf("post ready=true: code %d", code)
	}
	out.Reset()
	if code := request("get", srv.URL+"/readyz", &out, &errOut); code != 0 || out.String() != "ready" {
		t.Fatalf("readyz once ready again: code %d, out %q", code, out.String())
	}
}

func TestEnv(t *testing.T) {
	t.Setenv("BACKEND_SERVICE_HOST", "198.18.100.23")
	srv, _ := newTest(t, nil)
	code, body := do(t, http.MethodGet, srv.URL+"/env")
	require.Equal(t, http.StatusOK, code)
	var env map[string]string
	require.NoError(t, json.Unmarshal([]byte(body), &env))
	assert.Equal(t, "198.18.100.23", env["BACKEND_SERVICE_HOST"])
}

func TestLookup(t *testing.T) {
	var out, errOut strings.Builder
	// An address resolves to itself, without asking a server.
	if code := lookup("198.18.100.23", net.DefaultResolver, &out, &errOut); code != 0 || out.String() != "[\"198.18.100.23\"]\n" {
		t.Fatalf("lookup of an address: code %d, out %q, err %q", code, out.String(), errOut.String())
	}
	out.Reset()
	if code := lookup("no-such-name.invalid", net.DefaultResolver, &out, &errOut); code != 1 || out.Len() != 0 || !strings.Contains(errOut.String(), "testapp lookup:") {
		t.Fatalf("lookup of a name that does not resolve: code %d, out %q, err %q", code, out.String(), errOut.String())
	}
}

func TestExitCommand(t *testing.T) {
	var errOut strings.Builder
	assert.Equal(t, 3, exitWith("3", &errOut))
	assert.Contains(t, errOut.String(), "exiting with code 3")
	assert.Equal(t, 0, exitWith("0", &errOut))
	for _, bad := range []string{"x", "-1", "256", ""} {
		errOut.Reset()
		assert.Equal(t, 2, exitWith(bad, &errOut), bad)
		assert.Contains(t, errOut.String(), "code must be an exit code in [0, 255]")
	}
}

func TestAllocCommand(t *testing.T) {
	var out, errOut strings.Builder
	held := false
	assert.Equal(t, 0, alloc("17", &out, &errOut, func() { held = true }))
	assert.True(t, held, "holds the memory until told to stop")
	assert.Equal(t, "testapp alloc: 16 MiB allocated\ntestapp alloc: 17 MiB allocated\n", out.String())
	for _, bad := range []string{"x", "0", "65537"} {
		errOut.Reset()
		assert.Equal(t, 2, alloc(bad, &out, &errOut, func() { t.Fatal("no hold on a bad argument") }), bad)
		assert.Contains(t, errOut.String(), "MiB must be a whole number in [1, 65536]")
	}
}

func TestSleepFor(t *testing.T) {
	var errOut strings.Builder
	if code := sleepFor("0.05", &errOut); code != 0 {
		t.Fatalf("sleep 0.05: exit %d, %s", code, errOut.String())
	}
	for _, bad := range []string{"-1", "x", "999999"} {
		if code := sleepFor(bad, &errOut); code != 2 {
			t.Errorf("sleep %q: exit %d, want 2", bad, code)
		}
	}
}

func TestAPIGetAsInClusterConfig(t *testing.T) {
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer tok-1" {
			http.Error(w, "wrong token "+r.Header.Get("Authorization"), http.StatusUnauthorized)
			return
		}
		if r.URL.Path != "/api/v1/namespaces/shop/configmaps" {
			http.Error(w, "forbidden", http.StatusForbidden)
			return
		}
		_, _ = io.WriteString(w, `{"kind":"ConfigMapList"}`)
	}))
	defer srv.Close()
	dir := t.TempDir()
	caPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw})
	if err := os.WriteFile(filepath.Join(dir, "ca.crt"), caPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "token"), []byte("tok-1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	host, port, _ := net.SplitHostPort(srv.Listener.Addr().String())
	env := func(k string) string {
		return map[string]string{"KUBERNETES_SERVICE_HOST": host, "KUBERNETES_SERVICE_PORT": port}[k]
	}
	var out, errOut strings.Builder
	if code := apiGet("/api/v1/namespaces/shop/configmaps", env, dir, &out, &errOut); code != 0 || !strings.Contains(out.String(), "ConfigMapList") {
		t.Fatalf("allowed path: code %d, out %q, err %q", code, out.String(), errOut.String())
	}
	errOut.Reset()
	if code := apiGet("/api/v1/namespaces/other/configmaps", env, dir, &out, &errOut); code != 1 || !strings.Contains(errOut.String(), "403") {
		t.Fatalf("forbidden path: code %d, err %q", code, errOut.String())
	}
	errOut.Reset()
	if code := apiGet("/", func(string) string { return "" }, dir, &out, &errOut); code != 1 || !strings.Contains(errOut.String(), "KUBERNETES_SERVICE_HOST") {
		t.Fatalf("outside a pod: code %d, err %q", code, errOut.String())
	}
}
