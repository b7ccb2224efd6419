package testbed

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/fluidos-project/resource-broker/internal/certauthority"
	"github.com/fluidos-project/resource-broker/internal/kustomize"
)

// With Options.Kueue every requester cluster runs Kueue
// (sigs.k8s.io/kueue, `make kueue-bin`) as a Deployment of upstream's
// config/default would run it, minus the pod: the bed renders that base
// (kustomize) and applies its namespace, CRDs, ServiceAccount and RBAC and
// its webhook configurations as upstream wrote them, and runs the
// controller-manager as a host process with a token of its ServiceAccount.
// Kueue's internal certificate management is off: the cluster CA signs the
// serving certificate of its webhook server, which listens on 127.0.0.1,
// and the webhook configurations and the CRDs' conversion webhooks reach it
// by URL (with that CA as caBundle) instead of through Service
// kueue-webhook-service: an EndpointSlice may not name a loopback address,
// and a bed with stand-in nodes has no other. Kueue reads its metrics
// serving certificate from a fixed path, /etc/kueue/metrics/certs, where
// its pod mounts a Secret: the bed runs it in a mount namespace of its own
// whose /etc is a directory of the cluster's holding just that (as its
// distroless image's /etc holds next to nothing). Its on-demand visibility
// API (an aggregated APIService, feature gate VisibilityOnDemand) is off.

// KueueBinEnv names the directory holding kueue and its config/ (default
// <module root>/bin/kueue).
const KueueBinEnv = "RB_KUEUE_BIN"

const (
	// KueueNamespace is upstream's namespace of the controller-manager.
	KueueNamespace = "kueue-system"
	// kueueServiceAccount is upstream's ServiceAccount (config/default's
	// name prefix and config/components/rbac's controller-manager).
	kueueServiceAccount = "kueue-controller-manager"
	// kueueWebhookService is the Service upstream's webhook configurations
	// name; the bed's serving certificate names it too.
	kueueWebhookService = "kueue-webhook-service"
	// kueueMetricsCertDir is where Kueue reads its metrics serving
	// certificate when its internal certificate management is off.
	kueueMetricsCertDir = "/etc/kueue/metrics/certs"
)

// kueueKinds are what the bed applies of config/default before Kueue runs
// (its namespace first): not the Deployment, ConfigMap, Services, Secret
// and visibility APIServices (the bed runs the process with a config of
// its own and reaches it by URL).
var kueueKinds = append([]string{"CustomResourceDefinition"}, kustomize.RBAC...)

// kueueWebhookKinds are applied once Kueue serves them: with failurePolicy
// Fail, pods and Jobs could not be created in the cluster before.
var kueueWebhookKinds = []string{"MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"}

// KueueDir is where kueue and its config/ are: $RB_KUEUE_BIN, else
// <module root>/bin/kueue.
func KueueDir(moduleRoot string) string {
	if d := os.Getenv(KueueBinEnv); d != "" {
		return d
	}
	return filepath.Join(moduleRoot, "bin", "kueue")
}

// CheckKueue tells whether kueue and its config/ are built into KueueDir.
func CheckKueue(moduleRoot string) error {
	dir := KueueDir(moduleRoot)
	for _, f := range []string{"kueue", filepath.Join("config", "default", "kustomization.yaml")} {
		if _, err := os.Stat(filepath.Join(dir, f)); err != nil {
			return fmt.Errorf("%s not found in %s: run \"make kueue-bin\"", f, dir)
		}
	}
	return nil
}

// startKueue installs Kueue in the cluster, runs its controller-manager and
// waits until its webhooks answer.
func (c *Cluster) startKueue(ctx context.Context) error {
	root := c.bed.moduleRoot
	if err := CheckKueue(root); err != nil {
		return err
	}
	dir := KueueDir(root)
	objs, err := kustomize.Build(filepath.Join(dir, "config", "default"))
	if err != nil {
		return err
	}
	if c.CA == nil { // a cluster of stand-in nodes has no CA of its own yet
		if c.CA, err = certauthority.NewCA(c.Name + " cluster CA"); err != nil {
			return err
		}
	}
	ports, err := FreePorts(3)
	if err != nil {
		return err
	}
	webhookPort, healthPort, metricsPort := ports[0], ports[1], ports[2]
	webhookURL := "https://127.0.0.1:" + strconv.Itoa(webhookPort)
	webhooks := kustomize.Kinds(objs, kueueWebhookKinds...)
	install := append(kustomize.Kinds(objs, "Namespace"), kustomize.Kinds(objs, kueueKinds...)...)
	for _, o := range append(slices.Clone(install), webhooks...) {
		if err := pointAtURL(o, webhookURL, c.CA.CertPEM); err != nil {
			return fmt.Errorf("%s: Kueue's %s %s: %w", c.Name, o.GetKind(), o.GetName(), err)
		}
	}
	if err := kustomize.Apply(ctx, c.Config, "rb-testbed", install); err != nil {
		return fmt.Errorf("%s: Kueue's CRDs and RBAC: %w", c.Name, err)
	}
	if err := c.waitCRDsEstablished(ctx, kustomize.Kinds(install, "CustomResourceDefinition")); err != nil {
		return err
	}
	kubeconfig, err := c.serviceAccountKubeconfig(ctx, KueueNamespace, kueueServiceAccount)
	if err != nil {
		return fmt.Errorf("%s: Kueue's identity: %w", c.Name, err)
	}
	kdir := filepath.Join(c.dir, "kueue")
	serving, err := c.CA.IssueServer(kueueWebhookService, []string{"127.0.0.1",
		kueueWebhookService + "." + KueueNamespace + ".svc"})
	if err != nil {
		return err
	}
	webhookCerts := filepath.Join(kdir, "webhook-certs")
	etc := filepath.Join(kdir, "etc")
	for _, d := range []string{webhookCerts, filepath.Join(etc, strings.TrimPrefix(kueueMetricsCertDir, "/etc/"))} {
		if err := certauthority.WriteTLSDir(d, serving, c.CA.CertPEM); err != nil {
			return err
		}
	}
	config := filepath.Join(kdir, "controller_manager_config.yaml")
	if err := os.WriteFile(config, []byte(kueueConfig(webhookPort, healthPort, metricsPort, webhookCerts)), 0o600); err != nil {
		return err
	}
	c.Kueue = &Process{Name: "kueue-" + c.Name, LogPath: filepath.Join(c.bed.LogDir, "kueue-"+c.Name+".log"),
		Path: "unshare", Args: append(kueueMountNamespace(etc), filepath.Join(dir, "kueue"),
			"--config="+config, "--kubeconfig="+kubeconfig, "--zap-log-level=2")}
	if err := c.Kueue.Start(); err != nil {
		return err
	}
	err = c.bed.poll(ctx, c.Kueue, 90*time.Second, "Kueue of "+c.Name+" ready", func() (bool, error) {
		return HTTPOK("http://127.0.0.1:" + strconv.Itoa(healthPort) + "/readyz"), nil
	})
	if err != nil {
		return err
	}
	if err := kustomize.Apply(ctx, c.Config, "rb-testbed", webhooks); err != nil {
		return fmt.Errorf("%s: Kueue's webhook configurations: %w", c.Name, err)
	}
	c.KueueWebhookURL = webhookURL
	var refused error
	err = c.bed.poll(ctx, c.Kueue, 30*time.Second, "Kueue's webhooks of "+c.Name+" answering", func() (bool, error) {
		suspended, err := c.kueueSuspendsJobs(ctx)
		refused = err // the webhook may refuse while its configuration settles
		return suspended, nil
	})
	if err != nil && refused != nil {
		return fmt.Errorf("%w (last answer: %w)", err, refused)
	}
	return err
}

// kueueConfig is Kueue's Configuration: upstream's
// controller_manager_config.yaml but for the addresses and certificates,
// the integrations (batch/v1 Jobs only) and the visibility API (off); the
// leader election's namespace is what a pod would read from its
// ServiceAccount's mount.
func kueueConfig(webhookPort, healthPort, metricsPort int, certDir string) string {
	return fmt.Sprintf(`apiVersion: config.kueue.x-k8s.io/v1beta2
kind: Configuration
namespace: %[1]s
health:
  healthProbeBindAddress: 127.0.0.1:%[2]d
metrics:
  bindAddress: 127.0.0.1:%[3]d
webhook:
  host: 127.0.0.1
  port: %[4]d
  certDir: %[5]s
leaderElection:
  leaderElect: true
  resourceName: c1f6bfd2.kueue.x-k8s.io
  resourceNamespace: %[1]s
internalCertManagement:
  enable: false
featureGates:
  VisibilityOnDemand: false
clientConnection:
  qps: 50
  burst: 100
integrations:
  frameworks:
  - batch/job
`, KueueNamespace, healthPort, metricsPort, webhookPort, certDir)
}

// kueueMountNamespace is the unshare(1) command line that runs what follows
// it in a mount namespace of its own with etc bound on /etc (as root; else
// in a user namespace too, mapped to the caller).
func kueueMountNamespace(etc string) []string {
	args := []string{"--mount", "--propagation", "private"}
	if os.Geteuid() != 0 {
		args = append([]string{"--user", "--map-root-user"}, args...)
	}
	return append(args, "sh", "-c", `mount --bind "$0" /etc && exec "$@"`, etc)
}

// pointAtURL makes a webhook configuration's webhooks, or a CRD's
// conversion webhook, call base+<the Service's path> with caBundle instead
// of the Service; other objects are left as they are.
func pointAtURL(o *unstructured.Unstructured, base string, caBundle []byte) error {
	redirect := func(cc map[string]any) error {
		svc, ok := cc["service"].(map[string]any)
		if !ok {
			return errors.New("clientConfig names no service")
		}
		path, _ := svc["path"].(string)
		cc["url"] = base + path
		delete(cc, "service")
		cc["caBundle"] = base64.StdEncoding.EncodeToString(caBundle)
		return nil
	}
	switch o.GetKind() {
	case "MutatingWebhookConfiguration", "ValidatingWebhookConfiguration":
		whs, _, err := unstructured.NestedSlice(o.Object, "webhooks")
		if err != nil {
			return err
		}
		for _, w := range whs {
			cc, _ := w.(map[string]any)["clientConfig"].(map[string]any)
			if err := redirect(cc); err != nil {
				return err
			}
		}
		return unstructured.SetNestedSlice(o.Object, whs, "webhooks")
	case "CustomResourceDefinition":
		cc, found, err := unstructured.NestedMap(o.Object, "spec", "conversion", "webhook", "clientConfig")
		if err != nil || !found {
			return err
		}
		if err := redirect(cc); err != nil {
			return err
		}
		return unstructured.SetNestedMap(o.Object, cc, "spec", "conversion", "webhook", "clientConfig")
	}
	return nil
}

// waitCRDsEstablished waits until the API server serves every CRD of crds.
func (c *Cluster) waitCRDsEstablished(ctx context.Context, crds []*unstructured.Unstructured) error {
	for _, u := range crds {
		err := c.bed.poll(ctx, nil, 30*time.Second, "CRD "+u.GetName()+" of "+c.Name+" established", func() (bool, error) {
			var crd apiextensionsv1.CustomResourceDefinition
			if err := c.Client.Get(ctx, client.ObjectKey{Name: u.GetName()}, &crd); err != nil {
				return false, client.IgnoreNotFound(err)
			}
			for _, cond := range crd.Status.Conditions {
				if cond.Type == apiextensionsv1.Established {
					return cond.Status == apiextensionsv1.ConditionTrue, nil
				}
			}
			return false, nil
		})
		if err != nil {
			return err
		}
	}
	return nil
}

// KueueQueueLabel is the label by which a Job names its LocalQueue.
const KueueQueueLabel = "kueue.x-k8s.io/queue-name"

// kueueSuspendsJobs tells whether the API server calls Kueue's Job webhook:
// a Job that names a queue, created as a dry run, comes back suspended.
func (c *Cluster) kueueSuspendsJobs(ctx context.Context) (bool, error) {
	job := &batchv1.Job{
		ObjectMeta: metav1.ObjectMeta{Namespace: metav1.NamespaceDefault, Name: "testbed-kueue-probe",
			Labels: map[string]string{KueueQueueLabel: "testbed-kueue-probe"}},
		Spec: batchv1.JobSpec{Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{
			RestartPolicy: corev1.RestartPolicyNever,
			Containers:    []corev1.Container{{Name: "probe", Image: "probe"}}}}},
	}
	if err := c.Client.Create(ctx, job, client.DryRunAll); err != nil {
		return false, err
	}
	return ptr.Deref(job.Spec.Suspend, false), nil
}
