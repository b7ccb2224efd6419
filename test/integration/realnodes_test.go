package integration

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os/exec"
	"path/filepath"
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
	"github.com/fluidos-project/resource-broker/internal/testenv"
	"github.com/fluidos-project/resource-broker/internal/testimages"
)

// TestRealNodes starts one real-node bed and runs the scenarios on it in
// turn; each leaves the bed as it found it.
func TestRealNodes(t *testing.T) {
	bed := testbed.Start(t, testbed.Options{RealNodes: true, Clusters: []testbed.ClusterSpec{testbed.RealRome, testbed.RealParis, testbed.RealBerlin}})
	t.Logf("real-node bed up in %s (%s)", bed.Timings["total"].Round(time.Millisecond), timingsAll(bed))
	newNamespace(t, bed.Cluster("rome"), realWebNamespace) // lives across transparent, kubectl, release
	runScenarios(t, bed, []scenario{
		{"transparent", testRealTransparent},
		{"kubectl", testRealKubectl},
		{"release", testRealRelease},
		{"node-lost", testRealNodeLost},
	})
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
	const ns = realWebNamespace
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
	realWeb = realWebState{dep: dep, base: base}
}

// realWeb is what transparent leaves for the scenarios after it: the
// Deployment "web" in rome's namespace shop, three pods running in paris,
// and the broker's numbers before it.
var realWeb realWebState

const realWebNamespace = "shop"

type realWebState struct {
	dep  *appsv1.Deployment
	base testbed.Capacity
}

func (w realWebState) require(t *testing.T) {
	if w.dep == nil {
		t.Fatal("needs the transparent scenario's Deployment (run the whole TestRealNodes)")
	}
}

// kubectl runs the kubectl of the test control plane (same version as the
// API servers) against a cluster, as the bed's admin.
func kubectl(ctx context.Context, t *testing.T, c *testbed.Cluster, args ...string) *exec.Cmd {
	dir, err := testenv.AssetsDir()
	require.NoError(t, err)
	cmd := exec.CommandContext(ctx, filepath.Join(dir, "kubectl"), append([]string{"--kubeconfig", c.Kubeconfig}, args...)...)
	return cmd
}

// testRealKubectl: kubectl logs, exec and port-forward against pods on
// rome's virtual node reach their containers in paris, through rome's API
// server, the virtual node's kubelet endpoint (the agent) and paris's API
// server and kubelet.
func testRealKubectl(t *testing.T, bed *testbed.Bed) {
	realWeb.require(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	rome := bed.Cluster("rome")
	var pods corev1.PodList
	require.NoError(t, rome.Client.List(ctx, &pods, client.InNamespace(realWebNamespace)))
	require.NotEmpty(t, pods.Items)
	pod := pods.Items[0]
	other := pods.Items[len(pods.Items)-1]

	out, err := kubectl(ctx, t, rome, "logs", "-n", realWebNamespace, pod.Name).CombinedOutput()
	require.NoError(t, err, "kubectl logs: %s", out)
	assert.Contains(t, string(out), "testapp listening on :8080", "the container's log, read from paris")

	// exec: the image has no shell; its own client fetches another pod's
	// answer, pod to pod across paris's nodes.
	out, err = kubectl(ctx, t, rome, "exec", "-n", realWebNamespace, pod.Name, "--", "/testapp", "get", "http://"+other.Status.PodIP+":8080/").CombinedOutput()
	require.NoError(t, err, "kubectl exec: %s", out)
	var a appAnswer
	require.NoError(t, json.Unmarshal(out, &a), "exec output: %s", out)
	assert.Equal(t, other.Name, a["pod"], "exec ran in %s's container and reached %s", pod.Name, other.Name)
	// exec's exit code comes back too.
	err = kubectl(ctx, t, rome, "exec", "-n", realWebNamespace, pod.Name, "--", "/testapp", "get", "http://127.0.0.1:1/").Run()
	var exitErr *exec.ExitError
	require.ErrorAs(t, err, &exitErr, "a failing command fails kubectl exec")
	assert.Equal(t, 1, exitErr.ExitCode())

	// port-forward to the pod's 8080 from a local port.
	pf := kubectl(ctx, t, rome, "port-forward", "-n", realWebNamespace, "pod/"+pod.Name, ":8080")
	stdout, err := pf.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, pf.Start())
	defer func() { _ = pf.Process.Kill(); _ = pf.Wait() }()
	line, err := bufio.NewReader(stdout).ReadString('\n') // "Forwarding from 127.0.0.1:NNNNN -> 8080"
	require.NoError(t, err, "kubectl port-forward printed nothing")
	local := strings.Fields(strings.TrimPrefix(line, "Forwarding from "))[0]
	a, err = getApp("http://" + local + "/")
	require.NoError(t, err, "GET through port-forward (%s)", strings.TrimSpace(line))
	assert.Equal(t, pod.Name, a["pod"], "port-forward reached %s's container", pod.Name)
}

// testRealNodeLost: the kubelet of the paris node that runs a borrowed pod
// is killed (containerd and the container live on). What the user in rome
// sees: the pod stays Running, turns NotReady once paris's node lifecycle
// controller declares the node unreachable (NodeMonitorGracePeriod) and
// marks its pods NotReady, and the container still answers at its pod IP
// meanwhile; rb-paris stays Ready (paris's API server answers). The
// kubelet comes back: the pod is Ready again. Eviction (after the pod's
// toleration of node.kubernetes.io/unreachable, 300 s by default) is
// paris's to decide, not ours.
func testRealNodeLost(t *testing.T, bed *testbed.Bed) {
	ctx := context.Background()
	rome, paris := bed.Cluster("rome"), bed.Cluster("paris")
	base := baseline(t, bed)
	const ns = "lost"
	newNamespace(t, rome, ns)
	dep := appDeployment(ns, "solo", 1, "1500m", "256Mi")
	require.NoError(t, rome.Client.Create(ctx, dep))
	var pod corev1.Pod
	eventually(t, 120*time.Second, "the pod Running and Ready", func() (bool, string) {
		var pods corev1.PodList
		require.NoError(t, rome.Client.List(ctx, &pods, client.InNamespace(ns)))
		if len(pods.Items) != 1 {
			return false, fmt.Sprintf("%d pods", len(pods.Items))
		}
		pod = pods.Items[0]
		return pod.Status.Phase == corev1.PodRunning && podReady(&pod), podCondition(&pod)
	})
	var copies corev1.PodList
	require.NoError(t, paris.Client.List(ctx, &copies, client.InNamespace("rb-rome"), client.MatchingLabels{"app": "solo"}))
	require.Len(t, copies.Items, 1)
	node := paris.RealNode(copies.Items[0].Spec.NodeName)
	require.NotNil(t, node, "the copy runs on a real paris node")

	killed := time.Now()
	require.NoError(t, node.KillKubelet())
	eventually(t, 90*time.Second, "paris sees "+node.Name+" unreachable", func() (bool, string) {
		var n corev1.Node
		require.NoError(t, paris.Client.Get(ctx, client.ObjectKey{Name: node.Name}, &n))
		for _, c := range n.Status.Conditions {
			if c.Type == corev1.NodeReady {
				return c.Status == corev1.ConditionUnknown, string(c.Status) + " " + c.Reason
			}
		}
		return false, "no Ready condition"
	})
	unreachable := time.Since(killed)
	eventually(t, 60*time.Second, "the pod in rome NotReady", func() (bool, string) {
		require.NoError(t, rome.Client.Get(ctx, client.ObjectKeyFromObject(&pod), &pod))
		return !podReady(&pod), podCondition(&pod)
	})
	notReady := time.Since(killed)
	assert.Equal(t, corev1.PodRunning, pod.Status.Phase, "the pod stays Running while its node is unreachable")
	a, err := getApp("http://" + pod.Status.PodIP + ":8080/")
	if assert.NoError(t, err, "the container still runs without its kubelet") {
		assert.Equal(t, pod.Name, a["pod"])
	}
	var vnode corev1.Node
	require.NoError(t, rome.Client.Get(ctx, client.ObjectKey{Name: "rb-paris"}, &vnode))
	assert.True(t, nodeReady(&vnode), "rb-paris stays Ready: paris's API server answers")

	restarted := time.Now()
	require.NoError(t, node.StartKubelet(ctx))
	eventually(t, 90*time.Second, "the pod in rome Ready again", func() (bool, string) {
		require.NoError(t, rome.Client.Get(ctx, client.ObjectKeyFromObject(&pod), &pod))
		return podReady(&pod), podCondition(&pod)
	})
	figure(t, "kubelet killed -> node unreachable at paris %s, pod NotReady in rome %s; kubelet back -> pod Ready %s",
		unreachable.Round(100*time.Millisecond), notReady.Round(100*time.Millisecond), time.Since(restarted).Round(100*time.Millisecond))

	require.NoError(t, rome.Client.Delete(ctx, dep))
	waitNoPodOrReservation(t, rome, ns, 60*time.Second)
	waitNoLive(t, bed, 30*time.Second)
	backToBaseline(t, bed, base, 30*time.Second)
}

func nodeReady(n *corev1.Node) bool {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// testRealRelease: the Deployment scaled to zero. The pods go in rome, their
// copies and containers in paris (no task left in any paris node's
// containerd), the reservations are released at the broker, rome's tenant
// (namespace, quota, credentials, instructions) is removed from paris, and
// the broker's numbers are back exactly.
func testRealRelease(t *testing.T, bed *testbed.Bed) {
	realWeb.require(t)
	ctx := context.Background()
	rome, paris := bed.Cluster("rome"), bed.Cluster("paris")
	dep := realWeb.dep
	scaled := time.Now()
	require.NoError(t, rome.Client.Patch(ctx, &appsv1.Deployment{ObjectMeta: dep.ObjectMeta},
		client.RawPatch("application/merge-patch+json", []byte(`{"spec":{"replicas":0}}`))))
	waitNoPodOrReservation(t, rome, dep.Namespace, 60*time.Second)
	waitNoLive(t, bed, 30*time.Second)
	released := time.Since(scaled)
	eventually(t, 60*time.Second, "no container left on paris's nodes", func() (bool, string) {
		var state []string
		left := 0
		for _, n := range paris.RealNodes() {
			tasks, err := n.RunningTasks(ctx)
			require.NoError(t, err)
			left += len(tasks)
			state = append(state, fmt.Sprintf("%s: %d tasks", n.Name, len(tasks)))
		}
		return left == 0, strings.Join(state, ", ")
	})
	containersGone := time.Since(scaled)
	waitTenantGone(t, paris, 60*time.Second)
	backToBaseline(t, bed, realWeb.base, 30*time.Second)
	figure(t, "scaled to 0 -> released at the broker %s, containers gone at paris %s, tenant gone %s",
		released.Round(time.Millisecond), containersGone.Round(time.Millisecond), time.Since(scaled).Round(time.Millisecond))
	require.NoError(t, rome.Client.Delete(ctx, dep))
	realWeb = realWebState{}
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
