package main

import (
	"fmt"
	"maps"
	"slices"
	"sort"
	"strings"
	"text/tabwriter"
)

// activityOrder is the report's order of the activities.
var activityOrder = []string{"advertise", "heartbeat", "reserve", "renew", "quiet", "renew-for", "release", "list", "lost"}

// Report is what a run measured; Table prints it, --out writes it as JSON.
type Report struct {
	Command          string  `json:"command"`
	Commit           string  `json:"commit"`
	CPUs             int     `json:"cpus"`
	LoadAverageStart string  `json:"loadAverageStart"`
	LoadAverageEnd   string  `json:"loadAverageEnd"`
	Options          options `json:"-"`
	Config           Config  `json:"config"`
	// Nice is the priority each process ran at (--redis-nice, --broker-nice).
	Nice Niceness `json:"nice"`

	Fill    FillStats       `json:"fill"`
	Windows []Window        `json:"windows"` // one per --decisions-per-second rate, in order
	Memory  MemoryStats     `json:"memory"`
	End     []ActivityStats `json:"endActivities"`
	Checks  Checks          `json:"checks"`
}

// Window is one steady window's figures.
type Window struct {
	DecisionsPerSecond float64         `json:"decisionsPerSecond"`
	Vouch              string          `json:"vouch"` // the providers' renewals (--vouch)
	LoadAverageStart   string          `json:"loadAverageStart"`
	LoadAverageEnd     string          `json:"loadAverageEnd"`
	Seconds            float64         `json:"seconds"`
	Activities         []ActivityStats `json:"activities"`
	LiveAtEnd          int64           `json:"liveLeasesAtEnd"`
	// ParkedAtEnd are the live leases parked under their requester's
	// renewal set at the window's end (score +inf in expiry), and SetEnds
	// the sets standing for them (broker/scripts/expire.lua).
	ParkedAtEnd int64 `json:"parkedLeasesAtEnd"`
	SetEnds     int64 `json:"setEndsAtEnd"`
	// StaleAtEnd are the members whose last stored advertisement was older
	// than the broker's stale threshold at the window's end: not candidates.
	StaleAtEnd int           `json:"staleClustersAtEnd"`
	RenewedIDs int64         `json:"renewedIds"`
	Redis      RedisStats    `json:"redis"`
	Brokers    []BrokerStats `json:"brokers"`
	// Answered is how long the replicas took to answer, by route, from
	// their own histograms: the calls' latency less the client's side, the
	// network and the time before a replica reads the request.
	Answered []AnsweredStats `json:"answered,omitempty"`
	// SimulatorCPUShare is this process's CPU: the members' clients (and
	// the idle in-process broker of brokertest).
	SimulatorCPUShare float64 `json:"simulatorCpuShare"`
	MemoryAtEnd       int64   `json:"memoryAtEnd"` // Redis used_memory
}

// Config is the run's size.
type Config struct {
	Clusters             int       `json:"clusters"`
	NodesPerCluster      int       `json:"nodesPerCluster"`
	Leases               int       `json:"leases"`
	DecisionsPerSecond   []float64 `json:"decisionsPerSecond"`
	DurationSeconds      float64   `json:"durationSeconds"`
	SettleSeconds        float64   `json:"settleSeconds"`
	LeaseSeconds         float64   `json:"leaseSeconds"`
	RenewIntervalSeconds float64   `json:"renewIntervalSeconds"`
	Replicas             int       `json:"replicas"`
	Heartbeats           bool      `json:"heartbeats"`
	AdvertMoves          float64   `json:"advertMoves"`
}

// FillStats is the bulk fill before the window.
type FillStats struct {
	Leases     int64           `json:"leases"`
	Seconds    float64         `json:"seconds"`
	PerSecond  float64         `json:"perSecond"`
	Activities []ActivityStats `json:"activities"`
}

// RedisStats are Redis' figures over the window.
type RedisStats struct {
	CPUShare          float64        `json:"cpuShare"` // of one core
	Scripts           []ScriptStats  `json:"scripts,omitempty"`
	SlowlogOverflowed bool           `json:"slowlogOverflowed,omitempty"`
	Commands          []CommandStats `json:"commandstats"`
	// Stalls are what Redis' latency monitor recorded (--latency-monitor-ms).
	Stalls []StallStats `json:"stalls,omitempty"`
	// Methods are the window's last decisions (the audit stream's) by how
	// their candidates were found.
	Methods []MethodStats `json:"methods,omitempty"`
}

// MemoryStats is Redis' used_memory at each step.
type MemoryStats struct {
	Empty, Advertised, Filled int64
	BytesPerCluster           float64 `json:"bytesPerCluster"`
	BytesPerLease             float64 `json:"bytesPerLease"`
	// PerLease splits BytesPerLease by key kind (what the fill added).
	PerLease []LeaseMemory `json:"perLease,omitempty"`
}

// BrokerStats is one rb-broker replica's CPU over the window, and how its
// decisions were made: from its view of the index (hinted), or walking the
// index in Redis (walked: the view could not stand for the walk).
type BrokerStats struct {
	Replica  int     `json:"replica"`
	Pid      int     `json:"pid"`
	CPUShare float64 `json:"cpuShare"`
	Hinted   int64   `json:"hinted"`
	Walked   int64   `json:"walked"`
}

// AnsweredStats are one route's answers over a window, summed over the
// replicas (rb_broker_http_request_duration_seconds; "decide":
// rb_broker_decision_duration_seconds, a decision's wait for its batch and
// its reserve.lua round trip), with quantiles interpolated in its buckets.
type AnsweredStats struct {
	Route string  `json:"route"`
	Calls int64   `json:"calls"`
	P50Ms float64 `json:"p50Ms"`
	P99Ms float64 `json:"p99Ms"`
}

// answeredStats lists the routes called over the window, the most called first.
func answeredStats(hs map[string]histogram) []AnsweredStats {
	var out []AnsweredStats
	for route, h := range hs {
		if n := h.count(); n > 0 {
			out = append(out, AnsweredStats{Route: route, Calls: int64(n), P50Ms: 1000 * h.quantile(0.5), P99Ms: 1000 * h.quantile(0.99)})
		}
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Calls != out[j].Calls {
			return out[i].Calls > out[j].Calls
		}
		return out[i].Route < out[j].Route
	})
	return out
}

// Checks are the end of the run's findings.
type Checks struct {
	Held int `json:"listedLeases"`
	Lost int `json:"lost"` // held by a member, not listed by the broker
	// ReleasedUnanswered were released by calls whose answer was lost
	// (a client timeout): the broker ended them, the member did not know.
	ReleasedUnanswered int    `json:"releasedUnanswered"`
	Unexpected         int    `json:"unexpected"`  // listed, never granted to the member
	ListedTwice        int    `json:"listedTwice"` // one id listed twice
	ListErrors         int    `json:"listErrors"`
	InvariantLive      string `json:"invariantWithLeases,omitempty"`
	InvariantReleased  string `json:"invariantAfterRelease,omitempty"`
	LiveAfterRelease   int64  `json:"liveAfterRelease"`
	NotReleased        bool   `json:"notReleased,omitempty"` // --release-at-end=false: the last two were not checked
}

// OK says whether nothing was lost, doubled or left and the invariant held.
func (c Checks) OK() bool {
	return c.Lost == 0 && c.Unexpected == 0 && c.ListedTwice == 0 && c.ListErrors == 0 &&
		c.InvariantLive == "" && c.InvariantReleased == "" && c.LiveAfterRelease == 0
}

// Table is the report as text.
func (r *Report) Table() string {
	var b strings.Builder
	o := r.Options
	fmt.Fprintf(&b, "\n%d clusters x %d nodes, %d leases (%s, renewed every %s), %d replicas; commit %s, %d CPUs, load %s -> %s\n",
		o.clusters, o.nodesPerCluster, o.leases, o.leaseLength, o.renewInterval, o.replicas, r.Commit, r.CPUs, r.LoadAverageStart, r.LoadAverageEnd)
	fmt.Fprintf(&b, "nice: redis-server %d, the replicas %d, the simulator %d\n", r.Nice.Redis, r.Nice.Replicas, r.Nice.Simulator)
	fmt.Fprintf(&b, "fill: %d leases in %.1f s (%.0f/s)\n", r.Fill.Leases, r.Fill.Seconds, r.Fill.PerSecond)
	m := r.Memory
	fmt.Fprintf(&b, "Redis used_memory: empty %s, advertised %s (%.0f B per cluster), filled %s (%.0f B per lease)\n",
		mib(m.Empty), mib(m.Advertised), m.BytesPerCluster, mib(m.Filled), m.BytesPerLease)
	if len(m.PerLease) > 0 {
		b.WriteString("\nWhat the fill added, by key kind (MEMORY USAGE after the fill less before it; (client buffers): INFO mem_clients_normal; (other): used_memory less both):\n")
		tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintln(tw, "kind\tkeys\tbytes added\tB per lease\tencodings\t")
		for _, k := range m.PerLease {
			fmt.Fprintf(tw, "%s\t%d\t%d\t%.0f\t%s\t\n", k.Kind, k.Keys, k.BytesAdded, k.BytesPerLease, encodings(k.Encodings))
		}
		tw.Flush()
	}
	for _, w := range r.Windows {
		w.write(&b)
	}
	c := r.Checks
	if c.NotReleased {
		fmt.Fprintf(&b, "\nchecks: %d leases listed, %d lost, %d released by calls whose answer was lost, %d unexpected, %d listed twice, %d list errors, invariant with leases: %s (not released: --release-at-end=false)\n",
			c.Held, c.Lost, c.ReleasedUnanswered, c.Unexpected, c.ListedTwice, c.ListErrors, orOK(c.InvariantLive))
		return b.String()
	}
	fmt.Fprintf(&b, "\nchecks: %d leases listed, %d lost, %d released by calls whose answer was lost, %d unexpected, %d listed twice, %d list errors, invariant with leases: %s, after release: %s, live after release %d\n",
		c.Held, c.Lost, c.ReleasedUnanswered, c.Unexpected, c.ListedTwice, c.ListErrors, orOK(c.InvariantLive), orOK(c.InvariantReleased), c.LiveAfterRelease)
	return b.String()
}

func writeActivities(b *strings.Builder, acts []ActivityStats) {
	tw := tabwriter.NewWriter(b, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "activity\tcalls\tper s\tp50 ms\tp99 ms\tmax ms\tok\tok p50 ms\tok p99 ms\terrors")
	for _, a := range acts {
		kinds := make([]string, 0, len(a.Errors))
		for k, n := range a.Errors {
			kinds = append(kinds, fmt.Sprintf("%s: %d", k, n))
		}
		sort.Strings(kinds)
		fmt.Fprintf(tw, "%s\t%d\t%.1f\t%.2f\t%.2f\t%.2f\t%d\t%.2f\t%.2f\t%s\n", a.Name, a.Count, a.PerSec, a.P50Ms, a.P99Ms, a.MaxMs, a.OK, a.OKP50Ms, a.OKP99Ms, strings.Join(kinds, ", "))
	}
	tw.Flush()
}

// encodings lists how many keys have each encoding: "listpack 20000, hashtable 3".
func encodings(m map[string]int) string {
	parts := make([]string, 0, len(m))
	for _, e := range slices.Sorted(maps.Keys(m)) {
		parts = append(parts, fmt.Sprintf("%s %d", e, m[e]))
	}
	return strings.Join(parts, ", ")
}

func mib(n int64) string { return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20)) }

func orOK(s string) string {
	if s == "" {
		return "ok"
	}
	return s
}

// write prints the window's figures.
func (w Window) write(b *strings.Builder) {
	fmt.Fprintf(b, "\nsteady window at %g decisions/s offered, providers' renewals %s: %.1f s (load %s -> %s), %d live leases at its end (%d parked under %d renewal sets), %d lease renewals (ids), %d clusters stale at its end (last advertisement stored over %s before)\n\n",
		w.DecisionsPerSecond, w.Vouch, w.Seconds, w.LoadAverageStart, w.LoadAverageEnd, w.LiveAtEnd, w.ParkedAtEnd, w.SetEnds, w.RenewedIDs, w.StaleAtEnd, staleThreshold)
	writeActivities(b, w.Activities)
	fmt.Fprintf(b, "\nCPU over the window (share of one core): redis-server %.2f", w.Redis.CPUShare)
	for _, br := range w.Brokers {
		fmt.Fprintf(b, ", rb-broker %d %.2f", br.Replica, br.CPUShare)
	}
	fmt.Fprintf(b, ", simulator %.2f; Redis used_memory at its end %s\n", w.SimulatorCPUShare, mib(w.MemoryAtEnd))
	var hinted, walked int64
	for _, br := range w.Brokers {
		hinted, walked = hinted+br.Hinted, walked+br.Walked
	}
	if hinted+walked > 0 {
		fmt.Fprintf(b, "Decisions from the replicas' views: %d hinted, %d walked the index (%.1f %%)\n",
			hinted, walked, 100*float64(walked)/float64(hinted+walked))
	}
	if len(w.Answered) > 0 {
		b.WriteString("\nAnswered inside the replicas (their duration histograms, summed; quantiles interpolated in buckets doubling in size):\n")
		tw := tabwriter.NewWriter(b, 0, 0, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintln(tw, "route\tcalls\tp50 ms\tp99 ms\t")
		for _, a := range w.Answered {
			fmt.Fprintf(tw, "%s\t%d\t%.2f\t%.2f\t\n", a.Route, a.Calls, a.P50Ms, a.P99Ms)
		}
		tw.Flush()
	}
	if len(w.Redis.Scripts) > 0 {
		b.WriteString("\nRedis' own time by script or command over the window (SLOWLOG; wall time inside Redis; est. CPU = share x Redis CPU):\n")
		tw := tabwriter.NewWriter(b, 0, 0, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintln(tw, "script\tcalls\tµs per call\tp99 µs\tmax µs\tseconds\tin calls ≥ 2 ms\tshare\test. CPU, core\t")
		for i, s := range w.Redis.Scripts {
			if i == 10 {
				break
			}
			fmt.Fprintf(tw, "%s\t%d\t%.0f\t%d\t%d\t%.2f\t%.2f\t%.0f %%\t%.3f\t\n", s.Script, s.Calls, s.UsecPerCall, s.P99Usec, s.MaxUsec,
				float64(s.Usec)/1e6, float64(s.LongUsec)/1e6, 100*s.Share, s.Share*w.Redis.CPUShare)
		}
		tw.Flush()
	}
	if len(w.Redis.Methods) > 0 {
		b.WriteString("\nThe last decisions of the window by method (the audit stream's newest entries):")
		for _, m := range w.Redis.Methods {
			fmt.Fprintf(b, " %s %d (%.1f clusters examined each);", m.Method, m.Decisions, float64(m.Examined)/float64(max(m.Decisions, 1)))
		}
		b.WriteString("\n")
	}
	if len(w.Redis.Stalls) > 0 {
		b.WriteString("\nRedis' latency monitor (each second's longest event over the threshold, by kind):\n")
		tw := tabwriter.NewWriter(b, 0, 0, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintln(tw, "event\tseconds with one\tmax ms\tsum of each second's longest, ms\t")
		for _, st := range w.Redis.Stalls {
			fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t\n", st.Event, st.Seconds, st.MaxMs, st.SumMs)
		}
		tw.Flush()
	}
}
