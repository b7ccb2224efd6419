package main

import (
	"bytes"
	"context"
	"crypto/tls"
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

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fluidos-project/resource-broker/internal/certauthority"
	"github.com/fluidos-project/resource-broker/internal/redistest"
	redismanifest "github.com/fluidos-project/resource-broker/manifests/redis"
)

// runMainEnv makes the test binary run rb-broker's main instead of the tests:
// the secret test starts the broker as a process of its own and reads what
// it writes, as an operator's log collector would.
const runMainEnv = "RB_BROKER_TEST_RUN_MAIN"

func TestMain(m *testing.M) {
	if os.Getenv(runMainEnv) == "1" {
		main()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// syncBuffer is the broker's stdout and stderr, read while it runs.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// TestRedisPasswordNeverShown starts rb-broker with a Redis password in a
// file, breaks its Redis connections every way an operator sees (Redis down,
// connections killed, the password changed under it) and checks that the
// password appears in none of what the broker shows: its log (at -v=6), its
// errors to clients, /readyz, /metrics, /debug/pprof/cmdline and --help. It
// also shows the password file being read again: after the password is
// rotated in Redis and in the file, the broker reconnects without a restart.
func TestRedisPasswordNeverShown(t *testing.T) {
	ctx := context.Background()
	rs := redistest.Start(t, redistest.AllowDenials()) // the wrong password below is logged as a denial
	admin := rs.AdminClient()
	oldPassword, newPassword := rs.Users.BrokerPassword, "rotated-"+rs.Users.BrokerPassword[:16]
	passwordFile := filepath.Join(t.TempDir(), "password")
	require.NoError(t, os.WriteFile(passwordFile, []byte(oldPassword+"\n"), 0o600))

	ca, err := certauthority.NewCA("test CA")
	require.NoError(t, err)
	serverPair, err := ca.IssueServer("rb-broker", []string{"127.0.0.1"})
	require.NoError(t, err)
	certDir := filepath.Join(t.TempDir(), "tls")
	require.NoError(t, certauthority.WriteTLSDir(certDir, serverPair, ca.CertPEM))
	clientPair, err := ca.IssueClient("rome")
	require.NoError(t, err)
	clientCert, err := clientPair.TLSCertificate()
	require.NoError(t, err)
	api := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{RootCAs: ca.Pool(), Certificates: []tls.Certificate{clientCert}}}}

	apiAddr, healthAddr, pprofAddr := freeAddr(t), freeAddr(t), freeAddr(t)
	cmd := exec.Command(os.Args[0], "--listen-address="+apiAddr, "--health-address="+healthAddr, "--pprof-bind-address="+pprofAddr,
		"--cert-dir="+certDir, "--redis-url=redis://"+rs.Addr+"/0",
		"--redis-username="+redismanifest.BrokerUser, "--redis-password-file="+passwordFile,
		"--grant-key-file="+rs.Users.GrantKeyFile, "--expiry-interval=100ms", "-v=6")
	cmd.Env = append(os.Environ(), runMainEnv+"=1", redisPasswordEnv+"=")
	var out syncBuffer
	cmd.Stdout, cmd.Stderr = &out, &out
	require.NoError(t, cmd.Start())
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(15 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
	})

	var shown []string // everything the broker answered, besides its log
	get := func(c *http.Client, url string) (int, string) {
		resp, err := c.Get(url)
		if err != nil {
			return 0, err.Error()
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		shown = append(shown, string(body))
		return resp.StatusCode, string(body)
	}
	advertise := func() (int, string) {
		req, err := http.NewRequest(http.MethodPut, "https://"+apiAddr+"/api/v2/clusters/rome/advertisement", strings.NewReader(
			`{"resources":{"capacity":{"cpu":"8","memory":"32Gi"},"allocatable":{"cpu":"8","memory":"32Gi"}},"prices":{"currency":"EUR","cpu":"0.03"}}`))
		require.NoError(t, err)
		resp, err := api.Do(req)
		if err != nil {
			return 0, err.Error()
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		shown = append(shown, string(body))
		return resp.StatusCode, string(body)
	}
	ready := func() bool {
		code, _ := get(http.DefaultClient, "http://"+healthAddr+"/readyz")
		return code == http.StatusOK
	}
	logShows := func(s string) func() bool { return func() bool { return strings.Contains(out.String(), s) } }

	require.Eventually(t, ready, 20*time.Second, 50*time.Millisecond, "rb-broker not ready:\n%s", out.String())
	code, body := advertise()
	require.Equal(t, http.StatusOK, code, body)

	// Redis down: every call fails, the expiry loop logs each failure.
	rs.Stop()
	require.Eventually(t, logShows("connection refused"), 10*time.Second, 50*time.Millisecond)
	code, body = advertise()
	assert.Equal(t, http.StatusServiceUnavailable, code, body)
	assert.False(t, ready())
	rs.Restart()
	require.Eventually(t, ready, 20*time.Second, 50*time.Millisecond, "not ready after Redis came back:\n%s", out.String())

	// The password changed in Redis but not in the file: the broker's
	// connections are cut and every new one is refused (WRONGPASS).
	require.NoError(t, admin.Do(ctx, "ACL", "SETUSER", redismanifest.BrokerUser, "resetpass", ">"+newPassword).Err())
	require.NoError(t, admin.Do(ctx, "CLIENT", "KILL", "USER", redismanifest.BrokerUser).Err())
	require.Eventually(t, logShows("WRONGPASS"), 10*time.Second, 50*time.Millisecond, "no refused login in the log:\n%s", out.String())
	code, body = advertise()
	assert.Equal(t, http.StatusServiceUnavailable, code, body)
	assert.False(t, ready())

	// The file catches up (as the kubelet updates a mounted Secret): new
	// connections log in again, without a restart.
	require.NoError(t, os.WriteFile(passwordFile, []byte(newPassword+"\n"), 0o600))
	require.Eventually(t, ready, 20*time.Second, 50*time.Millisecond, "not ready with the rotated password:\n%s", out.String())
	code, body = advertise()
	require.Equal(t, http.StatusOK, code, body)

	_, metrics := get(http.DefaultClient, "http://"+healthAddr+"/metrics")
	assert.Contains(t, metrics, "rb_broker_script_errors_total")
	_, cmdline := get(http.DefaultClient, "http://"+pprofAddr+"/debug/pprof/cmdline")
	assert.Contains(t, cmdline, "--redis-password-file="+passwordFile)
	help := exec.Command(os.Args[0], "--help")
	help.Env = append(os.Environ(), runMainEnv+"=1", redisPasswordEnv+"=")
	helpOut, err := help.CombinedOutput()
	require.NoError(t, err, "%s", helpOut)
	shown = append(shown, string(helpOut))

	logText := out.String()
	assert.Contains(t, logText, `redisPassword="file `+passwordFile+`"`, "the log says where the password comes from")
	for _, pw := range []string{oldPassword, newPassword} {
		assert.NotContains(t, logText, pw, "the broker's log shows the Redis password")
		for _, s := range shown {
			assert.NotContains(t, s, pw, "the broker shows the Redis password")
		}
	}
}

// TestRedisPasswordNotInURL: a password in --redis-url is refused (it would
// show in the process list and the pod spec), and no error repeats it, not
// even for a URL that does not parse.
func TestRedisPasswordNotInURL(t *testing.T) {
	t.Setenv(redisPasswordEnv, "")
	for _, tc := range []struct {
		url, want string
	}{
		{"redis://rb-broker:s3cr3t-pw@rb-redis:6379/0", "redis://rb-broker:xxxxx@rb-redis:6379/0 carries a password"},
		{"redis://:s3cr3t-pw@rb-redis:bad-port/0", "--redis-url"},
		{"redis://:s3cr3t-pw@rb-redis:6379/not-a-db", "--redis-url"},
	} {
		cmd := newCommand()
		cmd.SetArgs([]string{"--redis-url=" + tc.url, "--cert-dir=" + t.TempDir()})
		err := cmd.Execute()
		require.Error(t, err, tc.url)
		assert.Contains(t, err.Error(), tc.want)
		assert.NotContains(t, err.Error(), "s3cr3t", tc.url)
	}
	assert.Equal(t, "redis://u:xxxxx@h:1/0", redactURL("redis://u:pw@h:1/0"))
	assert.Equal(t, "redis://h:1/0", redactURL("redis://h:1/0"))
	assert.Equal(t, "redis://u@h:1/0", redactURL("redis://u@h:1/0"))
}

func TestRedisPasswordFile(t *testing.T) {
	dir := t.TempDir()
	empty := filepath.Join(dir, "empty")
	require.NoError(t, os.WriteFile(empty, []byte("\n"), 0o600))
	for _, tc := range []struct {
		args []string
		env  string
		want string
	}{
		{[]string{"--redis-password-file=" + filepath.Join(dir, "missing")}, "", "--redis-password-file: open " + filepath.Join(dir, "missing")},
		{[]string{"--redis-password-file=" + empty}, "", "--redis-password-file " + empty + " is empty"},
		{[]string{"--redis-password-file=" + empty}, "from-env", "are both set"},
	} {
		t.Setenv(redisPasswordEnv, tc.env)
		cmd := newCommand()
		cmd.SetArgs(append(tc.args, "--cert-dir="+dir))
		err := cmd.Execute()
		require.Error(t, err)
		assert.Contains(t, err.Error(), tc.want)
	}
	pw := filepath.Join(dir, "pw")
	require.NoError(t, os.WriteFile(pw, []byte("hunter2\n\n"), 0o600))
	got, err := readPassword(pw)
	require.NoError(t, err)
	assert.Equal(t, "hunter2", got, "trailing newlines are not part of the password")
}

func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	return ln.Addr().String()
}
