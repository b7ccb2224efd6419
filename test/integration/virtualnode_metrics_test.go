package integration

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	authenticationv1 "k8s.io/api/authentication/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	statsv1alpha1 "k8s.io/kubelet/pkg/apis/stats/v1alpha1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	rbv1 "github.com/fluidos-project/resource-broker/api/v1alpha1"
	"github.com/fluidos-project/resource-broker/internal/testbed"
)

// testVirtualNodeMetrics: what cluster tools read from a node, for a pod
// borrowed from paris that burns half a CPU there. metrics-server runs in
// both clusters (its own metrics of rome's and paris's real nodes come
// first); in rome, through the API server's node proxy to the virtual node
// rb-paris, /stats/summary and /metrics/resource carry the pod under its
// local name with its real usage; `kubectl top pod` shows it and `kubectl top
// node` shows rb-paris using what that pod uses, not paris's whole cluster.
// The virtual node's kubelet endpoint refuses a caller without a token (401)
// and one whose token may not read node stats (403).
func testVirtualNodeMetrics(t *testing.T, bed *testbed.Bed) {
	ctx := context.Background()
	rome, paris := bed.Cluster("rome"), bed.Cluster("paris")
	base := baseline(t, bed)

	// metrics-server itself, on the real nodes.
	for _, c := range []*testbed.Cluster{rome, paris} {
		rows := waitTop(t, c, 90*time.Second, "every real node of "+c.Name+" in kubectl top node", []string{"node"},
			func(rows map[string]topRow) (bool, string) {
				for _, n := range c.Nodes() {
					if r, ok := rows[n]; !ok || r.cpu.IsZero() || r.mem.IsZero() {
						return false, fmt.Sprintf("%s: %+v", n, rows)
					}
				}
				return true, ""
			})
		figureLine(t, "metrics", "%s kubectl top node: %s", c.Name, rows)
	}

	const ns = "vn-metrics"
	newNamespace(t, rome, ns)
	dep := appDeployment(ns, "burner", 1, "1500m", "256Mi") // rome's node has 1 CPU
	require.NoError(t, rome.Client.Create(ctx, dep))
	pod := waitDeploymentReady(t, rome, ns, 1)[0]
	vnode := pod.Spec.NodeName
	require.Equal(t, "rb-paris", vnode, "the pod is borrowed from paris")
	stop := burnCPU(t, pod.Status.PodIP, 0.5)
	defer stop()
	burning := time.Now()

	// /stats/summary, as `kubectl get --raw` reads it through the node proxy.
	var podStats statsv1alpha1.PodStats
	eventually(t, 120*time.Second, "the burning pod in "+vnode+"'s /stats/summary", func() (bool, string) {
		out, err := kubectl(ctx, t, rome, "get", "--raw", "/api/v1/nodes/"+vnode+"/proxy/stats/summary").CombinedOutput()
		if err != nil {
			return false, string(out)
		}
		var s statsv1alpha1.Summary
		if err := json.Unmarshal(out, &s); err != nil {
			return false, fmt.Sprintf("%v: %s", err, out)
		}
		if s.Node.NodeName != vnode {
			return false, "node " + s.Node.NodeName
		}
		for _, p := range s.Pods {
			if p.PodRef.Namespace == ns && p.PodRef.Name == pod.Name {
				podStats = p
				return p.CPU != nil && p.CPU.UsageNanoCores != nil && *p.CPU.UsageNanoCores >= 100e6 &&
					p.Memory != nil && p.Memory.WorkingSetBytes != nil && *p.Memory.WorkingSetBytes > 0, string(out)
			}
		}
		return false, "pod not in " + string(out)
	})
	figure(t, "burning pod in %s's /stats/summary (via the API server's node proxy) %s after the burn began: cpu %dm, working set %d MiB",
		vnode, time.Since(burning).Round(time.Second), *podStats.CPU.UsageNanoCores/1e6, *podStats.Memory.WorkingSetBytes>>20)
	require.NotEmpty(t, podStats.Containers, "container stats")
	assert.Equal(t, "app", podStats.Containers[0].Name)
	assert.Equal(t, string(pod.UID), podStats.PodRef.UID, "the local pod's UID")

	// /metrics/resource: what metrics-server scrapes.
	eventually(t, 60*time.Second, vnode+"'s /metrics/resource with the pod's container", func() (bool, string) {
		out, err := kubectl(ctx, t, rome, "get", "--raw", "/api/v1/nodes/"+vnode+"/proxy/metrics/resource").CombinedOutput()
		if err != nil {
			return false, string(out)
		}
		p := expfmt.NewTextParser(model.UTF8Validation)
		fams, err := p.TextToMetricFamilies(bytes.NewReader(out))
		if err != nil {
			return false, fmt.Sprintf("%v: %s", err, out)
		}
		for _, name := range []string{"node_cpu_usage_seconds_total", "node_memory_working_set_bytes", "container_memory_working_set_bytes"} {
			if fams[name] == nil || len(fams[name].Metric) == 0 {
				return false, name + " missing: " + string(out)
			}
		}
		for _, m := range fams["container_cpu_usage_seconds_total"].GetMetric() {
			l := map[string]string{}
			for _, lp := range m.GetLabel() {
				l[lp.GetName()] = lp.GetValue()
			}
			if l["namespace"] == ns && l["pod"] == pod.Name && l["container"] == "app" {
				return m.GetCounter().GetValue() > 0 && m.GetTimestampMs() > 0, string(out)
			}
		}
		return false, "no container_cpu_usage_seconds_total of the pod: " + string(out)
	})

	// kubectl top pod: metrics-server in rome scraped the virtual node.
	podRows := waitTop(t, rome, 120*time.Second, "the borrowed pod burning in kubectl top pod", []string{"pod", "-n", ns},
		func(rows map[string]topRow) (bool, string) {
			r, ok := rows[pod.Name]
			return ok && r.cpu.MilliValue() >= 100 && !r.mem.IsZero(), fmt.Sprint(rows)
		})
	figure(t, "kubectl top pod shows the borrowed pod %s after the burn began: %s", time.Since(burning).Round(time.Second), podRows[pod.Name])

	// kubectl top node: rb-paris uses what its pod uses, far less than paris.
	var vn, parisTotal topRow
	var podNow topRow
	waitTop(t, rome, 90*time.Second, vnode+" in kubectl top node, close to its pod", []string{"node"},
		func(rows map[string]topRow) (bool, string) {
			var ok bool
			if vn, ok = rows[vnode]; !ok {
				return false, fmt.Sprint(rows)
			}
			pods, _, err := kubectlTop(ctx, t, rome, "pod", "-n", ns)
			if err != nil {
				return false, err.Error()
			}
			podNow = pods[pod.Name]
			prows, _, err := kubectlTop(ctx, t, paris, "node")
			if err != nil {
				return false, err.Error()
			}
			parisTotal = topRow{}
			for _, n := range paris.Nodes() {
				parisTotal.cpu.Add(prows[n].cpu)
				parisTotal.mem.Add(prows[n].mem)
			}
			// Both are rates over windows that need not coincide.
			diff := vn.cpu.MilliValue() - podNow.cpu.MilliValue()
			near := max(diff, -diff) <= max(150, podNow.cpu.MilliValue()/3)
			return near && vn.cpu.Cmp(parisTotal.cpu) < 0 && vn.mem.Cmp(parisTotal.mem) < 0 && !vn.mem.IsZero(),
				fmt.Sprintf("%s %s, pod %s, paris's nodes %s", vnode, vn, podNow, parisTotal)
		})
	figure(t, "kubectl top node: %s %s (its pod %s; paris's real nodes together %s)", vnode, vn, podNow, parisTotal)

	testKubeletEndpointRefusals(t, rome, ns, vnode, pod.Name)

	stop()
	require.NoError(t, rome.Client.Delete(ctx, dep))
	waitNoPods(t, rome, ns, 90*time.Second)
	waitTenantGone(t, paris, 90*time.Second)
	backToBaseline(t, bed, base, 60*time.Second)
}

// testKubeletEndpointRefusals: a ServiceAccount without nodes/proxy is
// refused by the API server's node proxy; at the virtual node's kubelet
// endpoint itself, no credentials are 401, a token without nodes/stats 403,
// and a token with it reads the summary.
func testKubeletEndpointRefusals(t *testing.T, rome *testbed.Cluster, ns, vnode, podName string) {
	t.Helper()
	ctx := context.Background()
	for _, sa := range []string{"no-stats", "stats-reader"} {
		require.NoError(t, rome.Client.Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: sa}}))
	}
	token := func(sa string) string {
		tr, err := rome.Clientset.CoreV1().ServiceAccounts(ns).CreateToken(ctx, sa, &authenticationv1.TokenRequest{}, metav1.CreateOptions{})
		require.NoError(t, err)
		return tr.Status.Token
	}
	noStats, reader := token("no-stats"), token("stats-reader")
	role := &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "vn-metrics-stats-reader"},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"nodes/stats"}, Verbs: []string{"get"}}}}
	binding := &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "vn-metrics-stats-reader"},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role.Name},
		Subjects: []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: ns, Name: "stats-reader"}}}
	for _, obj := range []client.Object{role, binding} {
		require.NoError(t, rome.Client.Create(ctx, obj))
		t.Cleanup(func() { _ = rome.Client.Delete(context.Background(), obj) })
	}

	// Through the API server: nodes/proxy is what it checks.
	kc := tokenKubeconfig(t, rome, noStats)
	out, err := kubectl(ctx, t, rome, "--kubeconfig", kc, "get", "--raw", "/api/v1/nodes/"+vnode+"/proxy/stats/summary").CombinedOutput()
	require.Error(t, err, "a ServiceAccount without nodes/proxy reads the summary: %s", out)
	assert.Contains(t, string(out), `cannot get resource "nodes/proxy"`)

	// At the kubelet endpoint (the node's address and port), as a kubelet
	// run with webhook authentication and authorization answers.
	var node corev1.Node
	require.NoError(t, rome.Client.Get(ctx, client.ObjectKey{Name: vnode}, &node))
	addr := ""
	for _, a := range node.Status.Addresses {
		if a.Type == corev1.NodeInternalIP {
			addr = a.Address
		}
	}
	port := node.Status.DaemonEndpoints.KubeletEndpoint.Port
	require.NotEmpty(t, addr, "InternalIP of %s", vnode)
	require.NotZero(t, port, "kubelet port of %s", vnode)
	url := "https://" + net.JoinHostPort(addr, strconv.Itoa(int(port))) + "/stats/summary"
	cl := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: rome.CA.Pool()}}}
	get := func(token string) (int, string) {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		require.NoError(t, err)
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := cl.Do(req)
		require.NoError(t, err, "GET %s (verified with rome's CA)", url)
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(body)
	}
	code, body := get("")
	assert.Equal(t, http.StatusUnauthorized, code, "no credentials: %s", body)
	code, body = get(noStats)
	assert.Equal(t, http.StatusForbidden, code, "a token without nodes/stats: %s", body)
	eventually(t, 30*time.Second, "stats-reader's token reads the summary", func() (bool, string) {
		code, body := get(reader)
		return code == http.StatusOK && strings.Contains(body, podName), fmt.Sprintf("%d %s", code, body)
	})
	figureLine(t, "metrics", "%s: no credentials 401, token without nodes/stats 403, with it 200; the API server's node proxy refuses a token without nodes/proxy", url)
}

// testVirtualNodeHPA: a Deployment whose pods are all borrowed from paris
// (none fits rome), under an autoscaling/v2 HPA at 10 % of its 1.5-CPU
// request (150m: an idle pod uses about 1m, one burning 0.8 CPU on a busy
// 2-core machine at least 200m). One pod burns: the HPA in rome, reading metrics-server,
// which reads the virtual node, scales out; every new pod is borrowed too,
// each with a Reservation of its own. The burn stops: it scales back in to 1.
func testVirtualNodeHPA(t *testing.T, bed *testbed.Bed) {
	ctx := context.Background()
	rome, paris := bed.Cluster("rome"), bed.Cluster("paris")
	base := baseline(t, bed)
	const ns, name = "vn-hpa", "scaler"
	newNamespace(t, rome, ns)
	dep := appDeployment(ns, name, 1, "1500m", "128Mi")
	require.NoError(t, rome.Client.Create(ctx, dep))
	first := waitDeploymentReady(t, rome, ns, 1)[0]
	require.Equal(t, "rb-paris", first.Spec.NodeName)

	hpa := &autoscalingv2.HorizontalPodAutoscaler{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: autoscalingv2.HorizontalPodAutoscalerSpec{
			ScaleTargetRef: autoscalingv2.CrossVersionObjectReference{APIVersion: "apps/v1", Kind: "Deployment", Name: name},
			MinReplicas:    ptr.To[int32](1), MaxReplicas: 3, // paris holds three 1.5-CPU pods
			Metrics: []autoscalingv2.MetricSpec{{Type: autoscalingv2.ResourceMetricSourceType,
				Resource: &autoscalingv2.ResourceMetricSource{Name: corev1.ResourceCPU,
					Target: autoscalingv2.MetricTarget{Type: autoscalingv2.UtilizationMetricType, AverageUtilization: ptr.To[int32](10)}}}},
			Behavior: &autoscalingv2.HorizontalPodAutoscalerBehavior{
				ScaleDown: &autoscalingv2.HPAScalingRules{StabilizationWindowSeconds: ptr.To[int32](0)}},
		},
	}
	require.NoError(t, rome.Client.Create(ctx, hpa))
	began := time.Now()
	eventually(t, 120*time.Second, "the HPA reads the borrowed pod's CPU", func() (bool, string) {
		require.NoError(t, rome.Client.Get(ctx, client.ObjectKeyFromObject(hpa), hpa))
		return hpaUtilization(hpa) != nil && hpaCondition(hpa, autoscalingv2.ScalingActive) == corev1.ConditionTrue, hpaState(hpa)
	})
	figure(t, "HPA created -> reads the borrowed pod's CPU (%d%%) in %s", *hpaUtilization(hpa), time.Since(began).Round(time.Second))
	require.Equal(t, int32(1), hpa.Status.DesiredReplicas, "idle: one replica (%s)", hpaState(hpa))

	stop := burnCPU(t, first.Status.PodIP, 0.8)
	defer stop()
	burning := time.Now()
	eventually(t, 240*time.Second, "the HPA scales out", func() (bool, string) {
		require.NoError(t, rome.Client.Get(ctx, client.ObjectKeyFromObject(hpa), hpa))
		return hpa.Status.DesiredReplicas > 1, hpaState(hpa)
	})
	scaledOut := time.Since(burning)
	var pods []corev1.Pod
	eventually(t, 120*time.Second, "every replica Running and Ready on rb-paris", func() (bool, string) {
		require.NoError(t, rome.Client.Get(ctx, client.ObjectKeyFromObject(dep), dep))
		var l corev1.PodList
		require.NoError(t, rome.Client.List(ctx, &l, client.InNamespace(ns)))
		pods = l.Items
		var state []string
		ready := 0
		for _, p := range pods {
			if p.Spec.NodeName == "rb-paris" && p.Status.Phase == corev1.PodRunning && podReady(&p) {
				ready++
			}
			state = append(state, fmt.Sprintf("%s %s on %q", p.Name, p.Status.Phase, p.Spec.NodeName))
		}
		n := int(*dep.Spec.Replicas)
		return n > 1 && len(pods) == n && ready == n, strings.Join(state, "; ")
	})
	allRunning := time.Since(burning)
	items := waitReservations(t, rome, ns, len(pods), 30*time.Second, "a Reservation Active on paris per replica",
		func(r *rbv1.Reservation) bool {
			return r.Status.Phase == rbv1.ReservationActive && r.Status.Provider == "paris"
		})
	var podNames, reserved []string
	for _, p := range pods {
		podNames = append(podNames, p.Name)
	}
	for _, r := range items {
		reserved = append(reserved, r.Spec.PodName)
	}
	sort.Strings(podNames)
	sort.Strings(reserved)
	assert.Equal(t, podNames, reserved, "each replica has a Reservation of its own")
	figure(t, "HPA: one pod burning 0.8 CPU -> scaled out to %d in %s, all %d Running on rb-paris in %s",
		len(pods), scaledOut.Round(time.Second), len(pods), allRunning.Round(time.Second))

	stop()
	stopped := time.Now()
	eventually(t, 300*time.Second, "the HPA scales back in to 1", func() (bool, string) {
		require.NoError(t, rome.Client.Get(ctx, client.ObjectKeyFromObject(hpa), hpa))
		var l corev1.PodList
		require.NoError(t, rome.Client.List(ctx, &l, client.InNamespace(ns)))
		return hpa.Status.DesiredReplicas == 1 && len(l.Items) == 1, fmt.Sprintf("%s; %d pods", hpaState(hpa), len(l.Items))
	})
	figure(t, "HPA: burn stopped -> scaled in to 1 in %s", time.Since(stopped).Round(time.Second))
	waitReservations(t, rome, ns, 1, 60*time.Second, "one Reservation left",
		func(r *rbv1.Reservation) bool { return r.Status.Phase == rbv1.ReservationActive })

	require.NoError(t, rome.Client.Delete(ctx, hpa))
	require.NoError(t, rome.Client.Delete(ctx, dep))
	waitNoPods(t, rome, ns, 90*time.Second)
	waitTenantGone(t, paris, 90*time.Second)
	backToBaseline(t, bed, base, 60*time.Second)
}

func hpaUtilization(h *autoscalingv2.HorizontalPodAutoscaler) *int32 {
	for _, m := range h.Status.CurrentMetrics {
		if m.Type == autoscalingv2.ResourceMetricSourceType && m.Resource != nil && m.Resource.Name == corev1.ResourceCPU {
			return m.Resource.Current.AverageUtilization
		}
	}
	return nil
}

func hpaCondition(h *autoscalingv2.HorizontalPodAutoscaler, typ autoscalingv2.HorizontalPodAutoscalerConditionType) corev1.ConditionStatus {
	for _, c := range h.Status.Conditions {
		if c.Type == typ {
			return c.Status
		}
	}
	return corev1.ConditionUnknown
}

func hpaState(h *autoscalingv2.HorizontalPodAutoscaler) string {
	u := "unknown"
	if p := hpaUtilization(h); p != nil {
		u = fmt.Sprintf("%d%%", *p)
	}
	var conds []string
	for _, c := range h.Status.Conditions {
		conds = append(conds, fmt.Sprintf("%s=%s (%s: %s)", c.Type, c.Status, c.Reason, c.Message))
	}
	return fmt.Sprintf("replicas %d desired %d cpu %s; %s", h.Status.CurrentReplicas, h.Status.DesiredReplicas, u, strings.Join(conds, "; "))
}

// burnCPU keeps the test application at podIP burning cores (POST /burn, in
// 5-second slices) until the returned stop is called; the burn ends within
// 5 s of it.
func burnCPU(t *testing.T, podIP string, cores float64) (stop func()) {
	t.Helper()
	const slice = 5 * time.Second
	url := fmt.Sprintf("http://%s:8080/burn?cpu=%g&seconds=%d", podIP, cores, int(slice.Seconds()))
	post := func() error {
		resp, err := (&http.Client{Timeout: 3 * time.Second}).Post(url, "", nil)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusAccepted {
			body, _ := io.ReadAll(resp.Body)
			return fmt.Errorf("%s: %s", resp.Status, body)
		}
		return nil
	}
	require.NoError(t, post(), "POST %s", url)
	done, exited := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(exited)
		tick := time.NewTicker(slice)
		defer tick.Stop()
		for {
			select {
			case <-done:
				return
			case <-tick.C:
				if err := post(); err != nil {
					t.Logf("burn: POST %s: %v", url, err)
				}
			}
		}
	}()
	var once sync.Once
	return func() { once.Do(func() { close(done); <-exited }) }
}

// topRow is one line of kubectl top: CPU and memory in use.
type topRow struct{ cpu, mem resource.Quantity }

func (r topRow) String() string { return fmt.Sprintf("cpu %s mem %s", r.cpu.String(), r.mem.String()) }

// kubectlTop runs `kubectl top <args>` against c, as a user would, and
// returns its rows by name.
func kubectlTop(ctx context.Context, t *testing.T, c *testbed.Cluster, args ...string) (map[string]topRow, string, error) {
	out, err := kubectl(ctx, t, c, append([]string{"top"}, args...)...).CombinedOutput()
	if err != nil {
		return nil, string(out), fmt.Errorf("kubectl top %s: %w: %s", strings.Join(args, " "), err, out)
	}
	sc := bufio.NewScanner(bytes.NewReader(out))
	var cols map[string]int
	rows := map[string]topRow{}
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if cols == nil {
			cols = map[string]int{}
			for i, h := range f {
				cols[h] = i
			}
			continue
		}
		ci, ok1 := cols["CPU(cores)"]
		mi, ok2 := cols["MEMORY(bytes)"]
		if !ok1 || !ok2 || len(f) <= max(ci, mi) {
			return nil, string(out), fmt.Errorf("kubectl top %s: unexpected output: %s", strings.Join(args, " "), out)
		}
		cpu, err1 := resource.ParseQuantity(f[ci])
		mem, err2 := resource.ParseQuantity(f[mi])
		if err1 != nil || err2 != nil {
			return nil, string(out), fmt.Errorf("kubectl top: %q: %v %v", sc.Text(), err1, err2)
		}
		rows[f[0]] = topRow{cpu: cpu, mem: mem}
	}
	return rows, string(out), nil
}

// waitTop polls `kubectl top <args>` until ok holds for its rows.
func waitTop(t *testing.T, c *testbed.Cluster, timeout time.Duration, what string, args []string,
	ok func(map[string]topRow) (bool, string)) map[string]topRow {
	t.Helper()
	var rows map[string]topRow
	eventually(t, timeout, what, func() (bool, string) {
		var err error
		if rows, _, err = kubectlTop(context.Background(), t, c, args...); err != nil {
			return false, err.Error()
		}
		return ok(rows)
	})
	return rows
}

// waitNoPods waits until a namespace holds no pod.
func waitNoPods(t *testing.T, c *testbed.Cluster, ns string, timeout time.Duration) {
	t.Helper()
	eventually(t, timeout, "no pod left in "+ns, func() (bool, string) {
		var l corev1.PodList
		require.NoError(t, c.Client.List(context.Background(), &l, client.InNamespace(ns)))
		return len(l.Items) == 0, fmt.Sprintf("%d pods", len(l.Items))
	})
}

// tokenKubeconfig writes a kubeconfig for c's API server with a bearer token
// and no client certificate.
func tokenKubeconfig(t *testing.T, c *testbed.Cluster, token string) string {
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["c"] = &clientcmdapi.Cluster{Server: c.Config.Host, CertificateAuthorityData: c.Config.CAData}
	cfg.AuthInfos["u"] = &clientcmdapi.AuthInfo{Token: token}
	cfg.Contexts["c"] = &clientcmdapi.Context{Cluster: "c", AuthInfo: "u"}
	cfg.CurrentContext = "c"
	path := filepath.Join(t.TempDir(), "token.kubeconfig")
	require.NoError(t, clientcmd.WriteToFile(*cfg, path))
	_ = os.Chmod(path, 0o600)
	return path
}
