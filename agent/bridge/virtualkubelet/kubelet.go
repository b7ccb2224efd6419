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
	"github.com/virtual-kubelet/virtual-kubelet/errdefs"
	vkapi "github.com/virtual-kubelet/virtual-kubelet/node/api"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/httpstream/wsstream"
)

// Streaming timeouts of the kubelet endpoint, the kubelet's defaults: a
// session (exec, attach, port-forward) idle for streamIdleTimeout is closed
// (--streaming-connection-idle-timeout), and its streams must be opened within
// streamCreationTimeout of the upgrade. Set explicitly: virtual-kubelet's
// handlers default to 30 s for both, which would cut an idle `kubectl exec -it`.
const (
	streamIdleTimeout     = 4 * time.Hour
	streamCreationTimeout = 30 * time.Second
)

// kubeletServer is the virtual nodes' kubelet endpoint: one listener, the
// status.daemonEndpoints of every virtual node of the agent. The API server
// calls it for `kubectl logs`, `exec`, `attach` and `port-forward` on a pod
// bound to a virtual node; virtual-kubelet's kubelet API (node/api) serves
// them, and the request reaches the pod's copy at the provider through the
// provider's API (pods/log, pods/exec, pods/attach, pods/portforward) with the
// granted tenant token (kubelet_stream.go).
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
	// of the streaming sessions; streamIdleTimeout and streamCreationTimeout
	// unless a test says otherwise
	idleTimeout, creationTimeout time.Duration
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
		timeout: 10 * time.Second, idleTimeout: streamIdleTimeout, creationTimeout: streamCreationTimeout}, nil
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
		// virtual-kubelet's handlers log with log.G(request context).
		BaseContext: func(net.Listener) context.Context { return withVKLogger(context.Background(), k.log) },
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

// handler is the endpoint: virtual-kubelet's kubelet API handlers
// (node/api: request parsing, the streaming protocols) on top of the
// provider's API (kubelet_stream.go), with authentication in front of every
// route and authorization in front of each (podRoute, nodeRoute).
func (k *kubeletServer) handler() http.Handler {
	vk := kubeletAPI(vkapi.PodHandlerConfig{
		GetContainerLogs:      k.containerLogs,
		RunInContainer:        k.runInContainer,
		AttachToContainer:     k.attachToContainer,
		PortForward:           k.portForward,
		GetPodsFromKubernetes: k.pods,
		StreamIdleTimeout:     k.idleTimeout,
		StreamCreationTimeout: k.creationTimeout,
	})
	mux := http.NewServeMux()
	// Any method: vk's router answers a wrong one (405) once authorized.
	mux.Handle("/containerLogs/{namespace}/{pod}/{container}", k.podRoute(vk))
	mux.Handle("/exec/{namespace}/{pod}/{container}", k.podRoute(vk))
	mux.Handle("/attach/{namespace}/{pod}/{container}", k.podRoute(vk))
	mux.Handle("/portForward/{namespace}/{pod}", k.podRoute(portForwardOverSPDY(vk)))
	mux.Handle("GET /healthz", k.nodeRoute(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok") })))
	mux.Handle("/", k.nodeRoute(vk)) // GET /pods; anything else is vk's 404, authorized first as a kubelet does
	return k.authenticated(mux)
}

// kubeletAPI is virtual-kubelet's kubelet API for cfg, with the port-forward
// timeouts put right. vk v1.13.0 swaps them: node/api/server.go:84-85
// (PodHandler) builds /portForward with
// WithPortForwardStreamIdleTimeout(p.StreamCreationTimeout) and
// WithPortForwardCreationTimeout(p.StreamIdleTimeout), so an idle
// port-forward would be closed after the creation timeout (30 s) and a
// half-opened stream pair wait for the idle one (4 h). /portForward is served
// by a second PodHandler given the two the other way round, which vk's swap
// puts back. TestPortForwardTimeouts fails if vk stops swapping them.
func kubeletAPI(cfg vkapi.PodHandlerConfig) http.Handler {
	pf := vkapi.PodHandlerConfig{PortForward: cfg.PortForward,
		StreamIdleTimeout: cfg.StreamCreationTimeout, StreamCreationTimeout: cfg.StreamIdleTimeout} // swapped back by vk
	cfg.PortForward = nil
	mux := http.NewServeMux()
	mux.Handle("/portForward/", vkapi.PodHandler(pf, false))
	mux.Handle("/", vkapi.PodHandler(cfg, false))
	return mux
}

// portForwardOverSPDY answers a port-forward over websockets (the
// v4.channel.k8s.io protocols, the ports in the query) with 400: vk's
// HandlePortForward (node/api/portforward.go) serves it with no ports (an
// empty V4Options, the query unread): it would forward nothing. kubectl
// speaks SPDY, or tunnels SPDY in websockets to the API server, which speaks
// SPDY to the kubelet (k8s.io/apiserver's TunnelingHandler).
func portForwardOverSPDY(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if wsstream.IsWebSocketRequest(r) {
			http.Error(w, "port-forward over websockets is not supported by this kubelet endpoint: use SPDY", http.StatusBadRequest)
			return
		}
		h.ServeHTTP(w, r)
	})
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

// errNoGrant: the provider's grant is not known yet (503).
type errNoGrant struct{ provider string }

func (e errNoGrant) Error() string { return fmt.Sprintf("no access to provider %s yet", e.provider) }

// target finds local pod namespace/name: on one of our virtual nodes (else
// a vk NotFound error), with the provider's grant (else errNoGrant) and a
// copy there (NotFound). t.node is set whenever the pod is on our node.
func (k *kubeletServer) target(namespace, name string) (t podTarget, err error) {
	t = podTarget{namespace: namespace, name: name, node: k.nodeOf(namespace, name)}
	if t.node == nil {
		return t, errdefs.NotFoundf("pod %s is not on a virtual node of this agent", t)
	}
	if t.remote = t.node.currentRemote(); t.remote == nil {
		return t, errNoGrant{t.node.provider}
	}
	if t.remote.synced() {
		if _, ok := t.remote.pod(namespace, name); !ok {
			return t, errdefs.NotFoundf("pod %s has no copy at provider %s", t, t.node.provider)
		}
	}
	return t, nil
}

// queryKey: the request's query, in the context vk's handlers pass on (podRoute).
type queryKey struct{}

// podRoute serves a route about one pod ({namespace}/{pod}): authorized on
// the pod's node, which must be one of ours; the provider's grant must be
// known, and the copy exist there. The handlers find the pod again
// (target): vk gives them the names only.
func (k *kubeletServer) podRoute(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		t, err := k.target(r.PathValue("namespace"), r.PathValue("pod"))
		node := "" // not one of ours: authorized on every node, so that only who may use any node learns that
		if t.node != nil {
			node = t.node.name
		}
		if !k.authorized(w, r, node) {
			return
		}
		var noGrant errNoGrant
		switch {
		case errors.As(err, &noGrant):
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		case err != nil:
			http.Error(w, err.Error(), http.StatusNotFound)
			return
		}
		// The query as sent, for what vk's parsing loses (containerLogs).
		h.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), queryKey{}, r.URL.Query())))
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
func (k *kubeletServer) pods(context.Context) ([]*corev1.Pod, error) {
	var all []*corev1.Pod
	for _, n := range k.b.runningNodes() {
		pods, err := n.localPods.List(everything)
		if err != nil {
			return nil, err
		}
		all = append(all, pods...)
	}
	return all, nil
}
