// Package embedredis starts an in-process Redis-protocol server (miniredis,
// github.com/alicebob/miniredis/v2) on a free loopback port.
//
// It is the fallback of `make demo` on a machine without redis-server, and
// nothing more. miniredis re-implements Redis for unit tests: it keeps
// everything in memory (no persistence, so no restart with data), serialises
// every command behind one lock, and its Lua (gopher-lua) differs from Redis'
// in places (no bit, struct or cmsgpack libraries; cjson encodes an empty
// table as [] where Redis gives {}). What runs on it proves nothing about
// behaviour on Redis: the tests use a real redis-server (internal/redistest).
package embedredis

import (
	"github.com/alicebob/miniredis/v2"
)

// Server is a running embedded Redis.
type Server struct {
	// Addr is 127.0.0.1:<port>.
	Addr string
	m    *miniredis.Miniredis
}

// Start serves on 127.0.0.1 on a port the kernel picks. Keys' TTLs run on the
// wall clock, as in Redis (miniredis' default is to freeze them).
func Start() (*Server, error) {
	m := miniredis.NewMiniRedis()
	m.ClockTTL(true)
	if err := m.StartAddr("127.0.0.1:0"); err != nil {
		return nil, err
	}
	return &Server{Addr: m.Addr(), m: m}, nil
}

// Close stops the server and drops its data; it may be called more than once.
func (s *Server) Close() { s.m.Close() }
