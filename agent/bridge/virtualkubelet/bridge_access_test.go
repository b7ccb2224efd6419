package virtualkubelet_test

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/httpstream"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/portforward"
	"k8s.io/client-go/tools/remotecommand"
	"k8s.io/client-go/transport/spdy"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/fluidos-project/resource-broker/agent/bridge/internal/bridgetest"
	"github.com/fluidos-project/resource-broker/agent/bridge/virtualkubelet"
	"github.com/fluidos-project/resource-broker/agent/provider"
)

// Steps of TestVirtualKubelet (bridge_test.go) about reaching the copies:
// the kubelet endpoint (its certificate, logs, exec, attach, port-forward)
// and the tenant token the bridge writes with.

func (vk *vkLifecycle) kubeletServingCertificate(t *testing.T) {
	rome, signingCA := vk.rome, vk.signingCA
	n, err := rome.node("rb-paris")
	require.NoError(t, err)
	addr := fmt.Sprintf("127.0.0.1:%d", n.Status.DaemonEndpoints.KubeletEndpoint.Port)
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		// As the API server dials it: the node's address, no SNI, verified with the signer's CA.
		conn, err := tls.Dial("tcp", addr, &tls.Config{RootCAs: signingCA.Pool, MinVersion: tls.VersionTLS12})
		require.NoError(c, err)
		defer conn.Close()
		assert.Equal(c, "system:node:rb-rome-vk", conn.ConnectionState().PeerCertificates[0].Subject.CommonName)
	}, 15*time.Second, 50*time.Millisecond)
}

func (vk *vkLifecycle) logs(t *testing.T) {
	ctx, rome := vk.ctx, vk.rome
	data, err := rome.Clientset.CoreV1().Pods("shop").GetLogs("web-0", &corev1.PodLogOptions{Container: "main"}).DoRaw(ctx)
	require.NoError(t, err, "%s", data)
	assert.Equal(t, "log of rb-rome/shop.web-0 container main on paris-node-1\n", string(data))

	// The kubelet endpoint authenticates and authorizes as a kubelet does:
	// nodes/proxy of the pod's node.
	_, err = virtualkubeletLogs(ctx, t, &rest.Config{}, rome, "shop", "web-0")
	assert.ErrorContains(t, err, "401", "no credentials")
	mallory := rest.CopyConfig(rome.Config)
	mallory.CertData, mallory.KeyData, err = rome.Authn.Issue("mallory")
	require.NoError(t, err)
	_, err = virtualkubeletLogs(ctx, t, mallory, rome, "shop", "web-0")
	assert.ErrorContains(t, err, "403", "a user without nodes/proxy is refused")

	require.NoError(t, rome.Client.Create(ctx, &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "rb-paris-proxy"},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"nodes/proxy"}, ResourceNames: []string{"rb-paris"}, Verbs: []string{"get"}}}}))
	require.NoError(t, rome.Client.Create(ctx, &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "alice-rb-paris-proxy"},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "rb-paris-proxy"},
		Subjects: []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: "alice"}}}))
	alice := rest.CopyConfig(rome.Config)
	alice.CertData, alice.KeyData, err = rome.Authn.Issue("alice")
	require.NoError(t, err)
	require.EventuallyWithT(t, func(c *assert.CollectT) { // RBAC caches
		data, err := virtualkubeletLogs(ctx, t, alice, rome, "shop", "web-0")
		require.NoError(c, err)
		assert.Equal(c, "log of rb-rome/shop.web-0 container main on paris-node-1\n", string(data))
	}, 5*time.Second, 50*time.Millisecond, "nodes/proxy of rb-paris is enough")

	_, err = virtualkubeletLogs(ctx, t, rome.Config, rome, "shop", "not-here")
	assert.ErrorContains(t, err, "404", "a pod that is not on a virtual node of this agent")
	_, err = virtualkubeletLogs(ctx, t, rome.Config, rome, "shop", "web-0", "sidecar")
	assert.ErrorContains(t, err, "400", "paris's answer: no such container")
	t.Logf("logs of a container the pod does not have: %v", err)
}

func (vk *vkLifecycle) streams(t *testing.T) {
	ctx, rome, paris := vk.ctx, vk.rome, vk.paris
	// paris's API server takes the requests to its kubelet, which (a
	// fake) serves no streams: its 404 comes back to rome's caller.
	_, err := remoteCommand(ctx, rome.Config, "exec", "shop", "web-0", "cat", "/etc/hostname")
	require.Error(t, err)
	assert.Contains(t, err.Error(), "exec in the copy shop.web-0 at paris")
	assert.Contains(t, err.Error(), "404", "paris's kubelet has no /exec")
	t.Logf("exec, through paris to its kubelet: %v", err)
	_, err = remoteCommand(ctx, rome.Config, "attach", "shop", "web-0")
	require.Error(t, err)
	assert.Contains(t, err.Error(), "404", "paris's kubelet has no /attach")
	t.Logf("attach, through paris to its kubelet: %v", err)
	msg := portForwardError(ctx, t, rome.Config, "shop", "web-0", 8080)
	assert.Contains(t, msg, "port-forward to the copy shop.web-0 at paris")
	assert.Contains(t, msg, "404", "paris's kubelet has no /portForward")
	t.Logf("port-forward, through paris to its kubelet: %s", msg)
	// With the tenant token: paris's audit log has the tenant asking for
	// the copy's streams.
	streams := map[string]bool{}
	for _, e := range paris.AuditEvents() {
		if r := e.ObjectRef; r.Namespace == "rb-rome" && r.Name == "shop.web-0" && e.User.Username == "system:serviceaccount:rb-rome:rb-tenant" {
			streams[r.Subresource] = true
		}
	}
	assert.True(t, streams["exec"] && streams["attach"] && streams["portforward"], "subresources the tenant asked paris for: %v", streams)

	// A provider that refuses: its answer is what rome's caller sees.
	var binding rbacv1.RoleBinding
	require.NoError(t, paris.Client.Get(ctx, types.NamespacedName{Namespace: "rb-rome", Name: provider.TenantRoleBinding}, &binding))
	require.NoError(t, paris.Client.Delete(ctx, &binding))
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		_, err := remoteCommand(ctx, rome.Config, "exec", "shop", "web-0", "cat", "/etc/hostname")
		require.Error(c, err)
		assert.Contains(c, err.Error(), `User "system:serviceaccount:rb-rome:rb-tenant" cannot create resource "pods/exec"`)
	}, 5*time.Second, 50*time.Millisecond)
	binding.ResourceVersion, binding.UID = "", ""
	require.NoError(t, paris.Client.Create(ctx, &binding))
	rome.waitReady(t, "rb-paris", corev1.ConditionTrue, virtualkubelet.ReasonReachable, 10*time.Second)
}

func (vk *vkLifecycle) tenantToken(t *testing.T) {
	ctx, rome, paris := vk.ctx, vk.rome, vk.paris
	at, err := rome.brokerClient().Reservation(ctx, vk.rsv.Status.ReservationID)
	require.NoError(t, err)
	require.NotNil(t, at.Grant)
	tenant, err := client.New(&rest.Config{Host: at.Grant.Endpoint, BearerToken: at.Grant.Token,
		TLSClientConfig: rest.TLSClientConfig{CAData: at.Grant.CABundle}}, client.Options{Scheme: bridgetest.Scheme})
	require.NoError(t, err)
	require.NoError(t, tenant.List(ctx, &corev1.PodList{}, client.InNamespace("rb-rome")))
	err = tenant.List(ctx, &corev1.PodList{}, client.InNamespace("default"))
	assert.True(t, apierrors.IsForbidden(err), "%v", err)
	err = tenant.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "x", Namespace: "default"}})
	assert.True(t, apierrors.IsForbidden(err), "%v", err)
	err = tenant.Get(ctx, types.NamespacedName{Namespace: "kube-system", Name: "extension-apiserver-authentication"}, &corev1.ConfigMap{})
	assert.True(t, apierrors.IsForbidden(err), "%v", err)

	// paris's audit log: who created the copies.
	creators := map[string][]string{}
	for _, e := range paris.AuditEvents() {
		r := e.ObjectRef
		if r.Resource == "pods" && strings.HasPrefix(r.Name, strings.TrimSuffix(provider.PlaceholderName("x"), "x")) {
			continue // paris's agent's placeholders (provider-side hold), not copies
		}
		// The copies of ConfigMaps and Secrets are made by server-side apply: a patch answered 201 Created.
		created := e.Verb == "create" || (e.Verb == "patch" && e.ResponseStatus.Code == http.StatusCreated)
		if created && r.Namespace == "rb-rome" && r.Subresource == "" && slices.Contains([]string{"pods", "configmaps", "secrets"}, r.Resource) {
			creators[e.User.Username] = append(creators[e.User.Username], r.Resource+"/"+r.Name)
		}
	}
	require.NotEmpty(t, creators)
	assert.Equal(t, []string{"system:serviceaccount:rb-rome:rb-tenant"}, mapsKeys(creators), "creations in rb-rome by user: %v", creators)
	assert.Subset(t, creators["system:serviceaccount:rb-rome:rb-tenant"], []string{"pods/shop.web-0", "configmaps/shop.web-config", "secrets/shop.web-creds"})
}

// virtualkubeletLogs calls the kubelet endpoint of rb-paris directly with cfg's credentials.
func virtualkubeletLogs(ctx context.Context, t *testing.T, cfg *rest.Config, rome *member, ns, pod string, container ...string) ([]byte, error) {
	t.Helper()
	n, err := rome.node("rb-paris")
	require.NoError(t, err)
	cfg = rest.CopyConfig(cfg)
	cfg.CAData, cfg.Insecure = nil, true
	hc, err := rest.HTTPClientFor(cfg)
	require.NoError(t, err)
	c := "main"
	if len(container) > 0 {
		c = container[0]
	}
	url := fmt.Sprintf("https://127.0.0.1:%d/containerLogs/%s/%s/%s", n.Status.DaemonEndpoints.KubeletEndpoint.Port, ns, pod, c)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	require.NoError(t, err)
	resp, err := hc.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return data, fmt.Errorf("%d: %s", resp.StatusCode, data)
	}
	return data, err
}

// remoteCommand runs pods/exec (command) or pods/attach of a pod through
// the API server of cfg as kubectl does (websockets, SPDY as the fallback),
// with stdout and stderr.
func remoteCommand(ctx context.Context, cfg *rest.Config, subresource, ns, pod string, command ...string) (string, error) {
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return "", err
	}
	var opts runtime.Object = &corev1.PodAttachOptions{Container: "main", Stdout: true, Stderr: true}
	if subresource == "exec" {
		opts = &corev1.PodExecOptions{Container: "main", Command: command, Stdout: true, Stderr: true}
	}
	u := cs.CoreV1().RESTClient().Post().Namespace(ns).Resource("pods").Name(pod).SubResource(subresource).VersionedParams(opts, scheme.ParameterCodec).URL()
	spdyExec, err := remotecommand.NewSPDYExecutor(cfg, http.MethodPost, u)
	if err != nil {
		return "", err
	}
	wsExec, err := remotecommand.NewWebSocketExecutor(cfg, http.MethodGet, u.String())
	if err != nil {
		return "", err
	}
	exe, _ := remotecommand.NewFallbackExecutor(wsExec, spdyExec, func(err error) bool {
		return httpstream.IsUpgradeFailure(err) || httpstream.IsHTTPSProxyError(err)
	})
	var out strings.Builder
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	err = exe.StreamWithContext(ctx, remotecommand.StreamOptions{Stdout: &out, Stderr: &out})
	return out.String(), err
}

// portForwardError forwards one connection to port of a pod through the API
// server of cfg, as kubectl port-forward does for each connection it
// accepts, and returns what the error stream says.
func portForwardError(ctx context.Context, t *testing.T, cfg *rest.Config, ns, pod string, port int) string {
	t.Helper()
	cs, err := kubernetes.NewForConfig(cfg)
	require.NoError(t, err)
	u := cs.CoreV1().RESTClient().Post().Namespace(ns).Resource("pods").Name(pod).SubResource("portforward").URL()
	transport, upgrader, err := spdy.RoundTripperFor(cfg)
	require.NoError(t, err)
	conn, _, err := spdy.NewDialer(upgrader, &http.Client{Transport: transport}, http.MethodPost, u).Dial(portforward.PortForwardProtocolV1Name)
	require.NoError(t, err)
	defer conn.Close()
	headers := http.Header{}
	headers.Set(corev1.StreamType, corev1.StreamTypeError)
	headers.Set(corev1.PortHeader, strconv.Itoa(port))
	headers.Set(corev1.PortForwardRequestIDHeader, "0")
	errorStream, err := conn.CreateStream(headers)
	require.NoError(t, err)
	require.NoError(t, errorStream.Close())
	headers.Set(corev1.StreamType, corev1.StreamTypeData)
	data, err := conn.CreateStream(headers)
	require.NoError(t, err)
	defer data.Close()
	msg := make(chan string, 1)
	go func() {
		b, _ := io.ReadAll(errorStream)
		msg <- string(b)
	}()
	select {
	case m := <-msg:
		return m
	case <-time.After(10 * time.Second):
		t.Fatal("no answer on the error stream")
		return ""
	case <-ctx.Done():
		return ""
	}
}

func mapsKeys(m map[string][]string) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}
