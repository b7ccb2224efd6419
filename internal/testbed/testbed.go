// Package testbed starts the whole resource broker on one machine, from the
// real binaries: redis-server (append-only), rb-broker replicas behind a TCP
// round-robin proxy, and member clusters (real kube-apiserver + etcd through
// envtest), each with its rb-agent and rb-scheduler as subprocesses. Node
// objects stand in for kubelets, an in-process kubelet stand-in marks pods
// on real nodes Running, and the parts of kube-controller-manager the flow
// needs (garbage collector, Deployment, ReplicaSet and namespace
// controllers) run in-process.
//
// The integration tests (test/integration) use it through Start, which ties
// its lifetime to a test; a program (a demo) uses New and Close.
//
//	bed := testbed.Start(t, testbed.Options{})
//	rome := bed.Cluster("rome")
//	rome.Client.Create(ctx, &rbv1.Reservation{...})
//
// The binaries are built once per checkout into a cache directory (see
// DefaultBinDir; RB_TESTBED_BIN names prebuilt ones). Logs of every
// subprocess go to <Dir>/logs/; Start prints their tails when the test fails.
package testbed

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
	"github.com/redis/go-redis/v9"
	"golang.org/x/sync/errgroup"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/klog/v2"

	"github.com/fluidos-project/resource-broker/broker/store"
	"github.com/fluidos-project/resource-broker/internal/certauthority"
	"github.com/fluidos-project/resource-broker/internal/clockskew"
	"github.com/fluidos-project/resource-broker/internal/realnode"
	"github.com/fluidos-project/resource-broker/internal/testenv"
)

// Options configure a bed. Zero values take the defaults.
type Options struct {
	// Dir holds certificates, kubeconfigs, Redis data and logs (required for
	// New; Start uses the test's temp dir).
	Dir string
	// BinDir holds (or receives) rb-broker, rb-agent and rb-scheduler
	// (default DefaultBinDir).
	BinDir string
	// Clusters of the bed (default Rome, Paris, Berlin).
	Clusters []ClusterSpec
	// BrokerReplicas behind the proxy (default 2).
	BrokerReplicas int
	// StaleThreshold of the brokers (default 3s): a cluster not advertised
	// for this long is not a candidate.
	StaleThreshold time.Duration
	// ExpiryInterval of the brokers (default 250ms).
	ExpiryInterval time.Duration
	// PublishPeriod and Debounce of the agents (defaults 1s and 250ms).
	PublishPeriod, Debounce time.Duration
	// TokenTTL of the agents' grants (default 1h).
	TokenTTL time.Duration
	// Verbosity (-v) of the subprocesses (default 0; schedulers at least 2).
	Verbosity int
	// AgentArgs adds flags to a cluster's rb-agent.
	AgentArgs func(cluster string) []string
	// Logf receives progress lines (default: none).
	Logf func(format string, args ...any)
	// RealNodes makes every node a real kubelet with containerd and runs
	// kube-controller-manager in every cluster (see realnodes.go); the host
	// must pass realnode.Check. Without it nodes are Node objects served by
	// the in-process kubelet stand-in, which runs no container.
	RealNodes bool
	// BrokerClockOffset moves the broker's clock (redis-server's TIME: every
	// broker replica's clock) this far from the agents' (internal/clockskew;
	// needs a C compiler). Zero: one host clock.
	BrokerClockOffset time.Duration
	// NodeMonitorGracePeriod of kube-controller-manager with RealNodes
	// (default 20s): how long a node may be silent before it is NotReady.
	NodeMonitorGracePeriod time.Duration
	// MetricsServer runs metrics-server (bin/metrics-server, `make
	// metrics-server-bin`) in every cluster with RealNodes, as a host process
	// behind the APIService v1beta1.metrics.k8s.io, scraping every node's
	// kubelet (the virtual nodes' too) at MetricResolution (default 15s, its
	// minimum); kube-controller-manager then runs the HPA controller with a
	// short sync period (5s) and no downscale stabilization.
	MetricsServer bool
	// MetricResolution of metrics-server with MetricsServer (default 15s).
	MetricResolution time.Duration
	// Deployed: the bed starts no Redis, broker, agent or scheduler; the
	// test deploys them into the clusters from the manifests (RealNodes).
	Deployed bool
	// Images are image tarballs imported into every real node besides the
	// bed's own (testimages).
	Images []string
	// Gangs installs scheduler-plugins' PodGroup CRD in every cluster and
	// enables its Coscheduling plugin in the requesters' resource-broker
	// profile (gangs.go).
	Gangs bool
	// Kueue runs Kueue (bin/kueue, `make kueue-bin`) in every requester
	// cluster: its CRDs, RBAC and webhooks from upstream's config/default,
	// its controller-manager as a host process with the batch/v1 Job
	// integration (kueue.go). Stand-in nodes or real ones.
	Kueue bool
}

func (o *Options) defaults() {
	if len(o.Clusters) == 0 {
		o.Clusters = []ClusterSpec{Rome, Paris, Berlin}
	}
	if o.BrokerReplicas == 0 {
		o.BrokerReplicas = 2
	}
	if o.StaleThreshold == 0 {
		o.StaleThreshold = 3 * time.Second
	}
	if o.ExpiryInterval == 0 {
		o.ExpiryInterval = 250 * time.Millisecond
	}
	if o.PublishPeriod == 0 {
		o.PublishPeriod = time.Second
	}
	if o.Debounce == 0 {
		o.Debounce = 250 * time.Millisecond
	}
	if o.TokenTTL == 0 {
		o.TokenTTL = time.Hour
	}
	if o.Logf == nil {
		o.Logf = func(string, ...any) {}
	}
	if o.NodeMonitorGracePeriod == 0 {
		o.NodeMonitorGracePeriod = 20 * time.Second
	}
	if o.MetricResolution == 0 {
		o.MetricResolution = minMetricResolution
	}
}

func (o *Options) validate() error {
	if o.MetricsServer && !o.RealNodes {
		return errors.New("Options.MetricsServer needs RealNodes: metrics-server scrapes kubelets, and stand-in nodes have none")
	}
	if o.Deployed && !o.RealNodes {
		return errors.New("Options.Deployed needs RealNodes: pods run on real nodes only")
	}
	if o.Kueue && !slices.ContainsFunc(o.Clusters, func(c ClusterSpec) bool { return c.Requester }) {
		return errors.New("Options.Kueue runs Kueue in the requester clusters, and none is")
	}
	if o.MetricResolution < minMetricResolution {
		return fmt.Errorf("Options.MetricResolution %s: metrics-server needs at least %s (above its 10s kubelet request timeout)",
			o.MetricResolution, minMetricResolution)
	}
	return nil
}

// Bed is a running test bed.
type Bed struct {
	Dir, LogDir, BinDir string
	// CA signs the broker's certificate and the clusters' client certificates.
	CA *certauthority.CA
	// BrokerCertDir holds ca.crt, tls.crt, tls.key of the brokers.
	BrokerCertDir string
	Redis         *Redis
	Brokers       []*Broker
	Proxy         *Proxy
	// BrokerURL is the brokers' API through the proxy: what the agents use.
	BrokerURL string
	// RDB and Store read (and, for tests, may write) the brokers' state, as
	// Redis' administrator; the brokers connect as the limited user of
	// manifests/redis/users.acl.
	RDB   *redis.Client
	Store *store.Store
	// Clusters in the order of Options.Clusters.
	Clusters []*Cluster
	// Timings of the start-up phases.
	Timings map[string]time.Duration

	opts       Options
	real       *realNodes
	hostReady  chan struct{} // closed once real is set (RealNodes)
	moduleRoot string
	ctx        context.Context
	cancel     context.CancelFunc
	ctrlLog    *os.File
	helpOnce   sync.Once
	agentHelp  string
	closeOnce  sync.Once

	identitiesOnce sync.Once // identities.go
	identityObjs   []*unstructured.Unstructured
	identitiesErr  error
}

// Broker is one rb-broker replica.
type Broker struct {
	Name       string
	Addr       string // 127.0.0.1:<port>, the mutual-TLS API
	HealthAddr string // 127.0.0.1:<port>, plain-HTTP /healthz /readyz /metrics
	*Process
	bed *Bed
}

// KeepDirEnv names a directory under which Start keeps each bed's
// directory (certificates, kubeconfigs, Redis data, logs) instead of the
// test's temporary directory, which is removed when the test ends:
//
//	RB_TESTBED_KEEP=/tmp/beds go test -run '^$' -bench EndToEnd -benchtime 1x ./test/integration/
const KeepDirEnv = "RB_TESTBED_KEEP"

// Start starts a bed for a test and stops it when the test ends, printing
// the tails of the logs first if the test failed.
func Start(t testing.TB, o Options) *Bed {
	t.Helper()
	if o.Dir == "" {
		if keep := os.Getenv(KeepDirEnv); keep != "" {
			dir, err := os.MkdirTemp(keep, strings.NewReplacer("/", "_", " ", "_").Replace(t.Name())+"-")
			if err != nil {
				t.Fatalf("testbed: %s: %v", KeepDirEnv, err)
			}
			t.Logf("testbed: logs and data kept in %s", dir)
			o.Dir = dir
		} else {
			o.Dir = t.TempDir()
		}
	}
	if o.Logf == nil {
		o.Logf = t.Logf
	}
	b, err := New(context.Background(), o)
	if b != nil {
		t.Cleanup(func() {
			for _, d := range b.Redis.Denials() {
				t.Errorf("testbed: %s", d)
			}
			if t.Failed() {
				b.DumpLogs(t.Logf, 60)
			}
			if err := b.Close(); err != nil {
				t.Errorf("testbed: %v", err)
			}
		})
	}
	if err != nil {
		t.Fatalf("testbed: %v", err)
	}
	return b
}

// New starts a bed. On error the returned bed (if not nil) holds what was
// started: Close it.
func New(ctx context.Context, o Options) (*Bed, error) {
	o.defaults()
	if o.Dir == "" {
		return nil, errors.New("Options.Dir is required")
	}
	if err := o.validate(); err != nil {
		return nil, err
	}
	root, err := testenv.ModuleRoot()
	if err != nil {
		return nil, err
	}
	if o.BinDir == "" {
		if o.BinDir, err = DefaultBinDir(root); err != nil {
			return nil, err
		}
	}
	b := &Bed{Dir: o.Dir, LogDir: filepath.Join(o.Dir, "logs"), BinDir: o.BinDir, opts: o, moduleRoot: root,
		Timings: map[string]time.Duration{}, hostReady: make(chan struct{})}
	if err := os.MkdirAll(b.LogDir, 0o755); err != nil {
		return nil, err
	}
	b.ctrlLog, err = os.Create(filepath.Join(b.LogDir, "in-process.log"))
	if err != nil {
		return nil, err
	}
	logger := funcr.New(func(prefix, args string) {
		fmt.Fprintf(b.ctrlLog, "%s %s %s\n", time.Now().Format("15:04:05.000000"), prefix, args)
	}, funcr.Options{Verbosity: o.Verbosity})
	b.ctx, b.cancel = context.WithCancel(klog.NewContext(context.Background(), logger))
	began := time.Now()
	if err := b.start(ctx); err != nil {
		return b, err
	}
	b.Timings["total"] = time.Since(began)
	o.Logf("testbed: up in %s (%s)", b.Timings["total"].Round(time.Millisecond), b.timingSummary())
	return b, nil
}

func (b *Bed) timingSummary() string {
	var parts []string
	for k, v := range b.Timings {
		if k != "total" {
			parts = append(parts, fmt.Sprintf("%s %s", k, v.Round(time.Millisecond)))
		}
	}
	sort.Strings(parts)
	return strings.Join(parts, ", ")
}

func (b *Bed) start(ctx context.Context) error {
	o := b.opts
	for i, spec := range o.Clusters {
		c := &Cluster{Spec: spec, Name: spec.Name, bed: b, index: i, dir: filepath.Join(b.Dir, "clusters", spec.Name),
			realNodes: map[string]*realnode.Node{}}
		if err := os.MkdirAll(c.dir, 0o755); err != nil {
			return err
		}
		b.Clusters = append(b.Clusters, c)
	}
	var timingsMu sync.Mutex
	timed := func(name string, fn func() error) func() error {
		return func() error {
			began := time.Now()
			err := fn()
			timingsMu.Lock()
			b.Timings[name] = time.Since(began)
			timingsMu.Unlock()
			return err
		}
	}

	// Phase 1, in parallel: build, control planes, Redis + brokers.
	g, gctx := errgroup.WithContext(ctx)
	if !o.Deployed && (os.Getenv(BinDirEnv) == "" || o.BinDir != os.Getenv(BinDirEnv)) {
		g.Go(timed("build", func() error {
			_, err := Build(gctx, b.moduleRoot, b.BinDir)
			return err
		}))
	}
	crdDirs := []string{filepath.Join(b.moduleRoot, "manifests", "crds")}
	if o.Gangs {
		dir, err := podGroupCRDDir(b.moduleRoot)
		if err != nil {
			return err
		}
		crdDirs = append(crdDirs, dir)
	}
	for _, c := range b.Clusters {
		g.Go(timed("control plane "+c.Name, func() error { return c.startControlPlane(gctx, crdDirs...) }))
	}
	g.Go(timed("certificates", b.makeCerts))
	if o.RealNodes {
		g.Go(timed("real nodes host and images", func() error { return b.startRealNodesHost(gctx) }))
	}
	if err := g.Wait(); err != nil {
		return err
	}
	// Brokers need the binaries and the certificates; real nodes and
	// kube-controller-manager their control plane.
	g, gctx = errgroup.WithContext(ctx)
	if !o.Deployed {
		g.Go(timed("redis and brokers", func() error { return b.startBrokers(gctx) }))
	}
	if o.RealNodes {
		for _, c := range b.Clusters {
			g.Go(timed("kube-controller-manager "+c.Name, func() error { return c.startControllerManager(gctx) }))
			g.Go(timed("nodes "+c.Name, func() error { return c.addSpecNodes(gctx) }))
			if o.MetricsServer {
				g.Go(timed("metrics-server "+c.Name, func() error { return c.startMetricsServer(gctx) }))
			}
			if o.Deployed {
				g.Go(timed("kube-scheduler "+c.Name, func() error { return c.startKubeScheduler(gctx) }))
			}
			if o.RealNodes {
				g.Go(timed("services "+c.Name, func() error {
					if err := c.startLoadBalancers(gctx); err != nil {
						return err
					}
					return c.startClusterDNS(gctx)
				}))
			}
		}
	}
	if o.Kueue {
		for _, c := range b.Clusters {
			if c.Spec.Requester {
				g.Go(timed("kueue "+c.Name, func() error { return c.startKueue(gctx) }))
			}
		}
	}
	if err := g.Wait(); err != nil {
		return err
	}
	if o.Deployed {
		return nil
	}

	// Phase 2: agents, schedulers and in-process controllers.
	g, gctx = errgroup.WithContext(ctx)
	for _, c := range b.Clusters {
		g.Go(timed("agent "+c.Name, func() error { return c.StartAgent(gctx) }))
		g.Go(timed("scheduler "+c.Name, func() error { return c.startScheduler(gctx) }))
		if !o.RealNodes {
			g.Go(timed("controllers "+c.Name, func() error { return c.startInProcess(b.ctx) }))
		}
	}
	return g.Wait()
}

// Operator is the common name of the operator's certificate that the bed's
// brokers serve their web dashboard to (--dashboard-operators).
const Operator = "operator"

func (b *Bed) makeCerts() error {
	ca, err := certauthority.NewCA("resource-broker testbed CA")
	if err != nil {
		return err
	}
	b.CA = ca
	pair, err := ca.IssueServer("rb-broker", []string{"127.0.0.1", "localhost"})
	if err != nil {
		return err
	}
	b.BrokerCertDir = filepath.Join(b.Dir, "certs", "broker")
	if err := certauthority.WriteTLSDir(b.BrokerCertDir, pair, ca.CertPEM); err != nil {
		return err
	}
	for _, c := range b.Clusters {
		p, err := ca.IssueClient(c.Name)
		if err != nil {
			return err
		}
		c.CertDir = filepath.Join(b.Dir, "certs", "clusters", c.Name)
		if err := certauthority.WriteTLSDir(c.CertDir, p, ca.CertPEM); err != nil {
			return err
		}
	}
	return nil
}

func (b *Bed) startBrokers(ctx context.Context) error {
	var err error
	if b.Redis, err = newRedis(filepath.Join(b.Dir, "redis"), filepath.Join(b.LogDir, "redis.log")); err != nil {
		return err
	}
	if b.opts.BrokerClockOffset != 0 {
		if b.Redis.Embedded {
			return errors.New("BrokerClockOffset needs redis-server, not the embedded Redis")
		}
		lib, err := clockskew.Build(filepath.Join(b.Dir, "clockskew"))
		if err != nil {
			return err
		}
		b.Redis.Env = append(b.Redis.Env, clockskew.Env(lib, b.opts.BrokerClockOffset)...)
	}
	if err := b.Redis.start(ctx); err != nil {
		return err
	}
	b.RDB = b.Redis.AdminClient()
	grantKeys, err := store.LoadGrantKeys(b.Redis.Users.GrantKeyFile) // the brokers' (Redis.BrokerFlags), to read their grants
	if err != nil {
		return err
	}
	b.Store = store.New(b.RDB, store.Config{StaleThreshold: b.opts.StaleThreshold, GrantKeys: grantKeys})
	policy := filepath.Join(b.Dir, "broker-policy.yaml")
	if err := os.WriteFile(policy, []byte(brokerPolicy), 0o600); err != nil {
		return err
	}
	var addrs []string
	for i := range b.opts.BrokerReplicas {
		br := &Broker{Name: fmt.Sprintf("rb-broker-%d", i), bed: b}
		br.Process = &Process{Name: br.Name, Path: filepath.Join(b.BinDir, "rb-broker"),
			LogPath: filepath.Join(b.LogDir, br.Name+".log")}
		if err := br.start(ctx); err != nil {
			return err
		}
		b.Brokers = append(b.Brokers, br)
		addrs = append(addrs, br.Addr)
	}
	if b.Proxy, err = newProxy(addrs); err != nil {
		return err
	}
	b.BrokerURL = "https://" + b.Proxy.Addr
	return nil
}

// brokerPolicy is the brokers' policy: rb-broker's own without a file
// (policy.Default), but for the advertisements' rate: the bed's agents
// advertise up to 4 times a second (Options.Debounce 250 ms, a tick every
// PublishPeriod), more often than an agent's defaults, on which the
// default rate is based.
const brokerPolicy = `apiVersion: broker.fluidos.eu/v1alpha1
kind: BrokerPolicy
requesters:
  default: {reservesPerSecond: 100, reserveBurst: 200, maxPriority: 1000000000}
members:
  default:
    advertisements: {perSecond: "10", burst: "40"}
`

func (br *Broker) start(ctx context.Context) error {
	var last error
	for range 3 {
		if br.Addr == "" {
			ports, err := FreePorts(2)
			if err != nil {
				return err
			}
			br.Addr, br.HealthAddr = "127.0.0.1:"+strconv.Itoa(ports[0]), "127.0.0.1:"+strconv.Itoa(ports[1])
		}
		o := br.bed.opts
		br.Args = []string{"--listen-address=" + br.Addr, "--health-address=" + br.HealthAddr,
			"--cert-dir=" + br.bed.BrokerCertDir, "--redis-url=redis://" + br.bed.Redis.Addr + "/0",
			"--stale-threshold=" + o.StaleThreshold.String(), "--expiry-interval=" + o.ExpiryInterval.String(),
			"--v=" + strconv.Itoa(o.Verbosity), "--dashboard-operators=" + Operator,
			"--policy-file=" + filepath.Join(br.bed.Dir, "broker-policy.yaml")}
		br.Args = append(br.Args, br.bed.Redis.BrokerFlags()...)
		if err := br.Start(); err != nil {
			return err
		}
		if last = br.WaitReady(ctx); last == nil {
			return nil
		}
		_ = br.Kill()
		if !br.portInUse() {
			return last
		}
		br.Addr = "" // taken by someone else: new ports (before the proxy knows them)
	}
	return last
}

// WaitReady waits until the replica's /readyz answers 200 (Redis reachable,
// scripts loaded: /readyz reloads them after a Redis restart).
func (br *Broker) WaitReady(ctx context.Context) error {
	return br.bed.poll(ctx, br.Process, 60*time.Second, br.Name+" ready", func() (bool, error) {
		return HTTPOK("http://" + br.HealthAddr + "/readyz"), nil
	})
}

// Restart starts a stopped or killed replica again on the same ports.
func (br *Broker) Restart(ctx context.Context) error {
	if err := br.Start(); err != nil {
		return err
	}
	return br.WaitReady(ctx)
}

// Cluster returns the cluster named name (nil if none).
func (b *Bed) Cluster(name string) *Cluster {
	for _, c := range b.Clusters {
		if c.Name == name {
			return c
		}
	}
	return nil
}

// Options returns the effective options.
func (b *Bed) Options() Options { return b.opts }

// Logger is the logger of the in-process parts (written to logs/in-process.log).
func (b *Bed) Logger() logr.Logger { return klog.FromContext(b.ctx) }

// poll calls cond every 25ms until it holds, the process exits, or timeout.
func (b *Bed) poll(ctx context.Context, p *Process, timeout time.Duration, what string, cond func() (bool, error)) error {
	deadline := time.Now().Add(timeout)
	var exited <-chan struct{}
	if p != nil {
		exited = p.Exited()
	}
	for {
		ok, err := cond()
		if err != nil {
			return fmt.Errorf("waiting for %s: %w", what, err)
		}
		if ok {
			return nil
		}
		select {
		case <-exited:
			how := p.Err()
			if how == nil {
				how = errors.New("exit status 0")
			}
			return fmt.Errorf("waiting for %s: %s %w: %w\n%s", what, p.Name, errExited, how, p.Tail(30))
		case <-ctx.Done():
			return fmt.Errorf("waiting for %s: %w", what, ctx.Err())
		case <-time.After(25 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			tail := ""
			if p != nil {
				tail = "\n" + p.Name + ":\n" + p.Tail(30)
			}
			return fmt.Errorf("waiting for %s: not within %s%s", what, timeout, tail)
		}
	}
}

// agentHasFlag tells whether rb-agent knows --name (flags that come with
// later versions, such as the bridge's, are passed only when they exist).
func (b *Bed) agentHasFlag(name string) bool {
	b.helpOnce.Do(func() {
		out, _ := exec.Command(filepath.Join(b.BinDir, "rb-agent"), "--help").CombinedOutput()
		b.agentHelp = string(out)
	})
	return strings.Contains(b.agentHelp, "--"+name+" ") || strings.Contains(b.agentHelp, "--"+name+"=")
}

// Processes lists every subprocess, in start order.
func (b *Bed) Processes() []*Process {
	var ps []*Process
	if b.Redis != nil {
		ps = append(ps, b.Redis.Process)
	}
	for _, br := range b.Brokers {
		ps = append(ps, br.Process)
	}
	for _, c := range b.Clusters {
		for _, p := range []*Process{c.ControllerManager, c.MetricsServer, c.Kueue, c.Agent, c.Scheduler} {
			if p != nil {
				ps = append(ps, p)
			}
		}
	}
	return ps
}

// DumpLogs prints the last lines of every log.
func (b *Bed) DumpLogs(logf func(string, ...any), lines int) {
	for _, p := range b.Processes() {
		logf("---- %s (%s), last %d lines:\n%s", p.Name, p.LogPath, lines, p.Tail(lines))
	}
	for _, c := range b.Clusters {
		for _, n := range c.RealNodes() {
			for _, f := range []string{"node.log", "kubelet.log"} {
				p := filepath.Join(n.LogDir, f)
				logf("---- %s %s (%s), last %d lines:\n%s", n.Name, f, p, lines/2, TailFile(p, lines/2))
			}
		}
	}
	if b.ctrlLog != nil {
		logf("---- in-process controllers (%s), last %d lines:\n%s", b.ctrlLog.Name(), lines, TailFile(b.ctrlLog.Name(), lines))
	}
}

// Close stops everything, in order: schedulers, agents, in-process
// controllers, kube-controller-manager, metrics-server and Kueue, the real nodes,
// brokers, the proxy, Redis, the control planes.
func (b *Bed) Close() error {
	var errs []error
	b.closeOnce.Do(func() {
		for _, c := range b.Clusters {
			if c.Frozen() {
				if err := c.Thaw(); err != nil {
					errs = append(errs, err)
				}
			}
		}
		stopAll := func(ps []*Process) {
			var wg sync.WaitGroup
			var mu sync.Mutex
			for _, p := range ps {
				if p == nil {
					continue
				}
				wg.Add(1)
				go func() {
					defer wg.Done()
					if err := p.Stop(15 * time.Second); err != nil {
						mu.Lock()
						errs = append(errs, err)
						mu.Unlock()
					}
				}()
			}
			wg.Wait()
		}
		var scheds, agents, brokers []*Process
		for _, c := range b.Clusters {
			scheds = append(scheds, c.Scheduler)
			agents = append(agents, c.Agent)
		}
		stopAll(scheds)
		stopAll(agents)
		if b.cancel != nil {
			b.cancel()
		}
		var kcms []*Process
		for _, c := range b.Clusters {
			kcms = append(kcms, c.ControllerManager, c.MetricsServer, c.Kueue)
		}
		for _, c := range b.Clusters {
			kcms = append(kcms, c.ClusterDNS, c.KubeScheduler)
		}
		stopAll(kcms) // before the host goes: metrics-server listens on a host bridge address
		stopControlPlanes := func() {
			var wg sync.WaitGroup
			var mu sync.Mutex
			for _, c := range b.Clusters {
				if c.env == nil {
					continue
				}
				wg.Add(1)
				go func() {
					defer wg.Done()
					if err := c.env.Stop(); err != nil && !(b.opts.RealNodes && isStopTimeout(err)) {
						mu.Lock()
						errs = append(errs, fmt.Errorf("%s: stop control plane: %w", c.Name, err))
						mu.Unlock()
					}
					c.env = nil
				}()
			}
			wg.Wait()
		}
		if b.opts.RealNodes {
			// The API servers listen on host bridge addresses, which go with
			// the host: stopped after them, they never finish shutting down.
			// The nodes go first, so that no kubelet or kube-proxy holds a
			// request open while the API servers shut down.
			if b.real != nil {
				if err := b.real.host.StopNodes(); err != nil {
					errs = append(errs, fmt.Errorf("real nodes: %w", err))
				}
			}
			stopControlPlanes()
		}
		if b.real != nil {
			if err := b.real.host.Close(); err != nil {
				errs = append(errs, fmt.Errorf("real nodes: %w", err))
			}
		}
		for _, br := range b.Brokers {
			brokers = append(brokers, br.Process)
		}
		stopAll(brokers)
		if b.Proxy != nil {
			b.Proxy.Close()
		}
		if b.RDB != nil {
			b.RDB.Close()
		}
		if b.Redis != nil {
			stopAll([]*Process{b.Redis.Process})
		}
		stopControlPlanes()
		if b.ctrlLog != nil {
			b.ctrlLog.Close()
		}
	})
	return errors.Join(errs...)
}

// ReplicasServing counts, per broker replica, the open connections that
// process p (an agent) holds to it through the proxy: which replica a fault
// must hit to matter to that agent.
func (b *Bed) ReplicasServing(p *Process) (map[*Broker]int, error) {
	_, portStr, err := net.SplitHostPort(b.Proxy.Addr)
	if err != nil {
		return nil, err
	}
	port, _ := strconv.Atoi(portStr)
	local, err := localPortsTo(p.Pid(), port)
	if err != nil {
		return nil, err
	}
	out := map[*Broker]int{}
	for _, lp := range local {
		addr, ok := b.Proxy.backendOf(lp)
		if !ok {
			continue
		}
		for _, br := range b.Brokers {
			if br.Addr == addr {
				out[br]++
			}
		}
	}
	return out, nil
}

// CutFromBroker cuts process p (an agent) off from the brokers: the proxy
// closes its connections and refuses its new ones, while the rest of the
// bed reaches them as before (a requester whose network to the broker is
// down, not to its providers). The returned func mends the cut.
func (b *Bed) CutFromBroker(p *Process) (mend func()) {
	_, portStr, _ := net.SplitHostPort(b.Proxy.Addr)
	proxyPort, _ := strconv.Atoi(portStr)
	pid := p.Pid()
	b.Proxy.setRefuse(func(clientPort int) bool {
		ports, err := localPortsTo(pid, proxyPort)
		return err == nil && slices.Contains(ports, clientPort)
	})
	return func() { b.Proxy.setRefuse(nil) }
}

// isStopTimeout tells envtest's error for an API server it had to kill.
// With real nodes (the API server on a host bridge address, pods as its
// clients) the API server's graceful shutdown stops its listener and
// controllers at once and then does not exit within envtest's 20 s; why is
// not found yet (no connection from a pod is left open by then). It is
// killed then, which is all a test bed's teardown needs.
func isStopTimeout(err error) bool {
	return strings.Contains(err.Error(), "timeout waiting for process kube-apiserver to stop")
}
