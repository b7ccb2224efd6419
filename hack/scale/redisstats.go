package main

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fluidos-project/resource-broker/broker/scripts"
	"github.com/fluidos-project/resource-broker/broker/store"
)

// infoField reads one "name:value" line of an INFO section.
func infoField(info, name string) (string, bool) {
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), name+":"); ok {
			return v, true
		}
	}
	return "", false
}

// redisCPU is Redis' CPU time so far (INFO cpu: used_cpu_sys + used_cpu_user).
func redisCPU(ctx context.Context, rdb *redis.Client) (time.Duration, error) {
	info, err := rdb.Info(ctx, "cpu").Result()
	if err != nil {
		return 0, err
	}
	var total float64
	for _, f := range []string{"used_cpu_sys", "used_cpu_user"} {
		v, _ := infoField(info, f)
		s, err := strconv.ParseFloat(v, 64)
		if err != nil {
			return 0, err
		}
		total += s
	}
	return time.Duration(total * float64(time.Second)), nil
}

// usedMemory is INFO memory's used_memory, in bytes.
func usedMemory(ctx context.Context, rdb *redis.Client) (int64, error) {
	return memoryField(ctx, rdb, "used_memory")
}

// memoryField is one figure of INFO memory, in bytes.
func memoryField(ctx context.Context, rdb *redis.Client, name string) (int64, error) {
	info, err := rdb.Info(ctx, "memory").Result()
	if err != nil {
		return 0, err
	}
	v, _ := infoField(info, name)
	return strconv.ParseInt(v, 10, 64)
}

// CommandStats is one command's line of INFO commandstats.
type CommandStats struct {
	Command     string  `json:"command"`
	Calls       int64   `json:"calls"`
	Usec        int64   `json:"usec"`
	UsecPerCall float64 `json:"usecPerCall"`
}

// commandStats parses INFO commandstats, the most Redis time first.
func commandStats(info string) []CommandStats {
	var out []CommandStats
	for _, line := range strings.Split(info, "\n") {
		name, rest, ok := strings.Cut(strings.TrimSpace(line), ":")
		cmd, isCmd := strings.CutPrefix(name, "cmdstat_")
		if !ok || !isCmd {
			continue
		}
		s := CommandStats{Command: cmd}
		for _, kv := range strings.Split(rest, ",") {
			k, v, _ := strings.Cut(kv, "=")
			switch k {
			case "calls":
				s.Calls, _ = strconv.ParseInt(v, 10, 64)
			case "usec":
				s.Usec, _ = strconv.ParseInt(v, 10, 64)
			case "usec_per_call":
				s.UsecPerCall, _ = strconv.ParseFloat(v, 64)
			}
		}
		out = append(out, s)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Usec > out[j].Usec })
	return out
}

// scriptNames maps each broker script's SHA1 (what EVALSHA names) to its name.
func scriptNames() map[string]string {
	out := map[string]string{}
	for name, s := range scripts.All {
		out[s.Hash()] = name
	}
	return out
}

// ScriptStats is Redis' own time in one script (or one other command).
type ScriptStats struct {
	Script      string  `json:"script"`
	Calls       int64   `json:"calls"`
	Usec        int64   `json:"usec"`
	UsecPerCall float64 `json:"usecPerCall"`
	// Share is Usec over the time of every command logged: Redis' time
	// attributed to this script. The times are wall-clock times inside
	// Redis, which on a loaded machine include its waits for a core, so
	// their sum may exceed Redis' CPU time; the shares still divide it.
	Share float64 `json:"share"`
	// MaxUsec is the longest call logged: Redis held every other caller
	// that long (0 for the calls the log missed).
	MaxUsec int64 `json:"maxUsec"`
	// P99Usec is the 99th percentile of the calls logged, and LongUsec
	// the time in the calls of at least longCallUsec: the calls that make
	// every caller of their moment wait long (0 for the calls the log
	// missed).
	P99Usec  int64 `json:"p99Usec"`
	LongUsec int64 `json:"longUsec"`
}

// longCallUsec: a call at least this long is counted as long (ScriptStats.LongUsec).
const longCallUsec = 2000

// slowlogSampler has Redis log the commands that take at least a
// threshold (slowlog-log-slower-than) and drains the log often, before its
// ring overwrites entries, adding up the time per script (EVALSHA by its
// SHA) or command. Logging every command (threshold 0) also logs every
// command the scripts call, hundreds per decision at 1,000 clusters: that
// floods the ring and slows Redis, hence a threshold; the script calls under
// it are counted together from INFO commandstats.
type slowlogSampler struct {
	rdb   *redis.Client
	names map[string]string

	mu      sync.Mutex
	calls   map[string]int64
	usec    map[string]int64
	maxUsec map[string]int64
	each    map[string][]int32 // every logged call's µs, for the percentiles
	lost    bool               // the ring went round between two drains
	lastID  int64              // the newest entry counted
	read    int                // how many entries the next drain asks for first
}

// The ring holds slowlogLen entries. SLOWLOG GET costs Redis for every entry
// it returns, read before or not, and holds it meanwhile (10,000 entries:
// 20-30 ms, a stall every caller of that moment sees): a drain asks for
// about twice what the last one found new, and more only if that did not
// reach back to the entries it read before.
const (
	slowlogLen       = 100_000
	slowlogFirstRead = 1000
)

// unlogged names the script calls INFO commandstats counted and SLOWLOG did not.
const unlogged = "evalsha not in SLOWLOG"

func startSlowlog(ctx context.Context, rdb *redis.Client, thresholdUsec int) (*slowlogSampler, error) {
	s := &slowlogSampler{rdb: rdb, names: scriptNames(), calls: map[string]int64{}, usec: map[string]int64{}, maxUsec: map[string]int64{},
		each: map[string][]int32{}, lastID: -1, read: slowlogFirstRead}
	for k, v := range map[string]string{"slowlog-log-slower-than": strconv.Itoa(thresholdUsec), "slowlog-max-len": strconv.Itoa(slowlogLen)} {
		if err := rdb.ConfigSet(ctx, k, v).Err(); err != nil {
			return nil, err
		}
	}
	return s, rdb.SlowLogReset(ctx).Err()
}

// drain reads the entries logged since the last drain (by their ids: a
// SLOWLOG RESET after the read would lose what Redis logged between the two,
// much of it when Redis is busy).
func (s *slowlogSampler) drain(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	var logs []redis.SlowLog
	for n := s.read; ; n = min(4*n, slowlogLen) {
		var err error
		if logs, err = s.rdb.SlowLogGet(ctx, int64(n)).Result(); err != nil {
			return err
		}
		if len(logs) < n || logs[len(logs)-1].ID <= s.lastID+1 {
			break // all there is, or back to what the last drain read
		}
		if n == slowlogLen {
			s.lost = true // the ring went round since the last drain
			break
		}
	}
	fresh := 0
	for _, l := range logs {
		if l.ID > s.lastID {
			fresh++
		}
	}
	s.read = min(max(2*fresh, slowlogFirstRead), slowlogLen)
	last := s.lastID
	for _, l := range logs { // newest first
		if l.ID <= s.lastID {
			break
		}
		last = max(last, l.ID)
		if len(l.Args) == 0 || l.ClientAddr == "?:0" {
			continue // a command a script called ("?:0", the Lua client): in its script's time
		}
		k := strings.ToLower(l.Args[0])
		if (k == "evalsha" || k == "evalsha_ro") && len(l.Args) > 1 {
			if name, ok := s.names[strings.ToLower(l.Args[1])]; ok {
				k = name + ".lua"
			}
		}
		us := l.Duration.Microseconds()
		s.calls[k]++
		s.usec[k] += us
		s.maxUsec[k] = max(s.maxUsec[k], us)
		s.each[k] = append(s.each[k], int32(min(us, math.MaxInt32)))
	}
	s.lastID = last
	return nil
}

// stop turns the logging of every command off.
func (s *slowlogSampler) stop(ctx context.Context) error {
	return s.rdb.ConfigSet(ctx, "slowlog-log-slower-than", "10000").Err()
}

// stats returns the time by script or command, the most first, with the
// script calls the log missed (evalsha's commandstats less the scripts
// logged: those under the threshold, and more on a loaded machine, where
// the log has been seen to miss calls well above it) as one more line.
func (s *slowlogSampler) stats(commands []CommandStats) []ScriptStats {
	s.mu.Lock()
	defer s.mu.Unlock()
	calls, usec := maps.Clone(s.calls), maps.Clone(s.usec)
	for _, c := range commands {
		if c.Command != "evalsha" {
			continue
		}
		var n, us int64
		for k := range calls {
			if strings.HasSuffix(k, ".lua") {
				n, us = n+calls[k], us+usec[k]
			}
		}
		if c.Calls > n {
			calls[unlogged], usec[unlogged] = c.Calls-n, max(c.Usec-us, 0)
		}
	}
	var total int64
	for _, us := range usec {
		total += us
	}
	out := make([]ScriptStats, 0, len(calls))
	for k, n := range calls {
		st := ScriptStats{Script: k, Calls: n, Usec: usec[k], UsecPerCall: float64(usec[k]) / float64(n), MaxUsec: s.maxUsec[k]}
		st.P99Usec, st.LongUsec = tail(s.each[k])
		if total > 0 {
			st.Share = float64(usec[k]) / float64(total)
		}
		out = append(out, st)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Usec > out[j].Usec })
	return out
}

// tail returns the 99th percentile of the logged calls (a script's calls
// under the log's threshold count on the line of the unlogged ones) and the
// time in those of at least longCallUsec.
func tail(logged []int32) (p99, long int64) {
	if len(logged) == 0 {
		return 0, 0
	}
	for _, us := range logged {
		if us >= longCallUsec {
			long += int64(us)
		}
	}
	sorted := slices.Clone(logged)
	slices.Sort(sorted)
	return int64(sorted[int(math.Ceil(0.99*float64(len(sorted))))-1]), long
}

// Niceness is the priority each process ran at (nice values: -20 the
// highest, 19 the lowest).
type Niceness struct {
	Simulator int `json:"simulator"`
	Redis     int `json:"redis"`
	Replicas  int `json:"replicas"`
}

// prioritize gives redis-server the simulator's nice value plus redisDelta
// and the replicas the simulator's plus brokerDelta (within -20..19). The
// machine's cores are shared: without it the scheduler gives Redis' one
// thread the share of any of the replicas' and the simulator's threads, and
// every call waits in its queue while it waits for a core. (The replicas'
// priority over the simulator, which stands for members on machines of
// their own, measured no better: brokerDelta defaults to 0.) It returns the
// nice values the run goes on with (those it could not set left as they were).
func prioritize(ctx context.Context, rdb *redis.Client, replicas []int, redisDelta, brokerDelta int) (Niceness, error) {
	own, err := syscall.Getpriority(syscall.PRIO_PROCESS, 0)
	if err != nil {
		return Niceness{}, err
	}
	sim := 20 - own // the system call answers 20 - nice
	n := Niceness{Simulator: sim, Redis: sim, Replicas: sim}
	info, err := rdb.Info(ctx, "server").Result()
	if err != nil {
		return n, err
	}
	v, _ := infoField(info, "process_id")
	pid, err := strconv.Atoi(v)
	if err != nil {
		return n, fmt.Errorf("redis-server's process_id %q: %w", v, err)
	}
	want := min(max(sim+redisDelta, -20), 19)
	if err := renice(pid, want); err != nil {
		return n, fmt.Errorf("redis-server: %w", err)
	}
	n.Redis = want
	want = min(max(sim+brokerDelta, -20), 19)
	for _, pid := range replicas {
		if err := renice(pid, want); err != nil {
			return n, fmt.Errorf("rb-broker: %w", err)
		}
	}
	n.Replicas = want
	return n, nil
}

// renice sets the nice value of every thread of process pid: on Linux a
// nice value is a thread's (setpriority's PRIO_PROCESS names one thread),
// and the threads a process starts later inherit their parent thread's.
func renice(pid, nice int) error {
	tasks, err := os.ReadDir("/proc/" + strconv.Itoa(pid) + "/task")
	if err != nil {
		return err
	}
	for _, t := range tasks {
		tid, err := strconv.Atoi(t.Name())
		if err != nil {
			continue
		}
		if err := syscall.Setpriority(syscall.PRIO_PROCESS, tid, nice); err != nil && !errors.Is(err, syscall.ESRCH) {
			return fmt.Errorf("nice %d for thread %d: %w", nice, tid, err)
		}
	}
	return nil
}

// StallStats is one kind of event Redis' latency monitor recorded over a
// window (LATENCY HISTORY: the longest of each second at or over the
// monitor's threshold): commands ("command", "fast-command") and the work
// Redis does between them ("expire-cycle", "eviction-cycle", "fork", ...),
// which SLOWLOG does not see and every caller waits for alike.
type StallStats struct {
	Event string `json:"event"`
	// Seconds counts the seconds with at least one such event; MaxMs is the
	// longest, SumMs the sum of each second's longest (a lower bound of the
	// time Redis was held by them).
	Seconds int64 `json:"seconds"`
	MaxMs   int64 `json:"maxMs"`
	SumMs   int64 `json:"sumMs"`
}

// startLatencyMonitor has Redis record the events that take at least
// thresholdMs from now on.
func startLatencyMonitor(ctx context.Context, rdb *redis.Client, thresholdMs int) error {
	if err := rdb.ConfigSet(ctx, "latency-monitor-threshold", strconv.Itoa(thresholdMs)).Err(); err != nil {
		return err
	}
	return rdb.Do(ctx, "LATENCY", "RESET").Err()
}

// readLatencyMonitor returns the events recorded since startLatencyMonitor
// (the history keeps the last 160 seconds of each), the longest first, and
// turns the monitor off.
func readLatencyMonitor(ctx context.Context, rdb *redis.Client) ([]StallStats, error) {
	latest, err := rdb.Do(ctx, "LATENCY", "LATEST").Slice()
	if err != nil {
		return nil, err
	}
	var out []StallStats
	for _, e := range latest {
		fields, ok := e.([]any)
		if !ok || len(fields) == 0 {
			continue
		}
		event, _ := fields[0].(string)
		history, err := rdb.Do(ctx, "LATENCY", "HISTORY", event).Slice()
		if err != nil {
			return nil, err
		}
		st := StallStats{Event: event}
		for _, h := range history {
			sample, ok := h.([]any)
			if !ok || len(sample) != 2 {
				continue
			}
			ms, _ := sample[1].(int64)
			st.Seconds++
			st.SumMs += ms
			st.MaxMs = max(st.MaxMs, ms)
		}
		out = append(out, st)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].SumMs > out[j].SumMs })
	return out, rdb.ConfigSet(ctx, "latency-monitor-threshold", "0").Err()
}

// MethodStats counts the decisions of the audit stream's last entries by
// how their candidates were found (reserve.lua's method: "hint" from a
// replica's view; "direct" or "threshold", the index walked in Redis, as
// when a hint's price range no longer fits), with the clusters they
// examined.
type MethodStats struct {
	Method    string `json:"method"`
	Decisions int64  `json:"decisions"`
	Examined  int64  `json:"examined"`
}

// auditSample is how many of the audit stream's newest entries a window
// reads (the broker keeps about 10,000: store.DefaultAuditMaxLen).
const auditSample = store.DefaultAuditMaxLen

// auditMethods reads up to n of the audit stream's newest entries.
func auditMethods(ctx context.Context, rdb *redis.Client, key string, n int64) ([]MethodStats, error) {
	entries, err := rdb.XRevRangeN(ctx, key, "+", "-", n).Result()
	if err != nil {
		return nil, err
	}
	by := map[string]*MethodStats{}
	for _, e := range entries {
		m, _ := e.Values["method"].(string)
		if m == "" {
			continue // not a decision (an expiry, a release)
		}
		st := by[m]
		if st == nil {
			st = &MethodStats{Method: m}
			by[m] = st
		}
		st.Decisions++
		ex, _ := e.Values["examined"].(string)
		n, _ := strconv.ParseInt(ex, 10, 64)
		st.Examined += n
	}
	out := make([]MethodStats, 0, len(by))
	for _, st := range by {
		out = append(out, *st)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Decisions > out[j].Decisions })
	return out, nil
}
