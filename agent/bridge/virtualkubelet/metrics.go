package virtualkubelet

import (
	"cmp"
	"context"
	"fmt"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	metricsv1beta1 "k8s.io/metrics/pkg/apis/metrics/v1beta1"

	rbv1 "github.com/fluidos-project/resource-broker/api/v1alpha1"
)

// The resource usage a virtual node's kubelet endpoint reports
// (/stats/summary, /metrics/resource; kubelet_stats.go) is that of the
// requester's pods borrowed on it, as the provider's metrics.k8s.io API
// (its metrics-server) measures their copies: the node's usage is the sum
// of those pods, never the provider's whole cluster. The node polls that
// API with the tenant token, one List of the tenant namespace per period
// for all its pods, and answers scrapes from what it last heard.
//
// metrics.k8s.io gives a rate (CPU cores over a window ending at a
// timestamp) and a working set; a kubelet gives cumulative CPU time, from
// which metrics-server computes the rate between two of its scrapes. The
// node rebuilds monotonic counters from the rates (usageTracker): each new
// sample adds rate × the time since the previous one.

// containerSample is one container's usage in a PodMetrics.
type containerSample struct {
	name       string
	start      time.Time // when the copy's container started running (zero: unknown)
	nanoCores  uint64
	workingSet uint64 // bytes
}

// podSample is one borrowed pod's PodMetrics, joined with its local pod.
type podSample struct {
	namespace, name string // the local pod
	uid             types.UID
	start           time.Time     // the local pod's status.startTime
	time            time.Time     // end of the window
	window          time.Duration // over which the rates were measured
	containers      []containerSample
}

// containerUsage is a container's usage as the endpoint reports it.
type containerUsage struct {
	name            string
	start, time     time.Time
	nanoCores       uint64
	coreNanoSeconds uint64 // cumulative CPU time
	workingSet      uint64
}

// podUsage is a pod's: the sums of its containers.
type podUsage struct {
	namespace, name string
	uid             types.UID
	start, time     time.Time
	nanoCores       uint64
	coreNanoSeconds uint64 // cumulative, since the pod was first seen: a restarted container does not reset it
	workingSet      uint64
	containers      []containerUsage // by name
}

// usageSnapshot is what the node's endpoint reports until the next poll;
// never modified once published.
type usageSnapshot struct {
	time            time.Time // of the node's figures
	nanoCores       uint64
	coreNanoSeconds uint64
	workingSet      uint64
	pods            []podUsage // by namespace, name
	// failed: the last poll failed and these are the figures of the one
	// before (resource_scrape_error 1).
	failed bool
}

// usageTracker rebuilds cumulative CPU counters from rate samples; it is
// used by one goroutine (the node's poller).
type usageTracker struct {
	pods     map[types.UID]*podTrack
	nodeCPU  float64 // core-nanoseconds
	nodeTime time.Time
}

type podTrack struct {
	cpu        float64
	containers map[string]*containerTrack
}

type containerTrack struct {
	cpu   float64
	time  time.Time
	start time.Time
}

// Every counter starts at 1 ns: metrics-server takes a zero CPU counter for
// a missing figure and drops the pod (or node), so an idle container would
// not show at all. The rates metrics-server computes are differences, which
// this does not change.
const counterFloor = 1

// advance takes a container's new sample at time at over window: the CPU
// time to add to its pod's and node's counters. A container seen for the
// first time, or started again (a later start time: a restart at the
// provider, whose counter a kubelet resets too), starts its counter at
// rate × its running time so far (the best estimate of its usage since it
// started; metrics-server's rate for a container younger than its
// resolution divides the counter by that time) and adds the usage of the
// sample's window to the pod's and node's; a sample newer than the last
// adds rate × the time between them; an older or the same one adds nothing.
func (c *containerTrack) advance(s containerSample, at time.Time, window time.Duration) (added float64, fresh bool) {
	rate := float64(s.nanoCores) / 1e9 // cores
	restarted := !s.start.IsZero() && !c.start.IsZero() && s.start.After(c.start)
	switch {
	case c.time.IsZero() || restarted:
		ran := window
		if !s.start.IsZero() && s.start.Before(at) {
			ran = at.Sub(s.start)
		}
		c.cpu = counterFloor + rate*float64(ran)
		c.time, c.start = at, s.start
		return rate * float64(min(window, ran)), true
	case at.After(c.time):
		added = rate * float64(at.Sub(c.time))
		c.cpu += added
		c.time = at
		if c.start.IsZero() {
			c.start = s.start
		}
		return added, false
	}
	return 0, false
}

// observe takes one poll's samples (taken at now) and returns the
// snapshot to serve. Pods whose local pod is gone (live false) are
// forgotten; a pod missing from one poll but still bound keeps its
// counters, so that it does not start over when it comes back.
func (tr *usageTracker) observe(samples []podSample, now time.Time, live func(types.UID) bool) *usageSnapshot {
	if tr.pods == nil {
		tr.pods = map[types.UID]*podTrack{}
	}
	snap := &usageSnapshot{pods: make([]podUsage, 0, len(samples))}
	var latest time.Time
	for _, s := range samples {
		pt := tr.pods[s.uid]
		newPod := pt == nil
		if newPod {
			pt = &podTrack{cpu: counterFloor, containers: map[string]*containerTrack{}}
			tr.pods[s.uid] = pt
		}
		pu := podUsage{namespace: s.namespace, name: s.name, uid: s.uid, start: s.start, time: s.time,
			containers: make([]containerUsage, 0, len(s.containers))}
		for _, cs := range s.containers {
			ct := pt.containers[cs.name]
			if ct == nil {
				ct = &containerTrack{}
				pt.containers[cs.name] = ct
			}
			added, fresh := ct.advance(cs, s.time, s.window)
			if newPod && fresh {
				pt.cpu += ct.cpu - counterFloor // the pod's counter starts as the sum of its containers'
			} else {
				pt.cpu += added
			}
			tr.nodeCPU += added
			pu.containers = append(pu.containers, containerUsage{name: cs.name, start: ct.start, time: ct.time,
				nanoCores: cs.nanoCores, coreNanoSeconds: uint64(ct.cpu), workingSet: cs.workingSet})
			pu.nanoCores += cs.nanoCores
			pu.workingSet += cs.workingSet
		}
		slices.SortFunc(pu.containers, func(a, b containerUsage) int { return cmp.Compare(a.name, b.name) })
		pu.coreNanoSeconds = uint64(pt.cpu)
		snap.pods = append(snap.pods, pu)
		snap.nanoCores += pu.nanoCores
		snap.workingSet += pu.workingSet
		if s.time.After(latest) {
			latest = s.time
		}
	}
	for uid := range tr.pods {
		if !live(uid) {
			delete(tr.pods, uid)
		}
	}
	// The node's figures are as of its newest sample (now when it has no
	// pod), never older than the last ones. A poll that missed every pod
	// still bound leaves them as they were: its counter did not move.
	if latest.IsZero() && len(tr.pods) == 0 {
		latest = now
	}
	if latest.After(tr.nodeTime) {
		tr.nodeTime = latest
	}
	snap.time = tr.nodeTime
	snap.coreNanoSeconds = counterFloor + uint64(tr.nodeCPU)
	slices.SortFunc(snap.pods, func(a, b podUsage) int {
		return cmp.Or(cmp.Compare(a.namespace, b.namespace), cmp.Compare(a.name, b.name))
	})
	return snap
}

// nodeUsage is a node's poller of the provider's metrics.k8s.io and what it
// last heard.
type nodeUsage struct {
	tracker usageTracker // the poller's
	snap    atomic.Pointer[usageSnapshot]

	mu sync.Mutex
	// problem says why the provider's usage cannot be had (the metrics
	// routes answer 503 with it); empty when it can.
	problem string
}

// usageLoop polls the provider's usage every MetricsPeriod.
func (n *providerNode) usageLoop(ctx context.Context) {
	t := time.NewTicker(n.b.cfg.MetricsPeriod)
	defer t.Stop()
	for {
		if rc := n.currentRemote(); rc != nil {
			n.pollUsage(ctx, rc)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// pollUsage lists the PodMetrics of this cluster's copies at the provider
// (one request for all of them) and publishes the node's new snapshot.
func (n *providerNode) pollUsage(ctx context.Context, rc *remoteCluster) {
	pctx, cancel := context.WithTimeout(ctx, max(n.b.cfg.MetricsPeriod, 10*time.Second))
	defer cancel()
	list, err := rc.metrics.MetricsV1beta1().PodMetricses(rc.namespace).List(pctx, metav1.ListOptions{
		LabelSelector: labels.SelectorFromSet(labels.Set{rbv1.RequesterLabel: n.b.cfg.ClusterID}).String()})
	if ctx.Err() != nil {
		return
	}
	if err != nil {
		if problem := metricsProblem(n.provider, rc.namespace, err); problem != "" {
			n.setUsageProblem(problem)
			return
		}
		n.log.V(1).Info("cannot read the provider's pod metrics, serving the last ones", "error", err.Error())
		if last := n.usage.snap.Load(); last != nil && !last.failed {
			failed := *last
			failed.failed = true
			n.usage.snap.Store(&failed)
		}
		return
	}
	n.setUsageProblem("")
	n.usage.snap.Store(n.usage.tracker.observe(n.usageSamples(rc, list.Items), time.Now(), n.bound()))
}

// metricsProblem says what a failed List tells of the provider's metrics
// API, when it is lasting: no metrics.k8s.io there (404), none that answers
// (503), or no permission (403). "" for a failure worth retrying quietly.
func metricsProblem(provider, namespace string, err error) string {
	switch {
	case apierrors.IsNotFound(err):
		return fmt.Sprintf("provider %s serves no metrics.k8s.io API (no metrics-server there): %v", provider, err)
	case apierrors.IsServiceUnavailable(err):
		return fmt.Sprintf("provider %s's metrics.k8s.io API is unavailable (its metrics-server does not answer): %v", provider, err)
	case apierrors.IsForbidden(err):
		return fmt.Sprintf("provider %s does not let this cluster list metrics.k8s.io pods in %s (its rb-tenant role lacks that rule): %v", provider, namespace, err)
	}
	return ""
}

// setUsageProblem records why the usage cannot be had, logging each new
// reason once and the recovery.
func (n *providerNode) setUsageProblem(problem string) {
	n.usage.mu.Lock()
	was := n.usage.problem
	n.usage.problem = problem
	n.usage.mu.Unlock()
	switch {
	case problem == was:
	case problem == "":
		n.log.Info("the provider's metrics.k8s.io API answers: the node reports its pods' usage")
	default:
		n.log.Info("the node cannot report its pods' usage (kubectl top, HorizontalPodAutoscalers): "+problem, "provider", n.provider)
	}
}

// usageProblem is why the metrics routes answer 503, or "".
func (n *providerNode) usageProblem() string {
	if n.currentRemote() == nil {
		return errNoGrant{n.provider}.Error()
	}
	n.usage.mu.Lock()
	defer n.usage.mu.Unlock()
	return n.usage.problem
}

// usageSnapshot is the node's last snapshot (empty before the first poll).
func (n *providerNode) usageSnapshot() *usageSnapshot {
	if s := n.usage.snap.Load(); s != nil {
		return s
	}
	return &usageSnapshot{time: time.Now(), coreNanoSeconds: counterFloor}
}

// usageSamples joins the provider's PodMetrics with the copies (the remote
// informer) and their local pods on this node: a PodMetrics whose copy or
// local pod is unknown, or of a pod not bound here, is left out.
func (n *providerNode) usageSamples(rc *remoteCluster, items []metricsv1beta1.PodMetrics) []podSample {
	out := make([]podSample, 0, len(items))
	for i := range items {
		pm := &items[i]
		cp, err := rc.pods.Get(pm.Name)
		if err != nil {
			continue
		}
		key, uid, ok := originOf(cp)
		if !ok {
			continue
		}
		local, err := n.localPods.Pods(key.Namespace).Get(key.Name)
		if err != nil || local.UID != uid || local.Spec.NodeName != n.name {
			continue
		}
		s := podSample{namespace: key.Namespace, name: key.Name, uid: uid, time: pm.Timestamp.Time, window: pm.Window.Duration,
			containers: make([]containerSample, 0, len(pm.Containers))}
		if local.Status.StartTime != nil {
			s.start = local.Status.StartTime.Time
		}
		for _, c := range pm.Containers {
			cs := containerSample{name: c.Name, nanoCores: nonNegative(c.Usage.Cpu().ScaledValue(resource.Nano)),
				workingSet: nonNegative(c.Usage.Memory().Value())}
			for _, st := range cp.Status.ContainerStatuses {
				if st.Name == c.Name && st.State.Running != nil {
					cs.start = st.State.Running.StartedAt.Time
				}
			}
			s.containers = append(s.containers, cs)
		}
		out = append(out, s)
	}
	return out
}

func nonNegative(v int64) uint64 { return uint64(max(v, 0)) }

// bound tells whether a local pod (by UID) is still bound to the node.
func (n *providerNode) bound() func(types.UID) bool {
	pods, _ := n.localPods.List(everything)
	uids := make(map[types.UID]bool, len(pods))
	for _, p := range pods {
		uids[p.UID] = true
	}
	return func(uid types.UID) bool { return uids[uid] }
}

// usageRoute answers 503 when the node cannot report usage (no grant yet,
// no metrics.k8s.io at the provider), naming what is missing.
func usageRoute(n *providerNode, h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if problem := n.usageProblem(); problem != "" {
			http.Error(w, problem, http.StatusServiceUnavailable)
			return
		}
		h.ServeHTTP(w, r)
	})
}
