package integration

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/fluidos-project/resource-broker/agent/bridge/virtualkubelet"
	rbv1 "github.com/fluidos-project/resource-broker/api/v1alpha1"
	"github.com/fluidos-project/resource-broker/broker/api"
	"github.com/fluidos-project/resource-broker/internal/testbed"
	"github.com/fluidos-project/resource-broker/internal/testimages"
)

// The lost-provider bed: rome probes its providers every second, keeps a
// silent one Ready for lostGrace and replaces its pods lostReplaceAfter
// after its last answer (the agent's defaults are 40 s and 2 min).
const (
	lostProbe        = time.Second
	lostGrace        = 6 * time.Second
	lostReplaceAfter = 20 * time.Second
)

// TestFaultsProviderLost: paris (API server and agent) frozen with three
// borrowed pods of a Deployment and one of a StatefulSet on it; berlin is
// the other provider. rb-paris reads Ready=Unknown with the unreachable
// taints after the grace; the Deployment's pods are deleted at the bound and
// their replacements run on berlin (the broker, to which paris is stale,
// never offers paris); the StatefulSet's pod stays, never twice. paris
// thawed: rb-paris is Ready and untainted, the copies whose pods were
// replaced are deleted, and the broker's and paris's numbers are exactly
// what is live.
func TestFaultsProviderLost(t *testing.T) {
	ports, err := testbed.FreePorts(1)
	require.NoError(t, err)
	metricsAddr := "127.0.0.1:" + strconv.Itoa(ports[0])
	bed := testbed.Start(t, testbed.Options{RealNodes: true,
		Clusters: []testbed.ClusterSpec{testbed.RealRome, testbed.RealParis, testbed.RealBerlin},
		AgentArgs: func(cluster string) []string {
			args := []string{"--provider-probe-period=" + lostProbe.String(), "--provider-lost-grace=" + lostGrace.String(),
				"--provider-lost-replace-after=" + lostReplaceAfter.String()}
			if cluster == "rome" {
				args = append(args, "--metrics-bind-address="+metricsAddr, "--metrics-secure=false")
			}
			return args
		},
	})
	ctx := context.Background()
	rome, paris, berlin := bed.Cluster("rome"), bed.Cluster("paris"), bed.Cluster("berlin")
	base := baseline(t, bed)
	const ns = "faults"
	newNamespace(t, rome, ns)
	bc, err := rome.BrokerClient()
	require.NoError(t, err)

	// 1.2-CPU pods: none fits rome's 1-CPU node; paris (4 and 2 CPU,
	// cheapest) takes the four, berlin (4 and 2 CPU) the three replacements.
	dep := appDeployment(ns, "web", 3, "1200m", "256Mi")
	require.NoError(t, rome.Client.Create(ctx, dep))
	web := waitAppPods(t, rome, ns, "web", 3, "rb-paris", 120*time.Second)
	// A StatefulSet's pod: it must never run twice.
	sts := statefulSet(ns, "db", "1200m", "256Mi")
	require.NoError(t, rome.Client.Create(ctx, sts))
	db := waitAppPods(t, rome, ns, "db", 1, "rb-paris", 120*time.Second)[0]
	copiesBefore := copiesAt(t, paris)
	require.Len(t, copiesBefore, 4, "four copies at paris")

	frozen := time.Now()
	require.NoError(t, paris.Freeze())
	t.Cleanup(func() {
		if paris.Frozen() {
			_ = paris.Thaw()
		}
	})

	// Ready for the grace, then Unknown and tainted unreachable.
	var vnode corev1.Node
	eventually(t, lostGrace+30*time.Second, "rb-paris Ready=Unknown", func() (bool, string) {
		require.NoError(t, rome.Client.Get(ctx, client.ObjectKey{Name: "rb-paris"}, &vnode))
		c := nodeCondition(&vnode, corev1.NodeReady)
		return c.Status == corev1.ConditionUnknown, fmt.Sprintf("%s %s: %s", c.Status, c.Reason, c.Message)
	})
	lostAfter := time.Since(frozen)
	ready := nodeCondition(&vnode, corev1.NodeReady)
	assert.Equal(t, virtualkubelet.ReasonUnreachable, ready.Reason)
	assert.Contains(t, ready.Message, "paris's API server")
	assert.Contains(t, ready.Message, "has not answered since")
	// The last answer came at most a probe (and its timeout) before the freeze.
	assert.GreaterOrEqual(t, lostAfter, lostGrace-2*lostProbe, "rb-paris stays Ready for the grace")
	eventually(t, 10*time.Second, "rb-paris tainted unreachable", func() (bool, string) {
		require.NoError(t, rome.Client.Get(ctx, client.ObjectKey{Name: "rb-paris"}, &vnode))
		return hasTaint(&vnode, corev1.TaintNodeUnreachable, corev1.TaintEffectNoSchedule) &&
			hasTaint(&vnode, corev1.TaintNodeUnreachable, corev1.TaintEffectNoExecute), fmt.Sprint(vnode.Spec.Taints)
	})
	assert.True(t, hasTaint(&vnode, rbv1.VirtualNodeTaint, corev1.TaintEffectNoSchedule), "the broker's taint stays: %v", vnode.Spec.Taints)

	// Replaced at the bound, on berlin.
	var moved []corev1.Pod
	eventually(t, lostReplaceAfter+90*time.Second, "three web pods Running and Ready on rb-berlin", func() (bool, string) {
		var ok bool
		var state string
		moved, ok, state = appPodsOn(t, rome, ns, "web", 3, "rb-berlin")
		return ok, state
	})
	replacedAfter := time.Since(frozen)
	for _, p := range web {
		err := rome.Client.Get(ctx, client.ObjectKeyFromObject(&p), &corev1.Pod{})
		assert.True(t, apierrors.IsNotFound(err), "pod %s on the lost provider is gone: %v", p.Name, err)
	}
	firstNew := time.Time{}
	for _, p := range moved {
		if firstNew.IsZero() || p.CreationTimestamp.Time.Before(firstNew) {
			firstNew = p.CreationTimestamp.Time
		}
	}
	// Seconds precision; the last answer came at most a probe before the freeze.
	assert.GreaterOrEqual(t, firstNew.Sub(frozen.Truncate(time.Second)), lostReplaceAfter-2*lostProbe, "not replaced before the bound")
	assert.Less(t, firstNew.Sub(frozen), lostReplaceAfter+10*time.Second, "replaced at the bound (%s)", lostReplaceAfter)
	assertEvent(t, rome, ns, virtualkubelet.EventPodReplaced, "paris has not answered since", web[0].Name)
	assertEvent(t, rome, "default", virtualkubelet.EventProviderLost, "paris has not answered since", "rb-paris")

	// Their reservations: the old ones ended, the new ones on berlin, where
	// the broker, to which paris is stale, did not even consider paris.
	paris1, err := bc.Cluster(ctx, "paris")
	require.NoError(t, err)
	assert.False(t, paris1.Live, "paris (its agent frozen) is stale at the broker")
	for _, p := range moved {
		r := reservationOfPod(t, rome, &p)
		require.NotNil(t, r, "pod %s has a Reservation", p.Name)
		assert.Equal(t, "berlin", r.Status.Provider, "%s", p.Name)
		at, err := bc.Reservation(ctx, r.Status.ReservationID)
		require.NoError(t, err)
		assert.Equal(t, "berlin", at.Provider)
		for _, c := range at.Candidates {
			assert.NotEqual(t, "paris", c.Cluster, "paris is no candidate while stale (%s)", p.Name)
		}
	}
	// The StatefulSet's pod stays: the same pod, on rb-paris, alone.
	var dbNow corev1.Pod
	require.NoError(t, rome.Client.Get(ctx, client.ObjectKeyFromObject(&db), &dbNow))
	assert.Equal(t, db.UID, dbNow.UID, "the StatefulSet's pod is not replaced")
	assert.Nil(t, dbNow.DeletionTimestamp, "nor deleted")
	assert.Equal(t, "rb-paris", dbNow.Spec.NodeName)
	assert.Len(t, podsOfApp(t, rome, ns, "db"), 1, "one pod of the StatefulSet")
	assertEvent(t, rome, ns, virtualkubelet.EventPodKept, "owned by StatefulSet db", db.Name)
	assert.Equal(t, 3.0, scrapeCounter(t, metricsAddr, `rb_agent_lost_provider_pods_replaced_total{provider="paris"}`))

	thawed := time.Now()
	require.NoError(t, paris.Thaw())
	eventually(t, 60*time.Second, "rb-paris Ready and untainted", func() (bool, string) {
		require.NoError(t, rome.Client.Get(ctx, client.ObjectKey{Name: "rb-paris"}, &vnode))
		c := nodeCondition(&vnode, corev1.NodeReady)
		return c.Status == corev1.ConditionTrue && !hasTaint(&vnode, corev1.TaintNodeUnreachable, corev1.TaintEffectNoSchedule) &&
			!hasTaint(&vnode, corev1.TaintNodeUnreachable, corev1.TaintEffectNoExecute), fmt.Sprintf("%s %s, %v", c.Status, c.Reason, vnode.Spec.Taints)
	})
	backAfter := time.Since(thawed)
	eventually(t, 90*time.Second, "the replaced pods' copies deleted at paris", func() (bool, string) {
		left := copiesAt(t, paris)
		return len(left) == 1 && left[0].Labels["app"] == "db", fmt.Sprintf("%d copies: %v", len(left), names(left))
	})
	orphansAfter := time.Since(thawed)
	eventually(t, 60*time.Second, "the StatefulSet's pod Ready again, the same", func() (bool, string) {
		require.NoError(t, rome.Client.Get(ctx, client.ObjectKeyFromObject(&db), &dbNow))
		return dbNow.UID == db.UID && podReady(&dbNow), podCondition(&dbNow)
	})
	assertEvent(t, rome, "default", virtualkubelet.EventProviderReturned, "paris answers again", "rb-paris")

	// Every counter exact: what the broker holds on paris is the
	// StatefulSet pod's reservation, and so is paris's tenant quota.
	dbRsv := reservationOfPod(t, rome, &dbNow)
	require.NotNil(t, dbRsv)
	eventually(t, 60*time.Second, "the broker's and paris's numbers are what is live", func() (bool, string) {
		return liveOnProviderExact(t, bc, paris, map[string]string{dbRsv.Status.ReservationID: "paris"})
	})
	onBerlin := map[string]string{}
	for _, p := range moved {
		r := reservationOfPod(t, rome, &p)
		require.NotNil(t, r)
		onBerlin[r.Status.ReservationID] = "berlin"
	}
	eventually(t, 60*time.Second, "the broker's and berlin's numbers are what is live", func() (bool, string) {
		return liveOnProviderExact(t, bc, berlin, onBerlin)
	})
	// Thawed, paris's node lifecycle controller finds every node's heartbeat
	// old and marks them NotReady until their kubelets report again: for a
	// moment paris advertises less than the broker holds there (overbooked
	// by its own advertisement, not by a decision). The books must be clean
	// once its nodes count again.
	eventually(t, 30*time.Second, "the invariants", func() (bool, string) {
		err := bed.Store.CheckInvariant(ctx)
		return err == nil, fmt.Sprint(err)
	})
	figure(t, "paris frozen -> rb-paris Unknown %s (grace %s); replacements Running on berlin %s (bound %s); thawed -> rb-paris Ready %s, orphaned copies deleted %s",
		lostAfter.Round(100*time.Millisecond), lostGrace, replacedAfter.Round(100*time.Millisecond), lostReplaceAfter,
		backAfter.Round(100*time.Millisecond), orphansAfter.Round(100*time.Millisecond))

	require.NoError(t, rome.Client.Delete(ctx, dep))
	require.NoError(t, rome.Client.Delete(ctx, sts))
	waitNoPodOrReservation(t, rome, ns, 90*time.Second)
	waitTenantGone(t, paris, 60*time.Second)
	waitTenantGone(t, berlin, 60*time.Second)
	backToBaseline(t, bed, base, 60*time.Second)
}

// TestFaultsGlitch: brief faults change nothing. paris (API server and
// agent) frozen for 20 s, less than rome's grace (40 s, the default); then
// rome's agent restarted, paris's agent restarted, the brokers restarted
// one after the other. Throughout: the same pods (UIDs), no container
// restarted, no readiness change of the pods in rome, rb-paris Ready and
// untainted.
func TestFaultsGlitch(t *testing.T) {
	const grace = 40 * time.Second
	bed := testbed.Start(t, testbed.Options{RealNodes: true,
		Clusters: []testbed.ClusterSpec{testbed.RealRome, testbed.RealParis},
		// Kubernetes' default (50 s): paris's node lifecycle controller
		// does not take its own nodes for lost while its API server is
		// frozen for less.
		NodeMonitorGracePeriod: 50 * time.Second,
		AgentArgs: func(string) []string {
			return []string{"--provider-probe-period=" + lostProbe.String(), "--provider-lost-grace=" + grace.String()}
		},
	})
	ctx := context.Background()
	rome, paris := bed.Cluster("rome"), bed.Cluster("paris")
	base := baseline(t, bed)
	const ns = "glitch"
	newNamespace(t, rome, ns)
	dep := appDeployment(ns, "web", 3, "1500m", "256Mi")
	require.NoError(t, rome.Client.Create(ctx, dep))
	pods := waitAppPods(t, rome, ns, "web", 3, "rb-paris", 120*time.Second)
	w := watchFlaps(t, rome, ns, "rb-paris", pods)
	bc, err := rome.BrokerClient()
	require.NoError(t, err)
	roundTrips := 0
	// reaches proves that rome's bridge writes to paris again: a new
	// annotation on a pod in rome reaches its copy.
	reaches := func(what string) {
		roundTrips++
		value := strconv.Itoa(roundTrips)
		p := pods[roundTrips%len(pods)]
		patch := fmt.Sprintf(`{"metadata":{"annotations":{"glitch":%q}}}`, value)
		require.NoError(t, rome.Client.Patch(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: p.Name}},
			client.RawPatch(types.MergePatchType, []byte(patch))))
		eventually(t, 60*time.Second, what+": an annotation of "+p.Name+" reaches its copy at paris", func() (bool, string) {
			var cp corev1.Pod
			err := paris.Client.Get(ctx, client.ObjectKey{Namespace: "rb-rome", Name: virtualkubelet.RemoteName(ns, p.Name)}, &cp)
			return err == nil && cp.Annotations["glitch"] == value, fmt.Sprintf("%v %q", err, cp.Annotations["glitch"])
		})
	}

	t.Run("provider frozen for less than the grace", func(t *testing.T) {
		frozen := time.Now()
		require.NoError(t, paris.Freeze())
		t.Cleanup(func() {
			if paris.Frozen() {
				_ = paris.Thaw()
			}
		})
		eventually(t, 15*time.Second, "paris stale at the broker", func() (bool, string) {
			c, err := bc.Cluster(ctx, "paris")
			return err == nil && !c.Live, fmt.Sprint(err)
		})
		rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		err := paris.Clientset.CoreV1().RESTClient().Get().AbsPath("/readyz").Do(rctx).Error()
		cancel()
		require.Error(t, err, "paris's API server answers nothing while frozen")
		time.Sleep(20*time.Second - time.Since(frozen)) // the fault's length
		require.NoError(t, paris.Thaw())
		thawed := time.Now()
		eventually(t, 30*time.Second, "paris live at the broker again", func() (bool, string) {
			c, err := bc.Cluster(ctx, "paris")
			return err == nil && c.Live, fmt.Sprint(err)
		})
		reaches("thawed")
		writes := time.Since(thawed)
		// Past the moment a grace counted from the last answer before the
		// freeze would have run out: the probes after the thaw reset it.
		w.until(t, frozen.Add(grace+3*lostProbe))
		w.assertQuiet(t)
		figure(t, "paris frozen %s (grace %s): rb-paris and the pods unchanged; the bridge writes to paris again %s after the thaw",
			thawed.Sub(frozen).Round(100*time.Millisecond), grace, writes.Round(100*time.Millisecond))
	})

	t.Run("requester's agent restarted", func(t *testing.T) {
		require.NoError(t, rome.StopAgent())
		require.NoError(t, rome.StartAgent(ctx))
		reaches("rome's agent restarted")
		w.assertQuiet(t)
	})

	t.Run("provider's agent restarted", func(t *testing.T) {
		require.NoError(t, paris.StopAgent())
		require.NoError(t, paris.StartAgent(ctx))
		reaches("paris's agent restarted")
		w.assertQuiet(t)
	})

	t.Run("brokers restarted one after the other", func(t *testing.T) {
		for _, br := range bed.Brokers {
			require.NoError(t, br.Stop(15*time.Second))
			require.NoError(t, br.Restart(ctx))
		}
		reaches("brokers restarted")
		eventually(t, 30*time.Second, "both agents advertise again", func() (bool, string) {
			for _, id := range []string{"rome", "paris"} {
				c, err := bc.Cluster(ctx, id)
				if err != nil || !c.Live {
					return false, fmt.Sprintf("%s: %v", id, err)
				}
			}
			return true, ""
		})
		w.assertQuiet(t)
	})

	w.close()
	require.NoError(t, rome.Client.Delete(ctx, dep))
	waitNoPodOrReservation(t, rome, ns, 60*time.Second)
	waitTenantGone(t, paris, 60*time.Second)
	backToBaseline(t, bed, base, 60*time.Second)
}

// statefulSet is a StatefulSet of one pause pod for rb-scheduler.
func statefulSet(ns, name, cpu, memory string) *appsv1.StatefulSet {
	labels := map[string]string{"app": name}
	return &appsv1.StatefulSet{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: appsv1.StatefulSetSpec{
			Replicas: ptr.To[int32](1), ServiceName: name,
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{
					SchedulerName:                 "resource-broker",
					TerminationGracePeriodSeconds: ptr.To[int64](5),
					Containers: []corev1.Container{{Name: "main", Image: testimages.Pause, ImagePullPolicy: corev1.PullIfNotPresent,
						Resources: corev1.ResourceRequirements{Requests: requests(cpu, memory)}}},
				},
			},
		},
	}
}

// podsOfApp lists the pods of a namespace labelled app=name.
func podsOfApp(t *testing.T, c *testbed.Cluster, ns, app string) []corev1.Pod {
	t.Helper()
	var l corev1.PodList
	require.NoError(t, c.Client.List(context.Background(), &l, client.InNamespace(ns), client.MatchingLabels{"app": app}))
	return l.Items
}

// appPodsOn tells whether exactly n pods of app exist, all Running and
// Ready on node, and none being deleted.
func appPodsOn(t *testing.T, c *testbed.Cluster, ns, app string, n int, node string) ([]corev1.Pod, bool, string) {
	t.Helper()
	pods := podsOfApp(t, c, ns, app)
	good := 0
	var state []string
	for _, p := range pods {
		if p.Spec.NodeName == node && p.Status.Phase == corev1.PodRunning && podReady(&p) && p.DeletionTimestamp == nil {
			good++
		}
		state = append(state, fmt.Sprintf("%s %s on %q ready=%v", p.Name, p.Status.Phase, p.Spec.NodeName, podReady(&p)))
	}
	return pods, len(pods) == n && good == n, strings.Join(state, "; ")
}

func waitAppPods(t *testing.T, c *testbed.Cluster, ns, app string, n int, node string, timeout time.Duration) []corev1.Pod {
	t.Helper()
	var pods []corev1.Pod
	eventually(t, timeout, fmt.Sprintf("%d %s pods Running and Ready on %s", n, app, node), func() (bool, string) {
		var ok bool
		var state string
		pods, ok, state = appPodsOn(t, c, ns, app, n, node)
		return ok, state
	})
	return pods
}

// copiesAt lists the copies of rome's pods at a provider, but those being deleted.
func copiesAt(t *testing.T, c *testbed.Cluster) []corev1.Pod {
	t.Helper()
	var l corev1.PodList
	require.NoError(t, c.Client.List(context.Background(), &l, client.InNamespace("rb-rome"), client.MatchingLabels{rbv1.RequesterLabel: "rome"}))
	var out []corev1.Pod
	for _, p := range l.Items {
		if p.Labels["broker.fluidos.eu/role"] != "placeholder" {
			out = append(out, p)
		}
	}
	return out
}

func names(pods []corev1.Pod) []string {
	var out []string
	for _, p := range pods {
		s := p.Name
		if p.DeletionTimestamp != nil {
			s += " (terminating)"
		}
		out = append(out, s)
	}
	return out
}

func nodeCondition(n *corev1.Node, t corev1.NodeConditionType) corev1.NodeCondition {
	for _, c := range n.Status.Conditions {
		if c.Type == t {
			return c
		}
	}
	return corev1.NodeCondition{}
}

func hasTaint(n *corev1.Node, key string, effect corev1.TaintEffect) bool {
	return slices.ContainsFunc(n.Spec.Taints, func(t corev1.Taint) bool { return t.Key == key && t.Effect == effect })
}

// reservationOfPod finds the Reservation the scheduler made for a pod (nil if none).
func reservationOfPod(t *testing.T, c *testbed.Cluster, p *corev1.Pod) *rbv1.Reservation {
	t.Helper()
	for _, r := range reservations(t, c, p.Namespace) {
		if r.Spec.PodName == p.Name && metav1.IsControlledBy(&r, p) {
			return &r
		}
	}
	return nil
}

// assertEvent checks that an Event of reason about object name in ns says msg.
func assertEvent(t *testing.T, c *testbed.Cluster, ns, reason, msg, name string) {
	t.Helper()
	var evs corev1.EventList
	eventually(t, 10*time.Second, fmt.Sprintf("Event %s about %s", reason, name), func() (bool, string) {
		require.NoError(t, c.Client.List(context.Background(), &evs, client.InNamespace(ns)))
		var seen []string
		for _, e := range evs.Items {
			if e.Reason == reason && e.InvolvedObject.Name == name && strings.Contains(e.Message, msg) {
				return true, ""
			}
			if e.Reason == reason {
				seen = append(seen, e.InvolvedObject.Name+": "+e.Message)
			}
		}
		return false, strings.Join(seen, "; ")
	})
}

// scrapeCounter reads one sample of the agent's plain-HTTP /metrics.
func scrapeCounter(t *testing.T, addr, series string) float64 {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	for _, line := range strings.Split(string(body), "\n") {
		if v, ok := strings.CutPrefix(line, series+" "); ok {
			f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
			require.NoError(t, err)
			return f
		}
	}
	t.Fatalf("no %s in the agent's metrics", series)
	return 0
}

// liveOnProviderExact tells whether what the broker holds on provider is
// exactly want (reservation id -> provider, of rome's live reservations on
// it): the same ids, its reserved amounts their sum, and the provider's
// tenant quota for rome that sum too.
func liveOnProviderExact(t *testing.T, bc interface {
	Reservations(context.Context, string) ([]api.Reservation, error)
	Cluster(context.Context, string) (api.Cluster, error)
}, provider *testbed.Cluster, want map[string]string) (bool, string) {
	t.Helper()
	ctx := context.Background()
	all, err := bc.Reservations(ctx, "requester")
	if err != nil {
		return false, err.Error()
	}
	var ids []string
	cpu, mem := resource.Quantity{}, resource.Quantity{}
	for _, r := range all {
		if r.Provider != provider.Name {
			continue
		}
		ids = append(ids, r.ID)
		cpu.Add(*r.Resources.CPU)
		mem.Add(*r.Resources.Memory)
	}
	sort.Strings(ids)
	var wantIDs []string
	for id, p := range want {
		if p == provider.Name {
			wantIDs = append(wantIDs, id)
		}
	}
	sort.Strings(wantIDs)
	if !slices.Equal(ids, wantIDs) {
		return false, fmt.Sprintf("live on %s: %v, want %v", provider.Name, ids, wantIDs)
	}
	c, err := bc.Cluster(ctx, provider.Name)
	if err != nil {
		return false, err.Error()
	}
	got := c.Resources.Reserved
	if got == nil || got.CPU == nil || got.CPU.Cmp(cpu) != 0 || got.Memory == nil || got.Memory.Cmp(mem) != 0 {
		return false, fmt.Sprintf("%s reserved at the broker %+v, want cpu %s memory %s", provider.Name, got, cpu.String(), mem.String())
	}
	if q, err := resource.ParseQuantity(tenantQuotaCPU(t, provider)); err != nil || q.Cmp(cpu) != 0 {
		return false, fmt.Sprintf("%s's tenant quota requests.cpu %s, want %s", provider.Name, tenantQuotaCPU(t, provider), cpu.String())
	}
	if n := len(providerInstructions(t, provider)); n != len(wantIDs) {
		return false, fmt.Sprintf("%s: %d ProviderInstructions, want %d", provider.Name, n, len(wantIDs))
	}
	return true, ""
}

// flapWatch records, from watches, every change that a brief fault must not
// make: a pod of the namespace deleted or added, its phase, reason, Ready
// condition or a container's restart count changed, the node not Ready or
// tainted unreachable.
type flapWatch struct {
	mu      sync.Mutex
	changes []string
	last    time.Time // of the last event seen
	stops   []func()
}

func watchFlaps(t *testing.T, c *testbed.Cluster, ns, node string, pods []corev1.Pod) *flapWatch {
	t.Helper()
	w := &flapWatch{}
	wc, err := client.NewWithWatch(c.Config, client.Options{Scheme: testbed.Scheme})
	require.NoError(t, err)
	ctx := context.Background()
	pw, err := wc.Watch(ctx, &corev1.PodList{}, client.InNamespace(ns))
	require.NoError(t, err)
	nw, err := wc.Watch(ctx, &corev1.NodeList{}, client.MatchingFields{"metadata.name": node})
	require.NoError(t, err)
	w.stops = []func(){pw.Stop, nw.Stop}
	known := map[types.UID]corev1.Pod{}
	for _, p := range pods {
		known[p.UID] = p
	}
	go func() {
		for ev := range pw.ResultChan() {
			p, ok := ev.Object.(*corev1.Pod)
			if !ok {
				continue
			}
			before, seen := known[p.UID]
			switch {
			case !seen:
				w.note("pod %s (%s) appeared", p.Name, ev.Type)
			case ev.Type == watch.Deleted || p.DeletionTimestamp != nil:
				w.note("pod %s deleted", p.Name)
			case podReady(&before) != podReady(p):
				w.note("pod %s Ready %v -> %v", p.Name, podReady(&before), podReady(p))
			case before.Status.Phase != p.Status.Phase || before.Status.Reason != p.Status.Reason:
				w.note("pod %s %s %s -> %s %s: %s", p.Name, before.Status.Phase, before.Status.Reason, p.Status.Phase, p.Status.Reason, p.Status.Message)
			case restarts(&before) != restarts(p):
				w.note("pod %s restarts %d -> %d", p.Name, restarts(&before), restarts(p))
			default:
				w.note("")
			}
			known[p.UID] = *p
		}
	}()
	go func() {
		for ev := range nw.ResultChan() {
			n, ok := ev.Object.(*corev1.Node)
			if !ok {
				continue
			}
			r := nodeCondition(n, corev1.NodeReady)
			switch {
			case r.Status != corev1.ConditionTrue:
				w.note("%s Ready=%s %s: %s", n.Name, r.Status, r.Reason, r.Message)
			case hasTaint(n, corev1.TaintNodeUnreachable, corev1.TaintEffectNoSchedule) || hasTaint(n, corev1.TaintNodeNotReady, corev1.TaintEffectNoSchedule):
				w.note("%s tainted %v", n.Name, n.Spec.Taints)
			default:
				w.note("")
			}
		}
	}()
	t.Cleanup(w.close)
	return w
}

func restarts(p *corev1.Pod) int32 {
	var n int32
	for _, s := range p.Status.ContainerStatuses {
		n += s.RestartCount
	}
	return n
}

func (w *flapWatch) note(format string, args ...any) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.last = time.Now()
	if format != "" {
		w.changes = append(w.changes, time.Now().Format("15:04:05.000 ")+fmt.Sprintf(format, args...))
	}
}

// until waits (observing) until at.
func (w *flapWatch) until(t *testing.T, at time.Time) {
	t.Helper()
	if d := time.Until(at); d > 0 {
		t.Logf("observing until %s (%s)", at.Format("15:04:05"), d.Round(100*time.Millisecond))
		time.Sleep(d)
	}
}

func (w *flapWatch) assertQuiet(t *testing.T) {
	t.Helper()
	w.mu.Lock()
	defer w.mu.Unlock()
	assert.Empty(t, w.changes, "no pod or node change")
}

func (w *flapWatch) close() {
	for _, s := range w.stops {
		s()
	}
	w.stops = nil
}
