package integration

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"

	rbv1 "github.com/fluidos-project/resource-broker/api/v1alpha1"
	"github.com/fluidos-project/resource-broker/internal/testbed"
	"github.com/fluidos-project/resource-broker/internal/testimages"
)

// figures collects the measurements of every scenario, printed together at
// the end of TestScenarios.
var figures struct {
	sync.Mutex
	lines []string
}

func figure(t *testing.T, format string, args ...any) {
	t.Helper()
	line := fmt.Sprintf("%-16s ", strings.TrimPrefix(t.Name(), "TestScenarios/")) + fmt.Sprintf(format, args...)
	t.Log(line)
	figures.Lock()
	figures.lines = append(figures.lines, line)
	figures.Unlock()
}

// stats summarises durations: n, min, median, p90, max.
func stats(ds []time.Duration) string {
	if len(ds) == 0 {
		return "n=0"
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	q := func(p float64) time.Duration { return s[min(len(s)-1, int(p*float64(len(s))))] }
	r := func(d time.Duration) string { return d.Round(time.Millisecond).String() }
	return fmt.Sprintf("n=%d min=%s p50=%s p90=%s max=%s", len(s), r(s[0]), r(q(0.5)), r(q(0.9)), r(s[len(s)-1]))
}

// eventually polls cond every 25ms until it holds or timeout passes; it
// fails the test with the last message cond gave.
func eventually(t testing.TB, timeout time.Duration, what string, cond func() (bool, string)) {
	t.Helper()
	eventuallyExplained(t, timeout, what, cond, nil)
}

// eventuallyExplained is eventually whose failure also says explain(), a
// look at the state too costly to take at every poll (nil: nothing more).
func eventuallyExplained(t testing.TB, timeout time.Duration, what string, cond func() (bool, string), explain func() string) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		ok, msg := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			if explain != nil {
				msg += "; " + explain()
			}
			t.Fatalf("waiting for %s: not within %s: %s", what, timeout, msg)
		}
		time.Sleep(25 * time.Millisecond)
	}
}

// scenario is one subtest of a test that shares one bed among several.
type scenario struct {
	name string
	run  func(*testing.T, *testbed.Bed)
}

// runScenarios runs each scenario on bed as a subtest, in order. A scenario
// that failed may have left the bed in any state: the next ones run on
// whatever it left.
func runScenarios(t *testing.T, bed *testbed.Bed, scenarios []scenario) {
	for _, sc := range scenarios {
		if !t.Run(sc.name, func(t *testing.T) { sc.run(t, bed) }) {
			t.Logf("scenario %s failed; the next ones run on whatever it left", sc.name)
		}
	}
}

// baseline reads the brokers' capacity accounting once the bed is quiet.
func baseline(t *testing.T, bed *testbed.Bed) testbed.Capacity {
	t.Helper()
	ctx := context.Background()
	waitNoLive(t, bed, 30*time.Second)
	c, err := bed.Capacity(ctx)
	require.NoError(t, err)
	require.NoError(t, bed.Store.CheckInvariant(ctx))
	return c
}

func waitNoLive(t *testing.T, bed *testbed.Bed, timeout time.Duration) {
	t.Helper()
	eventually(t, timeout, "no live reservation at the broker", func() (bool, string) {
		idx, err := bed.LiveIndexes(context.Background())
		return err == nil && len(idx) == 0, fmt.Sprintf("%v %v", idx, err)
	})
}

// backToBaseline waits until no reservation is live and every rb:{b}:cluster
// hash equals base again, field for field; then checks the invariant.
func backToBaseline(t *testing.T, bed *testbed.Bed, base testbed.Capacity, timeout time.Duration) {
	t.Helper()
	ctx := context.Background()
	waitNoLive(t, bed, timeout)
	// A cluster short of nodes: the failure says what its agent saw of
	// them (an advertisement counts the Ready, schedulable ones).
	eventuallyExplained(t, timeout, "capacity back to the starting numbers", func() (bool, string) {
		c, err := bed.Capacity(ctx)
		if err != nil {
			return false, err.Error()
		}
		d := c.Diff(base)
		return d == "", d
	}, func() string { return "the clusters' nodes now: " + nodeStates(bed, base) })
	require.NoError(t, bed.Store.CheckInvariant(ctx))
}

// nodeStates tells, for each cluster of base, each of its real nodes' Ready
// condition (status, reason, message, last heartbeat) and whether it is
// cordoned.
func nodeStates(bed *testbed.Bed, base testbed.Capacity) string {
	var b strings.Builder
	for _, name := range slices.Sorted(maps.Keys(base)) {
		c := bed.Cluster(name)
		if c == nil {
			continue
		}
		for _, node := range c.Nodes() {
			var n corev1.Node
			if err := c.Client.Get(context.Background(), client.ObjectKey{Name: node}, &n); err != nil {
				fmt.Fprintf(&b, "%s/%s: %v; ", name, node, err)
				continue
			}
			fmt.Fprintf(&b, "%s/%s: unschedulable=%v", name, node, n.Spec.Unschedulable)
			for _, cond := range n.Status.Conditions {
				if cond.Type == corev1.NodeReady {
					fmt.Fprintf(&b, " Ready=%s (%s: %s; heartbeat %s, since %s)", cond.Status, cond.Reason, cond.Message,
						cond.LastHeartbeatTime.Format(time.StampMilli), cond.LastTransitionTime.Format(time.StampMilli))
				}
			}
			b.WriteString("; ")
		}
	}
	return b.String()
}

// waitNoPodOrReservation waits until namespace ns of c holds no pod and no Reservation.
func waitNoPodOrReservation(t *testing.T, c *testbed.Cluster, ns string, timeout time.Duration) {
	t.Helper()
	ctx := context.Background()
	eventually(t, timeout, "no pod and no Reservation left in "+c.Name+"'s "+ns, func() (bool, string) {
		var left corev1.PodList
		require.NoError(t, c.Client.List(ctx, &left, client.InNamespace(ns)))
		n := len(reservations(t, c, ns))
		return len(left.Items) == 0 && n == 0, fmt.Sprintf("%d pods, %d reservations", len(left.Items), n)
	})
}

func newNamespace(t *testing.T, c *testbed.Cluster, name string) {
	t.Helper()
	require.NoError(t, c.Client.Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}))
	t.Cleanup(func() {
		_ = c.Client.Delete(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}})
	})
	if c.ControllerManager != nil { // pods are refused until its default ServiceAccount exists
		require.NoError(t, c.WaitServiceAccount(context.Background(), name))
	}
}

func reservation(ns, name, cpu, memory string) *rbv1.Reservation {
	return &rbv1.Reservation{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: rbv1.ReservationSpec{Resources: corev1.ResourceList{
			corev1.ResourceCPU: resource.MustParse(cpu), corev1.ResourceMemory: resource.MustParse(memory)}},
	}
}

// brokerPod is a pod for rb-scheduler (schedulerName resource-broker).
func brokerPod(ns, name string, requests corev1.ResourceList) *corev1.Pod {
	limits := corev1.ResourceList{}
	if g, ok := requests[rbv1.ResourceGPU]; ok {
		limits[rbv1.ResourceGPU] = g // extended resources need limits = requests
	}
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: map[string]string{"app": name}},
		Spec: corev1.PodSpec{SchedulerName: "resource-broker", Containers: []corev1.Container{{
			// The bed's own pause image: runs on real nodes (imported, never pulled).
			Name: "main", Image: testimages.Pause, ImagePullPolicy: corev1.PullIfNotPresent,
			Resources: corev1.ResourceRequirements{Requests: requests, Limits: limits}}}},
	}
}

func requests(cpu, memory string, gpus ...string) corev1.ResourceList {
	l := corev1.ResourceList{corev1.ResourceCPU: resource.MustParse(cpu), corev1.ResourceMemory: resource.MustParse(memory)}
	if len(gpus) > 0 {
		l[rbv1.ResourceGPU] = resource.MustParse(gpus[0])
	}
	return l
}

// waiting tells whether the broker refused a reservation for lack of
// capacity and the agent keeps asking: Pending with Reserved=False, reason
// NoCapacity (Failed is final, and not what a waiting reservation is).
func waiting(r *rbv1.Reservation) bool {
	c := meta.FindStatusCondition(r.Status.Conditions, rbv1.ConditionReserved)
	return r.Status.Phase == rbv1.ReservationPending && r.Status.Reason == "NoCapacity" &&
		c != nil && c.Status == metav1.ConditionFalse && c.Reason == "NoCapacity"
}

func live(p rbv1.ReservationPhase) bool {
	return p == rbv1.ReservationReserved || p == rbv1.ReservationActive
}

// reservations lists the Reservations of a namespace.
func reservations(t *testing.T, c *testbed.Cluster, ns string) []rbv1.Reservation {
	t.Helper()
	var l rbv1.ReservationList
	require.NoError(t, c.Client.List(context.Background(), &l, client.InNamespace(ns)))
	return l.Items
}

// waitReservations waits until the namespace holds n Reservations that all
// satisfy ok, and returns them.
func waitReservations(t *testing.T, c *testbed.Cluster, ns string, n int, timeout time.Duration, what string,
	ok func(*rbv1.Reservation) bool) []rbv1.Reservation {
	t.Helper()
	var items []rbv1.Reservation
	eventually(t, timeout, what, func() (bool, string) {
		var l rbv1.ReservationList
		if err := c.Client.List(context.Background(), &l, client.InNamespace(ns)); err != nil {
			return false, err.Error()
		}
		items = l.Items
		if len(items) != n {
			return false, fmt.Sprintf("%d reservations, want %d", len(items), n)
		}
		var bad []string
		for i := range items {
			if !ok(&items[i]) {
				bad = append(bad, fmt.Sprintf("%s: %s %s %s", items[i].Name, items[i].Status.Phase, items[i].Status.Reason, items[i].Status.Message))
			}
		}
		if len(bad) > 3 {
			bad = append(bad[:3], fmt.Sprintf("and %d more", len(bad)-3))
		}
		return len(bad) == 0, strings.Join(bad, "; ")
	})
	return items
}

// waitReservation waits until one Reservation satisfies ok.
func waitReservation(t *testing.T, c *testbed.Cluster, ns, name string, timeout time.Duration, what string,
	ok func(*rbv1.Reservation) bool) *rbv1.Reservation {
	t.Helper()
	var rsv rbv1.Reservation
	eventually(t, timeout, name+" "+what, func() (bool, string) {
		if err := c.Client.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: name}, &rsv); err != nil {
			return false, err.Error()
		}
		return ok(&rsv), fmt.Sprintf("phase %q provider %q reason %q attempts %d: %s", rsv.Status.Phase, rsv.Status.Provider,
			rsv.Status.Reason, rsv.Status.Attempts, rsv.Status.Message)
	})
	return &rsv
}

func podCondition(p *corev1.Pod) string {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodScheduled {
			return c.Message
		}
	}
	return ""
}

// waitPodCondition waits until a pod is unbound and its PodScheduled message
// contains every part.
func waitPodCondition(t *testing.T, c *testbed.Cluster, ns, name string, timeout time.Duration, parts ...string) {
	t.Helper()
	eventually(t, timeout, fmt.Sprintf("pod %s/%s condition %q", ns, name, parts), func() (bool, string) {
		var p corev1.Pod
		if err := c.Client.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: name}, &p); err != nil {
			return false, err.Error()
		}
		msg := podCondition(&p)
		if p.Spec.NodeName != "" {
			return false, "bound to " + p.Spec.NodeName
		}
		for _, part := range parts {
			if !strings.Contains(msg, part) {
				return false, msg
			}
		}
		return true, msg
	})
}

// waitPodServed waits until a pod whose Reservation is live on provider is
// served as far as this build goes: bound to the provider's virtual node
// rb-<provider> once the bridge runs in rb-agent, or, without it, unbound and
// saying in its PodScheduled condition that it waits for that reservation on
// that provider. It returns the node ("" when unbound).
func waitPodServed(t *testing.T, c *testbed.Cluster, ns, name, rsv, provider string, timeout time.Duration) string {
	t.Helper()
	var node string
	eventually(t, timeout, fmt.Sprintf("pod %s/%s on rb-%s or waiting for %s", ns, name, provider, rsv), func() (bool, string) {
		var p corev1.Pod
		if err := c.Client.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: name}, &p); err != nil {
			return false, err.Error()
		}
		node = p.Spec.NodeName
		if node != "" {
			return node == "rb-"+provider, "bound to " + node
		}
		msg := podCondition(&p)
		return strings.Contains(msg, "waiting for broker reservation "+rsv) && strings.Contains(msg, "on provider "+provider), msg
	})
	return node
}

// countBy counts reservations by provider.
func countBy(items []rbv1.Reservation) map[string]int {
	m := map[string]int{}
	for _, r := range items {
		m[r.Status.Provider]++
	}
	return m
}

// providerInstructions lists a provider's instructions (for requester rome).
func providerInstructions(t *testing.T, c *testbed.Cluster) []rbv1.ProviderInstruction {
	t.Helper()
	var l rbv1.ProviderInstructionList
	require.NoError(t, c.Client.List(context.Background(), &l, client.InNamespace(testbed.AgentNamespace)))
	return l.Items
}

// waitTenantGone waits until a provider has no instruction and no tenant
// namespace for rome left (the namespace controller really removes it).
func waitTenantGone(t *testing.T, c *testbed.Cluster, timeout time.Duration) {
	t.Helper()
	eventually(t, timeout, c.Name+": rome's tenant gone", func() (bool, string) {
		if n := len(providerInstructions(t, c)); n > 0 {
			return false, fmt.Sprintf("%d ProviderInstructions", n)
		}
		var ns corev1.Namespace
		err := c.Client.Get(context.Background(), client.ObjectKey{Name: "rb-rome"}, &ns)
		if apierrors.IsNotFound(err) {
			return true, ""
		}
		return false, fmt.Sprintf("namespace rb-rome: %v %v", ns.Status.Phase, err)
	})
}

// waitTenantDeleted waits until a provider's agent has deleted rome's tenant
// namespace (Terminating, or already gone).
func waitTenantDeleted(t *testing.T, c *testbed.Cluster, timeout time.Duration) {
	t.Helper()
	eventually(t, timeout, c.Name+": rome's tenant namespace deleted", func() (bool, string) {
		var ns corev1.Namespace
		err := c.Client.Get(context.Background(), client.ObjectKey{Name: "rb-rome"}, &ns)
		return apierrors.IsNotFound(err) || (err == nil && ns.DeletionTimestamp != nil), fmt.Sprintf("%v", err)
	})
}

// tenantQuotaCPU returns the hard requests.cpu of rome's tenant quota at a provider.
func tenantQuotaCPU(t *testing.T, c *testbed.Cluster) string {
	t.Helper()
	var q corev1.ResourceQuota
	if err := c.Client.Get(context.Background(), client.ObjectKey{Namespace: "rb-rome", Name: "rb-reservations"}, &q); err != nil {
		return err.Error()
	}
	v := q.Spec.Hard["requests.cpu"]
	return v.String()
}

// timeline records, from a watch, when each Reservation of a namespace was
// first seen and first Reserved (or Active) and Active, and when each pod of
// the namespace was first seen.
type timeline struct {
	mu       sync.Mutex
	seen     map[string]time.Time // reservation name
	reserved map[string]time.Time
	active   map[string]time.Time
	podOf    map[string]string // reservation -> pod
	podSeen  map[string]time.Time
	podRun   map[string]time.Time // pod -> first seen Running
	stop     []func()
}

func watchTimeline(t *testing.T, c *testbed.Cluster, ns string) *timeline {
	t.Helper()
	tl := &timeline{seen: map[string]time.Time{}, reserved: map[string]time.Time{}, active: map[string]time.Time{},
		podOf: map[string]string{}, podSeen: map[string]time.Time{}, podRun: map[string]time.Time{}}
	wc, err := client.NewWithWatch(c.Config, client.Options{Scheme: testbed.Scheme})
	require.NoError(t, err)
	ctx := context.Background()
	rw, err := wc.Watch(ctx, &rbv1.ReservationList{}, client.InNamespace(ns))
	require.NoError(t, err)
	pw, err := wc.Watch(ctx, &corev1.PodList{}, client.InNamespace(ns))
	require.NoError(t, err)
	tl.stop = []func(){rw.Stop, pw.Stop}
	go tl.run(rw.ResultChan())
	go tl.run(pw.ResultChan())
	t.Cleanup(tl.close)
	return tl
}

func (tl *timeline) close() {
	for _, s := range tl.stop {
		s()
	}
}

func (tl *timeline) run(ch <-chan watch.Event) {
	for ev := range ch {
		now := time.Now()
		tl.mu.Lock()
		switch o := ev.Object.(type) {
		case *rbv1.Reservation:
			if _, ok := tl.seen[o.Name]; !ok {
				tl.seen[o.Name] = now
			}
			if o.Spec.PodName != "" {
				tl.podOf[o.Name] = o.Spec.PodName
			}
			if _, ok := tl.reserved[o.Name]; !ok && live(o.Status.Phase) {
				tl.reserved[o.Name] = now
			}
			if _, ok := tl.active[o.Name]; !ok && o.Status.Phase == rbv1.ReservationActive {
				tl.active[o.Name] = now
			}
		case *corev1.Pod:
			if _, ok := tl.podSeen[o.Name]; !ok {
				tl.podSeen[o.Name] = now
			}
			if _, ok := tl.podRun[o.Name]; !ok && o.Status.Phase == corev1.PodRunning {
				tl.podRun[o.Name] = now
			}
		}
		tl.mu.Unlock()
	}
}

// durations returns, for every reservation with both times, to - from;
// from "created" is when the reservation was first seen, or its pod when it
// has one and podFirst is set.
func (tl *timeline) durations(from, to string) []time.Duration {
	tl.mu.Lock()
	defer tl.mu.Unlock()
	pick := func(which, name string) (time.Time, bool) {
		var m map[string]time.Time
		switch which {
		case "pod":
			p, ok := tl.podOf[name]
			if !ok {
				return time.Time{}, false
			}
			v, ok := tl.podSeen[p]
			return v, ok
		case "running":
			p, ok := tl.podOf[name]
			if !ok {
				return time.Time{}, false
			}
			v, ok := tl.podRun[p]
			return v, ok
		case "seen":
			m = tl.seen
		case "reserved":
			m = tl.reserved
		case "active":
			m = tl.active
		}
		v, ok := m[name]
		return v, ok
	}
	var out []time.Duration
	names := make([]string, 0, len(tl.seen))
	for n := range tl.seen {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		a, ok1 := pick(from, n)
		b, ok2 := pick(to, n)
		if ok1 && ok2 {
			out = append(out, b.Sub(a))
		}
	}
	return out
}

// createdAt overrides when a reservation counts as created (the test's own
// clock just before its Create call, more precise than the watch).
func (tl *timeline) createdAt(name string, at time.Time) {
	tl.mu.Lock()
	tl.seen[name] = at
	tl.mu.Unlock()
}

// assertBrokerMatches checks that the broker holds exactly one live
// reservation per Reservation object (id = UID) and nothing else of rome's.
func assertBrokerMatches(t *testing.T, bed *testbed.Bed, items []rbv1.Reservation) {
	t.Helper()
	liveAtBroker, err := bed.Store.LiveReservations(context.Background(), "by-requester", "rome")
	require.NoError(t, err)
	got := make([]string, 0, len(liveAtBroker))
	for _, r := range liveAtBroker {
		got = append(got, r.ID)
	}
	want := make([]string, 0, len(items))
	for _, r := range items {
		want = append(want, string(r.UID))
		assert.Equal(t, string(r.UID), r.Status.ReservationID, "%s: broker id is the UID", r.Name)
	}
	sort.Strings(got)
	sort.Strings(want)
	assert.Equal(t, want, got, "one broker reservation per object, no more, no less")
}

// reservedAuditCount counts, per reservation id, the audit entries that
// locked capacity ("reserved"): more than one would mean a doubled decision.
func reservedAuditCount(t *testing.T, bed *testbed.Bed, ids map[string]bool) map[string]int {
	t.Helper()
	entries, err := bed.Audit(context.Background())
	require.NoError(t, err)
	out := map[string]int{}
	for _, e := range entries {
		if id := e.Fields["reservation"]; ids[id] && e.Fields["outcome"] == "reserved" {
			out[id]++
		}
	}
	return out
}
