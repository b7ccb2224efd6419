package integration

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	rbv1 "github.com/fluidos-project/resource-broker/api/v1alpha1"
	"github.com/fluidos-project/resource-broker/internal/testbed"
)

// testTransparent (scenario 1): a plain Deployment in rome whose pods fit
// nowhere in rome. Each pod gets a reservation, is bound to the virtual node
// of the provider the scoring prefers (paris while it fits, then berlin), its
// copy in the provider's tenant namespace is placed by the provider's own
// scheduler on a real node and run by the kubelet stand-in, and the pod in
// rome reaches Running. Scaling to zero removes the copies, releases the
// reservations and gives the broker its starting numbers back.
func testTransparent(t *testing.T, bed *testbed.Bed) {
	ctx := context.Background()
	rome, paris, berlin := bed.Cluster("rome"), bed.Cluster("paris"), bed.Cluster("berlin")
	base := baseline(t, bed)
	const ns = "web"
	newNamespace(t, rome, ns)
	tl := watchTimeline(t, rome, ns)

	// 3-CPU pods: none fits rome's 2-CPU node; paris (8 CPU) takes two, berlin the third.
	dep := webDeployment(ns, 3)
	require.NoError(t, rome.Client.Create(ctx, dep))

	running := map[string]time.Time{} // pod -> when first seen Running (polled every 25ms)
	var pods corev1.PodList
	eventually(t, 90*time.Second, "3 pods Running", func() (bool, string) {
		require.NoError(t, rome.Client.List(ctx, &pods, client.InNamespace(ns)))
		var state []string
		for _, p := range pods.Items {
			if _, ok := running[p.Name]; !ok && p.Status.Phase == corev1.PodRunning {
				running[p.Name] = time.Now()
			}
			state = append(state, fmt.Sprintf("%s %s on %q: %s", p.Name, p.Status.Phase, p.Spec.NodeName, podCondition(&p)))
		}
		return len(pods.Items) == 3 && len(running) == 3, strings.Join(state, "; ")
	})
	items := waitReservations(t, rome, ns, 3, 10*time.Second, "3 Reservations Active",
		func(r *rbv1.Reservation) bool { return r.Status.Phase == rbv1.ReservationActive })
	byPod := map[string]rbv1.Reservation{}
	for _, r := range items {
		byPod[r.Spec.PodName] = r
	}
	nodes := map[string]int{}
	for _, p := range pods.Items {
		r, ok := byPod[p.Name]
		if assert.True(t, ok, "pod %s has a reservation", p.Name) {
			assert.Equal(t, "rb-"+r.Status.Provider, p.Spec.NodeName, "bound to its reservation's provider")
			assert.Equal(t, p.Spec.NodeName, r.Status.VirtualNode)
		}
		nodes[p.Spec.NodeName]++
	}
	assert.Equal(t, map[string]int{"rb-paris": 2, "rb-berlin": 1}, nodes, "cheaper paris while it fits, then berlin")
	assertBrokerMatches(t, bed, items)
	require.NoError(t, bed.Store.CheckInvariant(ctx))
	// The copies run at the providers, placed by their own schedulers on real nodes.
	for _, pc := range []struct {
		c    *testbed.Cluster
		want int
	}{{paris, 2}, {berlin, 1}} {
		var copies corev1.PodList
		require.NoError(t, pc.c.Client.List(ctx, &copies, client.InNamespace("rb-rome")))
		assert.Len(t, copies.Items, pc.want, pc.c.Name)
		for _, cp := range copies.Items {
			assert.True(t, strings.HasPrefix(cp.Name, ns+"."), "copy named <namespace>.<name>: %s", cp.Name)
			assert.Contains(t, pc.c.Nodes(), cp.Spec.NodeName, "placed on a real node of %s", pc.c.Name)
			assert.Equal(t, corev1.PodRunning, cp.Status.Phase)
		}
	}
	var toRunning []time.Duration
	tl.mu.Lock()
	for name, at := range running {
		if seen, ok := tl.podSeen[name]; ok {
			toRunning = append(toRunning, at.Sub(seen))
		}
	}
	tl.mu.Unlock()
	figure(t, "pod created -> Running on the provider (bridge): %s", stats(toRunning))
	figure(t, "pod created -> Reservation Active: %s", stats(tl.durations("pod", "active")))

	// Scale to zero: pods and their copies go, reservations released, tenants removed.
	scaled := time.Now()
	require.NoError(t, rome.Client.Patch(ctx, &appsv1.Deployment{ObjectMeta: dep.ObjectMeta},
		client.RawPatch("application/merge-patch+json", []byte(`{"spec":{"replicas":0}}`))))
	waitNoPodOrReservation(t, rome, ns, 60*time.Second)
	waitNoLive(t, bed, 30*time.Second)
	released := time.Since(scaled)
	waitTenantGone(t, paris, 30*time.Second)
	waitTenantGone(t, berlin, 30*time.Second)
	backToBaseline(t, bed, base, 30*time.Second)
	figure(t, "scaled to 0 -> pods gone and released at the broker: %s", released.Round(time.Millisecond))
	require.NoError(t, rome.Client.Delete(ctx, dep))
}
