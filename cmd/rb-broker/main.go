// Command rb-broker is the central Resource Broker: a stateless HTTP server
// over mutual TLS, with all state in Redis.
package main

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"os/signal"
	"runtime/debug"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"
	"github.com/spf13/cobra"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/component-base/logs"
	logsapi "k8s.io/component-base/logs/api/v1"
	_ "k8s.io/component-base/logs/json/register" // --logging-format=json
	"k8s.io/klog/v2"

	"github.com/fluidos-project/resource-broker/broker/api"
	"github.com/fluidos-project/resource-broker/broker/dashboard"
	"github.com/fluidos-project/resource-broker/broker/policy"
	"github.com/fluidos-project/resource-broker/broker/server"
	"github.com/fluidos-project/resource-broker/broker/store"
	"github.com/fluidos-project/resource-broker/internal/backoff"
	"github.com/fluidos-project/resource-broker/internal/version"
)

type options struct {
	listenAddress   string
	healthAddress   string
	certDir         string
	certCheck       time.Duration
	redisURL        string
	redisUsername   string
	redisPassFile   string
	sentinelMaster  string
	sentinelAddrs   []string
	clusterAddrs    []string
	cells           []string
	cellLabel       string
	redisPoolSize   int
	waitReplicas    int
	waitTimeout     time.Duration
	weightResources float64
	weightCost      float64
	staleThreshold  time.Duration
	defaultDuration time.Duration
	maxDuration     time.Duration
	expiryInterval  time.Duration
	outageGap       time.Duration
	waitTTL         time.Duration
	maxOwnerShare   float64
	reserveBatch    int
	reserveInFlight int
	decideFromView  bool
	gcPercent       int
	pprofAddress    string
	policyFile      string
	grantKeyFile    string
	retention       time.Duration
	maxEnded        int
	auditRetention  time.Duration
	maxStreams      int
	maxLists        int
	shutdownDelay   time.Duration
	shutdownTimeout time.Duration
	operators       []string
	logging         *logsapi.LoggingConfiguration
}

func main() {
	if err := newCommand().Execute(); err != nil {
		fmt.Fprintln(os.Stderr, "rb-broker:", err)
		os.Exit(1)
	}
}

func newCommand() *cobra.Command {
	o := options{logging: logsapi.NewLoggingConfiguration()}
	cmd := &cobra.Command{
		Use:           "rb-broker",
		Short:         "The central Resource Broker: scores clusters and locks capacity in Redis, serves the API over mutual TLS",
		SilenceUsage:  true,
		SilenceErrors: true,
		Args:          cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := logsapi.ValidateAndApply(o.logging, nil); err != nil {
				return err
			}
			defer logs.FlushLogs()
			if !cmd.Flags().Changed("redis-wait-replicas") && o.sentinelMaster != "" {
				o.waitReplicas = 1
			}
			if err := o.validate(); err != nil {
				return err
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			return run(ctx, o)
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.listenAddress, "listen-address", ":8443", "address of the mutual-TLS API")
	f.StringVar(&o.healthAddress, "health-address", ":8081", "address of plain-HTTP /healthz, /readyz and /metrics (empty: off)")
	f.StringVar(&o.certDir, "cert-dir", "/etc/rb-broker/tls", "directory with tls.crt, tls.key and ca.crt (the CAs that sign client certificates), "+
		"as a cert-manager Secret mounts it; read again when it changes, no restart needed")
	f.DurationVar(&o.certCheck, "cert-check-interval", server.DefaultCertCheckInterval, "how often, at most, --cert-dir is checked for rotated files "+
		"(on the next connection or request)")
	f.StringVar(&o.redisURL, "redis-url", "redis://127.0.0.1:6379/0", "Redis URL (redis:// or rediss://), without a password: see --redis-password-file")
	f.StringVar(&o.redisUsername, "redis-username", "", "Redis ACL user (manifests/redis: rb-broker); default: the user of --redis-url, else Redis' default user")
	f.StringVar(&o.redisPassFile, "redis-password-file", "", "file holding the Redis password (trailing newlines ignored), read again for every new Redis connection, "+
		"so a rotated Secret is picked up without a restart; without it, the environment variable REDIS_PASSWORD, if set")
	f.StringVar(&o.sentinelMaster, "redis-sentinel-master", "", "Sentinel master name; with --redis-sentinel-addrs, used instead of --redis-url's host")
	f.StringSliceVar(&o.sentinelAddrs, "redis-sentinel-addrs", nil, "Sentinel addresses host:port, comma-separated")
	f.StringSliceVar(&o.clusterAddrs, "redis-cluster-addrs", nil, "Redis Cluster primaries host:port, comma-separated (a few are enough: the client "+
		"learns the others); used instead of --redis-url's host, whose user and scheme (rediss: TLS) still apply; not with --redis-sentinel-master")
	f.StringSliceVar(&o.cells, "cells", []string{store.DefaultCell}, "the cells the federation is split into, comma-separated: each cell's state has "+
		"keys of its own (rb:{<cell>}:), on the primary of its slot with --redis-cluster-addrs; each member is in the cell its --cell-label names "+
		"(docs/redis.md, \"Cells\"). Default: one cell, "+store.DefaultCell+", the unsplit broker's keys")
	f.StringVar(&o.cellLabel, "cell-label", "", "the cluster label whose value names a member's cell (e.g. region); a member without it, "+
		"or whose value names no cell, is in the first of --cells. Empty: every member is in the first cell")
	f.IntVar(&o.waitReplicas, "redis-wait-replicas", 0, "how many Redis replicas must hold a decision (reserve, release, grant, renew, advertise, ...) "+
		"before the broker answers it (WAIT; else 503 with Retry-After), so that a failover loses no answered decision "+
		"(with --redis-cluster-addrs: the replicas of the primary of the decision's cell); "+
		"default 1 with --redis-sentinel-master, 0 (no wait) with --redis-url and --redis-cluster-addrs")
	f.DurationVar(&o.waitTimeout, "redis-wait-timeout", store.DefaultReplicaTimeout, "how long a decision waits for --redis-wait-replicas replicas "+
		"(less than the Redis read timeout, 3s)")
	f.IntVar(&o.redisPoolSize, "redis-pool-size", 256, "Redis connections per replica (the event streams of a replica share one)")
	f.IntVar(&o.maxStreams, "max-streams-per-cluster", server.DefaultMaxStreamsPerCluster, "event streams one cluster may hold open on a replica; "+
		"one more is answered 429 with Retry-After (an agent holds one)")
	f.IntVar(&o.maxLists, "max-lists-per-cluster", server.DefaultMaxListsPerCluster, "list requests (pages of reservations, clusters, usage) one cluster may have "+
		"in progress on a replica; one more waits up to 1s for a turn, then is answered 429 with Retry-After (an agent lists one page at a time)")
	f.DurationVar(&o.shutdownDelay, "shutdown-delay", 5*time.Second, "on SIGTERM, how long the replica keeps serving while /readyz fails, "+
		"so that Services and load balancers stop sending it new clients; then its event streams end with a reconnection hint")
	f.DurationVar(&o.shutdownTimeout, "shutdown-timeout", 15*time.Second, "after --shutdown-delay, how long requests in flight may take to finish; "+
		"keep --shutdown-delay plus this under the pod's terminationGracePeriodSeconds (30s)")
	f.StringSliceVar(&o.operators, "dashboard-operators", nil, "common names of the operators' client certificates that may read the web dashboard "+
		"(/dashboard/ on --listen-address; read-only); these names are refused on the members' API. Empty: no dashboard")
	f.Float64Var(&o.weightResources, "weight-resources", 0.7, "weight of the resource-availability score (weights sum to 1)")
	f.Float64Var(&o.weightCost, "weight-cost", 0.3, "weight of the cost score (weights sum to 1)")
	f.DurationVar(&o.staleThreshold, "stale-threshold", time.Minute, "a cluster not advertised for this long (Redis clock) is not a candidate")
	f.DurationVar(&o.defaultDuration, "default-duration", time.Hour, "duration of a reservation that names none")
	f.DurationVar(&o.maxDuration, "max-duration", 24*time.Hour, "longest duration a reservation may ask for")
	f.Float64Var(&o.maxOwnerShare, "max-owner-share", 0, "spread policy: a provider should hold at most this share (0 to 1) of one spread group's replicas, at least one (a preference; 0: no policy). Requests that name a spread group are then decided by the spread rules")
	f.DurationVar(&o.waitTTL, "wait-ttl", store.DefaultWaitTTL, "how long a request nothing fits keeps its place on the priority-ordered waiting list without a retry of it (must exceed the agents' waiting retry, 2s)")
	f.IntVar(&o.reserveBatch, "reserve-batch", 64, "most reservation requests decided in one Redis script call (those that queued while earlier calls were in flight; 1: one call each), and most releases ended in one")
	f.IntVar(&o.reserveInFlight, "reserve-in-flight", 2, "Redis script calls deciding reservations that one replica keeps in flight at once, and calls ending releases")
	f.BoolVar(&o.decideFromView, "decide-from-view", true, "keep a view of the candidate index in this replica's memory, caught up before each decision call, and propose each decision's candidates from it: Redis judges a few clusters instead of walking the index (docs/architecture.md, \"Decisions from the replicas' views\"); false: every decision walks the index in Redis")
	f.DurationVar(&o.expiryInterval, "expiry-interval", time.Second, "how often this replica releases expired reservations, sweeps the waiting list and trims the audit stream")
	f.DurationVar(&o.outageGap, "outage-gap", store.DefaultOutageGap, "no expiry run of any replica for this long (Redis clock) is a broker outage: its time does not count against leases; must exceed --expiry-interval")
	f.DurationVar(&o.retention, "retention", store.DefaultRetention, "how long an ended reservation stays readable (its requester's agent reads how it ended), then it is removed")
	f.IntVar(&o.maxEnded, "max-ended-per-member", store.DefaultMaxEndedPerMember, "ended reservations of one member (as requester) kept readable for --retention; "+
		"beyond it its oldest are removed before their retention, so that no member's ended reservations fill Redis for all (about 1.3 KB each)")
	f.DurationVar(&o.auditRetention, "audit-retention", store.DefaultAuditRetention, "how long a decision stays in the audit stream (which also keeps only its newest 10,000)")
	f.StringVar(&o.policyFile, "policy-file", "", "the operator's fair-share policy (YAML, kind BrokerPolicy: limits per requester, bounds on what a provider may advertise; "+
		"docs/security.md); read at start, a mistake refuses to start. Without it: 100 reserve calls per second per requester (a burst of 200), "+
		"priorities above 1000000000 clamped, no quota, no bounds")
	f.StringVar(&o.grantKeyFile, "grant-key-file", "", "required: the keys that seal the providers' grants in Redis (AES-256-GCM), one per line, "+
		"base64 of 32 random bytes (openssl rand -base64 32), the first seals, all open; every replica must have the same file")
	f.StringVar(&o.pprofAddress, "pprof-bind-address", "", "address of Go's /debug/pprof endpoints in plain HTTP, e.g. 127.0.0.1:6060 (empty: off; keep it on loopback)")
	f.IntVar(&o.gcPercent, "gc-percent", defaultGCPercent, "Go garbage collection target, as GOGC (the GOGC environment variable, when set, wins); "+
		"a soft memory limit of 90% of the container's memory limit (cgroup v2 memory.max) applies unless GOMEMLIMIT is set")
	// Kubernetes components' logging flags (--logging-format, -v, --vmodule),
	// without klog's legacy ones.
	logsapi.AddFlags(o.logging, f)
	version.AddFlag(cmd)
	return cmd
}

func (o options) validate() error {
	var errs []error
	if o.weightResources < 0 || o.weightCost < 0 || math.Abs(o.weightResources+o.weightCost-1) > 1e-9 {
		errs = append(errs, fmt.Errorf("--weight-resources (%g) and --weight-cost (%g) must be non-negative and sum to 1", o.weightResources, o.weightCost))
	}
	for _, op := range o.operators {
		if strings.TrimSpace(op) == "" || strings.TrimSpace(op) != op {
			errs = append(errs, fmt.Errorf("--dashboard-operators: %q is not a certificate common name (empty or with spaces around it)", op))
		}
	}
	for name, d := range map[string]time.Duration{"--stale-threshold": o.staleThreshold, "--cert-check-interval": o.certCheck, "--default-duration": o.defaultDuration,
		"--max-duration": o.maxDuration, "--expiry-interval": o.expiryInterval, "--wait-ttl": o.waitTTL, "--outage-gap": o.outageGap} {
		if d <= 0 {
			errs = append(errs, fmt.Errorf("%s must be positive, got %s", name, d))
		}
	}
	if o.maxOwnerShare < 0 || o.maxOwnerShare > 1 {
		errs = append(errs, fmt.Errorf("--max-owner-share must be between 0 and 1, got %g", o.maxOwnerShare))
	}
	if o.outageGap <= o.expiryInterval {
		errs = append(errs, fmt.Errorf("--outage-gap (%s) must exceed --expiry-interval (%s): every gap between two runs would count as an outage", o.outageGap, o.expiryInterval))
	}
	if o.defaultDuration > o.maxDuration {
		errs = append(errs, fmt.Errorf("--default-duration (%s) exceeds --max-duration (%s)", o.defaultDuration, o.maxDuration))
	}
	if (o.sentinelMaster == "") != (len(o.sentinelAddrs) == 0) {
		errs = append(errs, errors.New("--redis-sentinel-master and --redis-sentinel-addrs go together"))
	}
	errs = append(errs, o.validateCluster()...)
	if u, err := parseRedisURL(o.redisURL); err != nil {
		errs = append(errs, err)
	} else if u.Password != "" {
		// It would show in the process list, /debug/pprof/cmdline and the pod spec.
		errs = append(errs, fmt.Errorf("--redis-url %s carries a password: give it in --redis-password-file or REDIS_PASSWORD instead", redactURL(o.redisURL)))
	}
	if o.redisPassFile != "" {
		if os.Getenv(redisPasswordEnv) != "" {
			errs = append(errs, errors.New("--redis-password-file and "+redisPasswordEnv+" are both set: give the password once"))
		}
		if _, err := readPassword(o.redisPassFile); err != nil {
			errs = append(errs, err)
		}
	}
	if o.reserveBatch < 1 || o.reserveInFlight < 1 {
		errs = append(errs, fmt.Errorf("--reserve-batch (%d) and --reserve-in-flight (%d) must be at least 1", o.reserveBatch, o.reserveInFlight))
	}
	if o.gcPercent < -1 {
		errs = append(errs, errors.New("--gc-percent must be -1 (off) or more"))
	}
	if o.waitReplicas < 0 {
		errs = append(errs, fmt.Errorf("--redis-wait-replicas must not be negative, got %d", o.waitReplicas))
	}
	if o.waitTimeout <= 0 || o.waitTimeout >= redisReadTimeout {
		errs = append(errs, fmt.Errorf("--redis-wait-timeout must be positive and less than the Redis read timeout (%s), got %s", redisReadTimeout, o.waitTimeout))
	}
	if o.redisPoolSize < 1 {
		errs = append(errs, errors.New("--redis-pool-size must be at least 1"))
	}
	if o.maxStreams < 1 {
		errs = append(errs, fmt.Errorf("--max-streams-per-cluster must be at least 1, got %d", o.maxStreams))
	}
	if o.maxLists < 1 {
		errs = append(errs, fmt.Errorf("--max-lists-per-cluster must be at least 1, got %d", o.maxLists))
	}
	if o.shutdownDelay < 0 || o.shutdownTimeout <= 0 {
		errs = append(errs, fmt.Errorf("--shutdown-delay (%s) must not be negative and --shutdown-timeout (%s) must be positive", o.shutdownDelay, o.shutdownTimeout))
	}
	if o.maxEnded < 1 {
		errs = append(errs, fmt.Errorf("--max-ended-per-member must be at least 1, got %d", o.maxEnded))
	}
	for name, d := range map[string]time.Duration{"--retention": o.retention, "--audit-retention": o.auditRetention} {
		if d <= 0 {
			errs = append(errs, fmt.Errorf("%s must be positive, got %s", name, d))
		}
	}
	if o.policyFile != "" {
		if _, err := policy.Load(o.policyFile); err != nil {
			errs = append(errs, fmt.Errorf("--policy-file: %w", err))
		}
	}
	if o.grantKeyFile == "" {
		errs = append(errs, errors.New("--grant-key-file is required: the providers' grants are sealed in Redis with its keys "+
			"(openssl rand -base64 32 > grant.key; every replica needs the same file)"))
	} else if _, err := readGrantKeys(o.grantKeyFile); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// validateCluster checks --redis-cluster-addrs, --cells and --cell-label.
func (o options) validateCluster() []error {
	var errs []error
	if len(o.clusterAddrs) > 0 {
		if o.sentinelMaster != "" {
			errs = append(errs, errors.New("--redis-cluster-addrs and --redis-sentinel-master exclude each other: a Redis Cluster fails over by itself"))
		}
		for _, a := range o.clusterAddrs {
			if _, port, err := net.SplitHostPort(a); err != nil || port == "" {
				errs = append(errs, fmt.Errorf("--redis-cluster-addrs: %q is not host:port", a))
			}
		}
		if u, err := parseRedisURL(o.redisURL); err == nil && u.DB != 0 {
			errs = append(errs, fmt.Errorf("--redis-url names database %d: a Redis Cluster has database 0 only", u.DB))
		}
	}
	if _, err := store.NewCells(nil, store.Config{}, o.cells, o.cellRule()); err != nil {
		errs = append(errs, fmt.Errorf("--cells: %w", err))
	}
	if o.cellLabel != "" {
		if msgs := validation.IsQualifiedName(o.cellLabel); len(msgs) > 0 {
			errs = append(errs, fmt.Errorf("--cell-label %q: %s", o.cellLabel, strings.Join(msgs, "; ")))
		}
	}
	return errs
}

// cellRule places a member in its cell: by --cell-label, else the first cell.
func (o options) cellRule() store.CellRule {
	rule := store.CellRule{Label: o.cellLabel}
	if len(o.cells) > 0 {
		rule.Default = o.cells[0]
	}
	return rule
}

// readGrantKeys reads --grant-key-file; its errors never show a key.
func readGrantKeys(file string) (*store.GrantKeys, error) {
	keys, err := store.LoadGrantKeys(file)
	if err != nil {
		return nil, fmt.Errorf("--grant-key-file: %w", err)
	}
	return keys, nil
}

// loadPolicy reads --policy-file, or returns the default policy.
func (o options) loadPolicy() (*policy.Policy, error) {
	if o.policyFile == "" {
		return policy.Default(), nil
	}
	p, err := policy.Load(o.policyFile)
	if err != nil {
		return nil, fmt.Errorf("--policy-file: %w", err)
	}
	return p, nil
}

// redisReadTimeout is go-redis' default read timeout, which a WAIT must beat.
const redisReadTimeout = 3 * time.Second

// redisPasswordEnv holds the Redis password when --redis-password-file is not given.
const redisPasswordEnv = "REDIS_PASSWORD"

func (o options) redisClient() (redis.UniversalClient, error) {
	u, err := parseRedisURL(o.redisURL)
	if err != nil {
		return nil, err
	}
	if o.redisUsername != "" {
		u.Username = o.redisUsername
	}
	u.Password = os.Getenv(redisPasswordEnv)
	// With a password file, every new connection reads it: a rotated Secret
	// (the kubelet swaps the mounted file) is used without a restart.
	var credentials func(context.Context) (string, string, error)
	if o.redisPassFile != "" {
		user, file := u.Username, o.redisPassFile
		credentials = func(context.Context) (string, string, error) {
			pw, err := readPassword(file)
			return user, pw, err
		}
	}
	// The ACL of manifests/redis allows the broker's commands only: no CLIENT
	// SETINFO (DisableIdentity), no CLIENT MAINT_NOTIFICATIONS.
	if len(o.clusterAddrs) > 0 {
		return redis.NewClusterClient(&redis.ClusterOptions{
			Addrs: o.clusterAddrs, CredentialsProviderContext: credentials,
			Username: u.Username, Password: u.Password, TLSConfig: u.TLSConfig, PoolSize: o.redisPoolSize, MaxRetries: 1,
			DisableIdentity: true, MaintNotificationsConfig: &maintnotifications.Config{Mode: maintnotifications.ModeDisabled},
		}), nil
	}
	if o.sentinelMaster != "" {
		return redis.NewFailoverClient(&redis.FailoverOptions{
			MasterName: o.sentinelMaster, SentinelAddrs: o.sentinelAddrs, CredentialsProviderContext: credentials,
			Username: u.Username, Password: u.Password, DB: u.DB, TLSConfig: u.TLSConfig, PoolSize: o.redisPoolSize, MaxRetries: 1,
			DisableIdentity: true,
		}), nil
	}
	u.PoolSize = o.redisPoolSize
	u.MaxRetries = 1 // fail fast while Redis is down: callers retry, and /readyz must answer quickly
	u.CredentialsProviderContext = credentials
	u.DisableIdentity = true
	u.MaintNotificationsConfig = &maintnotifications.Config{Mode: maintnotifications.ModeDisabled}
	return redis.NewClient(u), nil
}

// parseRedisURL parses --redis-url; its errors never repeat the password
// (url.Parse's errors quote the whole URL).
func parseRedisURL(raw string) (*redis.Options, error) {
	u, err := redis.ParseURL(raw)
	if err != nil {
		msg := err.Error()
		if r := redactURL(raw); r != raw {
			msg = strings.ReplaceAll(msg, raw, r)
			if pw := urlPassword(raw); pw != "" {
				msg = strings.ReplaceAll(msg, pw, "xxxxx")
			}
		}
		return nil, fmt.Errorf("--redis-url: %s", msg)
	}
	return u, nil
}

// redactURL returns raw with the password of its user information, if any,
// replaced by xxxxx.
func redactURL(raw string) string {
	if pw := urlPassword(raw); pw != "" {
		return strings.Replace(raw, ":"+pw+"@", ":xxxxx@", 1)
	}
	return raw
}

// urlPassword returns the password in raw's user information, found
// without url.Parse (which refuses some URLs that still hold one).
func urlPassword(raw string) string {
	_, rest, ok := strings.Cut(raw, "://")
	if !ok {
		return ""
	}
	at := strings.LastIndex(rest, "@")
	if at < 0 {
		return ""
	}
	if slash := strings.IndexAny(rest, "/?#"); slash >= 0 && slash < at {
		return ""
	}
	_, pw, ok := strings.Cut(rest[:at], ":")
	if !ok {
		return ""
	}
	return pw
}

// readPassword reads a password file: its contents without trailing newlines
// (as the init container of manifests/redis hashes it), never empty. Its
// errors name the file, never the contents.
func readPassword(file string) (string, error) {
	data, err := os.ReadFile(file)
	if err != nil {
		return "", fmt.Errorf("--redis-password-file: %w", err)
	}
	pw := strings.TrimRight(string(data), "\n")
	if pw == "" {
		return "", fmt.Errorf("--redis-password-file %s is empty", file)
	}
	return pw, nil
}

// redisUser is the Redis user the broker connects as ("" for Redis' default user).
func (o options) redisUser() string {
	if o.redisUsername != "" {
		return o.redisUsername
	}
	if u, err := parseRedisURL(o.redisURL); err == nil {
		return u.Username
	}
	return ""
}

// policySource says where the fair-share policy comes from, for the log.
func policySource(file string) string {
	if file == "" {
		return "default (no --policy-file: no quota, no bounds)"
	}
	return "file " + file
}

// redisPasswordSource says where the password comes from, for the log.
func (o options) redisPasswordSource() string {
	switch {
	case o.redisPassFile != "":
		return "file " + o.redisPassFile
	case os.Getenv(redisPasswordEnv) != "":
		return "environment " + redisPasswordEnv
	}
	return "none"
}

// defaultGCPercent is the broker's GOGC. Its live heap is small (a few MB)
// and every request allocates about 15 KB, so at GOGC=100 the collector runs
// tens of times a second under load. In BenchmarkHTTPReserve
// (docs/benchmarks.md, "HTTP API") 400 cut the GC CPU per request from 15-25
// to 2.5-5 µs and the Go CPU per request by 5-25%, for tens of MB more heap.
const defaultGCPercent = 400

// memoryMaxFile is the cgroup v2 memory limit of the container.
var memoryMaxFile = "/sys/fs/cgroup/memory.max"

// tuneGC applies --gc-percent unless GOGC is set, and a soft memory limit of
// 90% of the container's limit unless GOMEMLIMIT is set, so that the larger
// GC target never takes the process to its hard limit. It returns what it set.
func tuneGC(gcPercent int) (gogc string, memLimit int64) {
	if os.Getenv("GOGC") == "" {
		debug.SetGCPercent(gcPercent)
		gogc = strconv.Itoa(gcPercent)
	}
	if os.Getenv("GOMEMLIMIT") == "" {
		if max := cgroupMemoryMax(); max > 0 {
			memLimit = max / 10 * 9
			debug.SetMemoryLimit(memLimit)
		}
	}
	return gogc, memLimit
}

// cgroupMemoryMax returns the cgroup v2 memory limit in bytes, or 0 when
// there is none ("max") or it cannot be read.
func cgroupMemoryMax() int64 {
	data, err := os.ReadFile(memoryMaxFile)
	if err != nil {
		return 0
	}
	n, err := strconv.ParseInt(strings.TrimSpace(string(data)), 10, 64)
	if err != nil || n <= 0 {
		return 0
	}
	return n
}

func run(ctx context.Context, o options) error {
	log := klog.Background().WithName("rb-broker")
	if gogc, limit := tuneGC(o.gcPercent); gogc != "" || limit > 0 {
		log.Info("garbage collection", "gcPercent", gogc, "memoryLimit", limit)
	}
	certs, err := server.LoadCerts(o.certDir, o.certCheck, log)
	if err != nil {
		return err
	}
	rdb, err := o.redisClient()
	if err != nil {
		return err
	}
	defer rdb.Close()
	pol, err := o.loadPolicy()
	if err != nil {
		return err
	}
	grantKeys, err := readGrantKeys(o.grantKeyFile)
	if err != nil {
		return err
	}
	cells, err := store.NewCells(rdb, store.Config{WeightResources: o.weightResources, WeightCost: o.weightCost, StaleThreshold: o.staleThreshold, WaitTTL: o.waitTTL, MaxOwnerShare: o.maxOwnerShare,
		ReserveBatch: o.reserveBatch, ReserveInFlight: o.reserveInFlight, DecideFromView: o.decideFromView, Retention: o.retention, AuditRetention: o.auditRetention,
		MaxEndedPerMember: o.maxEnded, OutageGap: o.outageGap, Policy: pol, GrantKeys: grantKeys, Replicas: o.waitReplicas, ReplicaTimeout: o.waitTimeout}, o.cells, o.cellRule())
	if err != nil {
		return err
	}
	st := cells.Cell(cells.Default())
	cfg := server.Config{Cells: cells, Log: log, MaxStreamsPerCluster: o.maxStreams, MaxListsPerCluster: o.maxLists,
		Limits: api.Limits{DefaultDuration: o.defaultDuration, MaxDuration: o.maxDuration}}
	if len(o.operators) > 0 {
		dash, err := dashboard.New(dashboard.Config{Store: st, Cells: cells, Operators: o.operators, Log: log.WithName("dashboard")})
		if err != nil {
			return err
		}
		cfg.Dashboard = dash
		go dash.Run(ctx)
		log.Info("dashboard", "path", dashboard.Path, "operators", dash.Operators(), "cells", cells.Names(), "defaultCell", cells.Default())
	}
	srv := server.New(cfg)

	// Wait for Redis rather than crash-looping while it starts.
	for retry := backoff.Exponential(500*time.Millisecond, 5*time.Second); ; {
		if err = cells.LoadScripts(ctx); err == nil {
			break
		}
		wait := retry.Step()
		log.Error(err, "Redis not ready, retrying", "in", wait)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(wait):
		}
	}
	apiLn, err := net.Listen("tcp", o.listenAddress)
	if err != nil {
		return err
	}
	var healthLn net.Listener
	if o.healthAddress != "" {
		if healthLn, err = net.Listen("tcp", o.healthAddress); err != nil {
			return err
		}
	}
	if o.pprofAddress != "" {
		pprofLn, err := net.Listen("tcp", o.pprofAddress)
		if err != nil {
			return fmt.Errorf("--pprof-bind-address: %w", err)
		}
		defer pprofLn.Close()
		mux := http.NewServeMux()
		mux.HandleFunc("/debug/pprof/", pprof.Index)
		mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
		mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
		mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
		pprofSrv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second, ErrorLog: klog.NewStandardLogger("ERROR")}
		go func() { _ = pprofSrv.Serve(pprofLn) }()
		defer pprofSrv.Close()
		log.Info("pprof", "address", pprofLn.Addr().String())
	}
	log.Info("serving", "version", version.Get().Version, "api", apiLn.Addr().String(), "health", o.healthAddress, "redis", redactURL(o.redisURL), "redisCluster", o.clusterAddrs, "cells", cells.Names(), "cellLabel", o.cellLabel,
		"redisUser", o.redisUser(), "redisPassword", o.redisPasswordSource(), "redisWaitReplicas", o.waitReplicas, "redisWaitTimeout", o.waitTimeout,
		"weights", fmt.Sprintf("%g/%g", o.weightResources, o.weightCost), "staleThreshold", o.staleThreshold,
		"policy", policySource(o.policyFile), "retention", o.retention, "maxEndedPerMember", o.maxEnded, "auditRetention", o.auditRetention)
	return srv.Run(ctx, server.RunOptions{APIListener: apiLn, Certs: certs, HealthListener: healthLn, ExpiryInterval: o.expiryInterval,
		ShutdownDelay: o.shutdownDelay, ShutdownTimeout: o.shutdownTimeout})
}
