package integration

import (
	"bufio"
	"bytes"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	"sigs.k8s.io/yaml"

	rbv1 "github.com/fluidos-project/resource-broker/api/v1alpha1"
	"github.com/fluidos-project/resource-broker/broker/api"
	"github.com/fluidos-project/resource-broker/internal/brokertest"
	"github.com/fluidos-project/resource-broker/internal/testbed"
	"github.com/fluidos-project/resource-broker/internal/testenv"
)

// operatorBinaries returns the directory of rb-broker, rb-agent and
// rb-scheduler: RB_TESTBED_BIN's, or this checkout's, built now.
func operatorBinaries(t *testing.T) string {
	t.Helper()
	root := testenv.ModulePath(t)
	dir, err := testbed.DefaultBinDir(root)
	require.NoError(t, err)
	if os.Getenv(testbed.BinDirEnv) == "" {
		_, err := testbed.Build(t.Context(), root, dir)
		require.NoError(t, err)
	}
	return dir
}

// TestOperatorJSONLogs starts each binary as an operator would with
// --logging-format=json (a real broker on a real Redis, a real API server for
// the agent and the scheduler) and checks that everything it writes is a
// JSON object with ts and msg, and v on every line that is not an error,
// net/http's own errors included.
func TestOperatorJSONLogs(t *testing.T) {
	bin := operatorBinaries(t)
	kubeconfig, _ := operatorCluster(t)

	b := brokertest.Start(t, brokertest.Options{})
	broker := b.StartProcess(filepath.Join(bin, "rb-broker"), nil, "--logging-format=json", "-v=2")
	// A client that does not speak TLS: net/http logs the handshake error
	// through its ErrorLog, which must be klog's.
	conn, err := net.Dial("tcp", strings.TrimPrefix(broker.URL, "https://"))
	require.NoError(t, err)
	_, _ = conn.Write([]byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n"))
	_, _ = conn.Read(make([]byte, 64))
	conn.Close()
	brokerLines := waitJSONLines(t, func() ([]byte, error) { return os.ReadFile(broker.Log) }, "http: TLS handshake error")
	assertServing(t, brokerLines, "serving")

	agentProbe := freePort(t)
	agent := startLogged(t, filepath.Join(bin, "rb-agent"), "--logging-format=json", "-v=2",
		"--kubeconfig="+kubeconfig, "--cluster-id=rome", "--broker-url="+broker.URL, "--broker-cert-dir="+b.ClusterCertDir("rome"),
		"--namespace=default", "--bridge=none", "--leader-elect=false", "--metrics-bind-address=0",
		"--health-probe-bind-address=127.0.0.1:"+agentProbe, "--allow-local-api-server-address")
	assertServing(t, waitJSONLines(t, agent, "starting rb-agent"), "starting rb-agent")

	schedPort := freePort(t)
	sched := startLogged(t, filepath.Join(bin, "rb-scheduler"), "--logging-format=json", "-v=2",
		"--kubeconfig="+kubeconfig, "--authentication-kubeconfig="+kubeconfig, "--authorization-kubeconfig="+kubeconfig,
		"--leader-elect=false", "--bind-address=127.0.0.1", "--secure-port="+schedPort)
	assertServing(t, waitJSONLines(t, sched, "Serving securely"), "Serving securely")
}

// operatorCluster starts a real API server with our CRDs and returns the
// kubeconfig file and client of an administrator (system:masters).
func operatorCluster(t *testing.T) (string, client.Client) {
	t.Helper()
	var env *envtest.Environment
	cfg := testenv.Start(t, testenv.WithCRDDirectories(testenv.ModulePath(t, "manifests", "crds")),
		testenv.WithEnvironment(func(e *envtest.Environment) { env = e }))
	admin, err := env.AddUser(envtest.User{Name: "operator", Groups: []string{"system:masters"}}, nil)
	require.NoError(t, err)
	kc, err := admin.KubeConfig()
	require.NoError(t, err)
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	require.NoError(t, os.WriteFile(kubeconfig, kc, 0o600))
	c, err := client.New(cfg, client.Options{Scheme: testbed.Scheme})
	require.NoError(t, err)
	return kubeconfig, c
}

// TestOperatorPrinterColumns runs `kubectl get providerinstructions -A`
// against a real API server: one NAMESPACE column (the object's), the
// tenant's namespace under its own name.
func TestOperatorPrinterColumns(t *testing.T) {
	kubeconfig, c := operatorCluster(t)
	ctx := t.Context()
	require.NoError(t, c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: testbed.AgentNamespace}}))
	pi := &rbv1.ProviderInstruction{ObjectMeta: metav1.ObjectMeta{Namespace: testbed.AgentNamespace, Name: "rome.r-1"},
		Spec: rbv1.ProviderInstructionSpec{ReservationID: "r-1", Requester: "rome", Resources: testbed.Resources("2", "4Gi")}}
	require.NoError(t, c.Create(ctx, pi))
	pi.Status.Enforced, pi.Status.TenantNamespace = true, "rb-rome"
	require.NoError(t, c.Status().Update(ctx, pi))

	kubectl := filepath.Join(testenv.ModulePath(t, "bin", "k8s"), "kubectl")
	if dir, err := testenv.AssetsDir(); err == nil {
		kubectl = filepath.Join(dir, "kubectl")
	}
	out, err := exec.Command(kubectl, "--kubeconfig="+kubeconfig, "get", "providerinstructions", "-A").CombinedOutput()
	require.NoError(t, err, "%s", out)
	t.Logf("kubectl get providerinstructions -A:\n%s", out)
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	require.Len(t, lines, 2)
	header := strings.Fields(lines[0])
	assert.Equal(t, 1, slices.Index(header, "NAME"), "one NAMESPACE column, then NAME: %v", header)
	assert.Equal(t, []string{"NAMESPACE"}, slices.DeleteFunc(slices.Clone(header), func(h string) bool { return h != "NAMESPACE" }))
	// The cell under TENANT-NAMESPACE (kubectl aligns cells on the header).
	at := strings.Index(lines[0], "TENANT-NAMESPACE")
	require.GreaterOrEqual(t, at, 0, "%v", header)
	require.Greater(t, len(lines[1]), at)
	assert.Equal(t, "rb-rome", strings.Fields(lines[1][at:])[0])
	assert.Equal(t, testbed.AgentNamespace, strings.Fields(lines[1])[0])
}

// startLogged runs bin with args until the end of the test and returns a
// reader of what it wrote so far (standard output and error together).
func startLogged(t *testing.T, bin string, args ...string) func() ([]byte, error) {
	t.Helper()
	logPath := filepath.Join(t.TempDir(), filepath.Base(bin)+".log")
	logf, err := os.Create(logPath)
	require.NoError(t, err)
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	require.NoError(t, cmd.Start())
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); logf.Close(); close(exited) }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(15 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
		if t.Failed() {
			data, _ := os.ReadFile(logPath)
			lines := strings.Split(string(data), "\n")
			t.Logf("%s, last lines:\n%s", filepath.Base(bin), strings.Join(lines[max(0, len(lines)-40):], "\n"))
		}
	})
	return func() ([]byte, error) { return os.ReadFile(logPath) }
}

// waitJSONLines waits (60 s at most) until a log line's msg contains want,
// checks that every line is a JSON log entry, and returns them.
func waitJSONLines(t *testing.T, read func() ([]byte, error), want string) []map[string]any {
	t.Helper()
	var lines []map[string]any
	var last []byte
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		data, err := read()
		require.NoError(t, err)
		last = data
		lines = lines[:0]
		found := false
		if i := bytes.LastIndexByte(data, '\n'); i >= 0 {
			data = data[:i+1] // not a line still being written
		} else {
			data = nil
		}
		sc := bufio.NewScanner(bytes.NewReader(data))
		sc.Buffer(nil, 1<<20)
		for sc.Scan() {
			line := sc.Bytes()
			if len(bytes.TrimSpace(line)) == 0 {
				continue
			}
			var entry map[string]any
			require.NoError(t, json.Unmarshal(line, &entry), "not a JSON log line: %s", line)
			lines = append(lines, entry)
			if strings.Contains(asString(entry["msg"]), want) && !found {
				found = true
				t.Logf("%s", line)
			}
		}
		if found {
			t.Logf("%d JSON lines so far", len(lines))
			for _, e := range lines {
				assert.IsType(t, float64(0), e["ts"], "ts of %v", e)
				assert.NotEmpty(t, asString(e["msg"]), "msg of %v", e)
				if _, isError := e["err"]; !isError && !strings.HasPrefix(asString(e["msg"]), "http: ") {
					assert.IsType(t, float64(0), e["v"], "v of %v", e)
				}
			}
			return lines
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("no log line with %q within 60s:\n%s", want, last)
	return nil
}

// assertServing checks that the line whose msg contains msg was logged at
// verbosity 0 with the binary's version.
func assertServing(t *testing.T, lines []map[string]any, msg string) {
	t.Helper()
	for _, e := range lines {
		if strings.Contains(asString(e["msg"]), msg) {
			assert.Equal(t, float64(0), e["v"], "%v", e)
			return
		}
	}
	t.Errorf("no line %q", msg)
}

func asString(v any) string {
	s, _ := v.(string)
	return s
}

func freePort(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	return strconv.Itoa(ln.Addr().(*net.TCPAddr).Port)
}

// TestOperatorMetrics runs a real broker and agent as deployed: the agent's
// /metrics is https and answers only callers the API server authenticates
// and authorizes (manifests/monitoring/agent's ClusterRole); after a
// reservation goes through both, every metric the federation's Grafana
// dashboard (manifests/grafana/federation.json) queries is one they serve.
func TestOperatorMetrics(t *testing.T) {
	bin := operatorBinaries(t)
	kubeconfig, c := operatorCluster(t)
	ctx := t.Context()
	b := brokertest.Start(t, brokertest.Options{})
	broker := b.StartProcess(filepath.Join(bin, "rb-broker"), nil)
	b.Advertise("paris", "8", "32Gi", "", "0.03", nil)

	metricsPort, probe := freePort(t), freePort(t)
	startLogged(t, filepath.Join(bin, "rb-agent"), "--kubeconfig="+kubeconfig, "--cluster-id=rome", "--broker-url="+broker.URL,
		"--broker-cert-dir="+b.ClusterCertDir("rome"), "--namespace=default", "--bridge=none", "--leader-elect=false",
		"--metrics-bind-address=127.0.0.1:"+metricsPort, "--health-probe-bind-address=127.0.0.1:"+probe, "--allow-local-api-server-address")
	require.Eventually(t, func() bool { return testbed.HTTPOK("http://127.0.0.1:" + probe + "/readyz") }, 60*time.Second, 100*time.Millisecond)
	agentMetrics := "https://127.0.0.1:" + metricsPort + "/metrics"
	require.Eventually(t, func() bool { // the metrics server starts after the probes'
		conn, err := net.Dial("tcp", "127.0.0.1:"+metricsPort)
		if err == nil {
			conn.Close()
		}
		return err == nil
	}, 60*time.Second, 100*time.Millisecond)

	// Prometheus's ServiceAccount, bound as manifests/monitoring/agent binds
	// it, and one that is not.
	kc, err := kubernetes.NewForConfig(mustRESTConfig(t, kubeconfig))
	require.NoError(t, err)
	token := func(sa string) string {
		_, err := kc.CoreV1().ServiceAccounts("default").Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: sa}}, metav1.CreateOptions{})
		require.NoError(t, err)
		tr, err := kc.CoreV1().ServiceAccounts("default").CreateToken(ctx, sa, &authenticationv1.TokenRequest{}, metav1.CreateOptions{})
		require.NoError(t, err)
		return tr.Status.Token
	}
	for _, u := range monitoringRBAC(t) {
		if u.GetKind() == "ClusterRoleBinding" {
			require.NoError(t, unstructured.SetNestedSlice(u.Object, []any{map[string]any{"kind": "ServiceAccount", "name": "prometheus", "namespace": "default"}}, "subjects"))
		}
		require.NoError(t, c.Create(ctx, u))
	}
	prometheus, stranger := token("prometheus"), token("stranger")

	code, _ := scrape(t, agentMetrics, "")
	assert.Equal(t, http.StatusUnauthorized, code, "no credentials")
	code, _ = scrape(t, agentMetrics, stranger)
	assert.Equal(t, http.StatusForbidden, code, "a token not allowed get on /metrics")
	plain, err := http.Get(strings.Replace(agentMetrics, "https://", "http://", 1))
	if err == nil {
		plain.Body.Close()
		assert.NotEqual(t, http.StatusOK, plain.StatusCode, "plain HTTP")
	}

	// A reservation through the agent and the broker, released, and a
	// renewal: the series of both sides exist.
	rsv := reservation("default", "web-0", "1", "1Gi")
	require.NoError(t, c.Create(ctx, rsv))
	eventually(t, 60*time.Second, "Reservation web-0 reserved on paris", func() (bool, string) {
		require.NoError(t, c.Get(ctx, client.ObjectKeyFromObject(rsv), rsv))
		return rsv.Status.Provider == "paris", fmt.Sprintf("phase %q provider %q", rsv.Status.Phase, rsv.Status.Provider)
	})
	require.NoError(t, c.Delete(ctx, rsv))
	renew, err := json.Marshal(api.RenewRequest{IDs: []string{"nothing"}})
	require.NoError(t, err)
	resp, err := b.Client("rome").Post(broker.URL+"/api/v2/renewals", "application/json", bytes.NewReader(renew))
	require.NoError(t, err)
	resp.Body.Close()

	served := map[string]bool{}
	var agentText string
	eventually(t, 60*time.Second, "the release counted by the broker", func() (bool, string) {
		code, text := scrape(t, broker.Health+"/metrics", "")
		require.Equal(t, http.StatusOK, code)
		return strings.Contains(text, `rb_broker_reservations_ended_total{how="released"} 1`), "not yet"
	})
	for _, target := range []struct{ url, token string }{{broker.Health + "/metrics", ""}, {agentMetrics, prometheus}} {
		code, text := scrape(t, target.url, target.token)
		require.Equal(t, http.StatusOK, code, target.url)
		if target.token != "" {
			agentText = text
		}
		parser := expfmt.NewTextParser(model.UTF8Validation)
		families, err := parser.TextToMetricFamilies(strings.NewReader(text))
		require.NoError(t, err)
		for name, f := range families {
			served[name] = true
			if f.GetType() == dto.MetricType_HISTOGRAM || f.GetType() == dto.MetricType_SUMMARY {
				served[name+"_bucket"], served[name+"_sum"], served[name+"_count"] = true, true, true
			}
		}
	}
	assert.Contains(t, agentText, `rb_agent_info{cluster="rome",version=`)
	assert.Contains(t, agentText, `rb_agent_broker_calls_total{call="reserve",outcome="ok"} 1`)

	queried := dashboardMetrics(t)
	require.NotEmpty(t, queried)
	for _, name := range queried {
		assert.True(t, served[name], "the dashboard queries %s, which neither rb-broker nor rb-agent serves", name)
	}
	t.Logf("the dashboard's %d metrics are all served: %v", len(queried), queried)
}

// dashboardMetrics are the metric names the queries of
// manifests/grafana/federation.json name, checked to be a Grafana dashboard
// whose every panel queries something.
func dashboardMetrics(t *testing.T) []string {
	t.Helper()
	data, err := os.ReadFile(testenv.ModulePath(t, "manifests", "grafana", "federation.json"))
	require.NoError(t, err)
	var dash struct {
		UID    string `json:"uid"`
		Panels []struct {
			Type, Title string
			Targets     []struct{ Expr string }
		}
	}
	require.NoError(t, json.Unmarshal(data, &dash))
	require.NotEmpty(t, dash.UID)
	names := map[string]bool{}
	// Our metrics and the process collectors' (a query's other words are
	// PromQL's functions, labels and keywords).
	metric := regexp.MustCompile(`\b(?:rb|process|go)_[a-z0-9_]+\b`)
	for _, p := range dash.Panels {
		if p.Type == "row" {
			continue
		}
		assert.NotEmpty(t, p.Targets, "panel %q queries nothing", p.Title)
		for _, q := range p.Targets {
			found := metric.FindAllString(q.Expr, -1)
			assert.NotEmpty(t, found, "panel %q: %s names no metric", p.Title, q.Expr)
			for _, n := range found {
				names[n] = true
			}
		}
	}
	return slices.Sorted(maps.Keys(names))
}

// monitoringRBAC are the RBAC objects of manifests/monitoring/agent.
func monitoringRBAC(t *testing.T) []*unstructured.Unstructured {
	t.Helper()
	data, err := os.ReadFile(testenv.ModulePath(t, "manifests", "monitoring", "agent", "rbac.yaml"))
	require.NoError(t, err)
	var out []*unstructured.Unstructured
	for _, doc := range strings.Split(string(data), "\n---\n") {
		u := &unstructured.Unstructured{}
		require.NoError(t, yaml.Unmarshal([]byte(doc), &u.Object))
		out = append(out, u)
	}
	require.Len(t, out, 2)
	return out
}

// scrape GETs url with token as bearer (none if empty), accepting the
// agent's self-signed certificate, and returns the status and body.
func scrape(t *testing.T, url, token string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	require.NoError(t, err)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	cl := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}} //nolint:gosec // controller-runtime's self-signed certificate
	resp, err := cl.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(body)
}

func mustRESTConfig(t *testing.T, kubeconfig string) *rest.Config {
	t.Helper()
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	require.NoError(t, err)
	return cfg
}
