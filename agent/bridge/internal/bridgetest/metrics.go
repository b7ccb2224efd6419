package bridgetest

import (
	"context"
	"encoding/json"
	"net"
	"net/http"
	"net/http/httptest"
	"sync"
	"time"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/wait"
	metricsv1beta1 "k8s.io/metrics/pkg/apis/metrics/v1beta1"
)

// MetricsAPI plays a cluster's metrics-server: the metrics.k8s.io/v1beta1
// API, registered with the cluster's real API server as an aggregated API
// (an APIService on an ExternalName Service "localhost", the port of an
// httptest TLS server), so that the API server authenticates and
// authorizes every request with its RBAC before it proxies it here. Its
// PodMetrics are the Running pods of the namespace asked for (label
// selectors honoured), measured now over a 15 s window, each container
// using what Usage says. Only the pods routes; no NodeMetrics.
type MetricsAPI struct {
	Usage func(pod *corev1.Pod, container string) corev1.ResourceList

	c     *Cluster
	srv   *httptest.Server
	mu    sync.Mutex
	users map[string]int // of the pod lists, as the API server names them (X-Remote-User)
}

// RunMetricsAPI serves it until the test ends, and waits until the API
// server says it is available.
func (c *Cluster) RunMetricsAPI(usage func(pod *corev1.Pod, container string) corev1.ResourceList) *MetricsAPI {
	c.t.Helper()
	m := &MetricsAPI{Usage: usage, c: c, users: map[string]int{}}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /apis/metrics.k8s.io/v1beta1", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, &metav1.APIResourceList{TypeMeta: metav1.TypeMeta{Kind: "APIResourceList", APIVersion: "v1"},
			GroupVersion: metricsv1beta1.SchemeGroupVersion.String(),
			APIResources: []metav1.APIResource{{Name: "pods", Namespaced: true, Kind: "PodMetrics", Verbs: metav1.Verbs{"get", "list"}}}})
	})
	mux.HandleFunc("GET /apis/metrics.k8s.io/v1beta1/namespaces/{namespace}/pods", m.list)
	m.srv = httptest.NewTLSServer(mux)
	c.t.Cleanup(m.srv.Close)

	ctx := context.Background()
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: metav1.NamespaceSystem, Name: "metrics-server"},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeExternalName, ExternalName: "localhost"}}
	require.NoError(c.t, c.Client.Create(ctx, svc))
	apiService := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "apiregistration.k8s.io/v1", "kind": "APIService",
		"metadata": map[string]any{"name": "v1beta1.metrics.k8s.io"},
		"spec": map[string]any{
			"group": "metrics.k8s.io", "version": "v1beta1", "groupPriorityMinimum": int64(100), "versionPriority": int64(100),
			"insecureSkipTLSVerify": true,
			"service":               map[string]any{"namespace": metav1.NamespaceSystem, "name": "metrics-server", "port": int64(m.srv.Listener.Addr().(*net.TCPAddr).Port)},
		},
	}}
	require.NoError(c.t, c.Client.Create(ctx, apiService))
	require.NoError(c.t, wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		err := c.Clientset.Discovery().RESTClient().Get().AbsPath("/apis/metrics.k8s.io/v1beta1").Do(ctx).Error()
		return err == nil, nil
	}), "the API server serves metrics.k8s.io")
	return m
}

// Lists is how many pod lists user made.
func (m *MetricsAPI) Lists(user string) int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.users[user]
}

func (m *MetricsAPI) list(w http.ResponseWriter, r *http.Request) {
	m.mu.Lock()
	m.users[r.Header.Get("X-Remote-User")]++
	m.mu.Unlock()
	pods, err := m.c.Clientset.CoreV1().Pods(r.PathValue("namespace")).List(r.Context(), metav1.ListOptions{LabelSelector: r.URL.Query().Get("labelSelector")})
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	now := metav1.NewTime(time.Now().Truncate(time.Second))
	out := &metricsv1beta1.PodMetricsList{TypeMeta: metav1.TypeMeta{Kind: "PodMetricsList", APIVersion: metricsv1beta1.SchemeGroupVersion.String()}}
	for i := range pods.Items {
		p := &pods.Items[i]
		if p.Status.Phase != corev1.PodRunning {
			continue
		}
		pm := metricsv1beta1.PodMetrics{ObjectMeta: metav1.ObjectMeta{Namespace: p.Namespace, Name: p.Name, Labels: p.Labels},
			Timestamp: now, Window: metav1.Duration{Duration: 15 * time.Second}}
		for _, c := range p.Spec.Containers {
			pm.Containers = append(pm.Containers, metricsv1beta1.ContainerMetrics{Name: c.Name, Usage: m.Usage(p, c.Name)})
		}
		out.Items = append(out.Items, pm)
	}
	writeJSON(w, out)
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(v)
}
