package manifests_test

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/fluidos-project/resource-broker/internal/testenv"
)

// helmBinary is $HELM, or the helm `make liqo-bin` builds into bin/liqo.
func helmBinary(t *testing.T) string {
	t.Helper()
	if h := os.Getenv("HELM"); h != "" {
		return h
	}
	h := testenv.ModulePath(t, "bin", "liqo", "helm")
	if _, err := os.Stat(h); err != nil {
		t.Fatalf("helm not found at %s: run `make liqo-bin` (it builds helm) or set HELM", h)
	}
	return h
}

func helm(t *testing.T, args ...string) (string, error) {
	t.Helper()
	cmd := exec.Command(helmBinary(t), args...)
	cmd.Dir = testenv.ModulePath(t)
	var out, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &stderr
	err := cmd.Run()
	if err != nil {
		return out.String(), &helmError{err: err, stderr: stderr.String()}
	}
	return out.String(), nil
}

type helmError struct {
	err    error
	stderr string
}

func (e *helmError) Error() string { return e.err.Error() + ": " + e.stderr }

// decodeAll splits a rendered chart into objects.
func decodeAll(t *testing.T, manifest string) []*unstructured.Unstructured {
	t.Helper()
	var out []*unstructured.Unstructured
	dec := utilyaml.NewYAMLOrJSONDecoder(strings.NewReader(manifest), 4096)
	for {
		u := &unstructured.Unstructured{}
		err := dec.Decode(&u.Object)
		if err != nil {
			require.ErrorContains(t, err, "EOF")
			return out
		}
		if len(u.Object) > 0 {
			out = append(out, u)
		}
	}
}

// The values of manifests/agent/config.env, as the chart takes them.
var agentValues = []string{"--set", "clusterId=rome", "--set", "brokerUrl=https://rb-broker.example.org",
	"--set", "apiServerAddress=https://rome.example.org:6443"}

// hashSuffix matches the names kustomize's configMapGenerator makes.
var hashSuffix = regexp.MustCompile(`^(rb-agent-config|rb-broker-policy)-[a-z0-9]{10}$`)

// normalize takes off what the chart and kustomize set differently on
// purpose: the namespace (Helm's release namespace), kustomize's part-of
// label, the ConfigMap's hash suffix (the chart rolls the pods with a
// checksum annotation instead) and the chart's logging flags at their
// defaults.
func normalize(t *testing.T, u *unstructured.Unstructured) *unstructured.Unstructured {
	t.Helper()
	u = u.DeepCopy()
	u.SetNamespace("")
	labels := u.GetLabels()
	delete(labels, "app.kubernetes.io/part-of")
	u.SetLabels(labels)
	if len(labels) == 0 {
		unstructured.RemoveNestedField(u.Object, "metadata", "labels")
	}
	if m := hashSuffix.FindStringSubmatch(u.GetName()); m != nil {
		u.SetName(m[1])
	}
	if u.GetKind() == "ConfigMap" {
		unstructured.RemoveNestedField(u.Object, "data", "API_SERVER_ADDRESS")     // config.env leaves it to the operator
		if l, ok, _ := unstructured.NestedString(u.Object, "data", "LABELS"); ok { // the chart sorts them
			kv := strings.Split(l, ",")
			slices.Sort(kv)
			require.NoError(t, unstructured.SetNestedField(u.Object, strings.Join(kv, ","), "data", "LABELS"))
		}
	}
	if u.GetKind() == "Deployment" {
		dep := as[appsv1.Deployment](t, u)
		for k := range dep.Spec.Template.Annotations {
			if strings.HasPrefix(k, "checksum/") {
				delete(dep.Spec.Template.Annotations, k)
			}
		}
		if len(dep.Spec.Template.Annotations) == 0 {
			dep.Spec.Template.Annotations = nil
		}
		c := &dep.Spec.Template.Spec.Containers[0]
		c.Args = slices.DeleteFunc(c.Args, func(a string) bool { return a == "--logging-format=text" || a == "-v=0" })
		for i := range c.EnvFrom {
			if ref := c.EnvFrom[i].ConfigMapRef; ref != nil {
				if m := hashSuffix.FindStringSubmatch(ref.Name); m != nil {
					ref.Name = m[1]
				}
			}
		}
		for _, v := range dep.Spec.Template.Spec.Volumes {
			if v.ConfigMap != nil {
				if m := hashSuffix.FindStringSubmatch(v.ConfigMap.Name); m != nil {
					v.ConfigMap.Name = m[1]
				}
			}
		}
		obj, err := runtime.DefaultUnstructuredConverter.ToUnstructured(&dep)
		require.NoError(t, err)
		u.Object = obj
		unstructured.RemoveNestedField(u.Object, "status")
		unstructured.RemoveNestedField(u.Object, "metadata", "creationTimestamp")
		unstructured.RemoveNestedField(u.Object, "spec", "template", "metadata", "creationTimestamp")
	}
	// Numbers as JSON has them: YAML decoders differ on int64 and float64.
	data, err := json.Marshal(u.Object)
	require.NoError(t, err)
	u.Object = nil
	require.NoError(t, json.Unmarshal(data, &u.Object))
	return u
}

// TestHelmChartAgent renders charts/rb-agent with config.env's values and
// checks that it makes manifests/agent's objects (the CRDs included), that
// bad values are refused with a clear error, and installs, upgrades and
// uninstalls it with helm against a real API server.
func TestHelmChartAgent(t *testing.T) {
	out, err := helm(t, append([]string{"lint", "charts/rb-agent", "--strict", "-n", namespace}, agentValues...)...)
	require.NoError(t, err, out)
	rendered, err := helm(t, append([]string{"template", "rb-agent", "charts/rb-agent", "-n", namespace, "--include-crds"}, agentValues...)...)
	require.NoError(t, err)

	sameAsKustomize(t, rendered, "agent")

	for name, tc := range map[string]struct {
		args []string
		want string
	}{
		"no cluster id":         {[]string{"--set", "brokerUrl=https://b", "--set", "apiServerAddress=https://a"}, "clusterId is required"},
		"a cluster id with dot": {[]string{"--set", "clusterId=rome.eu", "--set", "brokerUrl=https://b", "--set", "apiServerAddress=https://a"}, `clusterId "rome.eu": want a DNS label`},
		"plain http broker":     {[]string{"--set", "clusterId=rome", "--set", "brokerUrl=http://b", "--set", "apiServerAddress=https://a"}, "only reachable over https://"},
		"no API server address": {[]string{"--set", "clusterId=rome", "--set", "brokerUrl=https://b"}, "apiServerAddress is required"},
	} {
		_, err := helm(t, append([]string{"template", "rb-agent", "charts/rb-agent", "-n", namespace}, tc.args...)...)
		if assert.Error(t, err, name) {
			assert.Contains(t, err.Error(), tc.want, name)
		}
	}
	_, err = helm(t, append([]string{"template", "rb-agent", "charts/rb-agent", "-n", "default"}, agentValues...)...)
	if assert.Error(t, err) {
		assert.Contains(t, err.Error(), "install rb-agent in namespace resource-broker")
	}

	// Installed, upgraded and uninstalled on a real API server (with
	// cert-manager's CRDs; the chart brings ours).
	kubeconfig, c := helmCluster(t)
	ctx := context.Background()
	out, err = helm(t, append([]string{"install", "rb-agent", "charts/rb-agent", "-n", namespace, "--create-namespace", "--kubeconfig", kubeconfig}, agentValues...)...)
	require.NoError(t, err, out)
	t.Logf("helm install:\n%s", out)
	dep := &appsv1.Deployment{}
	require.NoError(t, c.Get(ctx, client.ObjectKey{Namespace: namespace, Name: "rb-agent"}, dep))
	args := dep.Spec.Template.Spec.Containers[0].Args
	assert.Contains(t, args, "--cluster-id=$(CLUSTER_ID)")
	assert.Contains(t, args, "--logging-format=text")
	cm := &corev1.ConfigMap{}
	require.NoError(t, c.Get(ctx, client.ObjectKey{Namespace: namespace, Name: "rb-agent-config"}, cm))
	assert.Equal(t, "rome", cm.Data["CLUSTER_ID"])
	checksum := dep.Spec.Template.Annotations["checksum/config"]

	out, err = helm(t, "upgrade", "rb-agent", "charts/rb-agent", "-n", namespace, "--kubeconfig", kubeconfig, "--reuse-values",
		"--set", "logging.format=json", "--set", "prices.cpu=0.05")
	require.NoError(t, err, out)
	require.NoError(t, c.Get(ctx, client.ObjectKey{Namespace: namespace, Name: "rb-agent"}, dep))
	assert.Contains(t, dep.Spec.Template.Spec.Containers[0].Args, "--logging-format=json")
	assert.NotEqual(t, checksum, dep.Spec.Template.Annotations["checksum/config"], "a new price rolls the pods")

	out, err = helm(t, "uninstall", "rb-agent", "-n", namespace, "--kubeconfig", kubeconfig)
	require.NoError(t, err, out)
	err = c.Get(ctx, client.ObjectKey{Namespace: namespace, Name: "rb-agent"}, dep)
	assert.True(t, apierrors.IsNotFound(err), "the Deployment is gone: %v", err)
}

// sameAsKustomize checks that a rendered chart is manifests/<base>'s build
// but for what normalize takes off (and the Namespace, the release's).
func sameAsKustomize(t *testing.T, rendered, base string) {
	t.Helper()
	chart := map[string]*unstructured.Unstructured{}
	for _, u := range decodeAll(t, rendered) {
		chart[u.GetKind()+"/"+u.GetName()] = normalize(t, u)
	}
	kustomized := build(t, base)
	for _, u := range kustomized {
		if u.GetKind() == "Namespace" {
			continue // the release's namespace (helm install --create-namespace)
		}
		want := normalize(t, u)
		key := want.GetKind() + "/" + want.GetName()
		got, ok := chart[key]
		if !assert.True(t, ok, "the chart renders no %s", key) {
			continue
		}
		if key == "Certificate/rb-agent" {
			// kustomize fills the CN from the ConfigMap; the chart from clusterId.
			assert.Equal(t, "rome", str(t, got, "spec", "commonName"))
			unstructured.RemoveNestedField(got.Object, "spec", "commonName")
			unstructured.RemoveNestedField(want.Object, "spec", "commonName")
		}
		assert.Equal(t, want.Object, got.Object, "%s differs between the chart and manifests/%s", key, base)
		delete(chart, key)
	}
	assert.Empty(t, chart, "the chart renders objects manifests/"+base+" has not")

}

// TestHelmChartBroker renders charts/rb-broker with its defaults and checks
// that it makes manifests/broker's objects, then installs and uninstalls it
// with helm against a real API server.
func TestHelmChartBroker(t *testing.T) {
	out, err := helm(t, "lint", "charts/rb-broker", "--strict", "-n", namespace)
	require.NoError(t, err, out)
	rendered, err := helm(t, "template", "rb-broker", "charts/rb-broker", "-n", namespace)
	require.NoError(t, err)
	sameAsKustomize(t, rendered, "broker")
	// With manifests/redis-sentinel: the Sentinel flags replace --redis-url.
	rendered, err = helm(t, "template", "rb-broker", "charts/rb-broker", "-n", namespace, "--set", "redis.sentinel.master=rb-redis",
		"--set", "redis.sentinel.addrs={s-0:26379,s-1:26379}", "--set", "redis.waitReplicas=1", "--set", "redis.waitTimeout=2s")
	require.NoError(t, err)
	assert.Contains(t, rendered, "- --redis-sentinel-master=rb-redis\n")
	assert.Contains(t, rendered, "- --redis-sentinel-addrs=s-0:26379,s-1:26379\n")
	assert.Contains(t, rendered, "- --redis-wait-replicas=1\n")
	assert.Contains(t, rendered, "- --redis-wait-timeout=2s\n")
	assert.NotContains(t, rendered, "--redis-url")
	_, err = helm(t, "template", "rb-broker", "charts/rb-broker", "-n", namespace, "--set", "redis.sentinel.master=rb-redis")
	if assert.Error(t, err) {
		assert.Contains(t, err.Error(), "redis.sentinel.master needs redis.sentinel.addrs")
	}
	_, err = helm(t, "template", "rb-broker", "charts/rb-broker", "-n", "default")
	if assert.Error(t, err) {
		assert.Contains(t, err.Error(), "install rb-broker in namespace resource-broker")
	}

	kubeconfig, c := helmCluster(t)
	ctx := context.Background()
	out, err = helm(t, "install", "rb-broker", "charts/rb-broker", "-n", namespace, "--create-namespace", "--kubeconfig", kubeconfig,
		"--set", "logging.format=json", "--set", "extraArgs={--reserve-batch=32}")
	require.NoError(t, err, out)
	dep := &appsv1.Deployment{}
	require.NoError(t, c.Get(ctx, client.ObjectKey{Namespace: namespace, Name: "rb-broker"}, dep))
	args := dep.Spec.Template.Spec.Containers[0].Args
	assert.Contains(t, args, "--logging-format=json")
	assert.Contains(t, args, "--reserve-batch=32")
	out, err = helm(t, "uninstall", "rb-broker", "-n", namespace, "--kubeconfig", kubeconfig)
	require.NoError(t, err, out)
	err = c.Get(ctx, client.ObjectKey{Namespace: namespace, Name: "rb-broker"}, dep)
	assert.True(t, apierrors.IsNotFound(err), "the Deployment is gone: %v", err)
}

// helmCluster starts a real API server with cert-manager's CRDs and returns
// an administrator's kubeconfig file and client.
func helmCluster(t *testing.T) (string, client.Client) {
	t.Helper()
	var env *envtest.Environment
	cfg := testenv.Start(t, testenv.WithCRDDirectories(testenv.ModulePath(t, certManagerCRDs...)),
		testenv.WithEnvironment(func(e *envtest.Environment) { env = e }))
	admin, err := env.AddUser(envtest.User{Name: "helm", Groups: []string{"system:masters"}}, nil)
	require.NoError(t, err)
	kc, err := admin.KubeConfig()
	require.NoError(t, err)
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	require.NoError(t, os.WriteFile(kubeconfig, kc, 0o600))
	c, err := client.New(cfg, client.Options{})
	require.NoError(t, err)
	return kubeconfig, c
}
