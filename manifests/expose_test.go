package manifests_test

import (
	"context"
	"encoding/json"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/restmapper"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/yaml"

	"github.com/fluidos-project/resource-broker/internal/testenv"
)

// exposeComponents are the ways in of manifests/broker/expose, one of which
// manifests/broker-external keeps.
var exposeComponents = []string{"loadbalancer", "ingress-nginx", "gateway-tlsroute"}

const defaultComponentLine = "  - ../broker/expose/loadbalancer"

// buildExternal builds manifests/broker-external as an operator sets it up:
// host as BROKER_HOST in endpoint.env and component as its one component. It
// builds an in-memory copy of manifests/broker and manifests/broker-external,
// so that the tree is left alone.
func buildExternal(t *testing.T, component, host string) []*unstructured.Unstructured {
	t.Helper()
	mem := filesys.MakeFsInMemory()
	for _, dir := range []string{"broker", "broker-external"} {
		err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() {
				return err
			}
			data, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			return mem.WriteFile(filepath.Join("/manifests", path), data)
		})
		must(t, err)
	}
	kust, err := mem.ReadFile("/manifests/broker-external/kustomization.yaml")
	must(t, err)
	if !strings.Contains(string(kust), defaultComponentLine+" ") {
		t.Fatalf("broker-external/kustomization.yaml: no line %q", defaultComponentLine)
	}
	must(t, mem.WriteFile("/manifests/broker-external/kustomization.yaml",
		[]byte(strings.Replace(string(kust), defaultComponentLine+" ", "  - ../broker/expose/"+component+" ", 1))))
	env, err := mem.ReadFile("/manifests/broker-external/endpoint.env")
	must(t, err)
	env = regexp.MustCompile(`(?m)^BROKER_HOST=.*$`).ReplaceAll(env, []byte("BROKER_HOST="+host))
	must(t, mem.WriteFile("/manifests/broker-external/endpoint.env", env))

	m, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(mem, "/manifests/broker-external")
	if err != nil {
		t.Fatalf("kustomize build broker-external with %s: %v", component, err)
	}
	var objs []*unstructured.Unstructured
	for _, r := range m.Resources() {
		data, err := r.MarshalJSON()
		must(t, err)
		u := &unstructured.Unstructured{}
		must(t, u.UnmarshalJSON(data))
		objs = append(objs, u)
	}
	return objs
}

// TestBrokerExternal builds manifests/broker-external with each component
// and checks that the broker is reachable under BROKER_HOST the way each
// promises, with TLS passed through to the broker, the certificate naming
// the host, the in-cluster Service unchanged, and the agents' endpoint
// published.
func TestBrokerExternal(t *testing.T) {
	const host = "broker.federation.example.net"
	onDisk := build(t, "broker-external")
	if !slices.ContainsFunc(onDisk, func(u *unstructured.Unstructured) bool { return u.GetName() == "rb-broker-external" }) {
		t.Error("manifests/broker-external as shipped: want the loadbalancer component")
	}
	for _, component := range exposeComponents {
		t.Run(component, func(t *testing.T) {
			objs := buildExternal(t, component, host)
			for _, u := range objs {
				if u.GetKind() != "Namespace" && u.GetNamespace() != namespace {
					t.Errorf("%s: namespace %q, want %q", id(u), u.GetNamespace(), namespace)
				}
				data, err := json.Marshal(u.Object)
				must(t, err)
				if regexp.MustCompile(`"BROKER_HOST"[^:]|/BROKER_HOST`).Match(data) {
					t.Errorf("%s: BROKER_HOST left unreplaced: %s", id(u), data)
				}
			}
			dep := as[appsv1.Deployment](t, find(t, objs, "Deployment", "rb-broker"))
			ctr := dep.Spec.Template.Spec.Containers[0]
			podLabels := labels.Set(dep.Spec.Template.Labels)
			inCluster := as[corev1.Service](t, find(t, objs, "Service", "rb-broker"))
			if inCluster.Spec.Type != "" && inCluster.Spec.Type != corev1.ServiceTypeClusterIP {
				t.Errorf("Service rb-broker: type %s, want ClusterIP (in-cluster clients)", inCluster.Spec.Type)
			}
			checkService(t, inCluster, podLabels, ctr, 443, 8443)

			cm := as[corev1.ConfigMap](t, find(t, objs, "ConfigMap", "rb-broker-endpoint"))
			if cm.Data["BROKER_HOST"] != host || cm.Data["BROKER_URL"] != "https://"+host {
				t.Errorf("ConfigMap rb-broker-endpoint: %v, want BROKER_HOST %s and BROKER_URL https://%s", cm.Data, host, host)
			}
			names, _, _ := unstructured.NestedStringSlice(find(t, objs, "Certificate", "rb-broker-tls").Object, "spec", "dnsNames")
			if !slices.Contains(names, host) || !slices.Contains(names, "rb-broker.resource-broker.svc") {
				t.Errorf("Certificate rb-broker-tls: dnsNames %q, want %s and the in-cluster names", names, host)
			}

			kinds := map[string]bool{}
			for _, u := range objs {
				kinds[u.GetKind()+"/"+u.GetName()] = true
			}
			want := map[string][]string{
				"loadbalancer":     {"Service/rb-broker-external"},
				"ingress-nginx":    {"Ingress/rb-broker"},
				"gateway-tlsroute": {"Gateway/rb-broker", "TLSRoute/rb-broker"},
			}
			for c, ks := range want {
				for _, k := range ks {
					if kinds[k] != (c == component) {
						t.Errorf("%s in the build: %v, want %v", k, kinds[k], c == component)
					}
				}
			}
			switch component {
			case "loadbalancer":
				svc := as[corev1.Service](t, find(t, objs, "Service", "rb-broker-external"))
				if svc.Spec.Type != corev1.ServiceTypeLoadBalancer || svc.Spec.ExternalTrafficPolicy != corev1.ServiceExternalTrafficPolicyLocal {
					t.Errorf("Service rb-broker-external: type %s, externalTrafficPolicy %s", svc.Spec.Type, svc.Spec.ExternalTrafficPolicy)
				}
				checkService(t, svc, podLabels, ctr, 443, 8443)
			case "ingress-nginx":
				ing := as[networkingv1.Ingress](t, find(t, objs, "Ingress", "rb-broker"))
				if ing.Annotations["nginx.ingress.kubernetes.io/ssl-passthrough"] != "true" {
					t.Errorf("Ingress rb-broker: not in ssl-passthrough: %v", ing.Annotations)
				}
				if len(ing.Spec.TLS) > 0 {
					t.Error("Ingress rb-broker: a tls section would terminate TLS at the controller")
				}
				if len(ing.Spec.Rules) != 1 || ing.Spec.Rules[0].Host != host || ing.Spec.Rules[0].HTTP == nil || len(ing.Spec.Rules[0].HTTP.Paths) != 1 {
					t.Fatalf("Ingress rb-broker: want one rule for %s, got %+v", host, ing.Spec.Rules)
				}
				backend := ing.Spec.Rules[0].HTTP.Paths[0].Backend.Service
				if backend == nil || backend.Name != "rb-broker" || backend.Port.Name != "https" {
					t.Errorf("Ingress rb-broker: backend %+v, want Service rb-broker port https", backend)
				}
			case "gateway-tlsroute":
				gw := find(t, objs, "Gateway", "rb-broker")
				route := find(t, objs, "TLSRoute", "rb-broker")
				for _, u := range []*unstructured.Unstructured{gw, route} {
					if u.GetAPIVersion() != "gateway.networking.k8s.io/v1" {
						t.Errorf("%s: apiVersion %s", id(u), u.GetAPIVersion())
					}
				}
				var g struct {
					Spec struct {
						Listeners []struct {
							Name, Hostname, Protocol string
							Port                     int
							TLS                      struct{ Mode string }
						}
					}
				}
				var r struct {
					Spec struct {
						ParentRefs []struct{ Name, SectionName string }
						Hostnames  []string
						Rules      []struct {
							BackendRefs []struct {
								Name string
								Port int32
							}
						}
					}
				}
				fromObject(t, gw, &g)
				fromObject(t, route, &r)
				if len(g.Spec.Listeners) != 1 {
					t.Fatalf("Gateway rb-broker: want one listener, got %+v", g.Spec.Listeners)
				}
				l := g.Spec.Listeners[0]
				if l.Protocol != "TLS" || l.TLS.Mode != "Passthrough" || l.Hostname != host || l.Port != 443 {
					t.Errorf("Gateway rb-broker: listener %+v, want TLS Passthrough for %s on 443", l, host)
				}
				if len(r.Spec.ParentRefs) != 1 || r.Spec.ParentRefs[0].Name != gw.GetName() || r.Spec.ParentRefs[0].SectionName != l.Name {
					t.Errorf("TLSRoute rb-broker: parentRefs %+v, want the Gateway's listener %s", r.Spec.ParentRefs, l.Name)
				}
				if !slices.Equal(r.Spec.Hostnames, []string{host}) || len(r.Spec.Rules) != 1 || len(r.Spec.Rules[0].BackendRefs) != 1 {
					t.Fatalf("TLSRoute rb-broker: hostnames %q, rules %+v", r.Spec.Hostnames, r.Spec.Rules)
				}
				b := r.Spec.Rules[0].BackendRefs[0]
				if b.Name != inCluster.Name || !slices.ContainsFunc(inCluster.Spec.Ports, func(p corev1.ServicePort) bool { return p.Port == b.Port }) {
					t.Errorf("TLSRoute rb-broker: backend %+v is not a port of Service rb-broker", b)
				}
			}
		})
	}
}

// TestBrokerExternalServerSideDryRun sends the LoadBalancer and ingress-nginx
// builds to a real API server (server-side apply, dryRun=All, strict field
// validation, cert-manager's CRDs). The Gateway API CRDs are not installed
// there: the Gateway build is checked by TestBrokerExternal only.
func TestBrokerExternalServerSideDryRun(t *testing.T) {
	crdDir := testenv.ModulePath(t, certManagerCRDs...)
	cfg := rest.CopyConfig(testenv.Start(t, testenv.WithCRDDirectories(crdDir)))
	w := &warnings{}
	cfg.WarningHandler = w
	dyn, err := dynamic.NewForConfig(cfg)
	must(t, err)
	dc, err := discovery.NewDiscoveryClientForConfig(cfg)
	must(t, err)
	c := &cluster{dyn: dyn, mapper: restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(dc)), warn: w}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for _, component := range []string{"loadbalancer", "ingress-nginx"} {
		objs := buildExternal(t, component, "broker.federation.example.net")
		ns := find(t, objs, "Namespace", namespace)
		if _, _, err := c.apply(ctx, ns, true); err != nil {
			t.Fatalf("creating %s: %v", id(ns), err)
		}
		for _, u := range objs {
			if _, warns, err := c.apply(ctx, u, false); err != nil {
				t.Errorf("%s: %s: rejected by the API server: %v", component, id(u), err)
			} else if len(warns) > 0 {
				t.Errorf("%s: %s: API server warnings: %q", component, id(u), warns)
			}
		}
	}
}

func fromObject(t *testing.T, u *unstructured.Unstructured, v any) {
	t.Helper()
	data, err := json.Marshal(u.Object)
	must(t, err)
	must(t, yaml.Unmarshal(data, v))
}
