package redismanifest_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fluidos-project/resource-broker/internal/redistest"
	redismanifest "github.com/fluidos-project/resource-broker/manifests/redis"
)

// TestBrokerUserIsRefusedTheRest: what the broker's user may do is proven by
// every broker test (they all run as that user under users.acl, and fail on
// any refusal); this is the other half, what it must not do: administration,
// enumeration, other keys (also from inside a script), Pub/Sub, other
// databases.
func TestBrokerUserIsRefusedTheRest(t *testing.T) {
	ctx := context.Background()
	s := redistest.Start(t, redistest.AllowDenials())
	c := s.Client()
	admin := s.AdminClient()
	require.NoError(t, admin.Set(ctx, "other", "v", 0).Err())
	require.NoError(t, c.Set(ctx, "rb:{b}:mine", "v", 0).Err(), "its own keys")

	for _, cmd := range [][]any{
		{"FLUSHALL"}, {"FLUSHDB"}, {"CONFIG", "GET", "*"}, {"CONFIG", "SET", "appendonly", "no"},
		{"KEYS", "*"}, {"SCAN", "0"}, {"RANDOMKEY"}, {"DBSIZE"},
		{"SHUTDOWN", "NOSAVE"}, {"SAVE"}, {"BGSAVE"}, {"BGREWRITEAOF"},
		{"REPLICAOF", "127.0.0.1", "1"}, {"MONITOR"}, {"MODULE", "LIST"}, {"SELECT", "1"}, {"SWAPDB", "0", "1"},
		{"ACL", "LIST"}, {"ACL", "SETUSER", "rb-broker", "+@all"}, {"CLIENT", "LIST"}, {"CLIENT", "KILL", "USER", "rb-test-admin"},
		{"SCRIPT", "FLUSH"}, {"SCRIPT", "KILL"}, {"FUNCTION", "LIST"}, {"FCALL", "f", "0"},
		{"PUBLISH", "ch", "x"}, {"SUBSCRIBE", "ch"},
		{"GET", "other"}, {"SET", "other", "x"}, {"DEL", "other"}, {"RENAME", "rb:{b}:mine", "other"},
		{"XTRIM", "other", "MAXLEN", "0"}, {"PTTL", "other"},
		{"DUMP", "rb:{b}:mine"}, {"RESTORE", "rb:{b}:new", "0", "x"}, {"OBJECT", "ENCODING", "rb:{b}:mine"},
		{"LPUSH", "rb:{b}:list", "x"}, {"BLPOP", "rb:{b}:list", "1"}, {"EXPIRE", "rb:{b}:mine", "1"},
		{"EVAL", "return redis.call('GET', 'other')", "1", "rb:{b}:"},
		{"EVAL", "return redis.call('FLUSHALL')", "1", "rb:{b}:"},
		{"EVAL", "return redis.call('DEL', 'other')", "0"},
	} {
		err := c.Do(ctx, cmd...).Err()
		require.Error(t, err, "%v", cmd)
		assert.True(t, refused(err), "%v: want an ACL refusal, got %v", cmd, err)
	}
	assert.Equal(t, "v", admin.Get(ctx, "other").Val(), "untouched")
	assert.Equal(t, "v", admin.Get(ctx, "rb:{b}:mine").Val(), "untouched")

	// The refusals are what an operator sees in ACL LOG.
	log, err := admin.ACLLog(ctx, 128).Result()
	require.NoError(t, err)
	denied := map[string]bool{}
	for _, e := range log {
		if e.Username == redismanifest.BrokerUser {
			denied[e.Object] = true
		}
	}
	for _, object := range []string{"flushall", "config|get", "keys", "other", "acl|setuser"} {
		assert.True(t, denied[object], "ACL LOG lacks %s: %v", object, denied)
	}

	anon := redis.NewClient(&redis.Options{Addr: s.Addr, MaxRetries: -1})
	defer anon.Close()
	assert.ErrorContains(t, anon.Get(ctx, "rb:{b}:mine").Err(), "NOAUTH", "the default user is off")
	wrong := redis.NewClient(&redis.Options{Addr: s.Addr, MaxRetries: -1, Username: redismanifest.BrokerUser, Password: "not-it"})
	defer wrong.Close()
	assert.ErrorContains(t, wrong.Ping(ctx).Err(), "WRONGPASS")
}

// refused tells an ACL refusal: NOPERM for a command or key, or the script
// error Redis gives when a script's call is refused.
func refused(err error) bool {
	msg := err.Error()
	return strings.HasPrefix(msg, "NOPERM") ||
		strings.Contains(msg, "can't run this command") || strings.Contains(msg, "can't access at least one of the keys")
}

// TestUsersACL: the password is written as its SHA-256 only, without its
// trailing newlines; comments go.
func TestUsersACL(t *testing.T) {
	acl := redismanifest.UsersACL("hunter2\n")
	assert.NotContains(t, acl, "hunter2")
	assert.NotContains(t, acl, "BROKER_PASSWORD_SHA256")
	// sha256("hunter2")
	assert.Contains(t, acl, "user rb-broker on #f52fbd32b2b3b86ff88ef6c490628285f482af15ddcb29541f94bcf526a3f6c7 ")
	for _, line := range strings.Split(strings.TrimSuffix(acl, "\n"), "\n") {
		assert.True(t, strings.HasPrefix(line, "user "), "%q", line)
	}
	assert.Equal(t, 2, strings.Count(acl, "\n"), "default and rb-broker")
}

// TestRestartKeepsScriptWrites: a restart on the append-only file keeps what
// the broker's scripts wrote. Redis logs a script's writes as a MULTI/EXEC
// block and replays the file as the default user, checking each block's
// commands against that user's permissions (redis/redis#14541): users.acl
// must leave them whole, or every script's writes are lost at a restart.
func TestRestartKeepsScriptWrites(t *testing.T) {
	ctx := context.Background()
	s := redistest.Start(t, redistest.WithAppendOnly())
	c := s.Client()
	require.NoError(t, c.Eval(ctx, "redis.call('HSET', KEYS[1]..'h', 'f', 'v'); return redis.call('ZADD', KEYS[1]..'z', 1, 'm')",
		[]string{"rb:{b}:"}).Err())
	require.NoError(t, c.Set(ctx, "rb:{b}:plain", "v", 0).Err())
	s.Restart() // SIGKILL, then the AOF is replayed
	assert.Equal(t, "v", c.HGet(ctx, "rb:{b}:h", "f").Val(), "a script's write")
	assert.Equal(t, []string{"m"}, c.ZRange(ctx, "rb:{b}:z", 0, -1).Val(), "a script's write")
	assert.Equal(t, "v", c.Get(ctx, "rb:{b}:plain").Val())
	data, err := os.ReadFile(filepath.Join(s.Dir, "redis.log"))
	require.NoError(t, err)
	assert.NotContains(t, string(data), "AOF-loading-client")
}

func TestCellsACL(t *testing.T) {
	acl := redismanifest.CellsACL("hunter2", []string{"b", "eu"})
	assert.Contains(t, acl, " ~rb:{b}:* ~rb:{eu}:* ", "each cell's keys, b once")
	assert.True(t, strings.HasSuffix(acl, " +cluster|slots +command\n"), "after -@all: %q", acl)
	assert.Equal(t, strings.Count(redismanifest.UsersACL("hunter2"), "\n"), strings.Count(acl, "\n"))
}
