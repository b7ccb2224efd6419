package main

import (
	"container/heap"
	"context"
	"fmt"
	"sync"
	"syscall"
	"time"

	"github.com/fluidos-project/resource-broker/broker/client"
	"github.com/fluidos-project/resource-broker/broker/model"
)

// leaseQueue holds the live leases by the time their pod ends.
type leaseQueue struct {
	mu    sync.Mutex
	items leaseHeap
}

type leaseDue struct {
	due time.Time
	m   *member
	id  string
}

type leaseHeap []leaseDue

func (h leaseHeap) Len() int           { return len(h) }
func (h leaseHeap) Less(i, j int) bool { return h[i].due.Before(h[j].due) }
func (h leaseHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *leaseHeap) Push(x any)        { *h = append(*h, x.(leaseDue)) }
func (h *leaseHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

func (q *leaseQueue) push(due time.Time, m *member, id string) {
	q.mu.Lock()
	defer q.mu.Unlock()
	heap.Push(&q.items, leaseDue{due, m, id})
}

// clear forgets every lease queued.
func (q *leaseQueue) clear() {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.items = nil
}

// pop returns the lease that ends first if it ends by now (any, with a zero now).
func (q *leaseQueue) pop(now time.Time) (leaseDue, bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if len(q.items) == 0 || (!now.IsZero() && q.items[0].due.After(now)) {
		return leaseDue{}, false
	}
	return heap.Pop(&q.items).(leaseDue), true
}

// steady runs one measured window: the open loop of rate decisions a
// second and the releases on top of the members' schedules, and reads the
// CPU and Redis figures around it.
func (s *sim) steady(ctx context.Context, rate float64) (Window, error) {
	w := Window{DecisionsPerSecond: rate, LoadAverageStart: loadAverage()}
	// The live leases end from now on, each after its own random hold at
	// this window's rate.
	s.rngMu.Lock()
	s.rate = rate
	s.rngMu.Unlock()
	s.leases.clear()
	now := time.Now()
	for _, m := range s.members {
		for _, id := range m.liveIDs() {
			s.leases.push(now.Add(s.holdTime()), m, id)
		}
	}
	rdb := s.b.RDB
	if err := rdb.ConfigResetStat(ctx).Err(); err != nil {
		return w, err
	}
	var slow *slowlogSampler
	if s.o.slowlogUsec >= 0 {
		var err error
		if slow, err = startSlowlog(ctx, rdb, s.o.slowlogUsec); err != nil {
			return w, err
		}
	}
	if s.o.latencyMonitorMs > 0 {
		if err := startLatencyMonitor(ctx, rdb, s.o.latencyMonitorMs); err != nil {
			return w, err
		}
	}
	steadyRec := newRecorder()
	s.rec.Store(steadyRec)
	renewed0 := s.renewedIDs.Load()
	cpu0, err := s.readCPU(ctx)
	if err != nil {
		return w, err
	}
	winCtx, stop := context.WithTimeout(ctx, s.o.duration)
	defer stop()
	callCtx := context.WithoutCancel(ctx) // calls under way finish after the window
	var calls sync.WaitGroup
	inFlight := make(chan struct{}, s.o.maxInFlight)
	launch := func(f func()) bool {
		select {
		case inFlight <- struct{}{}:
		default:
			return false
		}
		calls.Go(func() { defer func() { <-inFlight }(); f() })
		return true
	}
	var loops sync.WaitGroup
	loops.Go(func() { // pods end
		t := time.NewTicker(20 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-winCtx.Done():
				return
			case now := <-t.C:
				for {
					l, ok := s.leases.pop(now)
					if !ok {
						break
					}
					if !launch(func() { s.release(callCtx, l.m, l.id) }) {
						s.leases.push(l.due, l.m, l.id)
						steadyRec.count("release", "dropped: too many calls in flight")
						break
					}
				}
			}
		}
	})
	loops.Go(func() { // pods start: the open loop
		t := time.NewTicker(10 * time.Millisecond)
		defer t.Stop()
		start := time.Now()
		var issued int64
		for {
			select {
			case <-winCtx.Done():
				return
			case now := <-t.C:
				n := dueTicks(now.Sub(start), rate, issued)
				issued += n
				for range n {
					m := s.randomMember()
					if s.live.Load() >= int64(s.o.leases) { // at the bound: the pod due to end next ends now
						if l, ok := s.leases.pop(time.Time{}); ok {
							launch(func() { s.release(callCtx, l.m, l.id) })
						}
					}
					if !launch(func() { s.reserve(callCtx, m, true) }) {
						steadyRec.count("reserve", "dropped: too many calls in flight")
					}
				}
			}
		}
	})
	if slow != nil {
		loops.Go(func() {
			t := time.NewTicker(time.Second)
			defer t.Stop()
			for {
				select {
				case <-winCtx.Done():
					return
				case <-t.C:
					if err := slow.drain(ctx); err != nil {
						steadyRec.count("slowlog", err.Error())
					}
				}
			}
		})
	}
	<-winCtx.Done()
	pipe := rdb.Pipeline()
	parked := pipe.ZCount(ctx, s.b.Store.Key("expiry"), "+inf", "+inf")
	setEnds := pipe.ZCard(ctx, s.b.Store.Key("set-ends"))
	if _, err := pipe.Exec(ctx); err != nil {
		return w, err
	}
	w.ParkedAtEnd, w.SetEnds = parked.Val(), setEnds.Val()
	for _, m := range s.members {
		if time.Since(time.Unix(0, m.advertised.Load())) > staleThreshold {
			w.StaleAtEnd++
		}
	}
	cpu1, err := s.readCPU(ctx)
	if err != nil {
		return w, err
	}
	window := cpu1.at.Sub(cpu0.at)
	stats, err := rdb.Info(ctx, "commandstats").Result()
	if err != nil {
		return w, err
	}
	loops.Wait()
	var stalls []StallStats
	if s.o.latencyMonitorMs > 0 {
		if stalls, err = readLatencyMonitor(ctx, rdb); err != nil {
			return w, err
		}
	}
	if slow != nil {
		if err := slow.drain(ctx); err != nil {
			return w, err
		}
		_ = slow.stop(ctx)
	}
	// Read after the log's last drain: its read of 10,000 entries is not the window's.
	methods, err := auditMethods(ctx, rdb, s.b.Store.Key("audit"), auditSample)
	if err != nil {
		return w, err
	}
	calls.Wait()

	w.Seconds = window.Seconds()
	w.Activities = steadyRec.summary(window, activityOrder)
	w.LiveAtEnd = s.live.Load()
	w.RenewedIDs = s.renewedIDs.Load() - renewed0
	redisCPU := cpu1.redis - cpu0.redis
	w.Redis = RedisStats{CPUShare: share(redisCPU, window), Commands: commandStats(stats), Stalls: stalls, Methods: methods}
	if slow != nil {
		w.Redis.Scripts = slow.stats(w.Redis.Commands)
		w.Redis.SlowlogOverflowed = slow.lost
	}
	answered := map[string]histogram{} // over the window, summed over the replicas
	for i, p := range s.procs {
		r0, r1 := cpu0.replicas[i], cpu1.replicas[i]
		w.Brokers = append(w.Brokers, BrokerStats{Replica: i, Pid: p.Pid, CPUShare: share(cpu1.brokers[i]-cpu0.brokers[i], window),
			Hinted: int64(r1.hinted - r0.hinted), Walked: int64(r1.walked - r0.walked)})
		for key, h := range r1.answered {
			answered[key] = answered[key].plus(h.minus(r0.answered[key]))
		}
	}
	w.Answered = answeredStats(answered)
	w.SimulatorCPUShare = share(cpu1.self-cpu0.self, window)
	w.MemoryAtEnd, _ = usedMemory(ctx, rdb)
	w.LoadAverageEnd = loadAverage()
	return w, nil
}

func (s *sim) randomMember() *member {
	s.rngMu.Lock()
	defer s.rngMu.Unlock()
	return s.members[s.rng.IntN(len(s.members))]
}

// cpuReading is the CPU time used so far by Redis, each replica and this process.
type cpuReading struct {
	at      time.Time
	redis   time.Duration
	brokers []time.Duration
	self    time.Duration
	// replicas: what each replica's /metrics said (its decisions from its
	// view, its answers' durations).
	replicas []replicaMetrics
}

func (s *sim) readCPU(ctx context.Context) (cpuReading, error) {
	r := cpuReading{at: time.Now()}
	var err error
	if r.redis, err = redisCPU(ctx, s.b.RDB); err != nil {
		return r, err
	}
	for _, p := range s.procs {
		c, err := p.CPU()
		if err != nil {
			return r, err
		}
		r.brokers = append(r.brokers, c)
		rm, err := scrapeReplica(ctx, p.Health)
		if err != nil {
			return r, err
		}
		r.replicas = append(r.replicas, rm)
	}
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return r, err
	}
	r.self = time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	return r, nil
}

// share is cpu over wall as a share of one core.
func share(cpu, wall time.Duration) float64 {
	if wall <= 0 {
		return 0
	}
	return float64(cpu) / float64(wall)
}

// check ends the run as the members would leave: each advertises its
// nodes without churn (the most free it ever offered), lists its leases
// and compares them with those it holds, the invariant is checked with the
// leases live, then every lease is released and the invariant checked again.
func (s *sim) check(ctx context.Context) Checks {
	var c Checks
	var mu sync.Mutex
	s.forEachMember(ctx, 32, func(ctx context.Context, m *member) { s.advertiseUntilStored(ctx, m, false) })
	s.forEachMember(ctx, 32, func(ctx context.Context, m *member) {
		start := time.Now()
		listed, err := m.client.Reservations(ctx, client.RoleRequester)
		s.recorder().observe("list", time.Since(start), err)
		if err != nil {
			mu.Lock()
			c.ListErrors++
			mu.Unlock()
			return
		}
		m.mu.Lock()
		seen := map[string]int{}
		var extra []string
		for _, r := range listed {
			if r.Phase != model.PhaseReserved && r.Phase != model.PhaseActive {
				continue // the list holds live ones only; ended ones would not count
			}
			seen[r.ID]++
			if _, held := m.live[r.ID]; !held {
				if _, maybe := m.uncertain[r.ID]; maybe {
					m.live[r.ID] = nil // granted after all: released below
				} else {
					extra = append(extra, r.ID)
				}
			}
		}
		var lost, releasedUnanswered, twice int
		for id := range m.live {
			if seen[id] == 0 {
				if _, ok := m.releasing[id]; ok {
					releasedUnanswered++
				} else {
					lost++
				}
				delete(m.live, id)
			}
		}
		for _, n := range seen {
			if n > 1 {
				twice++
			}
		}
		m.mu.Unlock()
		mu.Lock()
		c.Held += len(listed)
		c.Lost += lost
		c.ReleasedUnanswered += releasedUnanswered
		c.ListedTwice += twice
		c.Unexpected += len(extra)
		mu.Unlock()
	})
	c.InvariantLive = errString(s.b.Store.CheckInvariant(ctx))
	if !s.o.releaseAtEnd {
		c.NotReleased = true
		return c
	}
	s.forEachMember(ctx, 128, func(ctx context.Context, m *member) {
		for _, id := range m.liveIDs() {
			s.release(ctx, m, id)
		}
	})
	c.InvariantReleased = errString(s.b.Store.CheckInvariant(ctx))
	left, err := s.b.RDB.ZCard(ctx, s.b.Store.Key("expiry")).Result()
	if err != nil {
		c.InvariantReleased += "; " + err.Error()
	}
	c.LiveAfterRelease = left
	return c
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return fmt.Sprint(err)
}
