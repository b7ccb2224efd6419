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
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	dto "github.com/prometheus/client_model/go"
	"github.com/virtual-kubelet/virtual-kubelet/errdefs"
	vkapi "github.com/virtual-kubelet/virtual-kubelet/node/api"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/httpstream/wsstream"
	"k8s.io/klog/v2"
	statsv1alpha1 "k8s.io/kubelet/pkg/apis/stats/v1alpha1"
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

// kubeletServer is the virtual nodes' kubelet endpoint: one listener per
// virtual node (nodeEndpoint), each on its own port, published as that node's
// status.daemonEndpoints.kubeletEndpoint.Port at the node address
// (Config.NodeIP). The API server calls a kubelet's port without naming the
// node: with one listener per node, a request about the node (/pods,
// /stats/summary, /metrics/resource) is about the node whose port it reached,
// and metrics-server, which scrapes every node, counts each borrowed pod once.
// The listeners share what is the agent's: the serving certificate (its IP
// SAN is the node address, the same for every node), the client CA, the
// port range.
//
// The API server calls it for `kubectl logs`, `exec`, `attach` and
// `port-forward` on a pod bound to a virtual node, and metrics-server for
// the node's resource usage; virtual-kubelet's kubelet API (node/api) serves
// them, and the request reaches the pod's copy at the provider through the
// provider's API (pods/log, pods/exec, pods/attach, pods/portforward) with the
// granted tenant token (kubelet_stream.go), or is answered from the usage the
// node polls from the provider's metrics.k8s.io (metrics.go).
//
// Routes, as a kubelet's:
//
//	GET      /containerLogs/{namespace}/{pod}/{container}
//	GET|POST /exec/{namespace}/{pod}/{container}?command=...&input=1&output=1&error=1&tty=1
//	GET|POST /attach/{namespace}/{pod}/{container}?input=1&output=1&error=1&tty=1
//	GET|POST /portForward/{namespace}/{pod}
//	GET      /pods, /healthz, /stats/summary, /metrics/resource
//
// Every request is authenticated and authorized as a kubelet does it
// (kubelet_auth.go), on the node whose port it reached: 401 without valid
// credentials, 403 when the caller may not use that node's API; then 404 for
// a pod that is not bound to that node (or has no copy at the provider), 503
// before the provider's grant is known (and for the metrics routes when the
// provider serves no metrics.k8s.io).
type kubeletServer struct {
	b       *Bridge
	log     logr.Logger
	roots   atomic.Pointer[x509.CertPool]
	cert    *servingCert
	timeout time.Duration // of a TokenReview or SubjectAccessReview
	// of the streaming sessions; streamIdleTimeout and streamCreationTimeout
	// unless a test says otherwise
	idleTimeout, creationTimeout time.Duration

	// The nodes' ports: host:first .. first+count-1 (first 0: any port the
	// kernel gives).
	host         string
	first, count int
	mu           sync.Mutex
	taken        map[int]bool
	// started is closed once the client CA is known (run): the nodes'
	// listeners accept connections from then on.
	started chan struct{}
}

func newKubeletServer(b *Bridge, addr string, ports int) (*kubeletServer, error) {
	host, portStr, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, fmt.Errorf("kubelet endpoint %q: %w", addr, err)
	}
	first, err := strconv.Atoi(portStr)
	if err != nil || first < 0 || first > 65535 {
		return nil, fmt.Errorf("kubelet endpoint %q: the port must be a number from 0 to 65535", addr)
	}
	if ports < 1 || first+ports-1 > 65535 {
		return nil, fmt.Errorf("kubelet ports %d from %d: want at least 1, up to port 65535", ports, first)
	}
	cert, err := newServingCert(b.local, b.recorder, b.log.WithName("kubelet"), b.cfg.ClusterID, b.cfg.NodeIP, b.cfg.KubeletServingCertTimeout)
	if err != nil {
		return nil, fmt.Errorf("kubelet endpoint: %w", err)
	}
	return &kubeletServer{b: b, log: b.log.WithName("kubelet"), cert: cert,
		timeout: 10 * time.Second, idleTimeout: streamIdleTimeout, creationTimeout: streamCreationTimeout,
		host: host, first: first, count: ports, taken: map[int]bool{}, started: make(chan struct{})}, nil
}

// run loads the client CA, opens the nodes' listeners (started) and keeps
// the serving certificate until ctx ends.
func (k *kubeletServer) run(ctx context.Context) {
	if err := k.loadClientCA(ctx); err != nil {
		k.log.Info("kubelet endpoint: no client CA, only bearer tokens are accepted", "error", err.Error())
	}
	if problem := nodeIPProblem(k.b.cfg.NodeIP); problem != "" {
		k.log.Info("WARNING: "+problem, "nodeIP", k.b.cfg.NodeIP)
	}
	close(k.started)
	k.log.Info("kubelet endpoint serving", "address", net.JoinHostPort(k.host, strconv.Itoa(k.first)), "ports", k.count,
		"nodeIP", k.b.cfg.NodeIP, "servingCert", k.b.cfg.KubeletServingCert, "kubeletVersion", kubeletVersion())
	// The endpoint serves at once, with a self-signed certificate until the
	// signer issues one: an API server that does not verify kubelets can use
	// it meanwhile, one that does could not use either.
	if k.b.cfg.KubeletServingCert == ServingCertCSR {
		k.cert.run(ctx)
	}
	<-ctx.Done()
}

// nodeIPProblem says what is wrong with the node address for the API
// server's node proxy (kubectl get --raw /api/v1/nodes/<node>/proxy/...),
// which accepts global unicast IPs only ("address not allowed"), or "". A
// warning, not an error: pod logs, exec, attach, port-forward and
// metrics-server dial the address as it is and work (the envtest tests and
// the test bed without real nodes run on 127.0.0.1).
func nodeIPProblem(nodeIP string) string {
	ip := net.ParseIP(nodeIP)
	switch {
	case nodeIP == "":
		return "no node address (--node-ip, $POD_IP): the virtual nodes publish no kubelet endpoint"
	case ip == nil:
		return fmt.Sprintf("node address %q is not an IP: set --node-ip to the agent pod's IP", nodeIP)
	case !ip.IsGlobalUnicast():
		return fmt.Sprintf("node address %s is not a global unicast IP: the API server's node proxy refuses it (\"address not allowed\"); logs, exec and metrics-server work; set --node-ip to the agent pod's IP", nodeIP)
	}
	return ""
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

// nodeEndpoint is the kubelet endpoint of one virtual node: its listener.
type nodeEndpoint struct {
	k    *kubeletServer
	n    *providerNode
	ln   net.Listener
	port int32
}

// listen takes the lowest free port of the range for node n: one that no
// other node of ours has and that nothing else listens on.
func (k *kubeletServer) listen(n *providerNode) (*nodeEndpoint, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.first == 0 {
		ln, err := net.Listen("tcp", net.JoinHostPort(k.host, "0"))
		if err != nil {
			return nil, fmt.Errorf("kubelet endpoint of %s: %w", n.name, err)
		}
		return &nodeEndpoint{k: k, n: n, ln: ln, port: int32(ln.Addr().(*net.TCPAddr).Port)}, nil
	}
	var last error
	for p := k.first; p < k.first+k.count; p++ {
		if k.taken[p] {
			continue
		}
		ln, err := net.Listen("tcp", net.JoinHostPort(k.host, strconv.Itoa(p)))
		if err != nil {
			last = err // in use by something else
			continue
		}
		k.taken[p] = true
		return &nodeEndpoint{k: k, n: n, ln: ln, port: int32(p)}, nil
	}
	return nil, fmt.Errorf("kubelet endpoint of %s: no free port among %d from %s:%d (raise --kubelet-ports): %v",
		n.name, k.count, k.host, k.first, last)
}

// serve answers the node's requests until ctx ends, then frees its port.
func (e *nodeEndpoint) serve(ctx context.Context) {
	k := e.k
	defer func() {
		k.mu.Lock()
		delete(k.taken, int(e.port))
		k.mu.Unlock()
	}()
	select {
	case <-k.started:
	case <-ctx.Done():
		_ = e.ln.Close()
		return
	}
	log := k.log.WithValues("node", e.n.name)
	srv := &http.Server{
		Handler:           k.handler(e.n),
		ReadHeaderTimeout: 10 * time.Second,
		ErrorLog:          klog.NewStandardLogger("ERROR"), // net/http's errors in klog's format
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
		BaseContext: func(net.Listener) context.Context { return withVKLogger(context.Background(), log) },
	}
	done := make(chan error, 1)
	go func() { done <- srv.ServeTLS(e.ln, "", "") }()
	log.Info("kubelet endpoint of the virtual node serving", "address", e.ln.Addr().String())
	select {
	case err := <-done:
		if !errors.Is(err, http.ErrServerClosed) {
			log.Error(err, "kubelet endpoint of the virtual node stopped")
		}
		return
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = srv.Shutdown(sctx) // upgraded (hijacked) connections end with their sessions
	<-done
}

// handler is node n's endpoint: virtual-kubelet's kubelet API handlers
// (node/api: request parsing, the streaming protocols) on top of the
// provider's API (kubelet_stream.go) and the usage polled from it
// (metrics.go), with authentication in front of every route and
// authorization on n in front of each.
func (k *kubeletServer) handler(n *providerNode) http.Handler {
	vk := kubeletAPI(vkapi.PodHandlerConfig{
		GetContainerLogs: func(ctx context.Context, namespace, pod, container string, opts vkapi.ContainerLogOpts) (io.ReadCloser, error) {
			return k.containerLogs(ctx, n, namespace, pod, container, opts)
		},
		RunInContainer: func(ctx context.Context, namespace, pod, container string, cmd []string, attach vkapi.AttachIO) error {
			return k.runInContainer(ctx, n, namespace, pod, container, cmd, attach)
		},
		AttachToContainer: func(ctx context.Context, namespace, pod, container string, attach vkapi.AttachIO) error {
			return k.attachToContainer(ctx, n, namespace, pod, container, attach)
		},
		PortForward: func(ctx context.Context, namespace, pod string, port int32, stream io.ReadWriteCloser) error {
			return k.portForward(ctx, n, namespace, pod, port, stream)
		},
		GetPodsFromKubernetes: func(context.Context) ([]*corev1.Pod, error) { return n.boundPods() },
		GetStatsSummary:       func(context.Context) (*statsv1alpha1.Summary, error) { return n.statsSummary(), nil },
		GetMetricsResource:    func(context.Context) ([]*dto.MetricFamily, error) { return n.resourceMetrics(), nil },
		StreamIdleTimeout:     k.idleTimeout,
		StreamCreationTimeout: k.creationTimeout,
	})
	mux := http.NewServeMux()
	// Any method: vk's router answers a wrong one (405) once authorized.
	mux.Handle("/containerLogs/{namespace}/{pod}/{container}", k.podRoute(n, vk))
	mux.Handle("/exec/{namespace}/{pod}/{container}", k.podRoute(n, vk))
	mux.Handle("/attach/{namespace}/{pod}/{container}", k.podRoute(n, vk))
	mux.Handle("/portForward/{namespace}/{pod}", k.podRoute(n, portForwardOverSPDY(vk)))
	mux.Handle("GET /healthz", k.nodeRoute(n, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok") })))
	for _, route := range []string{"/stats/summary", "/stats/summary/{$}", vkapi.MetricsResourceRouteSuffix, vkapi.MetricsResourceRouteSuffix + "/{$}"} {
		mux.Handle(route, k.nodeRoute(n, usageRoute(n, vk)))
	}
	mux.Handle("/", k.nodeRoute(n, vk)) // GET /pods; anything else is vk's 404, authorized first as a kubelet does
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

// target finds local pod namespace/name on node n (else a vk NotFound
// error), with the provider's grant (else errNoGrant) and a copy there
// (NotFound).
func target(n *providerNode, namespace, name string) (t podTarget, err error) {
	t = podTarget{namespace: namespace, name: name, node: n}
	if p, err := n.localPods.Pods(namespace).Get(name); err != nil || p.Spec.NodeName != n.name {
		return t, errdefs.NotFoundf("pod %s is not on virtual node %s", t, n.name)
	}
	if t.remote = n.currentRemote(); t.remote == nil {
		return t, errNoGrant{n.provider}
	}
	if t.remote.synced() {
		if _, ok := t.remote.pod(namespace, name); !ok {
			return t, errdefs.NotFoundf("pod %s has no copy at provider %s", t, n.provider)
		}
	}
	return t, nil
}

// queryKey: the request's query, in the context vk's handlers pass on (podRoute).
type queryKey struct{}

// podRoute serves a route about one pod ({namespace}/{pod}) of node n:
// authorized on n, as a kubelet authorizes on its own node; the pod must be
// bound to n, the provider's grant known, and the copy exist there. The
// handlers find the pod again (target): vk gives them the names only.
func (k *kubeletServer) podRoute(n *providerNode, h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !k.authorized(w, r, n.name) {
			return
		}
		_, err := target(n, r.PathValue("namespace"), r.PathValue("pod"))
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

// nodeRoute serves a route about node n itself, authorized on n.
func (k *kubeletServer) nodeRoute(n *providerNode, h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if k.authorized(w, r, n.name) {
			h.ServeHTTP(w, r)
		}
	})
}

// boundPods answers GET /pods: the pods bound to the node, as a kubelet
// lists the pods bound to it.
func (n *providerNode) boundPods() ([]*corev1.Pod, error) {
	return n.localPods.List(everything)
}
