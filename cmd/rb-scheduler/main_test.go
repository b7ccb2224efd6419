package main

// The tests run the real rb-scheduler command (newCommand, as main does) in
// a child process: the test binary re-executes itself with
// RB_SCHEDULER_EXEC=1, so a scheduler that refuses to start, or one that is
// stopped, ends only its own process.

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	coordinationv1 "k8s.io/api/coordination/v1"
	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/restmapper"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"k8s.io/component-base/cli"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/yaml"

	brokerv1alpha1 "github.com/fluidos-project/resource-broker/api/v1alpha1"
	"github.com/fluidos-project/resource-broker/internal/testenv"
	"github.com/fluidos-project/resource-broker/internal/version"
)

const execEnv = "RB_SCHEDULER_EXEC"

func TestMain(m *testing.M) {
	if os.Getenv(execEnv) == "1" {
		// The child: be rb-scheduler with the arguments after "--".
		args := os.Args[1:]
		for i, a := range args {
			if a == "--" {
				args = args[i+1:]
				break
			}
		}
		cmd := newCommand()
		cmd.SetArgs(args)
		os.Exit(cli.Run(cmd))
	}
	os.Exit(m.Run())
}

// scheduler is rb-scheduler running in a child process.
type scheduler struct {
	cmd    *exec.Cmd
	out    *syncBuffer
	exited chan struct{} // closed when the process has ended
	err    error         // how it ended (cmd.Wait), once exited is closed
}

func startScheduler(t *testing.T, args ...string) *scheduler {
	t.Helper()
	cmd := exec.Command(os.Args[0], append([]string{"-test.run=^$", "--"}, args...)...)
	cmd.Env = append(os.Environ(), execEnv+"=1")
	s := &scheduler{cmd: cmd, out: &syncBuffer{}, exited: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = s.out, s.out
	require.NoError(t, cmd.Start())
	go func() {
		s.err = cmd.Wait()
		close(s.exited)
	}()
	t.Cleanup(func() {
		select {
		case <-s.exited:
		default:
			_ = cmd.Process.Signal(syscall.SIGTERM)
			select {
			case <-s.exited:
			case <-time.After(20 * time.Second):
				_ = cmd.Process.Kill()
				<-s.exited
			}
		}
		if t.Failed() {
			t.Logf("rb-scheduler output:\n%s", tail(s.out.String(), 80))
		}
	})
	return s
}

func TestInvalidArgsRefuseToStart(t *testing.T) {
	dir := t.TempDir()
	// A kubeconfig that is never dialled: the args are checked first.
	kubeconfig := writeKubeconfig(t, dir, &rest.Config{Host: "https://127.0.0.1:1"})
	for _, tc := range []struct {
		name, args string
		want       []string
	}{{
		name: "bad values",
		args: `{reservationDuration: 0s, maxOutstandingReservationsPerNamespace: 0, excludedNamespaces: [Not_A_Namespace],
		        selector: {matchExpressions: [{key: app, operator: Sideways}]}}`,
		want: []string{
			`creating profile for scheduler name resource-broker: initializing plugin "ResourceBroker": invalid ResourceBroker args`,
			`pluginConfig[ResourceBroker].args.reservationDuration: Invalid value: "0s": must be between 1s and 24h0m0s`,
			`pluginConfig[ResourceBroker].args.maxOutstandingReservationsPerNamespace: Invalid value: 0: must be at least 1`,
			`pluginConfig[ResourceBroker].args.excludedNamespaces[0]: Invalid value: "Not_A_Namespace"`,
			`pluginConfig[ResourceBroker].args.selector.matchExpressions[0].operator: Invalid value: "Sideways"`,
		},
	}, {
		name: "namespace allowed and excluded",
		args: `{namespaces: [apps, kube-system]}`,
		want: []string{`pluginConfig[ResourceBroker].args.namespaces[1]: Invalid value: "kube-system": is also in excludedNamespaces`},
	}, {
		// Decoded by kube-scheduler's configuration loading (the args are in
		// its scheme): strictly, before any plugin is built.
		name: "unknown field",
		args: `{reservationDurationn: 1h}`,
		want: []string{`decoding .profiles[0].pluginConfig[0]: strict decoding error: decoding args for plugin ResourceBroker: strict decoding error: unknown field "reservationDurationn"`},
	}, {
		name: "wrong type",
		args: `{maxOutstandingReservationsPerNamespace: ten}`,
		want: []string{`decoding args for plugin ResourceBroker`, `maxOutstandingReservationsPerNamespace`},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			config := filepath.Join(dir, strings.ReplaceAll(tc.name, " ", "-")+".yaml")
			require.NoError(t, os.WriteFile(config, []byte(fmt.Sprintf(`apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
leaderElection: {leaderElect: false}
clientConnection: {kubeconfig: %q}
profiles:
- schedulerName: resource-broker
  plugins:
    multiPoint: {enabled: [{name: ResourceBroker}]}
  pluginConfig:
  - name: ResourceBroker
    args: %s
`, kubeconfig, tc.args)), 0o600))
			s := startScheduler(t, "--config="+config, "--secure-port=0")
			select {
			case <-s.exited:
				var exit *exec.ExitError
				require.ErrorAs(t, s.err, &exit, "rb-scheduler should exit with an error")
				assert.NotZero(t, exit.ExitCode())
			case <-time.After(60 * time.Second):
				t.Fatalf("rb-scheduler still running 60s after starting with invalid args:\n%s", tail(s.out.String(), 40))
			}
			// klog quotes the error: undo its escaping before looking for the messages.
			out := strings.ReplaceAll(s.out.String(), `\"`, `"`)
			for _, w := range tc.want {
				assert.Contains(t, out, w)
			}
			t.Logf("refused to start: %s", firstLine(out, "command failed"))
		})
	}
}

// TestManifestDeploysAWorkingScheduler applies manifests/scheduler (for
// real) to a test control plane, runs rb-scheduler with the configuration of
// its ConfigMap as the ServiceAccount user its RBAC binds, and checks that
// it takes the leader lease, serves /healthz, binds a pod that fits and
// asks the broker for one that does not: the manifests' permissions are
// enough, and the configuration is accepted.
func TestManifestDeploysAWorkingScheduler(t *testing.T) {
	env, err := testenv.New(testenv.WithCRDDirectories(testenv.ModulePath(t, "manifests", "crds")))
	require.NoError(t, err)
	cfg, err := env.Start()
	require.NoError(t, err)
	t.Cleanup(func() { _ = env.Stop() })
	ctx := context.Background()
	cs, err := kubernetes.NewForConfig(cfg)
	require.NoError(t, err)

	objs := kustomizeBuild(t, testenv.ModulePath(t, "manifests", "scheduler"))
	applyAll(t, cfg, objs)
	var config string
	for _, u := range objs {
		if u.GetKind() == "ConfigMap" && u.GetName() == "rb-scheduler-config" {
			config, _, _ = unstructured.NestedString(u.Object, "data", "config.yaml")
		}
	}
	require.NotEmpty(t, config, "no ConfigMap rb-scheduler-config with config.yaml")

	// The ServiceAccount's user name, so that the manifests' bindings apply.
	user, err := env.AddUser(envtest.User{Name: "system:serviceaccount:resource-broker:rb-scheduler",
		Groups: []string{"system:serviceaccounts", "system:serviceaccounts:resource-broker", "system:authenticated"}}, nil)
	require.NoError(t, err)
	ucfg := user.Config()
	ucs, err := kubernetes.NewForConfig(ucfg)
	require.NoError(t, err)
	_, err = ucs.CoreV1().Secrets("resource-broker").List(ctx, metav1.ListOptions{})
	require.True(t, apierrors.IsForbidden(err), "RBAC must be enforced for the test to mean anything (listing secrets: %v)", err)

	dir := t.TempDir()
	kubeconfig := writeKubeconfig(t, dir, ucfg)
	var parsed map[string]any
	require.NoError(t, yaml.Unmarshal([]byte(config), &parsed))
	parsed["clientConnection"] = map[string]any{"kubeconfig": kubeconfig}
	data, err := yaml.Marshal(parsed)
	require.NoError(t, err)
	configFile := filepath.Join(dir, "config.yaml")
	require.NoError(t, os.WriteFile(configFile, data, 0o600))

	port := freePort(t)
	s := startScheduler(t, "--config="+configFile, fmt.Sprintf("--secure-port=%d", port), "--bind-address=127.0.0.1",
		"--authentication-kubeconfig="+kubeconfig, "--authorization-kubeconfig="+kubeconfig, "--v=2")

	// Leader election on the Lease the RBAC allows.
	waitFor(t, s, 90*time.Second, "lease resource-broker/rb-scheduler held", func() bool {
		l, err := cs.CoordinationV1().Leases("resource-broker").Get(ctx, "rb-scheduler", metav1.GetOptions{})
		return err == nil && holder(l) != ""
	})
	// The probes of the Deployment.
	httpc := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}} //nolint:gosec // the scheduler's self-signed serving certificate
	for _, path := range []string{"/healthz", "/readyz"} {
		waitFor(t, s, 60*time.Second, path+" ok", func() bool {
			resp, err := httpc.Get(fmt.Sprintf("https://127.0.0.1:%d%s", port, path))
			if err != nil {
				return false
			}
			resp.Body.Close()
			return resp.StatusCode == http.StatusOK
		})
	}

	node := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "worker", Labels: map[string]string{"kubernetes.io/hostname": "worker"}}}
	node, err = cs.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{})
	require.NoError(t, err)
	node.Spec.Taints = nil
	node, err = cs.CoreV1().Nodes().Update(ctx, node, metav1.UpdateOptions{})
	require.NoError(t, err)
	alloc := v1.ResourceList{v1.ResourceCPU: resource.MustParse("2"), v1.ResourceMemory: resource.MustParse("4Gi"), v1.ResourcePods: resource.MustParse("110")}
	node.Status.Capacity, node.Status.Allocatable = alloc, alloc
	node.Status.Conditions = []v1.NodeCondition{{Type: v1.NodeReady, Status: v1.ConditionTrue, Reason: "KubeletReady", LastHeartbeatTime: metav1.Now(), LastTransitionTime: metav1.Now()}}
	_, err = cs.CoreV1().Nodes().UpdateStatus(ctx, node, metav1.UpdateOptions{})
	require.NoError(t, err)

	_, err = cs.CoreV1().Namespaces().Create(ctx, &v1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "apps"}}, metav1.CreateOptions{})
	require.NoError(t, err)
	pod := func(name, cpu string) *v1.Pod {
		return &v1.Pod{
			ObjectMeta: metav1.ObjectMeta{Namespace: "apps", Name: name},
			Spec: v1.PodSpec{SchedulerName: "resource-broker", Containers: []v1.Container{{Name: "main", Image: "registry.k8s.io/pause:3.10",
				Resources: v1.ResourceRequirements{Requests: v1.ResourceList{v1.ResourceCPU: resource.MustParse(cpu), v1.ResourceMemory: resource.MustParse("256Mi")}}}}},
		}
	}
	_, err = cs.CoreV1().Pods("apps").Create(ctx, pod("fits", "500m"), metav1.CreateOptions{})
	require.NoError(t, err)
	big, err := cs.CoreV1().Pods("apps").Create(ctx, pod("too-big", "8"), metav1.CreateOptions{})
	require.NoError(t, err)

	waitFor(t, s, 60*time.Second, "pod apps/fits bound to worker", func() bool {
		p, err := cs.CoreV1().Pods("apps").Get(ctx, "fits", metav1.GetOptions{})
		return err == nil && p.Spec.NodeName == "worker"
	})
	dyn, err := dynamic.NewForConfig(cfg)
	require.NoError(t, err)
	var rsv *unstructured.Unstructured
	waitFor(t, s, 60*time.Second, "a Reservation for apps/too-big", func() bool {
		l, err := dyn.Resource(brokerv1alpha1.GroupVersion.WithResource("reservations")).Namespace("apps").List(ctx, metav1.ListOptions{})
		if err != nil || len(l.Items) != 1 {
			return false
		}
		rsv = &l.Items[0]
		return true
	})
	podName, _, _ := unstructured.NestedString(rsv.Object, "spec", "podName")
	assert.Equal(t, "too-big", podName)
	require.Len(t, rsv.GetOwnerReferences(), 1)
	assert.Equal(t, big.UID, rsv.GetOwnerReferences()[0].UID)
	waitFor(t, s, 60*time.Second, "too-big's condition names its reservation", func() bool {
		p, err := cs.CoreV1().Pods("apps").Get(ctx, "too-big", metav1.GetOptions{})
		if err != nil {
			return false
		}
		for _, c := range p.Status.Conditions {
			if c.Type == v1.PodScheduled && strings.Contains(c.Message, "waiting for broker reservation "+rsv.GetName()) {
				return true
			}
		}
		return false
	})
}

func holder(l *coordinationv1.Lease) string {
	if l.Spec.HolderIdentity == nil {
		return ""
	}
	return *l.Spec.HolderIdentity
}

func kustomizeBuild(t *testing.T, dir string) []*unstructured.Unstructured {
	t.Helper()
	m, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(filesys.MakeFsOnDisk(), dir)
	require.NoError(t, err)
	var out []*unstructured.Unstructured
	for _, r := range m.Resources() {
		y, err := r.AsYAML()
		require.NoError(t, err)
		j, err := yaml.YAMLToJSON(y)
		require.NoError(t, err)
		o, err := runtime.Decode(unstructured.UnstructuredJSONScheme, j)
		require.NoError(t, err)
		out = append(out, o.(*unstructured.Unstructured))
	}
	return out
}

// applyAll server-side applies objs, Namespaces first.
func applyAll(t *testing.T, cfg *rest.Config, objs []*unstructured.Unstructured) {
	t.Helper()
	dyn, err := dynamic.NewForConfig(cfg)
	require.NoError(t, err)
	dc, err := discovery.NewDiscoveryClientForConfig(cfg)
	require.NoError(t, err)
	mapper := restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(dc))
	ctx := context.Background()
	for _, pass := range []bool{true, false} {
		for _, u := range objs {
			if (u.GetKind() == "Namespace") != pass {
				continue
			}
			gvk := u.GroupVersionKind()
			m, err := mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
			require.NoError(t, err)
			var r dynamic.ResourceInterface = dyn.Resource(m.Resource)
			if m.Scope.Name() == meta.RESTScopeNameNamespace {
				r = dyn.Resource(m.Resource).Namespace(u.GetNamespace())
			}
			body, err := json.Marshal(u.Object)
			require.NoError(t, err)
			_, err = r.Patch(ctx, u.GetName(), types.ApplyPatchType, body, metav1.PatchOptions{FieldManager: "rb-test"})
			require.NoError(t, err, "applying %s %s", u.GetKind(), u.GetName())
		}
	}
}

func writeKubeconfig(t *testing.T, dir string, cfg *rest.Config) string {
	t.Helper()
	kc := clientcmdapi.NewConfig()
	kc.Clusters["c"] = &clientcmdapi.Cluster{Server: cfg.Host, CertificateAuthorityData: cfg.CAData, InsecureSkipTLSVerify: len(cfg.CAData) == 0}
	kc.AuthInfos["u"] = &clientcmdapi.AuthInfo{ClientCertificateData: cfg.CertData, ClientKeyData: cfg.KeyData, Token: cfg.BearerToken}
	kc.Contexts["c"] = &clientcmdapi.Context{Cluster: "c", AuthInfo: "u"}
	kc.CurrentContext = "c"
	path := filepath.Join(dir, "kubeconfig")
	require.NoError(t, clientcmd.WriteToFile(*kc, path))
	return path
}

func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

func waitFor(t *testing.T, s *scheduler, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	err := wait.PollUntilContextTimeout(context.Background(), 50*time.Millisecond, timeout, true, func(context.Context) (bool, error) {
		select {
		case <-s.exited:
			return false, fmt.Errorf("rb-scheduler exited: %w", s.err)
		default:
		}
		return cond(), nil
	})
	if err != nil {
		t.Fatalf("waiting for %s: %v\nrb-scheduler output:\n%s", what, err, tail(s.out.String(), 60))
	}
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

func firstLine(s string, subs ...string) string {
	for _, l := range strings.Split(s, "\n") {
		for _, sub := range subs {
			if strings.Contains(l, sub) {
				return strings.TrimSpace(l)
			}
		}
	}
	return ""
}

func TestVersion(t *testing.T) {
	s := startScheduler(t, "--version")
	select {
	case <-s.exited:
	case <-time.After(time.Minute):
		t.Fatal("rb-scheduler --version did not quit")
	}
	require.NoError(t, s.err, s.out.String())
	assert.Equal(t, "rb-scheduler "+version.Get().String()+", kube-scheduler "+version.Module("k8s.io/kubernetes")+"\n", s.out.String())
	assert.Regexp(t, `kube-scheduler v1\.\d+\.\d+`, s.out.String())
}
