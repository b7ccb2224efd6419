package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	rbv1 "github.com/fluidos-project/resource-broker/api/v1alpha1"
	"github.com/fluidos-project/resource-broker/internal/testbed"
	"github.com/fluidos-project/resource-broker/internal/testimages"
)

// The real-node bed: every node a kubelet with containerd, every cluster
// with kube-controller-manager. rome's one node (1 CPU) holds none of the
// 1.5-CPU pods below; paris has a 4-CPU and a 2-CPU node (three such pods,
// one node each... two on the first, one on the second), berlin a 4-CPU
// node with GPUs and a 2-CPU one.
var (
	realRome = testbed.ClusterSpec{Name: "rome", Requester: true, Nodes: []corev1.ResourceList{testbed.Resources("1", "2Gi")},
		PriceCPU: "0.04", PriceMemory: "0.005", Labels: map[string]string{"region": "eu-south"}}
	realParis = testbed.ClusterSpec{Name: "paris", Nodes: []corev1.ResourceList{testbed.Resources("4", "8Gi"), testbed.Resources("2", "4Gi")},
		PriceCPU: "0.02", PriceMemory: "0.003", Labels: map[string]string{"region": "eu-west"}}
	realBerlin = testbed.ClusterSpec{Name: "berlin", Nodes: []corev1.ResourceList{testbed.Resources("4", "16Gi", "2"), testbed.Resources("2", "8Gi")},
		PriceCPU: "0.035", PriceMemory: "0.004", PriceGPU: "0.9", Labels: map[string]string{"region": "eu-central"}}
)

// TestRealNodes starts one real-node bed and runs the scenarios on it in
// turn; each leaves the bed as it found it.
func TestRealNodes(t *testing.T) {
	bed := testbed.Start(t, testbed.Options{RealNodes: true, Clusters: []testbed.ClusterSpec{realRome, realParis, realBerlin}})
	t.Logf("real-node bed up in %s (%s)", bed.Timings["total"].Round(time.Millisecond), timingsAll(bed))
	for _, sc := range []struct {
		name string
		run  func(*testing.T, *testbed.Bed)
	}{
		{"transparent", testRealTransparent},
	} {
		if !t.Run(sc.name, func(t *testing.T) { sc.run(t, bed) }) {
			t.Logf("scenario %s failed; the next ones run on whatever it left", sc.name)
		}
	}
}

func timingsAll(bed *testbed.Bed) string {
	var parts []string
	for k, v := range bed.Timings {
		if k != "total" {
			parts = append(parts, fmt.Sprintf("%s %s", k, v.Round(time.Millisecond)))
		}
	}
	return strings.Join(parts, ", ")
}

// appDeployment is a Deployment of the test application (an HTTP server on
// 8080 that says where it runs) scheduled by rb-scheduler.
func appDeployment(ns, name string, replicas int32, cpu, memory string) *appsv1.Deployment {
	labels := map[string]string{"app": name}
	return &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To(replicas),
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{
					SchedulerName:                 "resource-broker",
					TerminationGracePeriodSeconds: ptr.To[int64](5),
					Containers: []corev1.Container{{
						Name: "app", Image: testimages.TestApp, ImagePullPolicy: corev1.PullIfNotPresent,
						Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: 8080}},
						Env: []corev1.EnvVar{
							{Name: "NODE_NAME", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "spec.nodeName"}}},
							{Name: "HOST_IP", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "status.hostIP"}}},
							{Name: "POD_NAME", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.name"}}},
							{Name: "POD_NAMESPACE", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.namespace"}}},
						},
						Resources: corev1.ResourceRequirements{Requests: requests(cpu, memory), Limits: requests(cpu, memory)},
						ReadinessProbe: &corev1.Probe{ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/healthz", Port: intstrHTTP}},
							PeriodSeconds: 1},
					}},
				},
			},
		},
	}
}

// appAnswer is what the test application answers on GET /.
type appAnswer map[string]string

func getApp(url string) (appAnswer, error) {
	cl := &http.Client{Timeout: 3 * time.Second}
	resp, err := cl.Get(url)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("%s: %s: %s", url, resp.Status, body)
	}
	var a appAnswer
	return a, json.Unmarshal(body, &a)
}

// nodeIPs maps the InternalIPs of a cluster's nodes to their names.
func nodeIPs(t *testing.T, c *testbed.Cluster) map[string]string {
	var nodes corev1.NodeList
	require.NoError(t, c.Client.List(context.Background(), &nodes))
	out := map[string]string{}
	for _, n := range nodes.Items {
		for _, a := range n.Status.Addresses {
			if a.Type == corev1.NodeInternalIP {
				out[a.Address] = n.Name
			}
		}
	}
	return out
}

// testRealTransparent: a plain Deployment of three 1.5-CPU pods in rome,
// whose 1-CPU node holds none. Each gets a reservation, is bound to rb-paris
// (cheapest, and its nodes hold all three), its copy runs in a real
// container on a paris node, and the pod in rome is Running and Ready with
// the copy's pod IP, where the container answers over HTTP.
func testRealTransparent(t *testing.T, bed *testbed.Bed) {
	ctx := context.Background()
	rome, paris := bed.Cluster("rome"), bed.Cluster("paris")
	base := baseline(t, bed)
	const ns = "shop"
	newNamespace(t, rome, ns)
	tl := watchTimeline(t, rome, ns)
	dep := appDeployment(ns, "web", 3, "1500m", "256Mi")
	require.NoError(t, rome.Client.Create(ctx, dep))

	var pods corev1.PodList
	eventually(t, 120*time.Second, "3 pods Running and Ready", func() (bool, string) {
		require.NoError(t, rome.Client.List(ctx, &pods, client.InNamespace(ns)))
		ready := 0
		var state []string
		for _, p := range pods.Items {
			if p.Status.Phase == corev1.PodRunning && podReady(&p) {
				ready++
			}
			state = append(state, fmt.Sprintf("%s %s on %q: %s", p.Name, p.Status.Phase, p.Spec.NodeName, podCondition(&p)))
		}
		return len(pods.Items) == 3 && ready == 3, strings.Join(state, "; ")
	})
	items := waitReservations(t, rome, ns, 3, 10*time.Second, "3 Reservations Active",
		func(r *rbv1.Reservation) bool { return r.Status.Phase == rbv1.ReservationActive })
	assertBrokerMatches(t, bed, items)
	require.NoError(t, bed.Store.CheckInvariant(ctx))

	parisNodes := nodeIPs(t, paris)
	var copies corev1.PodList
	require.NoError(t, paris.Client.List(ctx, &copies, client.InNamespace("rb-rome")))
	require.Len(t, copies.Items, 3, "three copies in paris's tenant namespace")
	for _, cp := range copies.Items {
		assert.Contains(t, paris.Nodes(), cp.Spec.NodeName, "copy %s placed on a real paris node", cp.Name)
		require.NotEmpty(t, cp.Status.ContainerStatuses, cp.Name)
		assert.True(t, strings.HasPrefix(cp.Status.ContainerStatuses[0].ContainerID, "containerd://"), "a real container: %s", cp.Status.ContainerStatuses[0].ContainerID)
	}
	for _, p := range pods.Items {
		assert.Equal(t, "rb-paris", p.Spec.NodeName, "pod %s bound to paris's virtual node", p.Name)
		require.NotEmpty(t, p.Status.PodIP, "pod %s has the copy's IP", p.Name)
		a, err := getApp("http://" + p.Status.PodIP + ":8080/")
		require.NoError(t, err, "the container of %s answers at its pod IP", p.Name)
		assert.Equal(t, p.Name, a["pod"], "the pod sees its own name")
		assert.Contains(t, parisNodes, a["hostIP"], "answered from a paris node: %v", a)
		figureLine(t, "real", "%s answered from paris node %s (%s), pod IP %s", p.Name, parisNodes[a["hostIP"]], a["hostIP"], p.Status.PodIP)
	}
	figure(t, "pod created -> Running (real container on the provider): %s", stats(tl.durations("pod", "running")))

	require.NoError(t, rome.Client.Delete(ctx, dep))
	eventually(t, 60*time.Second, "no pod and no Reservation left in rome", func() (bool, string) {
		var left corev1.PodList
		require.NoError(t, rome.Client.List(ctx, &left, client.InNamespace(ns)))
		n := len(reservations(t, rome, ns))
		return len(left.Items) == 0 && n == 0, fmt.Sprintf("%d pods, %d reservations", len(left.Items), n)
	})
	waitNoLive(t, bed, 30*time.Second)
	waitTenantGone(t, paris, 60*time.Second)
	backToBaseline(t, bed, base, 30*time.Second)
}

var intstrHTTP = intstr.FromString("http")

func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}
