package virtualkubelet_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/client-go/rest"
	statsv1alpha1 "k8s.io/kubelet/pkg/apis/stats/v1alpha1"

	"github.com/fluidos-project/resource-broker/agent/bridge"
	"github.com/fluidos-project/resource-broker/agent/bridge/internal/bridgetest"
	"github.com/fluidos-project/resource-broker/agent/bridge/virtualkubelet"
	"github.com/fluidos-project/resource-broker/agent/provider"
	rbv1 "github.com/fluidos-project/resource-broker/api/v1alpha1"
	"github.com/fluidos-project/resource-broker/internal/brokertest"
)

// TestVirtualNodeUsage: two virtual nodes of rome, rb-paris and rb-berlin,
// each with one borrowed pod, each with its own kubelet endpoint (its own
// port of the agent's range, in its daemonEndpoints): /stats/summary and
// /metrics/resource of each answer with its own pod only, with the usage
// the provider's metrics.k8s.io reports for the copy (a fake metrics-server
// behind the provider's real API server, which authorizes the tenant's
// list with its RBAC), and the node's usage is the sum of its pods. The
// node lists the provider's metrics once per period, whatever the scrapes.
func TestVirtualNodeUsage(t *testing.T) {
	ctx := context.Background()
	b := brokertest.Start(t, brokertest.Options{})
	rome := newMember(t, b, "rome", bridgetest.Options{})
	cpu := map[string]string{"shop.web-0": "250m", "shop.api-0": "1500m"}
	memory := map[string]string{"shop.web-0": "100Mi", "shop.api-0": "300Mi"}
	usage := func(p *corev1.Pod, _ string) corev1.ResourceList {
		if cpu[p.Name] == "" { // the provider's placeholder pods, which hold the reservations there
			return corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("1m"), corev1.ResourceMemory: resource.MustParse("1Mi")}
		}
		return corev1.ResourceList{corev1.ResourceCPU: resource.MustParse(cpu[p.Name]), corev1.ResourceMemory: resource.MustParse(memory[p.Name])}
	}
	providers := map[string]*bridgetest.MetricsAPI{}
	for _, id := range []string{"paris", "berlin"} {
		m := newMember(t, b, id, bridgetest.Options{})
		m.RunKubelet(id+"-node-1", "rb-rome", corev1.ResourceList{
			corev1.ResourceCPU: resource.MustParse("16"), corev1.ResourceMemory: resource.MustParse("64Gi"), corev1.ResourcePods: resource.MustParse("110")})
		providers[id] = m.RunMetricsAPI(usage)
		m.labels = map[string]string{"city": id}
		b.Advertise(id, "8", "32Gi", "", "0.03", m.labels)
		m.startAgent(nil)
	}
	first := freePort(t)
	rome.startAgent(&bridge.Options{Log: bridgetest.Logger(t, 1), VirtualKubelet: virtualkubelet.Config{
		LeaseDuration: leaseDuration, ProbePeriod: time.Second, StatusSyncPeriod: 5 * time.Second,
		KubeletAddress: fmt.Sprintf("127.0.0.1:%d", first), KubeletPorts: 10, NodeIP: "127.0.0.1", MetricsPeriod: time.Second}})
	homeNamespace(t, rome, "shop")
	pods := map[string]string{"paris": "web-0", "berlin": "api-0"}
	for id, pod := range pods {
		rsv := podReservation("shop", pod, "2", "1Gi") // names the pod: the bridge admits it
		rsv.Spec.ProviderSelector = map[string]string{"city": id}
		require.NoError(t, rome.Client.Create(ctx, rsv))
	}
	for id, pod := range pods {
		rome.waitReservationIn(t, "shop", pod, func(r *rbv1.Reservation) bool { return r.Status.VirtualNode == virtualkubelet.NodeName(id) }, 30*time.Second)
		p := boundPod("shop", pod, corev1.RestartPolicyAlways)
		p.Spec.NodeName, p.Spec.NodeSelector = virtualkubelet.NodeName(id), map[string]string{rbv1.ProviderLabel: id}
		require.NoError(t, rome.Client.Create(ctx, p))
	}

	ports := map[int32]string{}
	for id, pod := range pods {
		node := virtualkubelet.NodeName(id)
		var local *corev1.Pod
		require.EventuallyWithT(t, func(c *assert.CollectT) {
			var err error
			local, err = rome.pod("shop", pod)
			require.NoError(c, err)
			assert.Equal(c, corev1.PodRunning, local.Status.Phase)
		}, 30*time.Second, 20*time.Millisecond)
		n, err := rome.node(node)
		require.NoError(t, err)
		port := n.Status.DaemonEndpoints.KubeletEndpoint.Port
		assert.Equal(t, []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "127.0.0.1"}}, n.Status.Addresses)
		assert.GreaterOrEqual(t, port, int32(first), node)
		assert.Less(t, port, int32(first+10), node)
		assert.NotContains(t, ports, port, "each node its own port")
		ports[port] = node
		endpoint := kubeletEndpoint(t, rome, port)
		wantCPU, wantMemory := resource.MustParse(cpu["shop."+pod]), resource.MustParse(memory["shop."+pod])

		t.Run(node+": /stats/summary has its own pod only", func(t *testing.T) {
			var sum statsv1alpha1.Summary
			require.EventuallyWithT(t, func(c *assert.CollectT) {
				code, body := endpoint.get(c, "/stats/summary")
				require.Equal(c, http.StatusOK, code, body)
				require.NoError(c, json.Unmarshal([]byte(body), &sum))
				assert.Len(c, sum.Pods, 1)
			}, 15*time.Second, 100*time.Millisecond)
			assert.Equal(t, node, sum.Node.NodeName)
			p := sum.Pods[0]
			assert.Equal(t, statsv1alpha1.PodReference{Name: pod, Namespace: "shop", UID: string(local.UID)}, p.PodRef, "the local pod")
			require.Len(t, p.Containers, 1)
			assert.Equal(t, "main", p.Containers[0].Name)
			assert.Equal(t, uint64(wantCPU.ScaledValue(resource.Nano)), *p.Containers[0].CPU.UsageNanoCores)
			assert.Positive(t, *p.Containers[0].CPU.UsageCoreNanoSeconds)
			assert.Equal(t, uint64(wantMemory.Value()), *p.Containers[0].Memory.WorkingSetBytes)
			assert.Equal(t, *p.CPU.UsageNanoCores, *sum.Node.CPU.UsageNanoCores, "the node's usage is its pods'")
			assert.Equal(t, uint64(wantMemory.Value()), *sum.Node.Memory.WorkingSetBytes)
			assert.Equal(t, uint64((1<<30)-wantMemory.Value()), *sum.Node.Memory.AvailableBytes, "allocatable (the reservation's 1Gi) minus the working set")
		})

		t.Run(node+": /metrics/resource, cumulative CPU at the provider's rate", func(t *testing.T) {
			fams := endpoint.metrics(t)
			require.Len(t, fams["container_cpu_usage_seconds_total"].Metric, 1)
			labels := map[string]string{}
			for _, l := range fams["container_cpu_usage_seconds_total"].Metric[0].Label {
				labels[l.GetName()] = l.GetValue()
			}
			assert.Equal(t, map[string]string{"container": "main", "namespace": "shop", "pod": pod}, labels)
			assert.Equal(t, float64(wantMemory.Value()), fams["pod_memory_working_set_bytes"].Metric[0].GetGauge().GetValue())
			assert.Positive(t, fams["container_start_time_seconds"].Metric[0].GetGauge().GetValue())
			// Two scrapes a few polls apart: what metrics-server computes
			// from them is the provider's rate.
			before := fams["node_cpu_usage_seconds_total"].Metric[0]
			var after *dto.Metric
			require.EventuallyWithT(t, func(c *assert.CollectT) {
				after = endpoint.metrics(c)["node_cpu_usage_seconds_total"].Metric[0]
				assert.GreaterOrEqual(c, after.GetTimestampMs()-before.GetTimestampMs(), int64(2000))
			}, 10*time.Second, 200*time.Millisecond)
			rate := (after.GetCounter().GetValue() - before.GetCounter().GetValue()) / (float64(after.GetTimestampMs()-before.GetTimestampMs()) / 1000)
			assert.InDelta(t, wantCPU.AsApproximateFloat64(), rate, 0.001, "cores")
		})

		t.Run(node+": one list of the provider's metrics per period, as the tenant", func(t *testing.T) {
			tenant := "system:serviceaccount:rb-rome:" + provider.TenantServiceAccount
			start, lists := time.Now(), providers[id].Lists(tenant)
			require.Positive(t, lists, "listed through the provider's API server, with the tenant's token")
			for range 30 {
				endpoint.metrics(t)
			}
			polls := providers[id].Lists(tenant) - lists
			assert.LessOrEqual(t, polls, int(time.Since(start)/time.Second)+1, "30 scrapes, %d lists", polls)
		})
	}
}

// freePort is a port nothing listens on now.
func freePort(t *testing.T) int {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// endpointClient calls a virtual node's kubelet endpoint directly, with the
// credentials of rome's administrator (client certificate of the cluster's
// client CA), as the API server's kubelet client would.
type endpointClient struct {
	hc   *http.Client
	base string
}

func kubeletEndpoint(t *testing.T, m *member, port int32) *endpointClient {
	cfg := rest.CopyConfig(m.Config)
	cfg.CAData, cfg.Insecure = nil, true // self-signed: no signer in this cluster
	hc, err := rest.HTTPClientFor(cfg)
	require.NoError(t, err)
	return &endpointClient{hc: hc, base: fmt.Sprintf("https://127.0.0.1:%d", port)}
}

func (e *endpointClient) get(t require.TestingT, path string) (int, string) {
	resp, err := e.hc.Get(e.base + path)
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(body)
}

// metrics reads /metrics/resource with the Prometheus text parser.
func (e *endpointClient) metrics(t require.TestingT) map[string]*dto.MetricFamily {
	code, body := e.get(t, "/metrics/resource")
	require.Equal(t, http.StatusOK, code, body)
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(strings.NewReader(body))
	require.NoError(t, err, body)
	return fams
}
