// Package scripts holds the broker's Redis Lua scripts, one per atomic
// operation, and the includes they are composed of. Each script file
// documents its KEYS, ARGV and reply; the helpers they share live in lib/,
// one include per concern (core, records, nodes, index, limits, events,
// waiting, ended, grants, reservations, and the stages of a reserve decision).
//
// A line "-- @include name" is replaced by lib/name.lua, once per script
// (an include already pulled in, directly or through another include, is
// not repeated), when the scripts are built at start-up: Redis still runs
// each script as one chunk, one atomic operation, and every key it touches
// still derives from the hash-tagged prefix in KEYS[1]. An include sees the
// locals declared above its directive.
package scripts

import (
	"embed"
	"fmt"
	"regexp"
	"strings"

	"github.com/redis/go-redis/v9"
)

//go:embed *.lua lib/*.lua
var files embed.FS

// includeLine matches an include directive, on a line of its own.
var includeLine = regexp.MustCompile(`(?m)^-- @include ([a-z_]+)\n`)

// Source is the text of script name as loaded: name.lua with its includes
// resolved.
func Source(name string) string {
	return Compose(name, nil)
}

// Compose is Source with some includes replaced: overrides maps an include
// name to the text that stands for it (tests use it to swap a stage for a
// reference one, scripts/reference). It panics on a missing file: the
// scripts are embedded, so that is a build error.
func Compose(name string, overrides map[string]string) string {
	body, err := files.ReadFile(name + ".lua")
	if err != nil {
		panic(err)
	}
	return resolve(string(body), overrides, map[string]bool{})
}

func resolve(src string, overrides map[string]string, done map[string]bool) string {
	return includeLine.ReplaceAllStringFunc(src, func(line string) string {
		name := includeLine.FindStringSubmatch(line)[1]
		if done[name] {
			return ""
		}
		done[name] = true
		text, ok := overrides[name]
		if !ok {
			b, err := files.ReadFile("lib/" + name + ".lua")
			if err != nil {
				panic(fmt.Sprintf("scripts: include %q: %v", name, err))
			}
			text = string(b)
		}
		if !strings.HasSuffix(text, "\n") {
			text += "\n"
		}
		return resolve(text, overrides, done)
	})
}

func load(name string) *redis.Script {
	return redis.NewScript(Source(name))
}

// The scripts, loaded once. Run them with Script.Run (EVALSHA, falling back to
// EVAL after a Redis restart has flushed the script cache).
var (
	Advertise = load("advertise")
	// Heartbeat refreshes the liveness of a cluster whose stored
	// advertisement it names by digest (heartbeat.lua).
	Heartbeat = load("heartbeat")
	Reserve   = load("reserve")
	Release   = load("release")
	Expire    = load("expire")
	Grant     = load("grant")
	Reindex   = load("reindex")
	Renew     = load("renew")
	// RenewCommit makes a full renewal the requester's renewal set
	// (renew_commit.lua).
	RenewCommit = load("renew_commit")
	Forget      = load("forget")
	// ReserveGroup decides a gang, all or nothing (reserve_group.lua).
	ReserveGroup = load("reserve_group")
	// Preempt reserves by taking lower-priority reservations' capacity (preempt.lua).
	Preempt = load("preempt")
	// Protect records the reservations PodDisruptionBudgets protect (protect.lua).
	Protect = load("protect")
	// Throttle counts a member's call against its rates (throttle.lua).
	Throttle = load("throttle")
	// Score scores requests as reserve would, deciding nothing (score.lua).
	Score = load("score")
	// View reads what changed in the candidate index since a replica's view
	// of it last looked (view.lua, store/view.go).
	View = load("view")
)

// All lists every script, for loading at start-up and readiness checks.
var All = map[string]*redis.Script{
	"advertise":     Advertise,
	"heartbeat":     Heartbeat,
	"reserve":       Reserve,
	"release":       Release,
	"expire":        Expire,
	"grant":         Grant,
	"reindex":       Reindex,
	"renew":         Renew,
	"renew_commit":  RenewCommit,
	"reserve_group": ReserveGroup,
	"preempt":       Preempt,
	"protect":       Protect,
	"forget":        Forget,
	"throttle":      Throttle,
	"score":         Score,
	"view":          View,
}
