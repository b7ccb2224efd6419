// Package redistest starts a real redis-server for tests: one process per
// call, on a free loopback port, with its data in the test's temp dir, stopped
// when the test ends. It never falls back to an in-process fake.
//
// Every server runs as manifests/redis deploys Redis: protected mode on, the
// ACL of manifests/redis/users.acl (the default user off, the broker's user
// limited to its keys and commands), plus an administrator for what a test
// itself inspects or breaks. Client connects as the broker's user, so
// everything the broker's code does in a test runs under the operator's
// rules; a command the ACL refused to that user fails the test at cleanup
// (ACL LOG), even one whose error the caller ignored.
package redistest

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"

	redismanifest "github.com/fluidos-project/resource-broker/manifests/redis"
)

// InstallHint is printed when redis-server is not on PATH.
const InstallHint = "redis-server not found on PATH: install it (Debian/Ubuntu: `apt-get install -y redis-server`; " +
	"macOS: `brew install redis`) or set REDIS_SERVER to its path; .ci/run installs it"

// Server is a running redis-server.
type Server struct {
	Addr string
	Dir  string
	// Users: the broker's user (Client) and the administrator (AdminClient).
	Users *Users

	cmd          *exec.Cmd
	args         []string
	t            testing.TB
	allowDenials bool
}

// Option changes the server's configuration.
type Option func(*Server)

// WithAppendOnly turns on AOF persistence with an fsync per write: a test
// kills the server right after a write, and with everysec (rb-redis's setting)
// Redis may answer before it writes the file while a background fsync is
// slow, so a write acknowledged just before the kill could be lost.
func WithAppendOnly() Option {
	return func(s *Server) { s.args = append(s.args, "--appendonly", "yes", "--appendfsync", "always") }
}

// AllowDenials is for a test that makes the broker's user try what the ACL
// refuses: the ACL LOG is not checked at cleanup.
func AllowDenials() Option { return func(s *Server) { s.allowDenials = true } }

// AdminUser is the tests' administrator: every command, every key.
const AdminUser = "rb-test-admin"

// Users are the Redis users of a test server and the files that hold them.
type Users struct {
	ACLFile string // manifests/redis/users.acl as rb-redis loads it, plus AdminUser
	// BrokerPassword is the password of redismanifest.BrokerUser; the file
	// holds it as rb-broker's --redis-password-file reads it.
	BrokerPassword, BrokerPasswordFile string
	AdminPassword                      string
	// GrantKeyFile is rb-broker's --grant-key-file for the brokers of this
	// Redis: every replica on one Redis must seal grants with the same keys.
	GrantKeyFile string
}

// WriteUsers writes an ACL file and the broker's password file in dir, with
// fresh random passwords.
func WriteUsers(dir string) (*Users, error) {
	return writeUsers(dir, redismanifest.UsersACL)
}

// writeUsers is WriteUsers with the broker's ACL from brokerACL (given the
// broker's password).
func writeUsers(dir string, brokerACL func(password string) string) (*Users, error) {
	u := &Users{ACLFile: filepath.Join(dir, "users.acl"), BrokerPasswordFile: filepath.Join(dir, "broker-password"),
		BrokerPassword: randomPassword(), AdminPassword: randomPassword(), GrantKeyFile: filepath.Join(dir, "grant.key")}
	acl := brokerACL(u.BrokerPassword) + "user " + AdminUser + " on >" + u.AdminPassword + " ~* &* +@all\n"
	if err := os.WriteFile(u.ACLFile, []byte(acl), 0o600); err != nil {
		return nil, err
	}
	if err := os.WriteFile(u.BrokerPasswordFile, []byte(u.BrokerPassword+"\n"), 0o600); err != nil {
		return nil, err
	}
	key := make([]byte, 32)
	_, _ = rand.Read(key) // never fails (crypto/rand)
	if err := os.WriteFile(u.GrantKeyFile, []byte(base64.StdEncoding.EncodeToString(key)+"\n"), 0o600); err != nil {
		return nil, err
	}
	return u, nil
}

// ServerArgs are redis-server's arguments for these users, with protected
// mode on as in manifests/redis.
func (u *Users) ServerArgs() []string {
	return []string{"--aclfile", u.ACLFile, "--protected-mode", "yes"}
}

// BrokerFlags are rb-broker's flags to connect as the broker's user, with
// the grant keys the brokers of this Redis share.
func (u *Users) BrokerFlags() []string {
	return append([]string{"--redis-username=" + redismanifest.BrokerUser, "--redis-password-file=" + u.BrokerPasswordFile},
		u.GrantKeyFlags()...)
}

// GrantKeyFlags are rb-broker's flags for the grant keys of this Redis's brokers.
func (u *Users) GrantKeyFlags() []string {
	return []string{"--grant-key-file=" + u.GrantKeyFile}
}

// BrokerOptions are the client options of the broker's user for addr, as
// rb-broker sets them (no CLIENT SETINFO or MAINT_NOTIFICATIONS: the ACL
// does not allow them).
func (u *Users) BrokerOptions(addr string) *redis.Options {
	return &redis.Options{Addr: addr, Username: redismanifest.BrokerUser, Password: u.BrokerPassword, DisableIdentity: true,
		MaintNotificationsConfig: &maintnotifications.Config{Mode: maintnotifications.ModeDisabled}}
}

// AdminOptions are the client options of the administrator for addr.
func (u *Users) AdminOptions(addr string) *redis.Options {
	return &redis.Options{Addr: addr, Username: AdminUser, Password: u.AdminPassword}
}

func randomPassword() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b) // never fails (crypto/rand)
	return hex.EncodeToString(b)
}

// Binary returns the redis-server path, or an error with InstallHint.
func Binary() (string, error) {
	if p := os.Getenv("REDIS_SERVER"); p != "" {
		if _, err := os.Stat(p); err != nil {
			return "", fmt.Errorf("REDIS_SERVER=%s: %w; %s", p, err, InstallHint)
		}
		return p, nil
	}
	p, err := exec.LookPath("redis-server")
	if err != nil {
		return "", fmt.Errorf("%s", InstallHint)
	}
	return p, nil
}

// Start runs a fresh redis-server for t and stops it at cleanup.
func Start(t testing.TB, opts ...Option) *Server {
	t.Helper()
	bin, err := Binary()
	if err != nil {
		t.Fatal(err)
	}
	s := &Server{Dir: t.TempDir(), args: []string{"--bind", "127.0.0.1", "--save", "", "--appendonly", "no"}, t: t}
	if s.Users, err = WriteUsers(s.Dir); err != nil {
		t.Fatal(err)
	}
	s.args = append(s.args, s.Users.ServerArgs()...)
	for _, o := range opts {
		o(s)
	}
	var lastErr error
	for attempt := 0; attempt < 5; attempt++ { // a free port can be taken before we bind it
		port, err := freePort()
		if err != nil {
			t.Fatal(err)
		}
		s.Addr = net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
		if lastErr = s.start(bin); lastErr == nil {
			t.Cleanup(func() {
				s.checkDenials()
				s.Stop()
			})
			return s
		}
	}
	t.Fatalf("start redis-server: %v", lastErr)
	return nil
}

func (s *Server) start(bin string) error {
	_, port, _ := net.SplitHostPort(s.Addr)
	args := append([]string{"--port", port, "--dir", s.Dir}, s.args...)
	s.cmd = exec.Command(bin, args...)
	logf, err := os.Create(filepath.Join(s.Dir, "redis.log"))
	if err != nil {
		return err
	}
	s.cmd.Stdout, s.cmd.Stderr = logf, logf
	if err := s.cmd.Start(); err != nil {
		return err
	}
	exited := make(chan error, 1)
	go func() { exited <- s.cmd.Wait(); logf.Close() }()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case err := <-exited:
			return fmt.Errorf("redis-server exited: %w; log:\n%s", err, tail(filepath.Join(s.Dir, "redis.log")))
		default:
		}
		o := s.Users.AdminOptions(s.Addr)
		o.MaxRetries = -1
		c := redis.NewClient(o)
		err := c.Ping(context.Background()).Err()
		c.Close()
		if err == nil {
			return nil
		}
		time.Sleep(10 * time.Millisecond)
	}
	_ = s.cmd.Process.Kill()
	return fmt.Errorf("redis-server did not answer PING within 10s")
}

// Client returns a new client of the broker's user (the ACL of
// manifests/redis), closed at cleanup: the client to give the broker's code.
func (s *Server) Client() *redis.Client {
	o := s.Users.BrokerOptions(s.Addr)
	o.PoolSize = 64
	c := redis.NewClient(o)
	s.t.Cleanup(func() { _ = c.Close() })
	return c
}

// AdminClient returns a new client of the administrator, closed at cleanup:
// for what a test does that the broker never does (FLUSHALL, CLIENT KILL, ...).
func (s *Server) AdminClient() *redis.Client {
	o := s.Users.AdminOptions(s.Addr)
	o.PoolSize = 8
	c := redis.NewClient(o)
	s.t.Cleanup(func() { _ = c.Close() })
	return c
}

// checkDenials fails the test if the ACL refused the broker's user anything
// (ACL LOG; it lists refused commands, keys and failed logins), unless
// AllowDenials. A server that is down (stopped by the test) is not asked.
func (s *Server) checkDenials() {
	if s.allowDenials {
		return
	}
	o := s.Users.AdminOptions(s.Addr)
	o.MaxRetries = -1
	c := redis.NewClient(o)
	defer c.Close()
	entries, err := c.ACLLog(context.Background(), 128).Result()
	if err != nil {
		return
	}
	for _, e := range entries {
		if e.Username == redismanifest.BrokerUser {
			s.t.Errorf("redis ACL refused the broker's user %s: %s %q (context %s, %d times): manifests/redis/users.acl lacks it",
				e.Username, e.Reason, e.Object, e.Context, e.Count)
		}
	}
}

// Stop kills the server (idempotent).
func (s *Server) Stop() {
	if s.cmd != nil && s.cmd.Process != nil {
		_ = s.cmd.Process.Kill()
		for i := 0; i < 200; i++ { // wait until the port is free for a restart
			if c, err := net.DialTimeout("tcp", s.Addr, 20*time.Millisecond); err != nil {
				break
			} else {
				c.Close()
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
}

// Freeze stops the server's process (SIGSTOP) until Thaw or the test's end:
// a replica that acknowledges nothing, a primary that answers nothing.
func (s *Server) Freeze() {
	s.t.Helper()
	if err := s.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		s.t.Fatalf("freeze redis-server %s: %v", s.Addr, err)
	}
	s.t.Cleanup(s.Thaw)
}

// Thaw resumes a frozen server (SIGCONT; idempotent).
func (s *Server) Thaw() { _ = s.cmd.Process.Signal(syscall.SIGCONT) }

// Restart stops the server and starts it again on the same port and data dir
// (with appendonly, the data survives).
func (s *Server) Restart() {
	s.t.Helper()
	s.Stop()
	bin, err := Binary()
	if err != nil {
		s.t.Fatal(err)
	}
	if err := s.start(bin); err != nil {
		s.t.Fatalf("restart redis-server: %v", err)
	}
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func tail(path string) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	var lines []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		lines = append(lines, sc.Text())
		if len(lines) > 20 {
			lines = lines[1:]
		}
	}
	return strings.Join(lines, "\n")
}
