package testbed

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/intstr"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	apiregistrationv1 "k8s.io/kube-aggregator/pkg/apis/apiregistration/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/fluidos-project/resource-broker/internal/certauthority"
)

// With Options.MetricsServer every cluster runs metrics-server
// (sigs.k8s.io/metrics-server, `make metrics-server-bin`) as a host process,
// as a Deployment of upstream's manifests would run it, minus the pod: its
// ServiceAccount and RBAC are upstream's manifests/base/rbac.yaml (copied
// beside the binary), it authenticates with a token of that ServiceAccount,
// listens on an address of its own on the host bridge (an EndpointSlice may
// not name a loopback address), and a selector-less Service in kube-system
// with that EndpointSlice stands for it: the API server dials the endpoint
// itself (--enable-aggregator-routing; no kube-proxy here). The APIService
// v1beta1.metrics.k8s.io trusts the cluster CA, which signs its serving
// certificate. It scrapes every node's kubelet at the port the Node reports
// (real kubelets 10250, virtual nodes their own), verifying the kubelets'
// serving certificates with the cluster CA, which signs the real ones and,
// through the kubelet-serving CSR signer, the virtual ones.

// MetricsServerBinEnv names the directory holding metrics-server and its
// rbac.yaml (default <module root>/bin/metrics-server).
const MetricsServerBinEnv = "RB_METRICS_SERVER_BIN"

const (
	// metricsServerName is upstream's name of its ServiceAccount and Service
	// (kube-system) and of the ClusterRoleBinding's subject.
	metricsServerName = "metrics-server"
	// metricsAPIService is the APIService of the resource metrics API.
	metricsAPIService = "v1beta1.metrics.k8s.io"
	// metricsServerPort is upstream's --secure-port, on an address of its own.
	metricsServerPort = 10250
	// serviceAccountTokenTTL (metrics-server's, rb-agent's, rb-scheduler's)
	// outlives any bed or demo: a host process has no kubelet to rotate its token.
	serviceAccountTokenTTL = 7 * 24 * time.Hour
	// minMetricResolution: metrics-server wants its resolution above its
	// kubelet request timeout (10s) by a tenth, and refuses to start otherwise.
	minMetricResolution = 15 * time.Second
)

// MetricsServerDir is where metrics-server and its rbac.yaml are: $RB_METRICS_SERVER_BIN,
// else <module root>/bin/metrics-server.
func MetricsServerDir(moduleRoot string) string {
	if d := os.Getenv(MetricsServerBinEnv); d != "" {
		return d
	}
	return filepath.Join(moduleRoot, "bin", "metrics-server")
}

// CheckMetricsServer tells whether metrics-server and its RBAC manifest are
// built into MetricsServerDir.
func CheckMetricsServer(moduleRoot string) error {
	dir := MetricsServerDir(moduleRoot)
	for _, f := range []string{"metrics-server", "rbac.yaml"} {
		if _, err := os.Stat(filepath.Join(dir, f)); err != nil {
			return fmt.Errorf("%s not found in %s: run \"make metrics-server-bin\"", f, dir)
		}
	}
	return nil
}

// startMetricsServer runs the cluster's metrics-server and waits until the
// API server serves metrics.k8s.io through it (APIService Available).
func (c *Cluster) startMetricsServer(ctx context.Context) error {
	root := c.bed.moduleRoot
	if err := CheckMetricsServer(root); err != nil {
		return err
	}
	dir := MetricsServerDir(root)
	if err := c.applyManifest(ctx, filepath.Join(dir, "rbac.yaml")); err != nil {
		return fmt.Errorf("%s: metrics-server RBAC: %w", c.Name, err)
	}
	kubeconfig, err := c.serviceAccountKubeconfig(ctx, metav1.NamespaceSystem, metricsServerName)
	if err != nil {
		return fmt.Errorf("%s: metrics-server identity: %w", c.Name, err)
	}
	ip, err := c.bed.real.allocHostIP()
	if err != nil {
		return err
	}
	if err := c.bed.real.host.AddAddress(ip); err != nil {
		return err
	}
	// The API server checks the serving certificate against the Service's
	// DNS name, whichever endpoint it dials.
	serving, err := c.CA.IssueServer(metricsServerName, []string{metricsServerName + "." + metav1.NamespaceSystem + ".svc", ip})
	if err != nil {
		return err
	}
	certDir := filepath.Join(c.dir, "pki", metricsServerName)
	if err := certauthority.WriteTLSDir(certDir, serving, c.CA.CertPEM); err != nil {
		return err
	}
	c.MetricsServerAddr = ip + ":" + strconv.Itoa(metricsServerPort)
	c.MetricsServer = &Process{Name: "metrics-server-" + c.Name, Path: filepath.Join(dir, "metrics-server"),
		LogPath: filepath.Join(c.bed.LogDir, "metrics-server-"+c.Name+".log"),
		Args: []string{
			"--kubeconfig=" + kubeconfig, "--authentication-kubeconfig=" + kubeconfig, "--authorization-kubeconfig=" + kubeconfig,
			"--bind-address=" + ip, "--secure-port=" + strconv.Itoa(metricsServerPort),
			"--tls-cert-file=" + filepath.Join(certDir, certauthority.TLSCertFile),
			"--tls-private-key-file=" + filepath.Join(certDir, certauthority.TLSKeyFile),
			"--kubelet-use-node-status-port", "--kubelet-preferred-address-types=InternalIP",
			"--kubelet-certificate-authority=" + c.caFile,
			"--metric-resolution=" + c.bed.opts.MetricResolution.String(),
			"--v=" + strconv.Itoa(max(c.bed.opts.Verbosity, 1)),
		}}
	if err := c.MetricsServer.Start(); err != nil {
		return err
	}
	err = c.bed.poll(ctx, c.MetricsServer, 60*time.Second, "metrics-server "+c.Name+" live", func() (bool, error) {
		return httpsOK("https://" + c.MetricsServerAddr + "/livez"), nil
	})
	if err != nil {
		return err
	}
	if err := c.registerMetricsAPI(ctx, ip); err != nil {
		return fmt.Errorf("%s: registering metrics-server: %w", c.Name, err)
	}
	return c.bed.poll(ctx, c.MetricsServer, 60*time.Second, "APIService "+metricsAPIService+" of "+c.Name+" Available", func() (bool, error) {
		var as apiregistrationv1.APIService
		if err := c.Client.Get(ctx, client.ObjectKey{Name: metricsAPIService}, &as); err != nil {
			return false, err
		}
		for _, cond := range as.Status.Conditions {
			if cond.Type == apiregistrationv1.Available {
				return cond.Status == apiregistrationv1.ConditionTrue, nil
			}
		}
		return false, nil
	})
}

// registerMetricsAPI makes the selector-less Service, its EndpointSlice at
// the host process's address and the APIService (upstream's, with the CA
// instead of insecureSkipTLSVerify).
func (c *Cluster) registerMetricsAPI(ctx context.Context, ip string) error {
	ns := metav1.NamespaceSystem
	labels := map[string]string{"k8s-app": metricsServerName}
	objs := []client.Object{
		&corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: metricsServerName, Labels: labels},
			Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "https", Port: 443, Protocol: corev1.ProtocolTCP,
				TargetPort: intstr.FromInt32(metricsServerPort)}}},
		},
		&discoveryv1.EndpointSlice{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: metricsServerName + "-host", Labels: map[string]string{
				discoveryv1.LabelServiceName: metricsServerName,
				// Not the EndpointSlice controllers': they leave it alone.
				discoveryv1.LabelManagedBy: "testbed.resource-broker.fluidos.eu"}},
			AddressType: discoveryv1.AddressTypeIPv4,
			Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{ip}, Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)}}},
			Ports: []discoveryv1.EndpointPort{{Name: ptr.To("https"), Port: ptr.To[int32](metricsServerPort),
				Protocol: ptr.To(corev1.ProtocolTCP)}},
		},
		&apiregistrationv1.APIService{
			ObjectMeta: metav1.ObjectMeta{Name: metricsAPIService, Labels: labels},
			Spec: apiregistrationv1.APIServiceSpec{
				Service: &apiregistrationv1.ServiceReference{Namespace: ns, Name: metricsServerName, Port: ptr.To[int32](443)},
				Group:   "metrics.k8s.io", Version: "v1beta1", CABundle: c.CA.CertPEM,
				GroupPriorityMinimum: 100, VersionPriority: 100,
			},
		},
	}
	for _, obj := range objs {
		if err := c.Client.Create(ctx, obj); err != nil {
			return err
		}
	}
	return nil
}

// applyManifest creates every object of a multi-document YAML file.
func (c *Cluster) applyManifest(ctx context.Context, path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	dec := utilyaml.NewYAMLOrJSONDecoder(f, 4096)
	for {
		var obj unstructured.Unstructured
		if err := dec.Decode(&obj.Object); err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
			return fmt.Errorf("%s: %w", path, err)
		}
		if len(obj.Object) == 0 {
			continue // an empty document
		}
		if err := c.Client.Create(ctx, &obj); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("%s %s: %w", obj.GetKind(), obj.GetName(), err)
		}
	}
}

// serviceAccountKubeconfig writes a kubeconfig with a token of the
// ServiceAccount ns/name (what its pod would mount).
func (c *Cluster) serviceAccountKubeconfig(ctx context.Context, ns, name string) (string, error) {
	tr, err := c.Clientset.CoreV1().ServiceAccounts(ns).CreateToken(ctx, name, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To(int64(serviceAccountTokenTTL.Seconds()))}}, metav1.CreateOptions{})
	if err != nil {
		return "", err
	}
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters[c.Name] = &clientcmdapi.Cluster{Server: c.Config.Host, CertificateAuthorityData: c.Config.CAData}
	cfg.AuthInfos[name] = &clientcmdapi.AuthInfo{Token: tr.Status.Token}
	cfg.Contexts[name] = &clientcmdapi.Context{Cluster: c.Name, AuthInfo: name, Namespace: ns}
	cfg.CurrentContext = name
	file := filepath.Join(c.dir, "sa-"+ns+"-"+name+".kubeconfig")
	return file, clientcmd.WriteToFile(*cfg, file)
}
