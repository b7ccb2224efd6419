// Package scripts holds the broker's Redis Lua scripts, one per atomic
// operation. Each script file documents its KEYS, ARGV and reply; lib.lua holds
// the helpers they share and is prepended to each of them before loading.
package scripts

import (
	"embed"

	"github.com/redis/go-redis/v9"
)

//go:embed *.lua
var files embed.FS

// Source is the text of script name as loaded: lib.lua, then name.lua.
func Source(name string) string {
	lib, err := files.ReadFile("lib.lua")
	if err != nil {
		panic(err)
	}
	body, err := files.ReadFile(name + ".lua")
	if err != nil {
		panic(err)
	}
	return string(lib) + "\n" + string(body)
}

func load(name string) *redis.Script {
	return redis.NewScript(Source(name))
}

// The scripts, loaded once. Run them with Script.Run (EVALSHA, falling back to
// EVAL after a Redis restart has flushed the script cache).
var (
	Advertise = load("advertise")
	Reserve   = load("reserve")
	Release   = load("release")
	Expire    = load("expire")
	Grant     = load("grant")
	Reindex   = load("reindex")
	Renew     = load("renew")
	Forget    = load("forget")
	// ReserveGroup decides a gang, all or nothing (reserve_group.lua).
	ReserveGroup = load("reserve_group")
	// Preempt reserves by taking lower-priority reservations' capacity (preempt.lua).
	Preempt = load("preempt")
	// Protect records the reservations PodDisruptionBudgets protect (protect.lua).
	Protect = load("protect")
)

// All lists every script, for loading at start-up and readiness checks.
var All = map[string]*redis.Script{
	"advertise":     Advertise,
	"reserve":       Reserve,
	"release":       Release,
	"expire":        Expire,
	"grant":         Grant,
	"reindex":       Reindex,
	"renew":         Renew,
	"reserve_group": ReserveGroup,
	"preempt":       Preempt,
	"protect":       Protect,
	"forget":        Forget,
}
