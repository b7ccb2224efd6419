package liqobed

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	authv1beta1 "github.com/liqotech/liqo/apis/authentication/v1beta1"
	liqov1beta1 "github.com/liqotech/liqo/apis/core/v1beta1"

	"github.com/fluidos-project/resource-broker/internal/testbed"
)

// The chart's names liqobed relies on.
const (
	webhookName        = "liqo-webhook"
	controllerManager  = "liqo-controller-manager"
	crdReplicator      = "liqo-crd-replicator"
	liqoPartOfLabel    = "app.kubernetes.io/part-of"
	liqoPartOfValue    = "liqo"
	helmHookAnnotation = "helm.sh/hook"
)

// CIDRs handed to the chart: all in 198.18.0.0/15, clear of the bed's own
// (hosts 198.18.0.0/24, services 198.18.100+i.0/24, pods 198.19.0.0/16).
const (
	externalCIDR = "198.18.192.0/20"
	internalCIDR = "198.18.208.0/20"
	ipamPool     = "198.18.224.0/19"
)

// install renders and applies the chart, then starts the webhook and, once
// the API server calls it, the controller-manager and the crd-replicator.
func (c *Cluster) install(ctx context.Context) error {
	l := c.liqo
	t0 := time.Now()
	objs, err := c.render(ctx)
	if err != nil {
		return err
	}
	l.timing("render "+c.Name, time.Since(t0))
	t0 = time.Now()
	if err := c.apply(ctx, objs); err != nil {
		return err
	}
	l.timing("apply "+c.Name, time.Since(t0))
	deployments := map[string]*appsv1.Deployment{}
	for _, o := range objs {
		if o.GetKind() == "Deployment" {
			var d appsv1.Deployment
			if err := runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, &d); err != nil {
				return err
			}
			d.Namespace = Namespace
			deployments[d.Name] = &d
		}
	}
	for _, name := range []string{webhookName, controllerManager, crdReplicator} {
		if deployments[name] == nil {
			return fmt.Errorf("the rendered chart has no Deployment %s", name)
		}
	}
	t0 = time.Now()
	wh, err := c.run(ctx, deployments[webhookName])
	if err != nil {
		return err
	}
	if err := c.waitWebhook(ctx, wh); err != nil {
		return err
	}
	l.timing("webhook "+c.Name, time.Since(t0))
	t0 = time.Now()
	cm, err := c.run(ctx, deployments[controllerManager])
	if err != nil {
		return err
	}
	rep, err := c.run(ctx, deployments[crdReplicator])
	if err != nil {
		return err
	}
	if err := wait(ctx, 90*time.Second, cm, "liqo-controller-manager healthy", func() (bool, error) {
		return testbed.HTTPOK(fmt.Sprintf("http://%s/healthz", cm.probe)), nil
	}); err != nil {
		return err
	}
	// crd-replicator has no probe: up once it has run for a moment.
	if err := wait(ctx, 3*time.Second, rep, "", func() (bool, error) { return false, nil }); err != nil && !errors.Is(err, errTimeout) {
		return err
	}
	l.timing("controller-manager "+c.Name, time.Since(t0))
	return nil
}

// values are the chart values of the cluster (a values file, as `liqoctl
// install --only-output-values` would write one).
func (c *Cluster) values(ctx context.Context) (map[string]any, error) {
	var podCIDRs []any
	for _, n := range c.RealNodes() {
		podCIDRs = append(podCIDRs, n.PodCIDR)
	}
	if len(podCIDRs) == 0 {
		return nil, errors.New("no real node: no pod CIDR")
	}
	var sc networkingv1.ServiceCIDR
	if err := c.Client.Get(ctx, client.ObjectKey{Name: "kubernetes"}, &sc); err != nil {
		return nil, fmt.Errorf("the cluster's service CIDR (ServiceCIDR kubernetes): %w", err)
	}
	if len(sc.Spec.CIDRs) == 0 {
		return nil, errors.New("ServiceCIDR kubernetes has no CIDR")
	}
	vals := map[string]any{
		"tag":       c.liqo.Version,
		"discovery": map[string]any{"config": map[string]any{"clusterID": c.Name}},
		// As liqoctl install: the API server URL of the kubeconfig (peers reach it there).
		"apiServer":  map[string]any{"address": c.Config.Host},
		"networking": map[string]any{"enabled": false},
		"ipam": map[string]any{
			"podCIDRs": podCIDRs, "serviceCIDR": sc.Spec.CIDRs[0],
			"externalCIDR": externalCIDR, "internalCIDR": internalCIDR,
			"pools": []any{ipamPool}, "reservedSubnets": []any{},
		},
		"metricAgent":       map[string]any{"enabled": false},
		"proxy":             map[string]any{"enabled": false},
		"telemetry":         map[string]any{"enabled": false},
		"controllerManager": map[string]any{"replicas": 0},
		"webhook":           map[string]any{"replicas": 0},
		"virtualKubelet":    map[string]any{"replicas": 0},
	}
	if v := c.liqo.opts.Verbosity; v > 0 {
		// Every component's args (common.extraArgs) and the virtual kubelets' (virtualKubelet.extra.args).
		flag := []any{fmt.Sprintf("--klog.v=%d", v)}
		vals["common"] = map[string]any{"extraArgs": flag}
		vals["virtualKubelet"] = map[string]any{"replicas": 0, "extra": map[string]any{"args": flag}}
	}
	return vals, nil
}

// render runs `helm template` on the chart and decodes what it prints.
func (c *Cluster) render(ctx context.Context) ([]*unstructured.Unstructured, error) {
	vals, err := c.values(ctx)
	if err != nil {
		return nil, err
	}
	raw, err := yaml.Marshal(vals)
	if err != nil {
		return nil, err
	}
	valuesFile := filepath.Join(c.dir, "values.yaml")
	if err := os.WriteFile(valuesFile, raw, 0o644); err != nil {
		return nil, err
	}
	args := []string{"template", "liqo", filepath.Join(c.liqo.BinDir, "chart"), "--namespace", Namespace, "--include-crds", "--values", valuesFile}
	for _, v := range c.liqo.opts.Values {
		args = append(args, "--set", v)
	}
	cmd := exec.CommandContext(ctx, filepath.Join(c.liqo.BinDir, "helm"), args...)
	home := filepath.Join(c.dir, "helm")
	cmd.Env = append(os.Environ(), "HELM_CACHE_HOME="+home+"/cache", "HELM_CONFIG_HOME="+home+"/config", "HELM_DATA_HOME="+home+"/data")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("helm %s: %w\n%s", strings.Join(args, " "), err, stderr.String())
	}
	if err := os.WriteFile(filepath.Join(c.dir, "chart-rendered.yaml"), out, 0o644); err != nil {
		return nil, err
	}
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(out), 4096)
	var objs []*unstructured.Unstructured
	for {
		var m map[string]any
		if err := dec.Decode(&m); err != nil {
			if errors.Is(err, io.EOF) {
				break
			}
			return nil, fmt.Errorf("decoding the rendered chart: %w", err)
		}
		if len(m) == 0 {
			continue
		}
		objs = append(objs, &unstructured.Unstructured{Object: m})
	}
	return objs, nil
}

// apply creates the rendered objects: the namespace, the CRDs (and waits
// until they are served), then the rest, with the Deployments at zero
// replicas, the webhook's Service without selector, and no hook.
func (c *Cluster) apply(ctx context.Context, objs []*unstructured.Unstructured) error {
	if err := c.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: Namespace}}); err != nil && !apierrors.IsAlreadyExists(err) {
		return err
	}
	var crds, rest []*unstructured.Unstructured
	for _, o := range objs {
		switch {
		case o.GetAnnotations()[helmHookAnnotation] != "":
			continue // the pre-delete uninstaller Job and its RBAC
		case o.GetKind() == "CustomResourceDefinition":
			crds = append(crds, o)
		default:
			rest = append(rest, o)
		}
	}
	for _, o := range crds {
		if err := c.Client.Create(ctx, o); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("CRD %s: %w", o.GetName(), err)
		}
	}
	if err := wait(ctx, 60*time.Second, nil, "Liqo's CRDs established", func() (bool, error) {
		for _, o := range crds {
			u := &unstructured.Unstructured{}
			u.SetGroupVersionKind(o.GroupVersionKind())
			if err := c.Client.Get(ctx, client.ObjectKey{Name: o.GetName()}, u); err != nil {
				return false, nil //nolint:nilerr // not there yet
			}
			conds, _, _ := unstructured.NestedSlice(u.Object, "status", "conditions")
			established := false
			for _, cd := range conds {
				m, _ := cd.(map[string]any)
				if m["type"] == "Established" && m["status"] == "True" {
					established = true
				}
			}
			if !established {
				return false, nil
			}
		}
		return true, nil
	}); err != nil {
		return err
	}
	for _, o := range rest {
		switch {
		case o.GetKind() == "Deployment":
			if err := unstructured.SetNestedField(o.Object, int64(0), "spec", "replicas"); err != nil {
				return err
			}
		case o.GetKind() == "Service" && o.GetName() == webhookName:
			unstructured.RemoveNestedField(o.Object, "spec", "selector")
		}
		if err := c.create(ctx, o); err != nil {
			return fmt.Errorf("%s %s: %w", o.GetKind(), o.GetName(), err)
		}
	}
	return nil
}

// create creates o (in the release namespace if it is namespaced),
// retrying while its type is not yet known to the client's mapper.
func (c *Cluster) create(ctx context.Context, o *unstructured.Unstructured) error {
	deadline := time.Now().Add(30 * time.Second)
	for {
		namespaced, err := c.Client.IsObjectNamespaced(o)
		if err == nil {
			if namespaced && o.GetNamespace() == "" {
				o.SetNamespace(Namespace)
			}
			err = c.Client.Create(ctx, o)
			if apierrors.IsAlreadyExists(err) {
				err = nil
			}
		}
		if err == nil || !meta.IsNoMatchError(err) || time.Now().After(deadline) {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// waitWebhook publishes the webhook process as the endpoint of its Service
// and waits until its certificate is in the webhook configurations and the
// API server gets answers from it.
func (c *Cluster) waitWebhook(ctx context.Context, wh *standIn) error {
	if err := wait(ctx, 90*time.Second, wh, "liqo-webhook ready", func() (bool, error) {
		return testbed.HTTPOK(fmt.Sprintf("http://%s/readyz", wh.probe)), nil
	}); err != nil {
		return err
	}
	ep := &corev1.Endpoints{ //nolint:staticcheck // a selector-less Service's endpoints, mirrored to EndpointSlices by kube-controller-manager
		ObjectMeta: metav1.ObjectMeta{Namespace: Namespace, Name: webhookName, Labels: map[string]string{liqoPartOfLabel: liqoPartOfValue}},
		Subsets: []corev1.EndpointSubset{{ //nolint:staticcheck // see above
			Addresses: []corev1.EndpointAddress{{IP: c.IP}},
			Ports:     []corev1.EndpointPort{{Port: int32(wh.port), Protocol: corev1.ProtocolTCP}}, //nolint:gosec // a port
		}},
	}
	if err := c.Client.Create(ctx, ep); err != nil {
		return fmt.Errorf("Endpoints of %s: %w", webhookName, err)
	}
	if err := wait(ctx, 60*time.Second, wh, "the webhook's CA in Liqo's webhook configurations", func() (bool, error) {
		var m admissionregistrationv1.MutatingWebhookConfiguration
		var v admissionregistrationv1.ValidatingWebhookConfiguration
		if c.Client.Get(ctx, client.ObjectKey{Name: webhookName}, &m) != nil || c.Client.Get(ctx, client.ObjectKey{Name: webhookName}, &v) != nil {
			return false, nil
		}
		for _, h := range m.Webhooks {
			if len(h.ClientConfig.CABundle) == 0 {
				return false, nil
			}
		}
		for _, h := range v.Webhooks {
			if len(h.ClientConfig.CABundle) == 0 {
				return false, nil
			}
		}
		return true, nil
	}); err != nil {
		return err
	}
	// A server-side dry run of a ResourceSlice goes through Liqo's
	// validating webhook: it answers once the API server reaches it.
	var last error
	if err := wait(ctx, 60*time.Second, wh, "the API server calling liqo-webhook", func() (bool, error) {
		rs := &authv1beta1.ResourceSlice{ObjectMeta: metav1.ObjectMeta{Namespace: Namespace, Name: "liqobed-webhook-probe"},
			Spec: authv1beta1.ResourceSliceSpec{ProviderClusterID: ptr.To(liqov1beta1.ClusterID("none"))}}
		last = c.Client.Create(ctx, rs, client.DryRunAll)
		return last == nil, nil
	}); err != nil {
		return fmt.Errorf("%w (last answer: %v)", err, last)
	}
	return nil
}
