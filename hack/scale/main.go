// Command scale simulates a large federation against one broker and
// measures what the broker and its Redis carry (make scale; docs/benchmarks.md,
// "Scale: one broker, a whole federation").
//
// It starts a real redis-server and --replicas real rb-broker processes
// built from this tree (internal/brokertest, over real mutual TLS), then
// --clusters simulated members, each with its own client certificate and
// its own broker/client: every member advertises its --nodes-per-cluster
// nodes every 30 s and renews its leases every 30 s (in batches of at most
// 5,000 ids), as rb-agent does, while an open loop reserves leases at
// --decisions-per-second for random members and releases each after a
// random hold, as pods end. The live leases (--leases) are filled in bulk
// first. After the --duration steady window it stops, releases everything
// and checks the broker's invariant, then prints the report (and writes it
// as JSON with --out).
package main

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"maps"
	"math/rand/v2"
	"os"
	"os/exec"
	"os/signal"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/sync/errgroup"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/klog/v2"

	"github.com/fluidos-project/resource-broker/broker/api"
	brokerclient "github.com/fluidos-project/resource-broker/broker/client"
	"github.com/fluidos-project/resource-broker/internal/brokertest"
)

// The agents' schedules (agent/publisher, agent/reservation/renewer.go).
const (
	advertisePeriod = 30 * time.Second
	renewBatch      = 5000
	// staleThreshold is rb-broker's default --stale-threshold: a cluster
	// not advertised for this long is no candidate.
	staleThreshold = time.Minute
)

type options struct {
	clusters, nodesPerCluster, leases int
	decisionsPerSecond                []float64
	leaseLength, renewInterval        time.Duration
	duration                          time.Duration
	replicas                          int
	decideFromView                    bool
	out                               string
	fillInFlight, maxInFlight         int
	slowlogUsec                       int
	redisNice                         int
	brokerNice                        int
	latencyMonitorMs                  int
	settle                            time.Duration
	seed                              uint64
	heartbeats                        bool
	moves                             float64
	fillPinned, releaseAtEnd          bool
	fillSpread                        int
	grant                             bool
	vouch                             []string
}

func main() {
	o := options{}
	cmd := &cobra.Command{
		Use:   "scale",
		Short: "Simulate a federation against real brokers and Redis and report what they carry",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			return run(ctx, o, strings.Join(os.Args, " "))
		},
		SilenceUsage: true,
	}
	f := cmd.Flags()
	f.IntVar(&o.clusters, "clusters", 1000, "simulated member clusters, each a provider and a requester with its own identity")
	f.IntVar(&o.nodesPerCluster, "nodes-per-cluster", 50, "nodes each member advertises (at most 100)")
	f.IntVar(&o.leases, "leases", 100_000, "live leases: filled in bulk before the window, then kept at about this many")
	f.Float64SliceVar(&o.decisionsPerSecond, "decisions-per-second", []float64{500}, "reservations offered per second in the window (an open loop), each released after a random hold; 0: none, the leases are held through the window. "+
		"A list (0,500,2000) measures a window at each rate, one after the other, on the same filled leases")
	f.DurationVar(&o.duration, "duration", time.Minute, "each steady window measured")
	f.DurationVar(&o.settle, "settle", 90*time.Second, "after the fill, the members renew and advertise this long before the first window, so that it measures the steady state: "+
		"a requester's renewals are its renewal set's from the third after its leases last changed (the fill's are renewed id by id until then; three --renew-interval)")
	f.DurationVar(&o.leaseLength, "lease-length", 2*time.Minute, "the lease (and hold time) each reservation asks for, as rb-agent's --lease-length")
	f.DurationVar(&o.renewInterval, "renew-interval", 30*time.Second, "how often each member renews its leases, as rb-agent's --lease-renew-interval")
	f.IntVar(&o.replicas, "replicas", 2, "rb-broker processes; member i talks to replica i mod replicas")
	f.BoolVar(&o.decideFromView, "decide-from-view", true, "the replicas' --decide-from-view (rb-broker's default): each proposes its decisions' candidates from its view of the candidate index; false: every decision walks the index in Redis")
	f.StringVar(&o.out, "out", "", "write the report as JSON to this file")
	f.IntVar(&o.fillInFlight, "fill-in-flight", 128, "reservations in flight while filling")
	f.IntVar(&o.maxInFlight, "max-in-flight", 2048, "most calls of the open loop in flight; a decision due beyond it is dropped and counted")
	f.IntVar(&o.slowlogUsec, "slowlog-usec", 50, "attribute Redis' time to scripts through SLOWLOG, logging the commands of the window that take at least this many µs "+
		"(0 logs every command, those the scripts call too, which slows Redis at scale); negative: off")
	f.IntVar(&o.redisNice, "redis-nice", -10, "run redis-server this much nicer than the simulator and the replicas, which share its cores (negative: a higher priority), "+
		"as a deployment gives Redis, the one thread every call goes through, a core of its own; 0: the same priority. "+
		"A higher priority needs CAP_SYS_NICE: without it the run goes on at the same priority and the report says so")
	f.IntVar(&o.latencyMonitorMs, "latency-monitor-ms", 2, "record with Redis' latency monitor what holds it at least this many ms in each window (commands, and the work between them that SLOWLOG does not see: the expire cycle, ...); 0: off")
	f.IntVar(&o.brokerNice, "broker-nice", 0, "run the replicas this much nicer than the simulator (negative: a higher priority), which stands for members on machines of their own "+
		"(-5 measured no better than 0 at 500/s and 2,000/s: docs/benchmarks.md)")
	f.Uint64Var(&o.seed, "seed", 1, "seed of the simulated clusters and requests")
	f.BoolVar(&o.heartbeats, "heartbeats", true, "members send a heartbeat naming the advertisement the broker holds while their figures stay within the agent's band of it, as agent/publisher does; false: a full advertisement every period")
	f.BoolVar(&o.fillPinned, "fill-pinned", false, "fill with requests that each name one provider by a label of its own (the member's "+memberLabel+"), round-robin over the providers: "+
		"each fill decision then evaluates one candidate (the index's direct method) instead of walking the index, so that a million leases fill in minutes; the window's decisions are never pinned")
	f.IntVar(&o.fillSpread, "fill-spread", 1, "with --fill-pinned, the providers each requester's leases are spread over (1: one provider per requester, each provider hosting one requester's leases)")
	f.BoolVar(&o.releaseAtEnd, "release-at-end", true, "after the window's checks, release every lease and check the invariant again (at a million leases this takes longer than the rest of the run)")
	f.StringSliceVar(&o.vouch, "vouch", []string{vouchQuiet}, "each member, as a provider, renews every 30 s the leases of the requesters whose leases it holds, as agent/provider does for the requesters it hears: "+
		vouchQuiet+": one call asks which requesters went quiet and renews for those alone (the agent now); "+vouchEach+": one renewal call per requester (the agent before); "+vouchOff+": none. "+
		"A list (each,quiet) measures the windows of --decisions-per-second in each mode, one after the other, on the same filled leases")
	f.BoolVar(&o.grant, "grant", false, "after each reservation granted, its provider posts a grant for it (grant.go)")
	f.Float64Var(&o.moves, "advert-moves", 0.1, "the share of a member's periods in which pods come or go: one node's used figures move past the band (8-12 % of the node), so its next publish is a full advertisement")
	var klogFlags flag.FlagSet
	klog.InitFlags(&klogFlags)
	f.AddGoFlag(klogFlags.Lookup("v")) // -v=4 shows the brokers' set-up logs
	if err := cmd.Execute(); err != nil {
		os.Exit(1)
	}
}

// sim is one run: the brokers, the members and what they measured.
type sim struct {
	o       options
	b       *brokertest.Broker
	procs   []*brokertest.Process
	members []*member
	leases  *leaseQueue
	grants  *grants // --grant; nil: none

	rec        atomic.Pointer[recorder] // the current phase's
	live       atomic.Int64             // leases the members hold
	renewedIDs atomic.Int64
	rate       float64                // decisions per second offered in the current window
	vouch      atomic.Pointer[string] // the --vouch mode of the current window (or fill)
	rngMu      sync.Mutex
	rng        *rand.Rand
}

func (s *sim) recorder() *recorder { return s.rec.Load() }

func run(ctx context.Context, o options, command string) (err error) {
	if o.clusters < 2 || o.nodesPerCluster < 1 || o.nodesPerCluster > 100 || o.replicas < 1 || len(o.decisionsPerSecond) == 0 || slices.Min(o.decisionsPerSecond) < 0 ||
		o.leases < 0 || o.moves < 0 || o.fillSpread < 1 || o.fillSpread >= o.clusters || o.moves > 1 || o.renewInterval <= 0 || o.renewInterval > o.leaseLength/3 ||
		len(o.vouch) == 0 || slices.ContainsFunc(o.vouch, func(v string) bool { return !slices.Contains([]string{vouchQuiet, vouchEach, vouchOff}, v) }) {
		return errors.New("need --clusters >= 2, --nodes-per-cluster 1 to 100, --replicas >= 1, --decisions-per-second >= 0, --leases >= 0, --advert-moves 0 to 1, --fill-spread 1 to clusters-1, " +
			"--renew-interval at most a third of --lease-length (as rb-agent), --vouch " + vouchQuiet + ", " + vouchEach + " or " + vouchOff)
	}
	tb := &programTB{}
	defer tb.runCleanups()
	defer func() {
		if r := recover(); r != nil {
			f, ok := r.(errFatal)
			if !ok {
				panic(r)
			}
			err = errors.New(f.msg)
		}
	}()
	rep := &Report{Command: command, Commit: gitCommit(), CPUs: runtime.NumCPU(), LoadAverageStart: loadAverage(), Options: o,
		Config: Config{Clusters: o.clusters, NodesPerCluster: o.nodesPerCluster, Leases: o.leases, DecisionsPerSecond: o.decisionsPerSecond,
			LeaseSeconds: o.leaseLength.Seconds(), RenewIntervalSeconds: o.renewInterval.Seconds(), Heartbeats: o.heartbeats, AdvertMoves: o.moves,
			DurationSeconds: o.duration.Seconds(), SettleSeconds: o.settle.Seconds(), Replicas: o.replicas}}
	s := &sim{o: o, leases: &leaseQueue{}, rng: rand.New(rand.NewPCG(o.seed, 7))}
	s.vouch.Store(&o.vouch[0])
	if o.grant {
		if s.grants, err = newGrants(); err != nil {
			return err
		}
	}

	step := func(format string, args ...any) { fmt.Fprintf(os.Stderr, "scale: "+format+"\n", args...) }
	step("building rb-broker and starting redis-server and %d replicas", o.replicas)
	bin := brokertest.BuildBroker(tb, tb.TempDir())
	// brokertest.Start also serves an in-process broker, which the members
	// never call; its expiry loop is slowed to an hour so that the rb-broker
	// processes do all the work.
	s.b = brokertest.Start(tb, brokertest.Options{ExpiryInterval: time.Hour})
	flags := []string{fmt.Sprintf("--decide-from-view=%t", o.decideFromView)}
	for range o.replicas {
		s.procs = append(s.procs, s.b.StartProcess(bin, nil, flags...))
	}
	pids := make([]int, len(s.procs))
	for i, p := range s.procs {
		pids[i] = p.Pid
	}
	if rep.Nice, err = prioritize(ctx, s.b.RDB, pids, o.redisNice, o.brokerNice); err != nil {
		step("priorities left as they were from where this failed: %v", err)
	}

	step("issuing %d client certificates", o.clusters)
	if err := s.makeMembers(); err != nil {
		return err
	}
	mem0, err := usedMemory(ctx, s.b.RDB)
	if err != nil {
		return err
	}

	fill := newRecorder()
	s.rec.Store(fill)
	step("advertising %d clusters of %d nodes", o.clusters, o.nodesPerCluster)
	s.forEachMember(ctx, 32, func(ctx context.Context, m *member) { s.advertiseUntilStored(ctx, m, true) })
	mem1, err := usedMemory(ctx, s.b.RDB)
	if err != nil {
		return err
	}
	kinds1, err := memoryByKind(ctx, s.b.RDB)
	if err != nil {
		return err
	}
	// The renewals outlast the advertisements: they run through the
	// checks, which at a million leases take longer than a lease.
	advCtx, stopAdverts := context.WithCancel(ctx)
	renewCtx, stopRenewals := context.WithCancel(ctx)
	loops := s.startMemberLoops(advCtx, renewCtx)
	stopLoops := func() {
		stopAdverts()
		stopRenewals()
		loops.Wait()
	}
	defer stopLoops()

	s.waitAllLive(ctx, step)
	step("filling %d leases, %d in flight", o.leases, o.fillInFlight)
	start := time.Now()
	s.fill(ctx)
	rep.Fill = FillStats{Leases: s.live.Load(), Seconds: time.Since(start).Seconds(), Activities: fill.summary(time.Since(start), activityOrder)}
	rep.Fill.PerSecond = float64(rep.Fill.Leases) / rep.Fill.Seconds
	mem2, err := usedMemory(ctx, s.b.RDB)
	if err != nil {
		return err
	}
	kinds2, err := memoryByKind(ctx, s.b.RDB)
	if err != nil {
		return err
	}
	rep.Memory = MemoryStats{Empty: mem0, Advertised: mem1, Filled: mem2, BytesPerCluster: float64(mem1-mem0) / float64(o.clusters)}
	if n := s.live.Load(); n > 0 {
		rep.Memory.BytesPerLease = float64(mem2-mem1) / float64(n)
		rep.Memory.PerLease = leaseMemory(kinds1, kinds2, mem1, mem2, n)
	}
	if o.settle > 0 {
		step("settling for %s: the members renew and advertise, nothing measured", o.settle)
		select {
		case <-ctx.Done():
		case <-time.After(o.settle):
		}
	}
	if ctx.Err() != nil {
		stopLoops()
		return ctx.Err()
	}

	for _, vouch := range o.vouch {
		s.vouch.Store(&vouch)
		for _, rate := range o.decisionsPerSecond {
			step("steady window: %s at %g decisions/s, providers' renewals: %s", o.duration, rate, vouch)
			w, err := s.steady(ctx, rate)
			if err != nil {
				stopLoops()
				return err
			}
			w.Vouch = vouch
			rep.Windows = append(rep.Windows, w)
			// The window's figures now: the checks of a large federation take minutes.
			var window strings.Builder
			w.write(&window)
			step("window done:%s", window.String())
		}
	}

	stopAdverts() // the calls it cuts count in the window's recorder, already summed up
	s.rec.Store(newRecorder())
	step("checking: listing every member's leases, the invariant, releasing everything")
	rep.Checks = s.check(context.WithoutCancel(ctx))
	stopLoops()
	rep.End = s.recorder().summary(0, activityOrder)
	rep.LoadAverageEnd = loadAverage()

	fmt.Print(rep.Table())
	if o.out != "" {
		data, _ := json.MarshalIndent(rep, "", "  ")
		if err := os.WriteFile(o.out, append(data, '\n'), 0o644); err != nil {
			return err
		}
	}
	if tb.Failed() {
		return errors.New("the brokers or Redis reported failures (see above)")
	}
	if !rep.Checks.OK() {
		return errors.New("the checks failed (see the report)")
	}
	return nil
}

// makeMembers issues a certificate per member (CN = its cluster id) and
// gives it a client of replica i mod replicas, as a load balancer in front
// of the replicas would keep its connections on one.
func (s *sim) makeMembers() error {
	s.members = make([]*member, s.o.clusters)
	var g errgroup.Group
	g.SetLimit(runtime.NumCPU())
	for i := range s.members {
		g.Go(func() error {
			id := fmt.Sprintf("c%05d", i)
			pair, err := s.b.CA.IssueClient(id)
			if err != nil {
				return err
			}
			cert, err := pair.TLSCertificate()
			if err != nil {
				return err
			}
			// No retries: each call's latency and error are the broker's answer to it.
			c, err := brokerclient.NewWithTLS(s.procs[i%len(s.procs)].URL,
				&tls.Config{RootCAs: s.b.CA.Pool(), Certificates: []tls.Certificate{cert}},
				brokerclient.WithRetries(0, 0), brokerclient.WithUserAgent("rb-scale"),
				// One idle connection a member: 10,000 members' overlapping calls (renewals,
				// providers' calls, heartbeats, reserves) otherwise keep more than the
				// process's descriptors allow.
				brokerclient.WithIdleConns(1))
			if err != nil {
				return err
			}
			m := newMember(id, s.o.nodesPerCluster, s.o.seed*1_000_003+uint64(i))
			if s.o.fillPinned {
				m.labels[memberLabel] = id
			}
			m.client = c
			s.members[i] = m
			return nil
		})
	}
	return g.Wait()
}

// forEachMember calls f for every member, n at once.
func (s *sim) forEachMember(ctx context.Context, n int, f func(context.Context, *member)) {
	var g errgroup.Group
	g.SetLimit(n)
	for _, m := range s.members {
		if ctx.Err() != nil {
			break
		}
		g.Go(func() error { f(ctx, m); return nil })
	}
	_ = g.Wait()
}

// advertise publishes what m's agent would: a heartbeat naming the
// advertisement the broker holds while m's figures stay within the band of
// it (--heartbeats), else, or when the broker asks for it, the full
// advertisement. Without churn, always the full one (the last, least used).
func (s *sim) advertise(ctx context.Context, m *member, churn bool) error {
	ad, cpus, mems := m.advertisement(churn, s.o.moves)
	if s.o.heartbeats && churn && m.withinBand(cpus, mems) {
		start := time.Now()
		_, err := m.client.Heartbeat(ctx, m.id, m.digest)
		s.recorder().observe("heartbeat", time.Since(start), err)
		if !brokerclient.IsAdvertisementNeeded(err) {
			if err == nil {
				m.advertised.Store(time.Now().UnixNano())
			}
			return err
		}
		m.digest = "" // the broker wants the advertisement itself: at once
	}
	start := time.Now()
	ack, err := m.client.Advertise(ctx, m.id, ad)
	s.recorder().observe("advertise", time.Since(start), err)
	if err == nil {
		m.advertised.Store(time.Now().UnixNano())
		m.digest, m.storedCPU, m.storedMem = ack.Digest, cpus, mems
	}
	if brokerclient.IsBusy(err) && s.o.heartbeats && churn && m.offersNoMore(cpus, mems) {
		// As agent/publisher: the broker's copy offers no more than there
		// is, so a heartbeat keeps the member live until its turn comes.
		start := time.Now()
		_, herr := m.client.Heartbeat(ctx, m.id, m.digest)
		s.recorder().observe("heartbeat", time.Since(start), herr)
		if herr == nil {
			m.advertised.Store(time.Now().UnixNano())
		}
	}
	return err
}

// waitAllLive waits, at most 5 minutes, until every member's advertisement
// or heartbeat was taken within the last period and a few seconds: a large
// federation's first advertisements take longer than the stale threshold,
// so the first members are stale until their loop's turn comes round again
// (and one shed then, later still), and a pinned fill would find them no
// candidate.
func (s *sim) waitAllLive(ctx context.Context, step func(string, ...any)) {
	deadline := time.Now().Add(5 * time.Minute)
	for {
		late := 0
		for _, m := range s.members {
			if time.Since(time.Unix(0, m.advertised.Load())) > advertisePeriod+5*time.Second {
				late++
			}
		}
		if late == 0 || time.Now().After(deadline) || ctx.Err() != nil {
			if late > 0 {
				step("%d members not advertised within the last %s; filling anyway", late, advertisePeriod+5*time.Second)
			}
			return
		}
		step("waiting for %d members' advertisements to be taken again", late)
		select {
		case <-ctx.Done():
		case <-time.After(5 * time.Second):
		}
	}
}

// advertiseUntilStored advertises m until the broker stores it: one shed
// (503 Busy) is sent again after its Retry-After, any other failure after a
// second, as an agent starting would.
func (s *sim) advertiseUntilStored(ctx context.Context, m *member, churn bool) {
	for {
		err := s.advertise(ctx, m, churn)
		if err == nil || ctx.Err() != nil {
			return
		}
		wait, ok := brokerclient.RetryAfter(err)
		if !ok {
			wait = time.Second
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
	}
}

// renew renews every lease the member holds, in batches, as the renewer
// does; a lease the broker refuses is lost.
func (s *sim) renew(ctx context.Context, m *member) {
	for _, ids := range batches(m.liveIDs(), renewBatch) {
		start := time.Now()
		resp, err := m.client.Renew(ctx, ids)
		s.recorder().observe("renew", time.Since(start), err)
		s.renewedIDs.Add(int64(len(resp.Renewed)))
		for _, r := range resp.Refused {
			if _, held := m.drop(r.ID); held {
				s.live.Add(-1)
				if m.released(r.ID) {
					s.recorder().count("renew", "refused, released by a call whose answer was lost: "+r.Reason)
				} else {
					s.recorder().count("lost", "renewal refused: "+r.Reason)
				}
			}
		}
	}
}

// The --vouch modes.
const (
	vouchQuiet = "quiet"
	vouchEach  = "each"
	vouchOff   = "off"
)

// vouchPeriod is agent/provider's DefaultVouchPeriod.
const vouchPeriod = 30 * time.Second

// vouchFor renews, as provider p, the leases placed on it for their
// requesters, as agent/provider's Requesters does for the requesters it
// hears (every requester, here: all are heard): with --vouch quiet, one
// call names them all and only those the broker finds quiet are renewed
// for; with --vouch each, one renewal per requester, each refused
// RequesterRenews while the requester renews itself.
func (s *sim) vouchFor(ctx context.Context, p *member) {
	mode := *s.vouch.Load()
	if mode == vouchOff {
		return
	}
	hosted := p.hostedIDs()
	requesters := slices.Sorted(maps.Keys(hosted))
	if mode == vouchQuiet {
		var quiet []string
		for names := range slices.Chunk(requesters, api.MaxQuietRequesters) {
			start := time.Now()
			q, err := p.client.QuietRequesters(ctx, names)
			s.recorder().observe("quiet", time.Since(start), err)
			quiet = append(quiet, q...)
		}
		requesters = quiet
	}
	for _, requester := range requesters {
		for ids := range slices.Chunk(hosted[requester], renewBatch) {
			start := time.Now()
			_, err := p.client.RenewFor(ctx, requester, ids)
			s.recorder().observe("renew-for", time.Since(start), err)
		}
	}
}

// startMemberLoops runs each member's agent schedule: advertise every 30 s
// and renew every --renew-interval, the members' phases spread over the
// period, each in a loop of its own as rb-agent's publisher and renewer are
// (a slow renewal does not hold the next advertisement back). An
// advertisement the broker shed is sent again after its Retry-After, as
// agent/publisher does, if that comes before the next one.
func (s *sim) startMemberLoops(advCtx, renewCtx context.Context) *sync.WaitGroup {
	var wg sync.WaitGroup
	for i, m := range s.members {
		wg.Go(func() {
			first := phase(i, len(s.members), advertisePeriod)
			nextTick := time.Now().Add(first)
			adv := time.NewTimer(first)
			defer adv.Stop()
			for {
				select {
				case <-advCtx.Done():
					return
				case <-adv.C:
					if !time.Now().Before(nextTick) {
						nextTick = nextTick.Add(advertisePeriod)
					}
					err := s.advertise(advCtx, m, true)
					wait := time.Until(nextTick)
					if ra, ok := brokerclient.RetryAfter(err); ok && brokerclient.IsBusy(err) && ra < wait {
						wait = ra
					}
					adv.Reset(wait)
				}
			}
		})
		n := len(s.members)
		if slices.ContainsFunc(s.o.vouch, func(v string) bool { return v != vouchOff }) {
			wg.Go(func() {
				every(renewCtx, phase((i+n/3)%n, n, vouchPeriod), vouchPeriod, func() { s.vouchFor(renewCtx, m) })
			})
		}
		wg.Go(func() {
			every(renewCtx, phase((i+n/2)%n, n, s.o.renewInterval), s.o.renewInterval, func() { s.renew(renewCtx, m) })
		})
	}
	return &wg
}

// every calls f after first, and then period after each call returns,
// until ctx ends.
func every(ctx context.Context, first, period time.Duration, f func()) {
	select {
	case <-ctx.Done():
		return
	case <-time.After(first):
	}
	wait.UntilWithContext(ctx, func(context.Context) { f() }, period)
}

// reserve asks for one lease for m and, granted, holds it until its hold
// time (queued for release, when queue is set).
func (s *sim) reserve(ctx context.Context, m *member, queue bool) {
	s.reserveOn(ctx, m, queue, nil)
}

// reserveOn is reserve on provider (any provider when nil).
func (s *sim) reserveOn(ctx context.Context, m *member, queue bool, provider *member) {
	req := m.request(s.o.leaseLength, provider == nil || provider.hasGPUs())
	if provider != nil {
		req.Selector = provider.selector()
	}
	start := time.Now()
	r, err := m.client.Reserve(ctx, req)
	s.recorder().observe("reserve", time.Since(start), err)
	if err == nil && s.grants != nil {
		s.grant(ctx, m, r)
	}
	var ae *brokerclient.APIError
	switch {
	case err == nil:
		m.hold(req.ID, s.memberByID(r.Provider))
		s.live.Add(1)
		if queue {
			s.leases.push(time.Now().Add(s.holdTime()), m, req.ID)
		}
	case !errors.As(err, &ae) || ae.StatusCode >= 500:
		// Lost in transit, or a 5xx ("retry": the call is idempotent, and
		// its answer may have failed after the decision): the broker may
		// have granted it.
		m.markUncertain(req.ID)
	}
}

// release ends a lease as its pod ends; a failed release keeps it held (it
// is released at the end).
func (s *sim) release(ctx context.Context, m *member, id string) {
	provider, held := m.drop(id)
	if !held {
		return
	}
	s.live.Add(-1)
	start := time.Now()
	_, err := m.client.Release(ctx, id)
	s.recorder().observe("release", time.Since(start), err)
	var ae *brokerclient.APIError
	if err != nil {
		m.hold(id, provider)
		s.live.Add(1)
		if !errors.As(err, &ae) { // lost in transit: the broker may have released it
			m.mu.Lock()
			m.releasing[id] = struct{}{}
			m.mu.Unlock()
		}
	}
}

// holdTime is a lease's random hold: exponential, with the mean that keeps
// --leases live at --decisions-per-second (Little's law). Memoryless, so
// the leases filled at the start end at the same rate as later ones. With
// no decisions, the leases are held past the window: the steady state of
// advertisements and renewals alone.
func (s *sim) holdTime() time.Duration {
	s.rngMu.Lock()
	defer s.rngMu.Unlock()
	if s.rate == 0 {
		return 24 * time.Hour
	}
	mean := float64(s.o.leases) / s.rate
	return time.Duration(s.rng.ExpFloat64() * mean * float64(time.Second))
}

// fill reserves --leases leases, round-robin over the members so that each
// member's leases are renewed from its first; with --fill-pinned, lease i
// of the round is placed on the member half a round away, so that every
// provider holds as many leases as it requests.
func (s *sim) fill(ctx context.Context) {
	done := make(chan struct{})
	defer close(done)
	go func() { // progress: a fill of 100,000 takes minutes
		t := time.NewTicker(15 * time.Second)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				fmt.Fprintf(os.Stderr, "scale: %d of %d leases live; errors so far: %s\n", s.live.Load(), s.o.leases, s.recorder().errorsSoFar())
			}
		}
	}()
	var g errgroup.Group
	g.SetLimit(s.o.fillInFlight)
	for i := 0; i < s.o.leases && ctx.Err() == nil; i++ {
		n := len(s.members)
		m := s.members[i%n]
		var provider *member
		if s.o.fillPinned {
			// The requester's k-th lease goes to the k-th of its
			// --fill-spread providers, spread round the ring, never itself.
			k := i / n
			off := (n/2 + (k%s.o.fillSpread)*max(1, n/s.o.fillSpread)) % n
			if off == 0 {
				off = 1
			}
			provider = s.members[(i+off)%n]
		}
		g.Go(func() error { s.reserveOn(ctx, m, false, provider); return nil })
	}
	_ = g.Wait()
}

func gitCommit() string {
	out, err := exec.Command("git", "rev-parse", "--short", "HEAD").Output()
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(out))
}

func loadAverage() string {
	data, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return ""
	}
	return strings.Join(strings.Fields(string(data))[:3], " ")
}
