// Package redismanifest gives Go the Redis ACL that manifests/redis deploys
// (users.acl), so that the redis-server of every test (internal/redistest,
// internal/testbed) enforces exactly the rules of the operator's Redis and
// the broker's whole test suite runs as the limited user.
package redismanifest

import (
	"crypto/sha256"
	_ "embed" // users.acl
	"encoding/hex"
	"strings"
)

//go:embed users.acl
var template string

// BrokerUser is the Redis user the broker connects as (rb-broker's
// --redis-username in manifests/broker).
const BrokerUser = "rb-broker"

// passwordPlaceholder is what the init container of rb-redis replaces.
const passwordPlaceholder = "BROKER_PASSWORD_SHA256"

// UsersACL returns the ACL file that Redis loads when the broker's password
// is brokerPassword: users.acl without its comments and blank lines, with
// the password's SHA-256 in place of BROKER_PASSWORD_SHA256, exactly as the
// init container of StatefulSet rb-redis writes it. Trailing newlines of the
// password are not part of it (the broker and the init container drop them
// from the password file too).
func UsersACL(brokerPassword string) string {
	sum := sha256.Sum256([]byte(strings.TrimRight(brokerPassword, "\n")))
	var b strings.Builder
	for _, line := range strings.Split(template, "\n") {
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		b.WriteString(strings.ReplaceAll(line, passwordPlaceholder, hex.EncodeToString(sum[:])))
		b.WriteByte('\n')
	}
	return b.String()
}

// CellsACL is UsersACL for a broker whose state is split into cells on a
// Redis Cluster (store.Cells, docs/redis.md "Cells"): the broker's user may
// also touch the keys of each cell, rb:{<cell>}:*, and read the cluster's
// slot map (CLUSTER SLOTS) and the command table (COMMAND), which a cluster
// client (go-redis) needs to send each command to the primary that holds
// its key. Nothing else changes.
func CellsACL(brokerPassword string, cells []string) string {
	keys := "~rb:{b}:*"
	for _, c := range cells {
		if c != "b" {
			keys += " ~rb:{" + c + "}:*"
		}
	}
	var b strings.Builder
	for _, line := range strings.SplitAfter(UsersACL(brokerPassword), "\n") {
		if strings.HasPrefix(line, "user "+BrokerUser+" ") {
			// After -@all, which would drop it again.
			line = strings.Replace(strings.TrimSuffix(line, "\n"), "~rb:{b}:* ", keys+" ", 1) + " +cluster|slots +command\n"
		}
		b.WriteString(line)
	}
	return b.String()
}
