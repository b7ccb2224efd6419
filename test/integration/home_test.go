package integration

import (
	"context"
	"fmt"
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
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/fluidos-project/resource-broker/agent/home"
	rbv1 "github.com/fluidos-project/resource-broker/api/v1alpha1"
	"github.com/fluidos-project/resource-broker/internal/testbed"
	"github.com/fluidos-project/resource-broker/plugins/resourcebroker"
)

// TestHome: borrowing is bursting, paid for only while home is full. On one
// real-node bed (rome's one node holds 1 CPU): a Deployment scaled in keeps
// its local pods and gives its borrowed ones back, and with the return-home
// policy a borrowed pod comes home once rome's node frees, replacement
// first, under a PodDisruptionBudget that allows no disruption.
func TestHome(t *testing.T) {
	bed := testbed.Start(t, testbed.Options{RealNodes: true, Clusters: []testbed.ClusterSpec{testbed.RealRome, testbed.RealParis, testbed.RealBerlin},
		// One move after the other within the test's time (default 2m).
		AgentArgs: func(string) []string { return []string{"--return-home-cooldown=3s"} }})
	t.Logf("home bed up in %s", bed.Timings["total"].Round(time.Millisecond))
	runScenarios(t, bed, []scenario{
		{"scale-in", testHomeScaleIn},
		{"return", testHomeReturn},
		{"preference", testHomePreference},
	})
}

// placedPods lists the pods of app in ns by where they run: rome's own
// nodes or virtual nodes (rb-<provider>), Running and Ready only.
func placedPods(t *testing.T, c *testbed.Cluster, ns, app string) (local, borrowed []corev1.Pod, all int) {
	var pods corev1.PodList
	require.NoError(t, c.Client.List(context.Background(), &pods, client.InNamespace(ns), client.MatchingLabels{"app": app}))
	for _, p := range pods.Items {
		if !p.DeletionTimestamp.IsZero() {
			continue
		}
		all++
		if p.Status.Phase != corev1.PodRunning || !podReady(&p) {
			continue
		}
		if strings.HasPrefix(p.Spec.NodeName, "rb-") {
			borrowed = append(borrowed, p)
		} else {
			local = append(local, p)
		}
	}
	return local, borrowed, all
}

func podNames(pods []corev1.Pod) []string {
	var out []string
	for _, p := range pods {
		out = append(out, p.Name)
	}
	sort.Strings(out)
	return out
}

// testHomeScaleIn: a Deployment of 4 pods of 400m in rome, whose node holds
// two: two run at home, two are borrowed (at paris, the cheapest), each
// ranked below the local ones by its deletion cost. Scaled to 2, the
// ReplicaSet controller removes the borrowed pods: the local two stay, the
// reservations end.
func testHomeScaleIn(t *testing.T, bed *testbed.Bed) {
	ctx := context.Background()
	rome := bed.Cluster("rome")
	base := baseline(t, bed)
	const ns = "home-scale"
	newNamespace(t, rome, ns)
	dep := appDeployment(ns, "web", 4, "400m", "128Mi")
	require.NoError(t, rome.Client.Create(ctx, dep))

	var local, borrowed []corev1.Pod
	eventually(t, 120*time.Second, "2 pods Ready at home and 2 borrowed", func() (bool, string) {
		var all int
		local, borrowed, all = placedPods(t, rome, ns, "web")
		ok := len(local) == 2 && len(borrowed) == 2
		var costs []string
		for _, p := range borrowed {
			ok = ok && p.Annotations[home.DeletionCostAnnotation] != ""
			costs = append(costs, fmt.Sprintf("%s: %q", p.Name, p.Annotations[home.DeletionCostAnnotation]))
		}
		return ok, fmt.Sprintf("%d pods: local %v, borrowed %v, deletion costs %v", all, podNames(local), podNames(borrowed), costs)
	})
	for _, p := range borrowed {
		cost, err := strconv.Atoi(p.Annotations[home.DeletionCostAnnotation])
		require.NoError(t, err)
		assert.Less(t, cost, 0, "%s on %s: deletion cost below a local pod's (0)", p.Name, p.Spec.NodeName)
		assert.Equal(t, "paris", p.Annotations[home.CostSetAnnotation])
	}
	for _, p := range local {
		assert.Empty(t, p.Annotations[home.DeletionCostAnnotation], "a local pod keeps the default deletion cost")
	}
	keep := podNames(local)

	require.NoError(t, rome.Client.Patch(ctx, &appsv1.Deployment{ObjectMeta: dep.ObjectMeta},
		client.RawPatch("application/merge-patch+json", []byte(`{"spec":{"replicas":2}}`))))
	eventually(t, 60*time.Second, "the Deployment scaled to 2, its local pods kept", func() (bool, string) {
		local, borrowed, all := placedPods(t, rome, ns, "web")
		return all == 2 && len(borrowed) == 0 && fmt.Sprint(podNames(local)) == fmt.Sprint(keep),
			fmt.Sprintf("%d pods: local %v (want %v), borrowed %v", all, podNames(local), keep, podNames(borrowed))
	})
	waitNoLive(t, bed, 60*time.Second)
	require.NoError(t, rome.Client.Delete(ctx, dep))
	waitNoPodOrReservation(t, rome, ns, 60*time.Second)
	backToBaseline(t, bed, base, 60*time.Second)
}

// testHomeReturn: rome's node is taken by a blocker; a Deployment web of two
// 400m pods, return-home policy WhenLocalFits in its namespace and a
// PodDisruptionBudget of maxUnavailable 0, is borrowed whole. The blocker
// goes: each web pod comes home, its replacement Ready at home before the
// borrowed pod goes, so that web never has fewer than two Ready pods, and
// nothing stays reserved.
func testHomeReturn(t *testing.T, bed *testbed.Bed) {
	ctx := context.Background()
	rome := bed.Cluster("rome")
	base := baseline(t, bed)
	const ns = "home-return"
	require.NoError(t, rome.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns,
		Annotations: map[string]string{home.PolicyAnnotation: home.PolicyWhenLocalFits}}}))
	t.Cleanup(func() {
		_ = rome.Client.Delete(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})
	})

	blocker := appDeployment(ns, "blocker", 1, "700m", "128Mi")
	require.NoError(t, rome.Client.Create(ctx, blocker))
	eventually(t, 60*time.Second, "the blocker Ready at home", func() (bool, string) {
		local, _, all := placedPods(t, rome, ns, "blocker")
		return len(local) == 1, fmt.Sprintf("%d pods, %d local Ready", all, len(local))
	})
	require.NoError(t, rome.Client.Create(ctx, &policyv1.PodDisruptionBudget{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "web"},
		Spec: policyv1.PodDisruptionBudgetSpec{MaxUnavailable: ptr.To(intstr.FromInt32(0)),
			Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "web"}}}}))
	web := appDeployment(ns, "web", 2, "400m", "128Mi")
	require.NoError(t, rome.Client.Create(ctx, web))
	eventually(t, 120*time.Second, "web's 2 pods Ready, borrowed", func() (bool, string) {
		local, borrowed, all := placedPods(t, rome, ns, "web")
		return len(borrowed) == 2, fmt.Sprintf("%d pods: local %v, borrowed %v", all, podNames(local), podNames(borrowed))
	})

	// From here on, web's Ready pods are counted at every change.
	ready := watchReady(t, rome, ns, "web")
	freed := time.Now()
	require.NoError(t, rome.Client.Delete(ctx, blocker))
	eventually(t, 120*time.Second, "web's 2 pods Ready at home, none borrowed", func() (bool, string) {
		local, borrowed, all := placedPods(t, rome, ns, "web")
		return len(local) == 2 && len(borrowed) == 0 && all == 2,
			fmt.Sprintf("%d pods: local %v, borrowed %v", all, podNames(local), podNames(borrowed))
	})
	took := time.Since(freed)
	least, most := ready.stop()
	assert.GreaterOrEqual(t, least, 2, "web never had fewer than 2 Ready pods (the PodDisruptionBudget's maxUnavailable 0)")
	assert.Equal(t, 3, most, "each replacement Ready beside the two pods before a borrowed one went")
	// The move ends with a write after the scale back.
	eventually(t, 15*time.Second, "web back at 2 replicas, no move left", func() (bool, string) {
		var d appsv1.Deployment
		require.NoError(t, rome.Client.Get(ctx, client.ObjectKeyFromObject(web), &d))
		return *d.Spec.Replicas == 2 && d.Annotations[home.MoveAnnotation] == "",
			fmt.Sprintf("replicas %d, move %q", *d.Spec.Replicas, d.Annotations[home.MoveAnnotation])
	})
	// Events are recorded asynchronously: the second may trail its move.
	eventually(t, 15*time.Second, "one "+home.EventMoved+" event per pod", func() (bool, string) {
		var events corev1.EventList
		require.NoError(t, rome.Client.List(ctx, &events, client.InNamespace(ns)))
		var moved []string
		for _, e := range events.Items {
			if e.Reason == home.EventMoved {
				moved = append(moved, e.InvolvedObject.Name)
			}
		}
		return len(moved) == 2 && moved[0] != moved[1], fmt.Sprintf("%s on %v", home.EventMoved, moved)
	})
	figure(t, "blocker deleted -> both borrowed pods home %s, Ready pods between %d and %d", took.Round(time.Millisecond), least, most)

	waitNoLive(t, bed, 60*time.Second)
	require.NoError(t, rome.Client.Delete(ctx, web))
	waitNoPodOrReservation(t, rome, ns, 60*time.Second)
	backToBaseline(t, bed, base, 60*time.Second)
}

// readyCount follows the number of Ready pods of an app.
type readyCount struct {
	mu          sync.Mutex
	least, most int
	w           watch.Interface
	done        chan struct{}
}

func watchReady(t *testing.T, c *testbed.Cluster, ns, app string) *readyCount {
	ctx := context.Background()
	sel := metav1.ListOptions{LabelSelector: "app=" + app}
	list, err := c.Clientset.CoreV1().Pods(ns).List(ctx, sel)
	require.NoError(t, err)
	ready := map[string]bool{}
	count := func() int {
		n := 0
		for _, r := range ready {
			if r {
				n++
			}
		}
		return n
	}
	for i := range list.Items {
		p := &list.Items[i]
		ready[p.Name] = p.DeletionTimestamp.IsZero() && podReady(p)
	}
	sel.ResourceVersion = list.ResourceVersion
	w, err := c.Clientset.CoreV1().Pods(ns).Watch(ctx, sel)
	require.NoError(t, err)
	rc := &readyCount{least: count(), most: count(), w: w, done: make(chan struct{})}
	go func() {
		defer close(rc.done)
		for ev := range w.ResultChan() {
			p, ok := ev.Object.(*corev1.Pod)
			if !ok {
				continue
			}
			ready[p.Name] = ev.Type != watch.Deleted && p.DeletionTimestamp.IsZero() && podReady(p)
			n := count()
			rc.mu.Lock()
			rc.least, rc.most = min(rc.least, n), max(rc.most, n)
			rc.mu.Unlock()
		}
	}()
	return rc
}

// stop ends the watch and returns the least and most Ready pods seen.
func (rc *readyCount) stop() (int, int) {
	rc.w.Stop()
	<-rc.done
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return rc.least, rc.most
}

// testHomePreference: a pod of 1500m (never at home) that prefers berlin
// (broker.fluidos.eu/provider In [berlin], its preferred node affinity)
// while paris, cheaper, fits too: berlin wins, and the broker's audit says
// it was the pod's first preference term.
func testHomePreference(t *testing.T, bed *testbed.Bed) {
	ctx := context.Background()
	rome := bed.Cluster("rome")
	base := baseline(t, bed)
	const ns = "home-pref"
	newNamespace(t, rome, ns)
	dep := appDeployment(ns, "pref", 1, "1500m", "128Mi")
	dep.Spec.Template.Spec.Affinity = &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{
		PreferredDuringSchedulingIgnoredDuringExecution: []corev1.PreferredSchedulingTerm{{Weight: 50, Preference: corev1.NodeSelectorTerm{
			MatchExpressions: []corev1.NodeSelectorRequirement{{Key: rbv1.ProviderLabel, Operator: corev1.NodeSelectorOpIn, Values: []string{"berlin"}}}}}}}}
	require.NoError(t, rome.Client.Create(ctx, dep))
	var borrowed []corev1.Pod
	eventually(t, 120*time.Second, "the pod Ready on a virtual node", func() (bool, string) {
		var all int
		_, borrowed, all = placedPods(t, rome, ns, "pref")
		return len(borrowed) == 1, fmt.Sprintf("%d pods", all)
	})
	assert.Equal(t, "rb-berlin", borrowed[0].Spec.NodeName, "the preferred provider, though paris is cheaper and fits")

	rsvs := reservations(t, rome, ns)
	require.Len(t, rsvs, 1)
	require.Len(t, rsvs[0].Spec.ProviderPreferences, 1, "the pod's preferred node affinity carried to the reservation")
	entries, err := bed.Audit(ctx)
	require.NoError(t, err)
	found := false
	for _, e := range entries {
		if e.Fields["reservation"] == rsvs[0].Status.ReservationID && e.Fields["outcome"] == "reserved" {
			found = true
			assert.Equal(t, "0", e.Fields["preference"], "placed among the first term's providers: %v", e.Fields)
			assert.Equal(t, "berlin", e.Fields["winner"], "%v", e.Fields)
		}
	}
	assert.True(t, found, "the decision in the audit")

	require.NoError(t, rome.Client.Delete(ctx, dep))
	waitNoPodOrReservation(t, rome, ns, 60*time.Second)

	// The namespace's preferences, for pods that state none.
	var nsObj corev1.Namespace
	require.NoError(t, rome.Client.Get(ctx, client.ObjectKey{Name: ns}, &nsObj))
	nsObj.Annotations = map[string]string{resourcebroker.PreferencesAnnotation: `[{"weight":10,"clusters":["berlin"]}]`}
	require.NoError(t, rome.Client.Update(ctx, &nsObj))
	plain := appDeployment(ns, "plain", 1, "1500m", "128Mi")
	require.NoError(t, rome.Client.Create(ctx, plain))
	eventually(t, 120*time.Second, "the plain pod Ready on a virtual node", func() (bool, string) {
		var all int
		_, borrowed, all = placedPods(t, rome, ns, "plain")
		return len(borrowed) == 1, fmt.Sprintf("%d pods", all)
	})
	assert.Equal(t, "rb-berlin", borrowed[0].Spec.NodeName, "the namespace's preferred provider")
	rsvs = reservations(t, rome, ns)
	require.Len(t, rsvs, 1)
	assert.Equal(t, []rbv1.ProviderPreference{{Weight: 10, Clusters: []string{"berlin"}}}, rsvs[0].Spec.ProviderPreferences)
	require.NoError(t, rome.Client.Delete(ctx, plain))
	waitNoPodOrReservation(t, rome, ns, 60*time.Second)
	backToBaseline(t, bed, base, 60*time.Second)
}
