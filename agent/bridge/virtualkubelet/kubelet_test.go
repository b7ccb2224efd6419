package virtualkubelet

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	corev1listers "k8s.io/client-go/listers/core/v1"
	clienttesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/cache"
)

func TestRequestAttributes(t *testing.T) {
	for _, tc := range []struct {
		method, path string
		verb         string
		subresources []string
	}{
		{"GET", "/containerLogs/shop/web-0/main", "get", []string{"proxy"}},
		{"HEAD", "/containerLogs/shop/web-0/main", "get", []string{"proxy"}},
		{"POST", "/exec/shop/web-0/main", "create", []string{"proxy"}},
		{"GET", "/exec/shop/web-0/main", "get", []string{"proxy"}}, // websockets
		{"POST", "/attach/shop/web-0/main", "create", []string{"proxy"}},
		{"POST", "/portForward/shop/web-0", "create", []string{"proxy"}},
		{"POST", "/run/shop/web-0/main", "create", []string{"proxy"}},
		{"GET", "/pods", "get", []string{"pods", "proxy"}},
		{"GET", "/pods/", "get", []string{"pods", "proxy"}},
		{"GET", "/podsx", "get", []string{"proxy"}}, // a sibling, not a subpath
		{"GET", "/runningpods/", "get", []string{"pods", "proxy"}},
		{"GET", "/healthz", "get", []string{"healthz", "proxy"}},
		{"GET", "/healthz/ping", "get", []string{"healthz", "proxy"}},
		{"GET", "/configz", "get", []string{"configz", "proxy"}},
		{"GET", "/stats/summary", "get", []string{"stats"}},
		{"GET", "/stats", "get", []string{"stats"}},
		{"GET", "/metrics", "get", []string{"metrics"}},
		{"GET", "/metrics/resource", "get", []string{"metrics"}},
		{"GET", "/metrics/cadvisor", "get", []string{"metrics"}},
		{"GET", "/logs/", "get", []string{"log"}},
		{"GET", "/logs/syslog", "get", []string{"log"}},
		{"POST", "/checkpoint/shop/web-0/main", "create", []string{"checkpoint"}},
		{"GET", "/statusz", "get", []string{"statusz"}},
		{"GET", "/flagz", "get", []string{"configz"}},
		{"GET", "/spec/", "get", []string{"proxy"}},
		{"PUT", "/anything", "update", []string{"proxy"}},
		{"PATCH", "/anything", "patch", []string{"proxy"}},
		{"DELETE", "/anything", "delete", []string{"proxy"}},
		{"OPTIONS", "/anything", "", []string{"proxy"}},
	} {
		verb, subresources := requestAttributes(tc.method, tc.path)
		assert.Equal(t, tc.verb, verb, "%s %s", tc.method, tc.path)
		assert.Equal(t, tc.subresources, subresources, "%s %s", tc.method, tc.path)
	}
}

// endpointFixture is the kubelet endpoints of two virtual nodes over fake
// API servers: the local one answers TokenReviews (token "<user>" is user
// <user>, any other is refused) and SubjectAccessReviews (by allow);
// rb-paris has a grant and the copy of shop/web-0 (whose pods/log the fake
// answers "fake logs"); rb-berlin has no grant yet.
type endpointFixture struct {
	paris, berlin *httptest.Server
	mu            sync.Mutex
	asked         []authorizationv1.ResourceAttributes // by user
	users         []string
}

func newEndpointFixture(t *testing.T, allow func(user string, a *authorizationv1.ResourceAttributes) bool) *endpointFixture {
	f := &endpointFixture{}
	local := fake.NewClientset()
	local.PrependReactor("create", "tokenreviews", func(a clienttesting.Action) (bool, runtime.Object, error) {
		tr := a.(clienttesting.CreateAction).GetObject().(*authenticationv1.TokenReview)
		if slices.Contains([]string{"admin", "alice", "bob", "mallory"}, tr.Spec.Token) {
			tr.Status = authenticationv1.TokenReviewStatus{Authenticated: true, User: authenticationv1.UserInfo{Username: tr.Spec.Token, Groups: []string{"system:authenticated"}}}
		}
		return true, tr, nil
	})
	local.PrependReactor("create", "subjectaccessreviews", func(a clienttesting.Action) (bool, runtime.Object, error) {
		sar := a.(clienttesting.CreateAction).GetObject().(*authorizationv1.SubjectAccessReview)
		f.mu.Lock()
		f.asked, f.users = append(f.asked, *sar.Spec.ResourceAttributes), append(f.users, sar.Spec.User)
		f.mu.Unlock()
		sar.Status.Allowed = allow(sar.Spec.User, sar.Spec.ResourceAttributes)
		return true, sar, nil
	})

	pod := func(ns, name, node string) *corev1.Pod {
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Spec: corev1.PodSpec{NodeName: node}}
	}
	provider := fake.NewClientset()
	paris := &providerNode{name: "rb-paris", provider: "paris",
		localPods: podLister(t, pod("shop", "web-0", "rb-paris"), pod("shop", "web-2", "rb-paris"))}
	paris.remote = &remoteCluster{namespace: "rb-rome", client: provider, synced: func() bool { return true },
		pods: podLister(t, pod("rb-rome", RemoteName("shop", "web-0"), "paris-node-1")).Pods("rb-rome")}
	berlin := &providerNode{name: "rb-berlin", provider: "berlin", localPods: podLister(t, pod("shop", "web-1", "rb-berlin"))}
	b := &Bridge{cfg: Config{ClusterID: "rome"}, log: logr.Discard(), local: local,
		nodes: map[string]*providerNode{"paris": paris, "berlin": berlin}}
	paris.b, berlin.b = b, b
	k := &kubeletServer{b: b, log: b.log, timeout: 5 * time.Second, idleTimeout: streamIdleTimeout, creationTimeout: streamCreationTimeout}
	f.paris, f.berlin = httptest.NewServer(k.handler(paris)), httptest.NewServer(k.handler(berlin))
	t.Cleanup(f.paris.Close)
	t.Cleanup(f.berlin.Close)
	return f
}

// podLister lists pods from an indexer.
func podLister(t testing.TB, objs ...*corev1.Pod) corev1listers.PodLister {
	idx := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{})
	for _, p := range objs {
		require.NoError(t, idx.Add(p))
	}
	return corev1listers.NewPodLister(idx)
}

// do sends a request to the endpoint of node srv.
func (f *endpointFixture) do(t *testing.T, srv *httptest.Server, method, path, token string, header ...string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, srv.URL+path, nil)
	require.NoError(t, err)
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := srv.Client().Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

// lastAsked is the last SubjectAccessReview's attributes.
func (f *endpointFixture) lastAsked() (string, authorizationv1.ResourceAttributes) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.asked) == 0 {
		return "", authorizationv1.ResourceAttributes{}
	}
	return f.users[len(f.users)-1], f.asked[len(f.asked)-1]
}

// TestKubeletEndpointAccess: who gets what, in which order: authentication
// (401), authorization on the node whose endpoint is called (403), routing
// (404), the grant (503), and the provider's answer.
func TestKubeletEndpointAccess(t *testing.T) {
	f := newEndpointFixture(t, func(user string, a *authorizationv1.ResourceAttributes) bool {
		switch user {
		case "admin": // nodes/proxy on every node, as the API server's kubelet client has
			return a.Subresource == "proxy"
		case "alice": // nodes/proxy on rb-paris only
			return a.Subresource == "proxy" && a.Name == "rb-paris"
		case "bob": // nodes/pods only (fine-grained)
			return a.Subresource == "pods"
		}
		return false
	})
	paris, berlin := f.paris, f.berlin
	logs := "/containerLogs/shop/web-0/main"

	t.Run("authentication", func(t *testing.T) {
		code, _ := f.do(t, paris, "GET", logs, "")
		assert.Equal(t, http.StatusUnauthorized, code, "no credentials")
		code, _ = f.do(t, paris, "GET", logs, "forged")
		assert.Equal(t, http.StatusUnauthorized, code, "a token the API server does not know")
		code, _ = f.do(t, paris, "GET", "/healthz", "")
		assert.Equal(t, http.StatusUnauthorized, code, "every route")
	})

	t.Run("authorization on the endpoint's node", func(t *testing.T) {
		code, body := f.do(t, paris, "GET", logs, "mallory")
		assert.Equal(t, http.StatusForbidden, code, body)
		user, asked := f.lastAsked()
		assert.Equal(t, "mallory", user)
		assert.Equal(t, authorizationv1.ResourceAttributes{Verb: "get", Version: "v1", Resource: "nodes", Subresource: "proxy", Name: "rb-paris"}, asked)

		code, body = f.do(t, paris, "POST", "/exec/shop/web-0/main?command=ls&output=1", "mallory")
		assert.Equal(t, http.StatusForbidden, code, body)
		_, asked = f.lastAsked()
		assert.Equal(t, "create", asked.Verb, "exec over SPDY is a POST")

		code, body = f.do(t, paris, "GET", logs, "alice")
		assert.Equal(t, http.StatusOK, code, body)
		assert.Equal(t, "fake logs", body, "the copy's pods/log at the provider")
		code, body = f.do(t, paris, "GET", logs, "bob")
		assert.Equal(t, http.StatusForbidden, code, "nodes/pods is not nodes/proxy: %s", body)
	})

	t.Run("a pod that is not on the endpoint's node: 404 once authorized on that node", func(t *testing.T) {
		code, body := f.do(t, paris, "GET", "/containerLogs/shop/elsewhere/main", "alice")
		assert.Equal(t, http.StatusNotFound, code, body)
		_, asked := f.lastAsked()
		assert.Equal(t, "rb-paris", asked.Name)
		code, body = f.do(t, paris, "GET", "/containerLogs/shop/web-1/main", "admin")
		assert.Equal(t, http.StatusNotFound, code, "shop/web-1 is on rb-berlin, not rb-paris: %s", body)
		assert.Contains(t, body, "not on virtual node rb-paris")
		code, _ = f.do(t, berlin, "GET", "/containerLogs/shop/web-1/main", "alice")
		assert.Equal(t, http.StatusForbidden, code, "alice may only use rb-paris: she does not learn whether the pod exists")
		_, asked = f.lastAsked()
		assert.Equal(t, "rb-berlin", asked.Name)
		code, body = f.do(t, paris, "POST", "/exec/shop/web-2/main?command=ls&output=1", "alice")
		assert.Equal(t, http.StatusNotFound, code, body)
		assert.Contains(t, body, "no copy at provider paris")
	})

	t.Run("no grant yet: 503", func(t *testing.T) {
		code, body := f.do(t, berlin, "POST", "/portForward/shop/web-1", "admin")
		assert.Equal(t, http.StatusServiceUnavailable, code, body)
		assert.Contains(t, body, "no access to provider berlin yet")
	})

	t.Run("bad requests after authorization", func(t *testing.T) {
		code, body := f.do(t, paris, "POST", "/exec/shop/web-0/main?command=ls", "alice")
		assert.Equal(t, http.StatusBadRequest, code, "no stream asked for: %s", body)
		code, body = f.do(t, paris, "GET", logs+"?tailLines=-1", "alice")
		assert.Equal(t, http.StatusBadRequest, code, body)
		code, _ = f.do(t, paris, "GET", "/stats/summary", "admin")
		assert.Equal(t, http.StatusForbidden, code, "nodes/stats")
		code, _ = f.do(t, paris, "GET", "/metrics/resource", "admin")
		assert.Equal(t, http.StatusForbidden, code, "nodes/metrics")
		code, _ = f.do(t, paris, "GET", "/nothing/here", "admin")
		assert.Equal(t, http.StatusNotFound, code)
		code, _ = f.do(t, paris, "GET", "/nothing/here", "mallory")
		assert.Equal(t, http.StatusForbidden, code, "authorized before routing, as a kubelet does")
		code, body = f.do(t, paris, "GET", "/portForward/shop/web-0?ports=80", "alice", "Connection", "Upgrade", "Upgrade", "websocket")
		assert.Equal(t, http.StatusBadRequest, code, "port-forward over websockets: %s", body)
		code, _ = f.do(t, paris, "POST", logs, "alice")
		assert.Equal(t, http.StatusMethodNotAllowed, code, "after authorization (create on nodes/proxy)")
	})

	t.Run("node routes: the endpoint's node only", func(t *testing.T) {
		code, body := f.do(t, paris, "GET", "/healthz", "alice")
		assert.Equal(t, http.StatusOK, code, body)
		code, _ = f.do(t, berlin, "GET", "/healthz", "alice")
		assert.Equal(t, http.StatusForbidden, code, "alice may use rb-paris only")

		for srv, want := range map[*httptest.Server][]string{paris: {"shop/web-0", "shop/web-2"}, berlin: {"shop/web-1"}} {
			code, body = f.do(t, srv, "GET", "/pods", "bob")
			require.Equal(t, http.StatusOK, code, body)
			var list corev1.PodList
			require.NoError(t, json.Unmarshal([]byte(body), &list))
			var names []string
			for _, p := range list.Items {
				names = append(names, p.Namespace+"/"+p.Name)
			}
			slices.Sort(names)
			assert.Equal(t, want, names)
			assert.True(t, strings.Contains(body, `"kind":"PodList"`), body)
		}
	})
}

// TestKubeletPorts: each virtual node's endpoint takes the lowest free port
// of the range, skipping one that something else listens on; none is left
// when all are taken; a stopped node frees its port.
func TestKubeletPorts(t *testing.T) {
	// Three consecutive ports, the middle one held by another listener.
	var first int
	var other net.Listener
	for range 20 {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		first = ln.Addr().(*net.TCPAddr).Port
		require.NoError(t, ln.Close())
		if first+2 > 65535 {
			continue
		}
		if other, err = net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", first+1)); err == nil {
			break
		}
	}
	require.NotNil(t, other, "no three free consecutive ports")
	defer other.Close()

	cert := &servingCert{address: "127.0.0.1"}
	require.NoError(t, cert.useSelfSigned())
	b := &Bridge{cfg: Config{ClusterID: "rome"}, log: logr.Discard()}
	k := &kubeletServer{b: b, log: b.log, cert: cert, host: "127.0.0.1", first: first, count: 3, taken: map[int]bool{}, started: make(chan struct{})}
	close(k.started)
	node := func(name string) *providerNode { return &providerNode{b: b, name: name, localPods: podLister(t)} }

	paris, err := k.listen(node("rb-paris"))
	require.NoError(t, err)
	assert.Equal(t, int32(first), paris.port)
	berlin, err := k.listen(node("rb-berlin"))
	require.NoError(t, err)
	assert.Equal(t, int32(first+2), berlin.port, "the next port is in use by something else")
	_, err = k.listen(node("rb-madrid"))
	require.Error(t, err)
	assert.Contains(t, err.Error(), "no free port among 3")
	assert.Contains(t, err.Error(), "raise --kubelet-ports")

	ctx, stop := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { paris.serve(ctx); close(done) }()
	conn, err := tls.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", first), &tls.Config{InsecureSkipVerify: true}) //nolint:gosec // a self-signed test certificate
	require.NoError(t, err, "rb-paris serves TLS on its port")
	require.NoError(t, conn.Close())
	stop()
	<-done
	madrid, err := k.listen(node("rb-madrid"))
	require.NoError(t, err)
	assert.Equal(t, int32(first), madrid.port, "rb-paris stopped: its port is free again")
	require.NoError(t, madrid.ln.Close())
	require.NoError(t, berlin.ln.Close())
}

// TestNodeIPProblem: the node addresses the API server's node proxy refuses
// are named at start.
func TestNodeIPProblem(t *testing.T) {
	for ip, want := range map[string]string{
		"10.244.0.7":  "",
		"198.18.0.5":  "",
		"2001:db8::7": "",
		"127.0.0.1":   "node address 127.0.0.1 is not a global unicast IP: the API server's node proxy refuses it",
		"::1":         "not a global unicast IP",
		"169.254.3.4": "not a global unicast IP",
		"0.0.0.0":     "not a global unicast IP",
		"agent.local": `node address "agent.local" is not an IP`,
		"":            "no node address",
	} {
		got := nodeIPProblem(ip)
		if want == "" {
			assert.Empty(t, got, ip)
		} else {
			assert.Contains(t, got, want, ip)
		}
	}
}
