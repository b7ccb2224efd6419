package manifests_test

import (
	"os"
	"path/filepath"
	"slices"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
)

// overlay builds, as an operator's overlay would, base with component.
func overlay(t *testing.T, base, component string) []*unstructured.Unstructured {
	t.Helper()
	dir := t.TempDir()
	// kustomize takes bases by relative path only.
	rel := func(p string) string {
		a, err := filepath.Abs(filepath.FromSlash(p))
		if err != nil {
			t.Fatal(err)
		}
		r, err := filepath.Rel(dir, a)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	k := "resources: [" + rel(base) + "]\ncomponents: [" + rel(component) + "]\n"
	if err := os.WriteFile(filepath.Join(dir, "kustomization.yaml"), []byte(k), 0o644); err != nil {
		t.Fatal(err)
	}
	return build(t, dir)
}

// TestMonitoringComponents checks that each ServiceMonitor component, added
// to its base, scrapes the base's pods on the port that serves /metrics,
// with the scheme and credentials that port wants.
func TestMonitoringComponents(t *testing.T) {
	for _, tc := range []struct {
		base, component, deployment, monitor, service string
		scheme                                        string
		port                                          int32
		flag                                          string
	}{
		{"agent", "monitoring/agent", "rb-agent", "rb-agent", "rb-agent-metrics", "https", 8443, "--metrics-bind-address=:8443"},
		{"broker", "monitoring/broker", "rb-broker", "rb-broker", "rb-broker-metrics", "http", 8081, "--health-address=:8081"},
	} {
		t.Run(tc.component, func(t *testing.T) {
			objs := overlay(t, tc.base, tc.component)
			for _, u := range build(t, tc.base) {
				if u.GetKind() == "ServiceMonitor" {
					t.Errorf("%s: the base itself has a ServiceMonitor (the CRD may be absent)", id(u))
				}
			}
			dep := as[appsv1.Deployment](t, find(t, objs, "Deployment", tc.deployment))
			ctr := dep.Spec.Template.Spec.Containers[0]
			if !slices.Contains(ctr.Args, tc.flag) {
				t.Errorf("%s args %q lack %s", tc.deployment, ctr.Args, tc.flag)
			}
			if v := dep.Spec.Template.Annotations["prometheus.io/scrape"]; tc.scheme == "https" && v != "" {
				t.Errorf("%s: prometheus.io/scrape annotation on an authorized https endpoint", tc.deployment)
			}
			svc := as[corev1.Service](t, find(t, objs, "Service", tc.service))
			checkService(t, svc, labels.Set(dep.Spec.Template.Labels), ctr, tc.port, tc.port)

			sm := find(t, objs, "ServiceMonitor", tc.monitor)
			if sm.GetNamespace() != svc.Namespace {
				t.Errorf("%s: namespace %q, its Service's %q", id(sm), sm.GetNamespace(), svc.Namespace)
			}
			match, _, _ := unstructured.NestedStringMap(sm.Object, "spec", "selector", "matchLabels")
			if len(match) == 0 || !labels.SelectorFromSet(match).Matches(labels.Set(svc.Labels)) {
				t.Errorf("%s: selector %v does not select Service %s (%v)", id(sm), match, svc.Name, svc.Labels)
			}
			for _, other := range objs {
				if other.GetKind() == "Service" && other.GetName() != svc.Name && labels.SelectorFromSet(match).Matches(labels.Set(other.GetLabels())) {
					t.Errorf("%s also selects Service %s", id(sm), other.GetName())
				}
			}
			eps, _, _ := unstructured.NestedSlice(sm.Object, "spec", "endpoints")
			if len(eps) != 1 {
				t.Fatalf("%s: %d endpoints, want 1", id(sm), len(eps))
			}
			ep := eps[0].(map[string]any)
			if !slices.ContainsFunc(svc.Spec.Ports, func(p corev1.ServicePort) bool { return p.Name == ep["port"] }) {
				t.Errorf("%s: endpoint port %v is no port of Service %s", id(sm), ep["port"], svc.Name)
			}
			if ep["scheme"] != tc.scheme || ep["path"] != "/metrics" {
				t.Errorf("%s: scheme %v path %v, want %s /metrics", id(sm), ep["scheme"], ep["path"], tc.scheme)
			}
			if tc.scheme == "https" && ep["bearerTokenFile"] == nil {
				t.Errorf("%s: no credentials for an endpoint that authorizes its callers", id(sm))
			}
		})
	}

	// Prometheus may get the agent's /metrics, and nothing else.
	objs := overlay(t, "agent", "monitoring/agent")
	role := as[rbacv1.ClusterRole](t, find(t, objs, "ClusterRole", "rb-agent-metrics-reader"))
	if len(role.Rules) != 1 || !slices.Equal(role.Rules[0].NonResourceURLs, []string{"/metrics"}) || !slices.Equal(role.Rules[0].Verbs, []string{"get"}) {
		t.Errorf("ClusterRole rb-agent-metrics-reader: %+v, want get on /metrics only", role.Rules)
	}
	binding := as[rbacv1.ClusterRoleBinding](t, find(t, objs, "ClusterRoleBinding", "rb-agent-metrics-reader"))
	if binding.RoleRef.Name != role.Name {
		t.Errorf("ClusterRoleBinding rb-agent-metrics-reader binds %s", binding.RoleRef.Name)
	}
}
