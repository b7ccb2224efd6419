package store_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fluidos-project/resource-broker/broker/model"
	"github.com/fluidos-project/resource-broker/broker/store"
	"github.com/fluidos-project/resource-broker/internal/redistest"
	redismanifest "github.com/fluidos-project/resource-broker/manifests/redis"
)

// keyFamily matches where a script builds a key name from the prefix:
// prefix .. 'family' or KEYS[1] .. 'family' (the literal that follows the
// prefix names the family).
var keyFamily = regexp.MustCompile(`(?:\bprefix|KEYS\[1\]) \.\. '([a-z:-]*)'`)

// documentedFamily matches a key of the key layout, which the includes
// (scripts/lib) document in their headers, each for the keys it owns: P.."family".
var documentedFamily = regexp.MustCompile(`P\.\."([a-z:-]*)"`)

// isDocumented tells whether key family f (what follows the prefix in a
// script's literal) is in the layout: itself, or under a documented family
// whose name ends in ':' and is followed by a variable part (P.."idx:free:"..r
// covers 'idx:free:cpu', P.."cluster:"..id covers 'cluster:').
func isDocumented(documented map[string]bool, f string) bool {
	if documented[f] {
		return true
	}
	for d := range documented {
		if strings.HasSuffix(d, ":") && strings.HasPrefix(f, d) {
			return true
		}
	}
	return false
}

// luaHeader is the leading comment of a Lua file.
func luaHeader(t *testing.T, path string) string {
	src, err := os.ReadFile(path)
	require.NoError(t, err)
	var header strings.Builder
	for _, line := range strings.Split(string(src), "\n") {
		if !strings.HasPrefix(line, "--") {
			break
		}
		header.WriteString(line + "\n")
	}
	return header.String()
}

// TestAbuseUndeclaredKeys: the scripts get only a key prefix in KEYS and
// build every other key name inside, so Redis Cluster and ACL key patterns
// could not tell what they touch. The contract that replaces a KEYS list:
// every key derives from the hash-tagged prefix (one slot) and its family is
// in the key layout of the includes' headers. Checked two ways: every family the scripts (and
// the test-only reference) build is documented there; and a broker on
// another prefix, whose Redis user may touch that prefix's keys only, runs
// every operation with no ACL refusal and leaves no key outside it, while
// the default prefix is refused on the same Redis.
func TestAbuseUndeclaredKeys(t *testing.T) {
	t.Run("families documented", func(t *testing.T) {
		documented := map[string]bool{}
		includes, err := filepath.Glob("../scripts/lib/*.lua")
		require.NoError(t, err)
		for _, path := range includes {
			for _, m := range documentedFamily.FindAllStringSubmatch(luaHeader(t, path), -1) {
				documented[m[1]] = true
			}
		}
		used := 0
		err = filepath.WalkDir("../scripts", func(path string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() || filepath.Ext(path) != ".lua" {
				return err
			}
			src, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			assert.NotContains(t, string(src), "'rb:", "%s names a key outside the prefix", path)
			for _, m := range keyFamily.FindAllStringSubmatch(string(src), -1) {
				used++
				assert.True(t, isDocumented(documented, m[1]), "%s uses key family %q, absent from the includes' key layout", path, m[1])
			}
			return nil
		})
		require.NoError(t, err)
		assert.Greater(t, used, 50, "the scripts' key names were found")
	})

	t.Run("restricted to the prefix", func(t *testing.T) {
		ctx := context.Background()
		const prefix = "rb:{t}:"
		srv := redistest.Start(t, redistest.AllowDenials())
		adm := srv.AdminClient()
		require.NoError(t, adm.Do(ctx, "ACL", "SETUSER", redismanifest.BrokerUser, "resetkeys", "~"+prefix+"*").Err())

		// The same user on the default prefix is refused: the restriction bites.
		refused := store.New(srv.Client(), store.Config{})
		_, err := refused.Advertise(ctx, "paris", cluster(8, 32, 0, 30_000, nil))
		require.ErrorContains(t, err, "NOPERM")
		require.NoError(t, adm.Do(ctx, "ACL", "LOG", "RESET").Err())

		for _, fullScan := range []bool{false, true} {
			s := storeOn(srv.Client(), store.Config{Prefix: prefix, WaitTTL: 200 * time.Millisecond, Policy: mustPolicy(t, fmt.Sprintf(`
requesters:
  default: {maxReservations: 10, reservesPerSecond: 1000}
  clusters:
    mallory-%v: {reservesPerSecond: 1, reserveBurst: 1}
`, fullScan))}, fullScan)
			require.NoError(t, s.LoadScripts(ctx))
			_, err := s.RebuildIndex(ctx)
			require.NoError(t, err)
			run := fmt.Sprint(fullScan)
			advertise(t, s, "paris", withNodes(30_000, node("p1", 4000, 4000, 0), node("p2", 2000, 2000, 0)))
			_, err = s.Advertise(ctx, "berlin", cluster(4, 16, 2, 20_000, map[string]string{"topology.kubernetes.io/region": "eu-central"}))
			require.NoError(t, err)

			lease := request("lease-"+run, "rome", 1000, 1, 0)
			lease.Lease = time.Minute
			d, err := s.Reserve(ctx, lease)
			require.NoError(t, err)
			_, err = s.Renew(ctx, "rome", []string{lease.ID})
			require.NoError(t, err)
			_, err = s.Grant(ctx, "rome", lease.ID, d.Reservation.Target, json.RawMessage(`{"token":"t"}`))
			require.NoError(t, err)
			sel := request("gpu-"+run, "rome", 500, 1, 1)
			sel.Selector = map[string]string{"topology.kubernetes.io/region": "eu-central"}
			_, err = s.Reserve(ctx, sel)
			require.NoError(t, err)
			_, err = s.Reserve(ctx, request("huge-"+run, "rome", 64_000, 1, 0))
			require.ErrorAs(t, err, new(*store.NoFitError), "waits")
			_, err = s.Reserve(ctx, request("m1", "mallory-"+run, 100, 1, 0))
			require.NoError(t, err)
			_, err = s.Reserve(ctx, request("m2", "mallory-"+run, 100, 1, 0))
			require.ErrorAs(t, err, new(*store.LimitError), "over its rate")
			_, err = s.Release(ctx, "rome", lease.ID, "rome")
			require.NoError(t, err)
			// A gang, a spread replica, a protection report, a preemption.
			_, err = s.ReserveGroup(ctx, gang("train-"+run, "rome", 2, 2, 500))
			require.NoError(t, err)
			spread := request("web-"+run, "rome", 200, 1, 0)
			spread.Spread = &model.Spread{Group: "web", TopologyKey: "topology.kubernetes.io/region", MaxSkew: 1, WhenUnsatisfiable: "ScheduleAnyway"}
			_, err = s.Reserve(ctx, spread)
			require.NoError(t, err)
			_, err = s.Protect(ctx, "rome", []string{"train-" + run + "-0"})
			require.NoError(t, err)
			_, err = s.Advertise(ctx, "tiny-"+run, cluster(2, 8, 0, 20_000, map[string]string{"pool": "tiny-" + run}))
			require.NoError(t, err)
			low := request("low-"+run, "oslo", 2000, 1, 0)
			low.Priority, low.Selector = 1, map[string]string{"pool": "tiny-" + run}
			_, err = s.Reserve(ctx, low)
			require.NoError(t, err)
			urgent := request("urgent-"+run, "milan", 2000, 1, 0)
			urgent.Priority, urgent.Preempt, urgent.Selector = 1000, true, low.Selector
			_, err = s.Reserve(ctx, urgent)
			require.NoError(t, err, "placed by preempting")
			taken, err := s.Reservation(ctx, "oslo", low.ID)
			require.NoError(t, err)
			require.Equal(t, "Released", taken.Phase, "preempted")

			events, err := s.ReadEvents(ctx, "rome", "0", 100, 0)
			require.NoError(t, err)
			assert.NotEmpty(t, events)
			_, err = s.LiveReservations(ctx, "requester", "rome")
			require.NoError(t, err)
			_, err = s.Usage(ctx)
			require.NoError(t, err)
			time.Sleep(300 * time.Millisecond) // the waiting request's TTL
			_, _, err = s.Expire(ctx)
			require.NoError(t, err)
			require.NoError(t, s.Ready(ctx))
			require.NoError(t, s.CheckIndex(ctx))
			assertInvariant(t, s)
		}

		denials, err := adm.ACLLog(ctx, 128).Result()
		require.NoError(t, err)
		assert.Empty(t, denials, "the broker's user was refused nothing on its own prefix")
		var keys []string
		iter := adm.Scan(ctx, 0, "*", 1000).Iterator()
		for iter.Next(ctx) {
			keys = append(keys, iter.Val())
		}
		require.NoError(t, iter.Err())
		assert.Greater(t, len(keys), 20)
		for _, k := range keys {
			assert.True(t, strings.HasPrefix(k, prefix), "key %q is outside the prefix", k)
		}
	})
}
