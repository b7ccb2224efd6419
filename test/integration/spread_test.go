package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	rbv1 "github.com/fluidos-project/resource-broker/api/v1alpha1"
	"github.com/fluidos-project/resource-broker/internal/testbed"
)

// The spread bed: two zones, paris (zone-a) twice berlin's cpu, so that the
// broker's first choice alone would put 4 of 6 replicas in zone-a. Each node
// holds two 3Gi replicas; rome's node (2Gi) none.
var (
	spreadParis = testbed.ClusterSpec{Name: "paris", Nodes: []corev1.ResourceList{
		testbed.Resources("4", "8Gi"), testbed.Resources("4", "8Gi")}, PriceCPU: "0.02", PriceMemory: "0.003",
		Labels: map[string]string{corev1.LabelTopologyZone: "zone-a"}}
	spreadBerlin = testbed.ClusterSpec{Name: "berlin", Nodes: []corev1.ResourceList{
		testbed.Resources("2", "8Gi"), testbed.Resources("2", "8Gi")}, PriceCPU: "0.035", PriceMemory: "0.004",
		Labels: map[string]string{corev1.LabelTopologyZone: "zone-b"}}
)

// TestSpread runs the spread scenarios on a real-node bed with two zones.
func TestSpread(t *testing.T) {
	bed := testbed.Start(t, testbed.Options{RealNodes: true,
		Clusters: []testbed.ClusterSpec{testbed.RealRome, spreadParis, spreadBerlin}})
	runScenarios(t, bed, []scenario{
		{"zones", testSpreadZones},
	})
}

// testSpreadZones: a Deployment of 6 replicas in rome, none of which fits
// there, with a zone spread constraint (maxSkew 1, DoNotSchedule): they run
// 3 in zone-a (paris) and 3 in zone-b (berlin), on real nodes. The broker's
// audit says, for the replicas it sent to berlin, that paris would have been
// the choice without spread.
func testSpreadZones(t *testing.T, bed *testbed.Bed) {
	ctx := context.Background()
	rome := bed.Cluster("rome")
	baseline(t, bed)
	const ns = "shop"
	newNamespace(t, rome, ns)
	labels := map[string]string{"app": "web"}
	tmpl := brokerPod(ns, "", requests("250m", "3Gi"))
	tmpl.Labels = labels
	tmpl.Spec.TopologySpreadConstraints = []corev1.TopologySpreadConstraint{{MaxSkew: 1,
		TopologyKey: corev1.LabelTopologyZone, WhenUnsatisfiable: corev1.DoNotSchedule,
		LabelSelector: &metav1.LabelSelector{MatchLabels: labels}}}
	dep := &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "web"},
		Spec: appsv1.DeploymentSpec{Replicas: ptr.To[int32](6), Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels}, Spec: tmpl.Spec}}}
	require.NoError(t, rome.Client.Create(ctx, dep))

	zones := map[string]string{"paris": "zone-a", "berlin": "zone-b"}
	perZone := map[string]int{}
	eventually(t, 180*time.Second, "6 replicas Running, spread over the zones", func() (bool, string) {
		var pods corev1.PodList
		require.NoError(t, rome.Client.List(ctx, &pods, client.InNamespace(ns)))
		var list rbv1.ReservationList
		require.NoError(t, rome.Client.List(ctx, &list, client.InNamespace(ns)))
		providerOf := map[string]string{}
		for _, r := range list.Items {
			providerOf[r.Spec.PodName] = r.Status.Provider
		}
		perZone = map[string]int{}
		running := 0
		for _, p := range pods.Items {
			if p.Status.Phase == corev1.PodRunning {
				running++
				perZone[zones[providerOf[p.Name]]]++
			}
		}
		return running == 6, fmt.Sprintf("%d running of %d, by zone %v", running, len(pods.Items), perZone)
	})
	assert.Equal(t, map[string]int{"zone-a": 3, "zone-b": 3}, perZone)

	var list rbv1.ReservationList
	require.NoError(t, rome.Client.List(ctx, &list, client.InNamespace(ns)))
	changed := 0
	for _, r := range list.Items {
		require.NotNil(t, r.Spec.Spread, r.Name)
		assert.Equal(t, ns+"/app=web/"+corev1.LabelTopologyZone, r.Spec.Spread.Group)
	}
	entries, err := bed.RDB.XRange(ctx, bed.Store.Key("audit"), "-", "+").Result()
	require.NoError(t, err)
	for _, e := range entries {
		raw, ok := e.Values["spread"].(string)
		if !ok || e.Values["outcome"] != "reserved" {
			continue
		}
		var sp struct {
			FirstFit []string `json:"first_fit"`
			Chosen   []string `json:"chosen"`
		}
		require.NoError(t, json.Unmarshal([]byte(raw), &sp))
		if len(sp.Chosen) == 1 && sp.Chosen[0] == "berlin" && sp.FirstFit[0] == "paris" {
			changed++
		}
	}
	assert.GreaterOrEqual(t, changed, 1, "the audit says spread sent a replica to berlin that paris would have taken")
	require.NoError(t, bed.Store.CheckInvariant(ctx))

	require.NoError(t, rome.Client.Delete(ctx, dep, client.PropagationPolicy(metav1.DeletePropagationForeground)))
	waitNoLive(t, bed, 90*time.Second)
	require.NoError(t, bed.Store.CheckInvariant(ctx))
}
