package collector

import (
	"fmt"
	"math/rand/v2"
	"runtime"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	rbv1 "github.com/fluidos-project/resource-broker/api/v1alpha1"
)

func list(kv ...string) corev1.ResourceList {
	out := corev1.ResourceList{}
	for i := 0; i < len(kv); i += 2 {
		out[corev1.ResourceName(kv[i])] = resource.MustParse(kv[i+1])
	}
	return out
}

func TestPodRequestOptions(t *testing.T) {
	podLevel := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "p", UID: "1"},
		Spec: corev1.PodSpec{
			NodeName:   "n",
			Resources:  &corev1.ResourceRequirements{Requests: list("cpu", "2", "memory", "1Gi")},
			Containers: []corev1.Container{{Name: "c", Resources: corev1.ResourceRequirements{Requests: list("cpu", "500m", "memory", "100Mi")}}},
		},
	}
	require.Equal(t, amounts{2000, 1 << 30, 0, 0}, New(Options{}).usageOf(podLevel).Requests, "pod-level requests replace the containers'")
	require.Equal(t, amounts{500, 100 << 20, 0, 0}, New(Options{IgnorePodLevelResources: true}).usageOf(podLevel).Requests)

	// Resized up from 500m to 1500m: the kubelet has allocated and actuated
	// 1500m while the spec still says 500m (or the other way round): the
	// pod takes the larger.
	resized := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "r", UID: "2"},
		Spec: corev1.PodSpec{
			NodeName:   "n",
			Containers: []corev1.Container{{Name: "c", Resources: corev1.ResourceRequirements{Requests: list("cpu", "500m")}}},
		},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, ContainerStatuses: []corev1.ContainerStatus{{
			Name: "c", AllocatedResources: list("cpu", "1500m"),
			Resources: &corev1.ResourceRequirements{Requests: list("cpu", "1500m")},
		}}},
	}
	require.Equal(t, int64(1500), New(Options{}).usageOf(resized).Requests[idxCPU])
	require.Equal(t, int64(500), New(Options{IgnoreStatusResources: true}).usageOf(resized).Requests[idxCPU])

	terminal := resized.DeepCopy()
	terminal.Status.Phase = corev1.PodFailed
	require.False(t, New(Options{}).usageOf(terminal).Active)
	unbound := resized.DeepCopy()
	unbound.Spec.NodeName = ""
	require.False(t, New(Options{}).usageOf(unbound).Active)
}

func TestNodeRules(t *testing.T) {
	ready := corev1.NodeStatus{Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}}}
	for _, tc := range []struct {
		name    string
		node    corev1.Node
		counted bool
	}{
		{"ready", corev1.Node{Status: ready}, true},
		{"no conditions", corev1.Node{}, false},
		{"unknown", corev1.Node{Status: corev1.NodeStatus{Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionUnknown}}}}, false},
		{"cordoned", corev1.Node{Spec: corev1.NodeSpec{Unschedulable: true}, Status: ready}, false},
		{"ours", corev1.Node{ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{rbv1.ProviderLabel: "paris"}}, Status: ready}, false},
		{"liqo", corev1.Node{ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"liqo.io/type": "virtual-node"}}, Status: ready}, false},
		{"other liqo type", corev1.Node{ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"liqo.io/type": "something"}}, Status: ready}, true},
	} {
		require.Equal(t, tc.counted, capacityOf(&tc.node).Counted, tc.name)
	}
}

// world is the state the events describe, from which the expected totals
// are recomputed by brute force.
type world struct {
	nodes      map[string]*nodeCapacity
	pods       map[types.UID]*podUsage
	tenants    map[string]bool
	requesters map[string]string
}

func (w *world) totals() totals {
	var t totals
	for _, n := range w.nodes {
		if n.Counted {
			t.capacity.add(n.Capacity)
			t.allocatable.add(n.Allocatable)
			t.nodes++
		}
	}
	for _, p := range w.pods {
		if n := w.nodes[p.NodeName]; p.Active && n != nil && n.Counted && !w.tenants[p.Namespace] {
			t.allocated.add(p.Requests)
			t.pods++
		}
	}
	return t
}

// nodeFigures recomputes the counted nodes' figures: every active pod
// bound to the node, tenant pods included, capped at allocatable.
func (w *world) nodeFigures() []nodeFree {
	out := []nodeFree{}
	for name, n := range w.nodes {
		if !n.Counted {
			continue
		}
		f := nodeFree{name: name, alloc: n.Allocatable}
		// A reservation's placeholders and tenant pods count the larger.
		type parts struct{ placeholder, tenant amounts }
		holds := map[[2]string]*parts{}
		for _, p := range w.pods {
			if !p.Active || p.NodeName != name {
				continue
			}
			if !w.tenants[p.Namespace] || p.Reservation == "" {
				f.used.add(p.Requests)
				continue
			}
			key := [2]string{p.Namespace, p.Reservation}
			if holds[key] == nil {
				holds[key] = &parts{}
			}
			if p.Placeholder {
				holds[key].placeholder.add(p.Requests)
			} else {
				holds[key].tenant.add(p.Requests)
			}
		}
		for _, h := range holds {
			for i := range f.used {
				f.used[i] += max(h.placeholder[i], h.tenant[i])
			}
		}
		for i := range f.used {
			f.used[i] = min(f.used[i], f.alloc[i])
			f.free[i] = f.alloc[i] - f.used[i]
		}
		out = append(out, f)
	}
	return sortedByName(out)
}

// reservations recomputes the ids to list: those of active tenant pods.
func (w *world) reservations() []string {
	set := map[string]bool{}
	for _, p := range w.pods {
		if p.Active && w.tenants[p.Namespace] && p.Reservation != "" && w.requesters[p.Namespace] != "" {
			set[w.requesters[p.Namespace]+"/"+p.Reservation] = true
		}
	}
	out := []string{}
	for id := range set {
		out = append(out, id)
	}
	slices.Sort(out)
	return out
}

func sortedByName(nodes []nodeFree) []nodeFree {
	slices.SortFunc(nodes, func(a, b nodeFree) int { return strings.Compare(a.name, b.name) })
	return nodes
}

// TestTallyMatchesRecomputation applies random events in any order (pods
// before their node or namespace, nodes flapping, namespaces flipping) and
// checks after each one that the running totals equal a recomputation.
func TestTallyMatchesRecomputation(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	w := &world{nodes: map[string]*nodeCapacity{}, pods: map[types.UID]*podUsage{}, tenants: map[string]bool{}, requesters: map[string]string{}}
	ty := newTally()
	nodeNames := []string{"a", "b", "c", "d", ""}
	namespaces := []string{"x", "y", "rb-z"}
	for i := 0; i < 20000; i++ {
		switch op := rng.IntN(10); {
		case op < 2: // node added or changed
			name := nodeNames[rng.IntN(4)]
			n := &nodeCapacity{ObjectMeta: metav1.ObjectMeta{Name: name}, Counted: rng.IntN(3) > 0,
				Capacity: amounts{rng.Int64N(8000), rng.Int64N(1 << 34), rng.Int64N(4), rng.Int64N(1 << 36)}}
			n.Allocatable = n.Capacity
			w.nodes[name] = n
			ty.setNode(n)
		case op < 3: // node deleted
			name := nodeNames[rng.IntN(4)]
			delete(w.nodes, name)
			ty.deleteNode(name)
		case op < 4: // namespace flips
			ns := namespaces[rng.IntN(len(namespaces))]
			tenant := rng.IntN(2) == 0
			requester := []string{"", "rome", "oslo"}[rng.IntN(3)]
			w.tenants[ns] = tenant
			w.requesters[ns] = requester
			if !tenant {
				w.requesters[ns] = ""
			}
			ty.setTenant(ns, tenant, requester)
		case op < 8: // pod added or changed
			uid := types.UID(fmt.Sprint(rng.IntN(200)))
			p := &podUsage{ObjectMeta: metav1.ObjectMeta{UID: uid, Namespace: namespaces[rng.IntN(len(namespaces))]},
				NodeName: nodeNames[rng.IntN(len(nodeNames))], Active: rng.IntN(5) > 0,
				Requests:    amounts{rng.Int64N(2000), rng.Int64N(1 << 30), rng.Int64N(2), rng.Int64N(1 << 30)},
				Reservation: []string{"", "", "r1", "r2", "r3"}[rng.IntN(5)], Placeholder: rng.IntN(3) == 0}
			if old := w.pods[uid]; old != nil {
				p.Namespace = old.Namespace // a pod never changes namespace
			}
			if p.NodeName == "" {
				p.Active = false
			}
			w.pods[uid] = p
			ty.setPod(p)
		default: // pod deleted
			uid := types.UID(fmt.Sprint(rng.IntN(200)))
			delete(w.pods, uid)
			ty.deletePod(uid)
		}
		require.Equal(t, w.totals(), ty.totals, "after event %d", i)
		require.Equal(t, w.nodeFigures(), sortedByName(ty.countedNodes()), "after event %d", i)
		require.Equal(t, w.reservations(), ty.listedReservations(), "after event %d", i)
	}
	// Everything gone: nothing left behind.
	for uid := range w.pods {
		ty.deletePod(uid)
	}
	for name := range w.nodes {
		ty.deleteNode(name)
	}
	require.Equal(t, totals{}, ty.totals)
	require.Empty(t, ty.use)
	require.Empty(t, ty.reservations)
	require.Empty(t, ty.holds)
	require.Empty(t, ty.pods)
	require.Empty(t, ty.nodes)
}

// realisticPod is a pod as a Deployment creates it: labels, annotations,
// owner, two containers with env, mounts and probes, a status with conditions.
func realisticPod(i int) *corev1.Pod {
	c := func(name string) corev1.Container {
		return corev1.Container{
			Name: name, Image: "registry.example/team/app:v1.2.3",
			Env:            []corev1.EnvVar{{Name: "A", Value: "1"}, {Name: "B", Value: "two"}, {Name: "C", Value: "three"}},
			Resources:      corev1.ResourceRequirements{Requests: list("cpu", "100m", "memory", "128Mi"), Limits: list("cpu", "1", "memory", "256Mi")},
			VolumeMounts:   []corev1.VolumeMount{{Name: "data", MountPath: "/data"}, {Name: "kube-api-access", MountPath: "/var/run/secrets"}},
			Ports:          []corev1.ContainerPort{{ContainerPort: 8080, Name: "http"}},
			ReadinessProbe: &corev1.Probe{ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/ready"}}},
		}
	}
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name: fmt.Sprintf("app-7d9f8c6b5-%05d", i), Namespace: "team-a", UID: types.UID(fmt.Sprintf("6f1c2a3e-0000-4000-8000-%012d", i)),
			ResourceVersion: fmt.Sprint(100000 + i),
			Labels:          map[string]string{"app": "app", "pod-template-hash": "7d9f8c6b5", "team": "a"},
			Annotations:     map[string]string{"kubectl.kubernetes.io/restartedAt": "2025-01-01T00:00:00Z", "prometheus.io/scrape": "true"},
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "ReplicaSet", Name: "app-7d9f8c6b5", UID: "rs", Controller: ptr.To(true)}},
		},
		Spec: corev1.PodSpec{
			NodeName: fmt.Sprintf("node-%04d", i%1000), Containers: []corev1.Container{c("app"), c("sidecar")},
			Volumes: []corev1.Volume{{Name: "data", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}},
		},
		Status: corev1.PodStatus{
			Phase: corev1.PodRunning, PodIP: "10.0.0.1", HostIP: "192.168.0.1",
			Conditions:        []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}, {Type: corev1.PodScheduled, Status: corev1.ConditionTrue}},
			ContainerStatuses: []corev1.ContainerStatus{{Name: "app", Ready: true, Image: "x", ImageID: "sha256:abc"}, {Name: "sidecar", Ready: true}},
		},
	}
}

// TestReducedPodFootprint measures what 30,000 pods cost the collector once
// reduced: the cache's podUsage objects plus the tally's entries.
func TestReducedPodFootprint(t *testing.T) {
	if testing.Short() {
		t.Skip("allocates")
	}
	const n = 30000
	c := New(Options{})
	usages := make([]any, 0, n)
	heap := func() uint64 {
		runtime.GC()
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		return ms.HeapAlloc
	}
	for i := 0; i < 1000; i++ {
		c.onNode(&nodeCapacity{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("node-%04d", i)}, Counted: true, Capacity: amounts{8000, 1 << 35}}, false)
	}
	before := heap()
	for i := 0; i < n; i++ {
		u, err := c.transformPod(realisticPod(i))
		require.NoError(t, err)
		usages = append(usages, u)
		c.onPod(u, false)
	}
	after := heap()
	perPod := float64(after-before) / n
	t.Logf("%d pods: %.0f bytes per pod (reduced object + tally entry), %.1f MiB in all", n, perPod, float64(after-before)/(1<<20))
	require.Less(t, perPod, 1024.0)
	require.Equal(t, n, c.Measure().Pods)
	runtime.KeepAlive(usages)
}

func BenchmarkPodEvent(b *testing.B) {
	c := New(Options{})
	for i := 0; i < 1000; i++ {
		c.onNode(&nodeCapacity{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("node-%04d", i)}, Counted: true, Capacity: amounts{8000, 1 << 35}}, false)
	}
	pods := make([]*podUsage, 30000)
	for i := range pods {
		u, _ := c.transformPod(realisticPod(i))
		pods[i] = u.(*podUsage)
		c.onPod(pods[i], false)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		p := *pods[i%len(pods)]
		p.Requests[idxCPU] += int64(i % 2) // alternate between two states
		c.onPod(&p, false)
	}
}

func BenchmarkTransformPod(b *testing.B) {
	c := New(Options{})
	p := realisticPod(1)
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		_, _ = c.transformPod(p)
	}
}
