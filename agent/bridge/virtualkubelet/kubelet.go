package virtualkubelet

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/scheme"
)

// Streaming timeouts of the kubelet endpoint, the kubelet's defaults: a
// session (exec, attach, port-forward) idle for streamIdleTimeout is closed
// (--streaming-connection-idle-timeout), and its streams must be opened within
// streamCreationTimeout of the upgrade.
const (
	streamIdleTimeout     = 4 * time.Hour
	streamCreationTimeout = 30 * time.Second
)

// kubeletServer is the virtual nodes' kubelet endpoint: one listener, the
// status.daemonEndpoints of every virtual node of the agent. The API server
// calls it for `kubectl logs`, `exec`, `attach` and `port-forward` on a pod
// bound to a virtual node, and the request reaches the pod's copy at the
// provider through the provider's API (pods/log, pods/exec, pods/attach,
// pods/portforward) with the granted tenant token (kubelet_stream.go).
//
// Routes, as a kubelet's:
//
//	GET      /containerLogs/{namespace}/{pod}/{container}
//	GET|POST /exec/{namespace}/{pod}/{container}?command=...&input=1&output=1&error=1&tty=1
//	GET|POST /attach/{namespace}/{pod}/{container}?input=1&output=1&error=1&tty=1
//	GET|POST /portForward/{namespace}/{pod}
//	GET      /pods, /healthz
//
// Every request is authenticated and authorized as a kubelet does it
// (kubelet_auth.go): 401 without valid credentials, 403 when the caller may
// not use the node's API; then 404 for a pod that is not on one of our
// virtual nodes (or has no copy at the provider), 503 before the provider's
// grant is known.
type kubeletServer struct {
	b       *Bridge
	log     logr.Logger
	ln      net.Listener
	port    int32
	roots   atomic.Pointer[x509.CertPool]
	cert    *servingCert
	timeout time.Duration // of a TokenReview or SubjectAccessReview
}

func newKubeletServer(b *Bridge, addr string) (*kubeletServer, error) {
	cert, err := newServingCert(b.local, b.recorder, b.log.WithName("kubelet"), b.cfg.ClusterID, b.cfg.NodeIP, b.cfg.KubeletServingCertTimeout)
	if err != nil {
		return nil, fmt.Errorf("kubelet endpoint: %w", err)
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("kubelet endpoint: %w", err)
	}
	return &kubeletServer{b: b, log: b.log.WithName("kubelet"), ln: ln, port: int32(ln.Addr().(*net.TCPAddr).Port), cert: cert,
		timeout: 10 * time.Second}, nil
}

// serve runs until ctx ends.
func (k *kubeletServer) serve(ctx context.Context) error {
	if err := k.loadClientCA(ctx); err != nil {
		k.log.Info("kubelet endpoint: no client CA, only bearer tokens are accepted", "error", err.Error())
	}
	// The endpoint serves at once, with a self-signed certificate until the
	// signer issues one: an API server that does not verify kubelets can use
	// it meanwhile, one that does could not use either.
	if k.b.cfg.KubeletServingCert == ServingCertCSR {
		go k.cert.run(ctx)
	}
	srv := &http.Server{
		Handler:           k.handler(),
		ReadHeaderTimeout: 10 * time.Second,
		TLSConfig: &tls.Config{
			GetCertificate: k.cert.getCertificate,
			// Verified in authenticate: a request without a certificate
			// may still bring a bearer token.
			ClientAuth: tls.RequestClientCert,
			MinVersion: tls.VersionTLS12,
		},
		// HTTP/1.1 only: exec, attach and port-forward upgrade the
		// connection (SPDY, websockets), which HTTP/2 cannot.
		TLSNextProto: map[string]func(*http.Server, *tls.Conn, http.Handler){},
	}
	done := make(chan error, 1)
	go func() { done <- srv.ServeTLS(k.ln, "", "") }()
	k.log.Info("kubelet endpoint serving", "address", k.ln.Addr().String(), "servingCert", k.b.cfg.KubeletServingCert, "kubeletVersion", kubeletVersion())
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = srv.Shutdown(sctx) // upgraded (hijacked) connections end with their sessions
	return nil
}

// loadClientCA takes the configured CA, else the cluster's client CA as the
// API server publishes it.
func (k *kubeletServer) loadClientCA(ctx context.Context) error {
	pemData := k.b.cfg.KubeletClientCA
	if len(pemData) == 0 {
		cm, err := k.b.local.CoreV1().ConfigMaps(metav1.NamespaceSystem).Get(ctx, "extension-apiserver-authentication", metav1.GetOptions{})
		if err != nil {
			return err
		}
		pemData = []byte(cm.Data["client-ca-file"])
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pemData) {
		return errors.New("no certificate in the client CA")
	}
	k.roots.Store(pool)
	return nil
}

// handler is the endpoint: authentication in front of every route,
// authorization in front of each (podRoute, nodeRoute).
func (k *kubeletServer) handler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /containerLogs/{namespace}/{pod}/{container}", k.podRoute(k.containerLogs))
	// GET for websocket callers, POST for SPDY ones.
	for _, method := range []string{http.MethodGet, http.MethodPost} {
		mux.Handle(method+" /exec/{namespace}/{pod}/{container}", k.podRoute(k.exec))
		mux.Handle(method+" /attach/{namespace}/{pod}/{container}", k.podRoute(k.attach))
		mux.Handle(method+" /portForward/{namespace}/{pod}", k.podRoute(k.portForward))
	}
	mux.Handle("GET /pods", k.nodeRoute(http.HandlerFunc(k.pods)))
	mux.Handle("GET /healthz", k.nodeRoute(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok") })))
	mux.Handle("/", k.nodeRoute(http.NotFoundHandler())) // authorized first, as a kubelet does
	return k.authenticated(mux)
}

// podTarget is the pod a request is about, on one of our virtual nodes, and
// the provider's API where its copy is.
type podTarget struct {
	namespace, name string
	node            *providerNode
	remote          *remoteCluster
}

// remoteName is the copy's name in the tenant namespace.
func (t podTarget) remoteName() string { return RemoteName(t.namespace, t.name) }

func (t podTarget) String() string { return t.namespace + "/" + t.name }

// podRoute serves a route about one pod ({namespace}/{pod}): authorized on
// the pod's node, which must be one of ours; the provider's grant must be
// known, and the copy exist there.
func (k *kubeletServer) podRoute(h func(http.ResponseWriter, *http.Request, podTarget)) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		t := podTarget{namespace: r.PathValue("namespace"), name: r.PathValue("pod")}
		t.node = k.nodeOf(t.namespace, t.name)
		node := "" // not one of ours: authorized on every node, so that only who may use any node learns that
		if t.node != nil {
			node = t.node.name
		}
		if !k.authorized(w, r, node) {
			return
		}
		if t.node == nil {
			http.Error(w, fmt.Sprintf("pod %s is not on a virtual node of this agent", t), http.StatusNotFound)
			return
		}
		if t.remote = t.node.currentRemote(); t.remote == nil {
			http.Error(w, fmt.Sprintf("no access to provider %s yet", t.node.provider), http.StatusServiceUnavailable)
			return
		}
		if t.remote.synced() {
			if _, ok := t.remote.pod(t.namespace, t.name); !ok {
				http.Error(w, fmt.Sprintf("pod %s has no copy at provider %s", t, t.node.provider), http.StatusNotFound)
				return
			}
		}
		h(w, r, t)
	})
}

// nodeRoute serves a route about the node itself. One endpoint serves all our
// virtual nodes and the API server dials it by IP, without naming the node:
// the caller must be allowed on every node.
func (k *kubeletServer) nodeRoute(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if k.authorized(w, r, "") {
			h.ServeHTTP(w, r)
		}
	})
}

// nodeOf is the virtual node of ours that local pod namespace/name is bound to.
func (k *kubeletServer) nodeOf(namespace, name string) *providerNode {
	for _, n := range k.b.runningNodes() {
		if p, err := n.localPods.Pods(namespace).Get(name); err == nil && p.Spec.NodeName == n.name {
			return n
		}
	}
	return nil
}

// pods answers GET /pods: the pods bound to our virtual nodes, as a kubelet
// lists the pods bound to it.
func (k *kubeletServer) pods(w http.ResponseWriter, _ *http.Request) {
	list := &corev1.PodList{}
	for _, n := range k.b.runningNodes() {
		pods, err := n.localPods.List(everything)
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		for _, p := range pods {
			list.Items = append(list.Items, *p)
		}
	}
	data, err := runtime.Encode(scheme.Codecs.LegacyCodec(corev1.SchemeGroupVersion), list)
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(data)
}
