package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	rbv1 "github.com/fluidos-project/resource-broker/api/v1alpha1"
	"github.com/fluidos-project/resource-broker/internal/testbed"
	"github.com/fluidos-project/resource-broker/internal/testimages"
)

// TestNetworking: borrowed pods as members of their home cluster's network.
// One real-node bed whose nodes each have a network namespace of their own
// and run the real kube-proxy, with CoreDNS per cluster, and a flat pod
// network across the clusters, as every real-node bed has.
// rome's agent keeps its borrowed pods in rome's network view
// (--borrowed-pod-network=home): the host routes every cluster's service
// CIDR to one of its nodes, as BGP-advertised Service addresses would.
func TestNetworking(t *testing.T) {
	bed := testbed.Start(t, testbed.Options{RealNodes: true,
		Clusters: []testbed.ClusterSpec{testbed.RealRome, testbed.RealParis, testbed.RealBerlin},
		AgentArgs: func(cluster string) []string {
			if cluster == "rome" {
				// Home API tokens renewed every 20 s: the api scenario sees one renewed.
				return []string{"--borrowed-pod-network=home", "--home-api-token-refresh=20s"}
			}
			return nil
		}})
	t.Logf("networking bed up in %s", bed.Timings["total"].Round(time.Millisecond))
	runScenarios(t, bed, []scenario{
		{"inbound", testNetworkingInbound},
		{"outbound", testNetworkingOutbound},
		{"mixed", testNetworkingMixed},
		{"api", testNetworkingAPI},
	})
}

// testNetworkingInbound: a Deployment web of 3 pods in rome's namespace front,
// of which rome's node holds 2, and a Service web. From a pod on rome's
// node, web, web.front and web.front.svc.cluster.local resolve (CoreDNS) and
// reach all three pods through rome's kube-proxy, the borrowed one at paris
// included. The borrowed pod made unready leaves the Service's endpoints
// (paris's kubelet probes it, the virtual node reports it, rome's
// EndpointSlice controller drops it) and gets no traffic; ready again, it
// gets traffic again.
func testNetworkingInbound(t *testing.T, bed *testbed.Bed) {
	ctx := context.Background()
	rome := bed.Cluster("rome")
	base := baseline(t, bed)
	const ns = "front"
	newNamespace(t, rome, ns)
	web := appDeployment(ns, "web", 3, "400m", "64Mi")
	web.Spec.Template.Spec.Containers[0].ReadinessProbe.HTTPGet.Path = "/readyz"
	require.NoError(t, rome.Client.Create(ctx, web))
	require.NoError(t, rome.Client.Create(ctx, appService(ns, "web")))

	var local, borrowed []corev1.Pod
	eventually(t, 120*time.Second, "web: 2 pods Ready at home, 1 borrowed", func() (bool, string) {
		var all int
		local, borrowed, all = placedPods(t, rome, ns, "web")
		return len(local) == 2 && len(borrowed) == 1, fmt.Sprintf("%d pods: local %v, borrowed %v", all, podNames(local), podNames(borrowed))
	})
	away := borrowed[0]
	client := clientPod(t, rome, ns, local[0].Spec.NodeName)

	all := append(podNames(local), away.Name)
	sort.Strings(all)
	for _, name := range []string{"web", "web." + ns, "web." + ns + ".svc." + testbed.ClusterDomain} {
		eventually(t, 30*time.Second, "every web pod answers through Service "+name, func() (bool, string) {
			seen := answeredBy(t, rome, ns, client, "http://"+name+"/", 12)
			return fmt.Sprint(seen) == fmt.Sprint(all), fmt.Sprintf("answered by %v, want %v", seen, all)
		})
	}

	// The borrowed pod turns unready at paris.
	execIn(t, rome, ns, client, "post", "http://"+away.Status.PodIP+":8080/ready?ready=false")
	eventually(t, 30*time.Second, "the borrowed pod out of rome's ready endpoints", func() (bool, string) {
		ready := readyEndpoints(t, rome, ns, "web")
		return !ready[away.Status.PodIP] && len(ready) == 2, fmt.Sprintf("ready endpoints %v", ready)
	})
	homeOnly := podNames(local)
	seen := answeredBy(t, rome, ns, client, "http://web/", 12)
	assert.Equal(t, homeOnly, seen, "only the ready pods answer")

	execIn(t, rome, ns, client, "post", "http://"+away.Status.PodIP+":8080/ready?ready=true")
	eventually(t, 30*time.Second, "the borrowed pod answers through the Service again", func() (bool, string) {
		seen := answeredBy(t, rome, ns, client, "http://web/", 12)
		return fmt.Sprint(seen) == fmt.Sprint(all), fmt.Sprintf("answered by %v", seen)
	})

	require.NoError(t, rome.Client.Delete(ctx, web))
	require.NoError(t, rome.Client.Delete(ctx, client))
	waitNoPodOrReservation(t, rome, ns, 60*time.Second)
	backToBaseline(t, bed, base, 60*time.Second)
}

// testNetworkingOutbound: rome's namespaces shop and books each run a
// backend pod at home behind a Service backend, and a caller pod that fits
// nowhere in rome and is borrowed by paris. Each caller reaches its own
// namespace's backend as backend, backend.<ns> and
// backend.<ns>.svc.cluster.local: rome's DNS answers with rome's
// ClusterIP, which rome's kube-proxy takes to the pod. Its Service
// environment variables are those of a local pod of its namespace.
func testNetworkingOutbound(t *testing.T, bed *testbed.Bed) {
	ctx := context.Background()
	rome := bed.Cluster("rome")
	base := baseline(t, bed)
	namespaces := []string{"shop", "books"}
	for _, ns := range namespaces {
		newNamespace(t, rome, ns)
		require.NoError(t, rome.Client.Create(ctx, appService(ns, "backend")))
		require.NoError(t, rome.Client.Create(ctx, appDeployment(ns, "backend", 1, "100m", "32Mi")))
		require.NoError(t, rome.Client.Create(ctx, appDeployment(ns, "caller", 1, "1500m", "64Mi")))
	}
	backends, callers := map[string]corev1.Pod{}, map[string]corev1.Pod{}
	for _, ns := range namespaces {
		eventually(t, 120*time.Second, ns+": backend Ready at home, caller borrowed", func() (bool, string) {
			local, _, _ := placedPods(t, rome, ns, "backend")
			_, borrowed, _ := placedPods(t, rome, ns, "caller")
			if len(local) == 1 && len(borrowed) == 1 {
				backends[ns], callers[ns] = local[0], borrowed[0]
				return true, ""
			}
			return false, fmt.Sprintf("backend at home %v, caller borrowed %v", podNames(local), podNames(borrowed))
		})
	}
	for _, ns := range namespaces {
		caller := callers[ns]
		for _, name := range []string{"backend", "backend." + ns, "backend." + ns + ".svc." + testbed.ClusterDomain} {
			var id appAnswer
			out := execIn(t, rome, ns, &caller, "get", "http://"+name+"/")
			require.NoError(t, json.Unmarshal([]byte(out), &id), "answer of %s: %s", name, out)
			assert.Equal(t, backends[ns].Name, id["pod"], "%s's caller (on %s) asking %s", ns, caller.Spec.NodeName, name)
			assert.Equal(t, ns, id["namespace"])
		}
		local, borrowed := serviceVars(t, backends[ns]), serviceVars(t, caller)
		assert.NotEmpty(t, local["BACKEND_SERVICE_HOST"])
		assert.Equal(t, local, borrowed, "%s: the borrowed pod's Service variables are a local pod's", ns)
	}

	// The copies read those variables from one ConfigMap per home namespace
	// at their provider, which follows the namespace's Services.
	provider := bed.Cluster(strings.TrimPrefix(callers["shop"].Spec.NodeName, "rb-"))
	tenant := rbv1.TenantNamespacePrefix + "rome"
	envKey := client.ObjectKey{Namespace: tenant, Name: "shop.rb-service-env-0"}
	var copyPod corev1.Pod
	require.NoError(t, provider.Client.Get(ctx, client.ObjectKey{Namespace: tenant, Name: "shop." + callers["shop"].Name}, &copyPod))
	require.NotEmpty(t, copyPod.Spec.Containers[0].EnvFrom)
	assert.Equal(t, envKey.Name, copyPod.Spec.Containers[0].EnvFrom[0].ConfigMapRef.Name)
	backendHost := serviceVars(t, backends["shop"])["BACKEND_SERVICE_HOST"]
	require.NoError(t, rome.Client.Create(ctx, appService("shop", "late")))
	eventually(t, 30*time.Second, "a Service created later in the provider's ConfigMap", func() (bool, string) {
		var cm corev1.ConfigMap
		err := provider.Client.Get(ctx, envKey, &cm)
		return err == nil && cm.Data["LATE_SERVICE_HOST"] != "" && cm.Data["BACKEND_SERVICE_HOST"] == backendHost,
			fmt.Sprint(err, len(cm.Data))
	})

	for _, ns := range namespaces {
		require.NoError(t, rome.Client.DeleteAllOf(ctx, &appsv1.Deployment{}, client.InNamespace(ns)))
		waitNoPodOrReservation(t, rome, ns, 60*time.Second)
	}
	eventually(t, 30*time.Second, "the provider's ConfigMap of shop's Service variables gone with its last copy", func() (bool, string) {
		err := provider.Client.Get(ctx, envKey, &corev1.ConfigMap{})
		return apierrors.IsNotFound(err), fmt.Sprint(err)
	})
	backToBaseline(t, bed, base, 60*time.Second)
}

// testNetworkingMixed: one Service, mixed, in front of a pod at home, a pod
// borrowed by paris and one borrowed by berlin (its preferred provider):
// from rome's node and from the borrowed pods at paris and at berlin, the
// Service's name reaches all three pods.
func testNetworkingMixed(t *testing.T, bed *testbed.Bed) {
	ctx := context.Background()
	rome := bed.Cluster("rome")
	base := baseline(t, bed)
	const ns = "mixed"
	newNamespace(t, rome, ns)
	svc := appService(ns, "mixed")
	svc.Spec.Selector = map[string]string{"tier": "mixed"}
	require.NoError(t, rome.Client.Create(ctx, svc))
	for _, d := range []struct {
		name, cpu, prefer string
	}{{"home", "100m", ""}, {"paris", "1500m", ""}, {"berlin", "1500m", "berlin"}} {
		dep := appDeployment(ns, d.name, 1, d.cpu, "64Mi")
		dep.Spec.Template.Labels["tier"] = "mixed"
		if d.prefer != "" {
			dep.Spec.Template.Spec.Affinity = &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{
				PreferredDuringSchedulingIgnoredDuringExecution: []corev1.PreferredSchedulingTerm{{Weight: 50, Preference: corev1.NodeSelectorTerm{
					MatchExpressions: []corev1.NodeSelectorRequirement{{Key: rbv1.ProviderLabel, Operator: corev1.NodeSelectorOpIn, Values: []string{d.prefer}}}}}}}}
		}
		require.NoError(t, rome.Client.Create(ctx, dep))
	}
	pods := map[string]corev1.Pod{}
	eventually(t, 120*time.Second, "a mixed pod at home, at paris and at berlin", func() (bool, string) {
		var placed []string
		for _, app := range []string{"home", "paris", "berlin"} {
			local, borrowed, _ := placedPods(t, rome, ns, app)
			for _, p := range append(local, borrowed...) {
				pods[app] = p
				placed = append(placed, app+"@"+p.Spec.NodeName)
			}
		}
		return len(placed) == 3 && pods["home"].Spec.NodeName == rome.RealNodes()[0].Name &&
			pods["paris"].Spec.NodeName == "rb-paris" && pods["berlin"].Spec.NodeName == "rb-berlin", fmt.Sprint(placed)
	})
	all := []string{pods["berlin"].Name, pods["home"].Name, pods["paris"].Name}
	sort.Strings(all)
	from := map[string]*corev1.Pod{"rome": clientPod(t, rome, ns, pods["home"].Spec.NodeName)}
	for _, at := range []string{"paris", "berlin"} {
		p := pods[at]
		from[at] = &p
	}
	for side, pod := range from {
		eventually(t, 30*time.Second, "every mixed pod answers a caller at "+side, func() (bool, string) {
			seen := answeredBy(t, rome, ns, pod, "http://mixed/", 12)
			return fmt.Sprint(seen) == fmt.Sprint(all), fmt.Sprintf("answered by %v, want %v", seen, all)
		})
	}

	require.NoError(t, rome.Client.DeleteAllOf(ctx, &appsv1.Deployment{}, client.InNamespace(ns)))
	require.NoError(t, rome.Client.Delete(ctx, from["rome"]))
	waitNoPodOrReservation(t, rome, ns, 60*time.Second)
	backToBaseline(t, bed, base, 60*time.Second)
}

// testNetworkingAPI: a borrowed pod whose ServiceAccount reader may list
// the ConfigMaps of its namespace at home (a Role) lists them as client-go's
// in-cluster config would (testapp api: KUBERNETES_SERVICE_HOST and _PORT,
// the token and ca.crt at the standard path): its copy at paris carries a
// token of reader bound to the pod, and rome's CA. It is refused another
// namespace's, as at home, and keeps working with the token the agent
// renews (every 20 s here), once paris's kubelet has put it in the volume.
func testNetworkingAPI(t *testing.T, bed *testbed.Bed) {
	ctx := context.Background()
	rome := bed.Cluster("rome")
	base := baseline(t, bed)
	const ns = "reports"
	newNamespace(t, rome, ns)
	require.NoError(t, rome.Client.Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "reader"}}))
	require.NoError(t, rome.Client.Create(ctx, &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "configmap-reader"},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"configmaps"}, Verbs: []string{"list"}}}}))
	require.NoError(t, rome.Client.Create(ctx, &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "reader"},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "configmap-reader"},
		Subjects: []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: ns, Name: "reader"}}}))
	job := appDeployment(ns, "job", 1, "1500m", "64Mi")
	job.Spec.Template.Spec.ServiceAccountName = "reader"
	require.NoError(t, rome.Client.Create(ctx, job))
	var pod corev1.Pod
	eventually(t, 120*time.Second, "job's pod borrowed", func() (bool, string) {
		_, borrowed, all := placedPods(t, rome, ns, "job")
		if len(borrowed) == 1 {
			pod = borrowed[0]
			return true, ""
		}
		return false, fmt.Sprintf("%d pods, none borrowed and Ready", all)
	})

	list := "/api/v1/namespaces/" + ns + "/configmaps"
	out, token, err := callAPI(t, rome, &pod, list)
	require.NoError(t, err, "listing its namespace's ConfigMaps from %s: %s", pod.Spec.NodeName, token)
	assert.Contains(t, out, `"kind":"ConfigMapList"`)
	assert.Contains(t, out, "kube-root-ca.crt", "rome's ConfigMaps, not paris's")
	_, said, err := callAPI(t, rome, &pod, "/api/v1/namespaces/default/configmaps")
	require.Error(t, err, "another namespace's ConfigMaps")
	assert.Contains(t, said, "403", "refused as at home")

	eventually(t, 3*time.Minute, "a renewed token in the pod, and the call still answered", func() (bool, string) {
		out, now, err := callAPI(t, rome, &pod, list)
		return err == nil && now != token && strings.Contains(out, "ConfigMapList"), fmt.Sprintf("token %s (first %s), err %v", now, token, err)
	})

	require.NoError(t, rome.Client.Delete(ctx, job))
	waitNoPodOrReservation(t, rome, ns, 60*time.Second)
	backToBaseline(t, bed, base, 60*time.Second)
}

// callAPI runs `testapp api path` in pod: its output, the token it used
// (testapp names its digest) or, on failure, what it said, and its error.
func callAPI(t *testing.T, c *testbed.Cluster, pod *corev1.Pod, path string) (out, token string, err error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var stdout, stderr strings.Builder
	cmd := kubectl(ctx, t, c, "exec", "-n", pod.Namespace, pod.Name, "--", "/testapp", "api", path)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err = cmd.Run()
	said := stderr.String()
	if i := strings.Index(said, "token sha256:"); i >= 0 && err == nil {
		said = strings.Fields(said[i+len("token "):])[0]
	}
	return stdout.String(), said, err
}

// appService is Service name in front of appDeployment name's pods.
func appService(ns, name string) *corev1.Service {
	return &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: corev1.ServiceSpec{Selector: map[string]string{"app": name},
			Ports: []corev1.ServicePort{{Name: "http", Port: 80, TargetPort: intstr.FromString("http")}}}}
}

// serviceVar names a Service environment variable (FOO_SERVICE_HOST,
// FOO_PORT_80_TCP_ADDR, ...).
var serviceVar = regexp.MustCompile(`^[A-Z0-9_]+_(SERVICE_HOST|SERVICE_PORT(_[A-Z0-9_]+)?|PORT(_[0-9]+_(TCP|UDP|SCTP)(_PROTO|_PORT|_ADDR)?)?)$`)

// serviceVars are the Service environment variables of pod's container,
// as its process sees them (testapp's GET /env at the pod's IP).
func serviceVars(t *testing.T, pod corev1.Pod) map[string]string {
	t.Helper()
	cl := &http.Client{Timeout: 5 * time.Second}
	resp, err := cl.Get("http://" + pod.Status.PodIP + ":8080/env")
	require.NoError(t, err)
	defer resp.Body.Close()
	var env map[string]string
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&env))
	out := map[string]string{}
	for k, v := range env {
		if serviceVar.MatchString(k) {
			out[k] = v
		}
	}
	return out
}

// clientPod runs a testapp pod on node (bound there, no scheduler) to make
// requests from, and waits until it runs.
func clientPod(t *testing.T, c *testbed.Cluster, ns, node string) *corev1.Pod {
	t.Helper()
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "client"},
		Spec: corev1.PodSpec{NodeName: node, TerminationGracePeriodSeconds: ptr.To[int64](1),
			Containers: []corev1.Container{{Name: "app", Image: testimages.TestApp, ImagePullPolicy: corev1.PullIfNotPresent,
				Resources: corev1.ResourceRequirements{Requests: requests("10m", "16Mi"), Limits: requests("10m", "16Mi")}}}}}
	require.NoError(t, c.Client.Create(context.Background(), pod))
	eventually(t, 60*time.Second, "client pod running on "+node, func() (bool, string) {
		var p corev1.Pod
		if err := c.Client.Get(context.Background(), client.ObjectKeyFromObject(pod), &p); err != nil {
			return false, err.Error()
		}
		return p.Status.Phase == corev1.PodRunning && podReady(&p), podCondition(&p)
	})
	return pod
}

// execIn runs `testapp <verb> <url>` in pod and returns its output.
func execIn(t *testing.T, c *testbed.Cluster, ns string, pod *corev1.Pod, verb, url string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	out, err := kubectl(ctx, t, c, "exec", "-n", ns, pod.Name, "--", "/testapp", verb, url).CombinedOutput()
	require.NoError(t, err, "testapp %s %s in %s: %s", verb, url, pod.Name, out)
	return string(out)
}

// answeredBy makes n GETs of url from pod and returns the pods that
// answered, sorted, each once; a failed request fails the test.
func answeredBy(t *testing.T, c *testbed.Cluster, ns string, pod *corev1.Pod, url string, n int) []string {
	t.Helper()
	seen := map[string]bool{}
	for range n {
		var id appAnswer
		out := execIn(t, c, ns, pod, "get", url)
		require.NoError(t, json.Unmarshal([]byte(out), &id), "answer of %s: %s", url, out)
		seen[id["pod"]] = true
	}
	var names []string
	for name := range seen {
		names = append(names, name)
	}
	sort.Strings(names)
	return names
}

// readyEndpoints are the addresses of Service svc's ready endpoints, from
// its EndpointSlices.
func readyEndpoints(t *testing.T, c *testbed.Cluster, ns, svc string) map[string]bool {
	t.Helper()
	var slices discoveryv1.EndpointSliceList
	require.NoError(t, c.Client.List(context.Background(), &slices, client.InNamespace(ns),
		client.MatchingLabels{discoveryv1.LabelServiceName: svc}))
	ready := map[string]bool{}
	for _, s := range slices.Items {
		for _, ep := range s.Endpoints {
			if ep.Conditions.Ready == nil || *ep.Conditions.Ready {
				for _, a := range ep.Addresses {
					ready[a] = true
				}
			}
		}
	}
	return ready
}
