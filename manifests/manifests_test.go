package manifests_test

// The kustomize bases under manifests/ are built in-process (krusty, the code
// behind `kubectl kustomize`) and every object is sent to a real
// kube-apiserver (envtest) as a server-side apply with dryRun=All and
// fieldValidation=Strict: the API server's own defaulting, validation,
// admission (PodSecurity "restricted" warnings included) and, for
// cert-manager's kinds, cert-manager's real CRD schemas decide whether the
// manifests are valid. A second, control-plane-free test checks that the
// pieces fit together (selectors, ports, Secret names, issuer chain).
//
// Needs `make envtest-bin` (bin/k8s) and `make cert-manager-crds`
// (bin/crds/cert-manager).

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	schedulingv1 "k8s.io/api/scheduling/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/restmapper"
	"sigs.k8s.io/yaml"

	"github.com/fluidos-project/resource-broker/agent/provider"
	"github.com/fluidos-project/resource-broker/internal/kustomize"
	"github.com/fluidos-project/resource-broker/internal/testenv"
)

const (
	namespace    = "resource-broker"
	fieldManager = "rb-test"
)

// bases are the kustomize directories, relative to manifests/, each of which
// must build on its own.
var bases = []string{"crds", "broker", "broker/agent-certificates", "broker-external", "redis", "redis-sentinel", "agent", "scheduler"}

// certManagerCRDs is where `make cert-manager-crds` puts cert-manager's CRDs.
var certManagerCRDs = []string{"bin", "crds", "cert-manager"}

// build runs kustomize on manifests/<base> as `kubectl kustomize` would.
func build(t testing.TB, base string) []*unstructured.Unstructured {
	t.Helper()
	dir, err := filepath.Abs(filepath.FromSlash(base))
	if err != nil {
		t.Fatal(err)
	}
	objs, err := kustomize.Build(dir)
	if err != nil {
		t.Fatal(err)
	}
	return objs
}

func id(u *unstructured.Unstructured) string {
	s := u.GetKind() + "/" + u.GetName()
	if ns := u.GetNamespace(); ns != "" {
		s = ns + "/" + s
	}
	return s
}

// warnings collects the API server's Warning headers.
type warnings struct {
	mu   sync.Mutex
	msgs []string
}

func (w *warnings) HandleWarningHeader(_ int, _ string, text string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.msgs = append(w.msgs, text)
}

func (w *warnings) take() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	m := w.msgs
	w.msgs = nil
	return m
}

type cluster struct {
	dyn    dynamic.Interface
	mapper meta.RESTMapper
	warn   *warnings
}

func (c *cluster) resource(u *unstructured.Unstructured) (dynamic.ResourceInterface, error) {
	gvk := u.GroupVersionKind()
	m, err := c.mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
	if err != nil {
		return nil, fmt.Errorf("%s: no such kind on the API server: %w", gvk, err)
	}
	if m.Scope.Name() == meta.RESTScopeNameNamespace {
		if u.GetNamespace() == "" {
			return nil, fmt.Errorf("%s is namespaced but has no namespace", id(u))
		}
		return c.dyn.Resource(m.Resource).Namespace(u.GetNamespace()), nil
	}
	return c.dyn.Resource(m.Resource), nil
}

// apply is a server-side apply of u by field manager rb-test with strict
// field validation; a dry run (dryRun=All) unless real. It returns the
// object as the API server would store it and the warnings it sent.
func (c *cluster) apply(ctx context.Context, u *unstructured.Unstructured, real bool) (*unstructured.Unstructured, []string, error) {
	r, err := c.resource(u)
	if err != nil {
		return nil, nil, err
	}
	body, err := json.Marshal(u.Object)
	if err != nil {
		return nil, nil, err
	}
	opts := metav1.PatchOptions{
		FieldManager:    fieldManager,
		FieldValidation: metav1.FieldValidationStrict,
	}
	if !real {
		opts.DryRun = []string{metav1.DryRunAll}
	}
	c.warn.take()
	out, err := r.Patch(ctx, u.GetName(), types.ApplyPatchType, body, opts)
	return out, c.warn.take(), err
}

func TestManifestsServerSideDryRun(t *testing.T) {
	crdDir := testenv.ModulePath(t, certManagerCRDs...)
	if yamls, _ := filepath.Glob(filepath.Join(crdDir, "*.yaml")); len(yamls) == 0 {
		t.Fatalf("cert-manager CRDs not found in %s: run `make cert-manager-crds`", crdDir)
	}

	built := map[string][]*unstructured.Unstructured{}
	for _, b := range bases {
		built[b] = build(t, b)
	}

	cfg := testenv.Start(t, testenv.WithCRDDirectories(crdDir))

	cfg = rest.CopyConfig(cfg)
	w := &warnings{}
	cfg.WarningHandler = w
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	dc, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	c := &cluster{dyn: dyn, mapper: restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(dc)), warn: w}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()

	// Namespaced objects can only be admitted (even as a dry run) into a
	// namespace that exists, so the bases' Namespaces are applied for real
	// first; that also puts their Pod Security labels in force, so that the
	// workloads below draw PodSecurity warnings if they break "restricted".
	created := map[string]bool{}
	for _, b := range bases {
		for _, u := range built[b] {
			if u.GetKind() != "Namespace" || u.GetAPIVersion() != "v1" {
				continue
			}
			if _, warns, err := c.apply(ctx, u, true); err != nil {
				t.Fatalf("%s: creating %s: %v", b, id(u), err)
			} else if len(warns) > 0 {
				t.Errorf("%s: %s: API server warnings: %q", b, id(u), warns)
			}
			created[u.GetName()] = true
		}
	}
	if !created[namespace] {
		t.Fatalf("no base creates Namespace %s", namespace)
	}
	// Every cluster has these (a few RBAC objects live there).
	created[metav1.NamespaceSystem], created[corev1.NamespaceNodeLease], created[metav1.NamespaceDefault] = true, true, true

	var accepted int
	for _, b := range bases {
		t.Run(b, func(t *testing.T) {
			for _, u := range built[b] {
				if ns := u.GetNamespace(); ns != "" && !created[ns] {
					t.Errorf("%s: namespace %s is created by none of the bases", id(u), ns)
					continue
				}
				out, warns, err := c.apply(ctx, u, false)
				if err != nil {
					t.Errorf("%s: rejected by the API server: %v", id(u), err)
					continue
				}
				if len(warns) > 0 {
					t.Errorf("%s: API server warnings: %q", id(u), warns)
				}
				if out.GetKind() != u.GetKind() || out.GetName() != u.GetName() || out.GetNamespace() != u.GetNamespace() {
					t.Errorf("%s: the API server answered with %s", id(u), id(out))
				}
				// The dry run must not have stored anything.
				if u.GetKind() != "Namespace" {
					r, _ := c.resource(u)
					if _, err := r.Get(ctx, u.GetName(), metav1.GetOptions{}); !apierrors.IsNotFound(err) {
						t.Errorf("%s: present after a dry run (err=%v)", id(u), err)
					}
				}
				accepted++
			}
		})
	}
	t.Logf("%d objects accepted by server-side apply dry run (strict field validation)", accepted)

	// The checks above are only worth something if the API server does
	// reject unknown fields and does warn about Pod Security: prove it on
	// broken copies of real objects, for a built-in kind and for a CRD kind.
	t.Run("strict validation rejects unknown fields", func(t *testing.T) {
		for _, u := range []*unstructured.Unstructured{
			find(t, built["broker"], "Deployment", "rb-broker"),
			find(t, built["broker"], "Certificate", "rb-broker-tls"),
		} {
			bad := u.DeepCopy()
			if err := unstructured.SetNestedField(bad.Object, "x", "spec", "notAField"); err != nil {
				t.Fatal(err)
			}
			_, _, err := c.apply(ctx, bad, false)
			if err == nil || !strings.Contains(err.Error(), "notAField") {
				t.Errorf("%s with spec.notAField: want an unknown-field error, got %v", id(u), err)
			}
		}
	})
	t.Run("cert-manager's CRD schema is enforced", func(t *testing.T) {
		bad := find(t, built["broker"], "Certificate", "rb-broker-ca").DeepCopy()
		if err := unstructured.SetNestedField(bad.Object, "DSA", "spec", "privateKey", "algorithm"); err != nil {
			t.Fatal(err)
		}
		_, _, err := c.apply(ctx, bad, false)
		if !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), "spec.privateKey.algorithm") {
			t.Errorf("Certificate with privateKey.algorithm DSA: want Invalid on spec.privateKey.algorithm, got %v", err)
		}
	})
	t.Run("Pod Security restricted is enforced in the namespace", func(t *testing.T) {
		bad := find(t, built["broker"], "Deployment", "rb-broker").DeepCopy()
		containers, _, _ := unstructured.NestedSlice(bad.Object, "spec", "template", "spec", "containers")
		if err := unstructured.SetNestedStringSlice(containers[0].(map[string]any), []string{"NET_ADMIN"}, "securityContext", "capabilities", "add"); err != nil {
			t.Fatal(err)
		}
		if err := unstructured.SetNestedSlice(bad.Object, containers, "spec", "template", "spec", "containers"); err != nil {
			t.Fatal(err)
		}
		_, warns, err := c.apply(ctx, bad, false)
		if err != nil {
			t.Fatalf("apply: %v", err)
		}
		if !slices.ContainsFunc(warns, func(s string) bool { return strings.Contains(s, "PodSecurity") }) {
			t.Errorf("a Deployment adding NET_ADMIN drew no PodSecurity warning: %q", warns)
		}
	})
}

// TestManifestsFitTogether checks, without a control plane, the references
// between objects that the API server cannot check.
func TestManifestsFitTogether(t *testing.T) {
	broker := build(t, "broker")
	agents := build(t, "broker/agent-certificates")
	redis := build(t, "redis")

	for _, objs := range [][]*unstructured.Unstructured{broker, agents, redis} {
		for _, u := range objs {
			if u.GetKind() != "Namespace" && u.GetNamespace() != namespace {
				t.Errorf("%s: namespace %q, want %q", id(u), u.GetNamespace(), namespace)
			}
		}
	}

	// --- broker ---
	dep := as[appsv1.Deployment](t, find(t, broker, "Deployment", "rb-broker"))
	pod := dep.Spec.Template
	podLabels := labels.Set(pod.Labels)
	if dep.Spec.Replicas == nil || *dep.Spec.Replicas != 2 {
		t.Errorf("Deployment rb-broker: replicas %v, want 2", dep.Spec.Replicas)
	}
	if sel, err := metav1.LabelSelectorAsSelector(dep.Spec.Selector); err != nil || !sel.Matches(podLabels) {
		t.Errorf("Deployment rb-broker: selector does not match its pod labels (%v)", err)
	}
	if len(pod.Spec.Containers) != 1 {
		t.Fatalf("Deployment rb-broker: %d containers, want 1", len(pod.Spec.Containers))
	}
	ctr := pod.Spec.Containers[0]
	if want := "ghcr.io/fluidos-project/rb-broker:" + releaseTag(t); ctr.Image != want {
		t.Errorf("rb-broker image %q, want %q", ctr.Image, want)
	}
	for _, flag := range []string{
		"--listen-address=:8443", "--health-address=:8081", "--cert-dir=/etc/rb-broker/tls",
		"--redis-url=redis://rb-redis:6379/0",
		"--weight-resources=0.7", "--weight-cost=0.3", "--stale-threshold=60s",
		"--default-duration=1h", "--max-duration=24h", "--expiry-interval=1s",
		"--max-streams-per-cluster=8", "--shutdown-delay=5s", "--shutdown-timeout=15s", "--max-ended-per-member=5000",
	} {
		if !slices.Contains(ctr.Args, flag) {
			t.Errorf("rb-broker args %q lack %s", ctr.Args, flag)
		}
	}
	// The shutdown (readiness off, then streams ended, then requests in
	// flight) must end before the kubelet kills the container.
	var shutdown time.Duration
	for _, a := range ctr.Args {
		for _, f := range []string{"--shutdown-delay=", "--shutdown-timeout="} {
			if v, ok := strings.CutPrefix(a, f); ok {
				d, err := time.ParseDuration(v)
				if err != nil {
					t.Errorf("rb-broker %s: %v", a, err)
				}
				shutdown += d
			}
		}
	}
	if grace := pod.Spec.TerminationGracePeriodSeconds; grace == nil || shutdown >= time.Duration(*grace)*time.Second {
		t.Errorf("rb-broker: --shutdown-delay + --shutdown-timeout = %s, not within terminationGracePeriodSeconds %v", shutdown, grace)
	}
	// manifests/redis/README.md's Sentinel patch replaces args/3.
	if len(ctr.Args) < 4 || !strings.HasPrefix(ctr.Args[3], "--redis-url=") {
		t.Errorf("rb-broker args[3] is not --redis-url (the Sentinel patch in manifests/redis/README.md relies on it): %q", ctr.Args)
	}
	checkPort(t, ctr, "https", 8443)
	checkPort(t, ctr, "health", 8081)
	checkHTTPProbe(t, "readiness", ctr, ctr.ReadinessProbe, "/readyz", 8081)
	checkHTTPProbe(t, "liveness", ctr, ctr.LivenessProbe, "/healthz", 8081)
	checkHardened(t, "rb-broker", pod.Spec, ctr, 65532)
	if pod.Spec.AutomountServiceAccountToken == nil || *pod.Spec.AutomountServiceAccountToken {
		t.Errorf("rb-broker pod: automountServiceAccountToken is not false")
	}
	sa := as[corev1.ServiceAccount](t, find(t, broker, "ServiceAccount", pod.Spec.ServiceAccountName))
	if sa.AutomountServiceAccountToken == nil || *sa.AutomountServiceAccountToken {
		t.Errorf("ServiceAccount %s: automountServiceAccountToken is not false", sa.Name)
	}
	var spreadsNodes bool
	for _, c := range pod.Spec.TopologySpreadConstraints {
		sel, err := metav1.LabelSelectorAsSelector(c.LabelSelector)
		spreadsNodes = spreadsNodes || (c.TopologyKey == "kubernetes.io/hostname" && err == nil && sel.Matches(podLabels))
	}
	if !spreadsNodes {
		t.Errorf("rb-broker pod: no topology spread over kubernetes.io/hostname selecting its own pods")
	}

	// TLS Secret: issued by Certificate rb-broker-tls, mounted at --cert-dir.
	tlsCert := find(t, broker, "Certificate", "rb-broker-tls")
	tlsSecret := str(t, tlsCert, "spec", "secretName")
	mountedAt := ""
	for _, v := range pod.Spec.Volumes {
		if v.Secret != nil && v.Secret.SecretName == tlsSecret {
			for _, m := range ctr.VolumeMounts {
				if m.Name == v.Name {
					mountedAt = m.MountPath
				}
			}
		}
	}
	if mountedAt != "/etc/rb-broker/tls" {
		t.Errorf("Secret %s (of Certificate rb-broker-tls) mounted at %q, want /etc/rb-broker/tls", tlsSecret, mountedAt)
	}

	svc := as[corev1.Service](t, find(t, broker, "Service", "rb-broker"))
	checkService(t, svc, podLabels, ctr, 443, 8443)
	metrics := as[corev1.Service](t, find(t, broker, "Service", "rb-broker-metrics"))
	checkService(t, metrics, podLabels, ctr, 8081, 8081)

	pdb := as[policyv1.PodDisruptionBudget](t, find(t, broker, "PodDisruptionBudget", "rb-broker"))
	if pdb.Spec.MinAvailable == nil || pdb.Spec.MinAvailable.IntValue() != 1 {
		t.Errorf("PodDisruptionBudget rb-broker: minAvailable %v, want 1", pdb.Spec.MinAvailable)
	}
	if sel, err := metav1.LabelSelectorAsSelector(pdb.Spec.Selector); err != nil || !sel.Matches(podLabels) {
		t.Errorf("PodDisruptionBudget rb-broker does not select the broker pods (%v)", err)
	}

	np := as[networkingv1.NetworkPolicy](t, find(t, broker, "NetworkPolicy", "rb-broker"))
	if sel, err := metav1.LabelSelectorAsSelector(&np.Spec.PodSelector); err != nil || !sel.Matches(podLabels) {
		t.Errorf("NetworkPolicy rb-broker does not select the broker pods (%v)", err)
	}
	for _, r := range np.Spec.Ingress {
		if hasPort(r.Ports, corev1.ProtocolTCP, 8443) && len(r.From) != 0 {
			t.Errorf("NetworkPolicy rb-broker: 8443 must be open to any source (agents are in other clusters)")
		}
		if hasPort(r.Ports, corev1.ProtocolTCP, 8081) && len(r.From) == 0 {
			t.Errorf("NetworkPolicy rb-broker: 8081 (health, metrics) is open to any source")
		}
	}
	if !ingressAllows(np, 8443) || !ingressAllows(np, 8081) {
		t.Errorf("NetworkPolicy rb-broker: ingress to 8443 or 8081 not allowed")
	}
	for _, p := range []struct {
		proto corev1.Protocol
		port  int
	}{{corev1.ProtocolTCP, 6379}, {corev1.ProtocolTCP, 26379}, {corev1.ProtocolUDP, 53}, {corev1.ProtocolTCP, 53}} {
		if !slices.ContainsFunc(np.Spec.Egress, func(r networkingv1.NetworkPolicyEgressRule) bool { return hasPort(r.Ports, p.proto, p.port) }) {
			t.Errorf("NetworkPolicy rb-broker: no egress to %s/%d", p.proto, p.port)
		}
	}

	// Issuer chain: self-signed -> CA Certificate -> CA Issuer -> broker.
	ca := find(t, broker, "Certificate", "rb-broker-ca")
	if isCA, _, _ := unstructured.NestedBool(ca.Object, "spec", "isCA"); !isCA {
		t.Errorf("Certificate rb-broker-ca: isCA is not true")
	}
	if alg := str(t, ca, "spec", "privateKey", "algorithm"); alg != "ECDSA" {
		t.Errorf("Certificate rb-broker-ca: key algorithm %q, want ECDSA", alg)
	}
	bootstrap := findIssuer(t, broker, ca)
	if _, ok, _ := unstructured.NestedMap(bootstrap.Object, "spec", "selfSigned"); !ok {
		t.Errorf("Certificate rb-broker-ca is not issued by a selfSigned Issuer but by %s", id(bootstrap))
	}
	caIssuer := find(t, broker, "Issuer", "rb-broker-ca-issuer")
	if got, want := str(t, caIssuer, "spec", "ca", "secretName"), str(t, ca, "spec", "secretName"); got != want {
		t.Errorf("Issuer rb-broker-ca-issuer uses Secret %q, the CA Certificate writes %q", got, want)
	}
	if iss := findIssuer(t, broker, tlsCert); iss.GetName() != "rb-broker-ca-issuer" {
		t.Errorf("Certificate rb-broker-tls is issued by %s", id(iss))
	}
	dnsNames, _, _ := unstructured.NestedStringSlice(tlsCert.Object, "spec", "dnsNames")
	for _, n := range []string{"rb-broker", "rb-broker.resource-broker", "rb-broker.resource-broker.svc", "rb-broker.resource-broker.svc.cluster.local"} {
		if !slices.Contains(dnsNames, n) {
			t.Errorf("Certificate rb-broker-tls: dnsNames %q lack %s", dnsNames, n)
		}
	}
	checkUsages(t, tlsCert, "server auth", "client auth")

	// --- agent certificates ---
	var ids []string
	for _, u := range agents {
		if u.GetKind() != "Certificate" {
			t.Errorf("agent-certificates: unexpected %s", id(u))
			continue
		}
		cn := str(t, u, "spec", "commonName")
		ids = append(ids, cn)
		if want := "rb-agent-" + cn + "-tls"; str(t, u, "spec", "secretName") != want {
			t.Errorf("%s: secretName %q, want %q", id(u), str(t, u, "spec", "secretName"), want)
		}
		if want := "rb-agent-" + cn; u.GetName() != want {
			t.Errorf("%s: name, want %q", id(u), want)
		}
		checkUsages(t, u, "client auth", "server auth")
		if iss := findIssuer(t, broker, u); iss.GetName() != "rb-broker-ca-issuer" {
			t.Errorf("%s is issued by %s, want the broker's CA issuer", id(u), id(iss))
		}
	}
	for _, want := range []string{"rome", "paris", "berlin"} {
		if !slices.Contains(ids, want) {
			t.Errorf("agent-certificates: no Certificate for cluster %s (have %q)", want, ids)
		}
	}

	// --- redis ---
	sts := as[appsv1.StatefulSet](t, find(t, redis, "StatefulSet", "rb-redis"))
	rpod := sts.Spec.Template
	if sts.Spec.Replicas == nil || *sts.Spec.Replicas != 1 {
		t.Errorf("StatefulSet rb-redis: replicas %v, want 1", sts.Spec.Replicas)
	}
	headless := as[corev1.Service](t, find(t, redis, "Service", sts.Spec.ServiceName))
	if headless.Spec.ClusterIP != corev1.ClusterIPNone {
		t.Errorf("Service %s (the StatefulSet's serviceName) is not headless", headless.Name)
	}
	rctr := rpod.Spec.Containers[0]
	if rctr.Image != "redis:7.2" {
		t.Errorf("rb-redis image %q, want redis:7.2", rctr.Image)
	}
	checkHardened(t, "rb-redis", rpod.Spec, rctr, 999)
	for _, p := range []*corev1.Probe{rctr.ReadinessProbe, rctr.LivenessProbe} {
		if p == nil || p.Exec == nil || !strings.Contains(strings.Join(p.Exec.Command, " "), "redis-cli") {
			t.Errorf("rb-redis: readiness and liveness must be redis-cli ping, got %+v", p)
		}
	}
	var dataMounted, confMounted bool
	for _, m := range rctr.VolumeMounts {
		for _, vct := range sts.Spec.VolumeClaimTemplates {
			dataMounted = dataMounted || (m.Name == vct.Name && m.MountPath == "/data" && !m.ReadOnly)
		}
	}
	for _, v := range rpod.Spec.Volumes {
		if v.ConfigMap == nil {
			continue
		}
		cm := as[corev1.ConfigMap](t, find(t, redis, "ConfigMap", v.ConfigMap.Name))
		conf := strings.Split(cm.Data["redis.conf"], "\n")
		for _, line := range []string{"appendonly yes", "appendfsync everysec", "dir /data", "maxmemory-policy noeviction"} {
			if !slices.Contains(conf, line) {
				t.Errorf("ConfigMap %s: redis.conf lacks %q", cm.Name, line)
			}
		}
		for _, m := range rctr.VolumeMounts {
			confMounted = confMounted || (m.Name == v.Name && slices.Contains(rctr.Command, m.MountPath+"/redis.conf"))
		}
	}
	if !dataMounted || !confMounted {
		t.Errorf("rb-redis: PVC template mounted writable at /data: %v; redis.conf from the ConfigMap given to redis-server: %v", dataMounted, confMounted)
	}
	// The broker's --redis-url names this Service.
	rsvc := as[corev1.Service](t, find(t, redis, "Service", "rb-redis"))
	checkService(t, rsvc, labels.Set(rpod.Labels), rctr, 6379, 6379)
	rnp := as[networkingv1.NetworkPolicy](t, find(t, redis, "NetworkPolicy", "rb-redis"))
	if sel, err := metav1.LabelSelectorAsSelector(&rnp.Spec.PodSelector); err != nil || !sel.Matches(labels.Set(rpod.Labels)) {
		t.Errorf("NetworkPolicy rb-redis does not select the Redis pod (%v)", err)
	}
	if !slices.Contains(rnp.Spec.PolicyTypes, networkingv1.PolicyTypeIngress) || len(rnp.Spec.Ingress) != 1 {
		t.Fatalf("NetworkPolicy rb-redis: want exactly one ingress rule")
	}
	rule := rnp.Spec.Ingress[0]
	if len(rule.From) != 1 || rule.From[0].PodSelector == nil || rule.From[0].NamespaceSelector != nil || rule.From[0].IPBlock != nil {
		t.Fatalf("NetworkPolicy rb-redis: ingress must come from a pod selector in the namespace only: %+v", rule.From)
	}
	if sel, err := metav1.LabelSelectorAsSelector(rule.From[0].PodSelector); err != nil || !sel.Matches(podLabels) {
		t.Errorf("NetworkPolicy rb-redis does not admit the broker pods %v (%v)", podLabels, err)
	}
	if !hasPort(rule.Ports, corev1.ProtocolTCP, 6379) || len(rule.Ports) != 1 {
		t.Errorf("NetworkPolicy rb-redis: ingress ports %+v, want only TCP 6379", rule.Ports)
	}
}

func find(t testing.TB, objs []*unstructured.Unstructured, kind, name string) *unstructured.Unstructured {
	t.Helper()
	for _, u := range objs {
		if u.GetKind() == kind && u.GetName() == name {
			return u
		}
	}
	t.Fatalf("no %s/%s in the build", kind, name)
	return nil
}

func findIssuer(t testing.TB, objs []*unstructured.Unstructured, cert *unstructured.Unstructured) *unstructured.Unstructured {
	t.Helper()
	kind := str(t, cert, "spec", "issuerRef", "kind")
	if kind == "" {
		kind = "Issuer"
	}
	if g, _, _ := unstructured.NestedString(cert.Object, "spec", "issuerRef", "group"); g != "" && g != "cert-manager.io" {
		t.Fatalf("%s: issuerRef group %q", id(cert), g)
	}
	iss := find(t, objs, kind, str(t, cert, "spec", "issuerRef", "name"))
	if kind == "Issuer" && iss.GetNamespace() != cert.GetNamespace() {
		t.Errorf("%s: Issuer %s is in another namespace", id(cert), id(iss))
	}
	return iss
}

func str(t testing.TB, u *unstructured.Unstructured, fields ...string) string {
	t.Helper()
	s, _, err := unstructured.NestedString(u.Object, fields...)
	if err != nil {
		t.Fatalf("%s: %s: %v", id(u), strings.Join(fields, "."), err)
	}
	return s
}

func as[T any](t testing.TB, u *unstructured.Unstructured) T {
	t.Helper()
	var v T
	if err := runtime.DefaultUnstructuredConverter.FromUnstructuredWithValidation(u.Object, &v, true); err != nil {
		t.Fatalf("%s: %v", id(u), err)
	}
	return v
}

func checkUsages(t testing.TB, cert *unstructured.Unstructured, want, forbidden string) {
	t.Helper()
	usages, _, _ := unstructured.NestedStringSlice(cert.Object, "spec", "usages")
	if !slices.Contains(usages, want) || slices.Contains(usages, forbidden) {
		t.Errorf("%s: usages %q, want %q and not %q", id(cert), usages, want, forbidden)
	}
}

func containerPort(c corev1.Container, p intstr.IntOrString) int32 {
	if p.Type == intstr.Int {
		return p.IntVal
	}
	for _, cp := range c.Ports {
		if cp.Name == p.StrVal {
			return cp.ContainerPort
		}
	}
	return -1
}

func checkPort(t testing.TB, c corev1.Container, name string, port int32) {
	t.Helper()
	if got := containerPort(c, intstr.FromString(name)); got != port {
		t.Errorf("container %s: port %q is %d, want %d", c.Name, name, got, port)
	}
}

func checkHTTPProbe(t testing.TB, what string, c corev1.Container, p *corev1.Probe, path string, port int32) {
	t.Helper()
	if p == nil || p.HTTPGet == nil {
		t.Errorf("container %s: no HTTP %s probe", c.Name, what)
		return
	}
	if p.HTTPGet.Path != path || containerPort(c, p.HTTPGet.Port) != port || (p.HTTPGet.Scheme != "" && p.HTTPGet.Scheme != corev1.URISchemeHTTP) {
		t.Errorf("container %s: %s probe %s %v %s, want HTTP %s on %d", c.Name, what, p.HTTPGet.Scheme, p.HTTPGet.Port.String(), p.HTTPGet.Path, path, port)
	}
}

func checkService(t testing.TB, svc corev1.Service, podLabels labels.Set, c corev1.Container, port, target int32) {
	t.Helper()
	if len(svc.Spec.Selector) == 0 || !labels.SelectorFromSet(svc.Spec.Selector).Matches(podLabels) {
		t.Errorf("Service %s: selector %v does not select the pods %v", svc.Name, svc.Spec.Selector, podLabels)
	}
	for _, p := range svc.Spec.Ports {
		if p.Port == port && containerPort(c, p.TargetPort) == target {
			return
		}
	}
	t.Errorf("Service %s: no port %d -> container port %d: %+v", svc.Name, port, target, svc.Spec.Ports)
}

func checkHardened(t testing.TB, name string, pod corev1.PodSpec, c corev1.Container, uid int64) {
	t.Helper()
	psc, sc := pod.SecurityContext, c.SecurityContext
	if psc == nil || sc == nil {
		t.Errorf("%s: pod and container need a securityContext", name)
		return
	}
	runAsNonRoot := (sc.RunAsNonRoot != nil && *sc.RunAsNonRoot) || (sc.RunAsNonRoot == nil && psc.RunAsNonRoot != nil && *psc.RunAsNonRoot)
	runAsUser := sc.RunAsUser
	if runAsUser == nil {
		runAsUser = psc.RunAsUser
	}
	seccomp := sc.SeccompProfile
	if seccomp == nil {
		seccomp = psc.SeccompProfile
	}
	switch {
	case !runAsNonRoot:
		t.Errorf("%s: runAsNonRoot is not true", name)
	case runAsUser == nil || *runAsUser != uid:
		t.Errorf("%s: runAsUser %v, want %d", name, runAsUser, uid)
	case sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem:
		t.Errorf("%s: readOnlyRootFilesystem is not true", name)
	case sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation:
		t.Errorf("%s: allowPrivilegeEscalation is not false", name)
	case sc.Capabilities == nil || !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) || len(sc.Capabilities.Add) != 0:
		t.Errorf("%s: capabilities %+v, want drop [ALL] and nothing added", name, sc.Capabilities)
	case seccomp == nil || seccomp.Type != corev1.SeccompProfileTypeRuntimeDefault:
		t.Errorf("%s: seccompProfile %+v, want RuntimeDefault", name, seccomp)
	}
	for _, res := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory} {
		if _, ok := c.Resources.Requests[res]; !ok {
			t.Errorf("%s: no %s request", name, res)
		}
		if _, ok := c.Resources.Limits[res]; !ok {
			t.Errorf("%s: no %s limit", name, res)
		}
	}
}

func hasPort(ports []networkingv1.NetworkPolicyPort, proto corev1.Protocol, port int) bool {
	for _, p := range ports {
		pr := corev1.ProtocolTCP
		if p.Protocol != nil {
			pr = *p.Protocol
		}
		if pr == proto && p.Port != nil && p.Port.IntValue() == port {
			return true
		}
	}
	return false
}

func ingressAllows(np networkingv1.NetworkPolicy, port int) bool {
	return slices.ContainsFunc(np.Spec.Ingress, func(r networkingv1.NetworkPolicyIngressRule) bool {
		return hasPort(r.Ports, corev1.ProtocolTCP, port)
	})
}

// TestBasesStandAlone: there is deliberately no manifests/kustomization.yaml;
// each base is built and applied on its own.
func TestBasesStandAlone(t *testing.T) {
	if _, err := os.Stat("kustomization.yaml"); err == nil {
		t.Errorf("manifests/kustomization.yaml must not exist: each base builds on its own")
	}
	for _, b := range bases {
		if _, err := os.Stat(filepath.Join(filepath.FromSlash(b), "kustomization.yaml")); err != nil {
			t.Errorf("base %s: %v", b, err)
		}
	}
}

// TestTenantPolicyIsTheAgents: the tenant policy the agent builds in and
// applies (package manifests) comes out of kustomize unchanged but for the
// labels, and cluster-scoped; so do the PriorityClasses it ensures at
// start-up (default priority).
func TestTenantPolicyIsTheAgents(t *testing.T) {
	objs := build(t, "agent")
	find := func(kind, name string) *unstructured.Unstructured {
		for _, u := range objs {
			if u.GetKind() == kind && u.GetName() == name {
				assert.Empty(t, u.GetNamespace(), "%s %s is cluster-scoped", kind, name)
				return u
			}
		}
		t.Fatalf("manifests/agent has no %s %s", kind, name)
		return nil
	}
	var role rbacv1.ClusterRole
	require.NoError(t, runtime.DefaultUnstructuredConverter.FromUnstructured(find("ClusterRole", provider.TenantClusterRole).Object, &role))
	assert.Equal(t, provider.TenantRules(), role.Rules)
	policies := provider.TenantAdmissionPolicy()
	require.Len(t, policies, 4, "rb-tenant-pods and rb-tenant-services, each with its binding")
	for _, want := range policies {
		kind := want.GetObjectKind().GroupVersionKind().Kind
		switch want := want.(type) {
		case *admissionregistrationv1.ValidatingAdmissionPolicy:
			var got admissionregistrationv1.ValidatingAdmissionPolicy
			require.NoError(t, runtime.DefaultUnstructuredConverter.FromUnstructured(find(kind, want.Name).Object, &got))
			assert.Equal(t, want.Spec, got.Spec, want.Name)
		case *admissionregistrationv1.ValidatingAdmissionPolicyBinding:
			var got admissionregistrationv1.ValidatingAdmissionPolicyBinding
			require.NoError(t, runtime.DefaultUnstructuredConverter.FromUnstructured(find(kind, want.Name).Object, &got))
			assert.Equal(t, want.Spec, got.Spec, want.Name)
		default:
			t.Errorf("unexpected %s %s in the tenant policy", kind, want.GetName())
		}
	}
	for _, want := range provider.NewPriorityClasses(provider.DefaultHoldPriority) {
		var pc schedulingv1.PriorityClass
		require.NoError(t, runtime.DefaultUnstructuredConverter.FromUnstructured(find("PriorityClass", want.Name).Object, &pc))
		assert.Equal(t, want.Value, pc.Value, want.Name)
		assert.Equal(t, want.PreemptionPolicy, pc.PreemptionPolicy, want.Name)
		assert.Equal(t, want.Description, pc.Description, want.Name)
	}
	for _, name := range []string{"rb-agent", "rb-tenant-pods", "rb-tenant-services"} {
		find("ValidatingAdmissionPolicy", name)
		find("ValidatingAdmissionPolicyBinding", name)
	}
	// The RBAC objects that name another namespace keep it.
	for _, u := range objs {
		switch u.GetKind() + "/" + u.GetName() {
		case "Role/rb-agent-node-leases", "RoleBinding/rb-agent-node-leases":
			assert.Equal(t, "kube-node-lease", u.GetNamespace(), id(u))
		case "RoleBinding/rb-agent-auth-reader":
			assert.Equal(t, "kube-system", u.GetNamespace(), id(u))
		case "Role/rb-agent-home-api", "RoleBinding/rb-agent-home-api":
			assert.Equal(t, "default", u.GetNamespace(), id(u))
		}
	}
}

// TestTenantNamespaceDefaults: the LimitRange and object quota of a tenant
// namespace decode from the built-in tenant-namespace.yaml.
func TestTenantNamespaceDefaults(t *testing.T) {
	lr := provider.NewTenantLimitRange("rb-rome")
	require.Len(t, lr.Spec.Limits, 1)
	assert.Equal(t, "100m", lr.Spec.Limits[0].DefaultRequest.Cpu().String())
	assert.Equal(t, "rb-rome", lr.Namespace)
	q := provider.NewTenantObjectQuota("rb-rome")
	nodePorts := q.Spec.Hard["services.nodeports"]
	assert.Equal(t, "0", nodePorts.String())
	assert.Contains(t, q.Spec.Hard, corev1.ResourceName("configmaps"))
}

// ourImages are the images this repository builds (make images), by base.
var ourImages = map[string]string{
	"broker":    "ghcr.io/fluidos-project/rb-broker",
	"agent":     "ghcr.io/fluidos-project/rb-agent",
	"scheduler": "ghcr.io/fluidos-project/rb-scheduler",
}

// releaseTag is the tag the bases' kustomize images: entries give our
// images; they must agree (one release).
func releaseTag(t testing.TB) string {
	t.Helper()
	tags := map[string]bool{}
	for base, image := range ourImages {
		var k struct {
			Images []struct {
				Name    string `json:"name"`
				NewName string `json:"newName"`
				NewTag  string `json:"newTag"`
				Digest  string `json:"digest"`
			} `json:"images"`
		}
		b, err := os.ReadFile(filepath.Join(base, "kustomization.yaml"))
		require.NoError(t, err)
		require.NoError(t, yaml.Unmarshal(b, &k))
		var found bool
		for _, im := range k.Images {
			if im.Name != image {
				continue
			}
			found = true
			if im.NewTag == "" || im.NewTag == "latest" || im.NewName != "" || im.Digest != "" {
				t.Errorf("%s/kustomization.yaml: images: %s: newTag %q (newName %q, digest %q): want a release tag, not latest", base, image, im.NewTag, im.NewName, im.Digest)
			}
			tags[im.NewTag] = true
		}
		if !found {
			t.Errorf("%s/kustomization.yaml: no images: entry for %s (the way to point the base at another tag or registry)", base, image)
		}
	}
	if len(tags) != 1 {
		t.Fatalf("the bases' images: entries give our images different tags: %v", slices.Sorted(maps.Keys(tags)))
	}
	for tag := range tags {
		return tag
	}
	return ""
}

// pinned says what is wrong with an image reference that a manifest
// names: it must carry a tag or a digest (no implicit latest), and the tag
// must not be latest.
func pinned(image string) error {
	ref, err := name.ParseReference(image)
	if err != nil {
		return fmt.Errorf("image %q is no image reference: %w", image, err)
	}
	tag, ok := ref.(name.Tag)
	switch {
	case !ok: // a digest
	case !strings.HasSuffix(image, ":"+tag.TagStr()):
		return fmt.Errorf("image %q has no tag or digest: it means latest", image)
	case tag.TagStr() == "latest":
		return fmt.Errorf("image %q: latest is not a version", image)
	}
	return nil
}

// images returns every "image" string under obj (the containers of pod
// templates, whatever the kind).
func images(obj any) []string {
	var out []string
	switch v := obj.(type) {
	case map[string]any:
		for k, e := range v {
			if s, ok := e.(string); ok && k == "image" {
				out = append(out, s)
				continue
			}
			out = append(out, images(e)...)
		}
	case []any:
		for _, e := range v {
			out = append(out, images(e)...)
		}
	}
	return out
}

// TestImagesArePinned: every image a base deploys has a tag (or digest)
// that is not latest, in what kustomize builds and in the YAML files
// themselves; ours carry the release tag of the images: entries.
func TestImagesArePinned(t *testing.T) {
	t.Run("pinned refuses latest and untagged images", func(t *testing.T) {
		for _, bad := range []string{"ghcr.io/fluidos-project/rb-agent", "ghcr.io/fluidos-project/rb-agent:latest", "redis", "localhost:5000/redis", "Not An Image"} {
			assert.Error(t, pinned(bad), bad)
		}
		for _, good := range []string{"redis:7.2", "ghcr.io/fluidos-project/rb-agent:v0.1.0",
			"registry.k8s.io/pause@sha256:ee6521f290b2168b6e0935a181d4cff9be1ac3f505666ef0e3c98fae8199917a"} {
			assert.NoError(t, pinned(good), good)
		}
	})

	tag := releaseTag(t)
	var seen int
	for _, b := range bases {
		for _, u := range build(t, b) {
			for _, image := range images(u.Object) {
				seen++
				if err := pinned(image); err != nil {
					t.Errorf("%s: %s: %v", b, id(u), err)
				}
				repo, _, _ := strings.Cut(image, ":")
				if repo == ourImages[b] && image != repo+":"+tag {
					t.Errorf("%s: %s: image %q, want the release tag %q", b, id(u), image, tag)
				}
			}
		}
	}
	if seen < 4 { // rb-broker, rb-agent, rb-scheduler, Redis
		t.Errorf("found only %d images in the bases' builds", seen)
	}

	// The files too: a base applied without kustomize must not pull latest.
	files, err := filepath.Glob("*/*.yaml")
	require.NoError(t, err)
	more, err := filepath.Glob("*/*/*.yaml")
	require.NoError(t, err)
	for _, f := range append(files, more...) {
		b, err := os.ReadFile(f)
		require.NoError(t, err)
		for i, doc := range strings.Split(string(b), "\n---") {
			var obj any
			if err := yaml.Unmarshal([]byte(doc), &obj); err != nil {
				t.Errorf("%s: document %d: %v", f, i, err)
				continue
			}
			for _, image := range images(obj) {
				if err := pinned(image); err != nil {
					t.Errorf("%s: %v", f, err)
				}
			}
		}
	}
}

// TestAgentArgsResolve: every $(VAR) in the agent's args is defined (its
// env or the config it takes from rb-agent-config), and the API server
// requesters are handed comes from that config, where it ships empty: an
// agent nobody configured refuses to start (the in-cluster address) rather
// than advertise an address no other cluster reaches.
func TestAgentArgsResolve(t *testing.T) {
	objs := build(t, "agent")
	dep := as[appsv1.Deployment](t, find(t, objs, "Deployment", "rb-agent"))
	ctr := dep.Spec.Template.Spec.Containers[0]
	defined := map[string]string{}
	for _, e := range ctr.Env {
		defined[e.Name] = e.Value
	}
	for _, from := range ctr.EnvFrom {
		require.NotNil(t, from.ConfigMapRef, "envFrom other than a ConfigMap")
		cm := as[corev1.ConfigMap](t, find(t, objs, "ConfigMap", from.ConfigMapRef.Name))
		maps.Copy(defined, cm.Data)
	}
	ref := regexp.MustCompile(`\$\(([A-Za-z_][A-Za-z0-9_]*)\)`)
	for _, arg := range append(slices.Clone(ctr.Command), ctr.Args...) {
		for _, m := range ref.FindAllStringSubmatch(arg, -1) {
			if _, ok := defined[m[1]]; !ok {
				t.Errorf("rb-agent arg %q: $(%s) is defined by neither its env nor its ConfigMap: the kubelet would pass it as is", arg, m[1])
			}
		}
	}
	for _, want := range []string{"--api-server-address=$(API_SERVER_ADDRESS)", "--api-server-ca-file=$(API_SERVER_CA_FILE)"} {
		if !slices.Contains(ctr.Args, want) {
			t.Errorf("rb-agent args %q lack %s", ctr.Args, want)
		}
	}
	if v, ok := defined["API_SERVER_ADDRESS"]; !ok || v != "" {
		t.Errorf("config.env: API_SERVER_ADDRESS %q (set: %v), want it present and empty, to be set per cluster", v, ok)
	}
}
