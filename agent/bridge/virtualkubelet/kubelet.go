package virtualkubelet

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// kubeletServer is the virtual nodes' kubelet endpoint (the node's
// status.daemonEndpoints): the API server calls it for `kubectl logs`, and it
// streams the copy's pods/log from the provider. Callers authenticate as they
// do to a kubelet (a client certificate of the cluster's client CA, or a
// bearer token checked with a TokenReview) and need get on nodes/proxy of the
// pod's node (SubjectAccessReview).
type kubeletServer struct {
	b       *Bridge
	ln      net.Listener
	port    int32
	roots   atomic.Pointer[x509.CertPool]
	timeout time.Duration
}

func newKubeletServer(b *Bridge, addr string) (*kubeletServer, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("kubelet endpoint: %w", err)
	}
	return &kubeletServer{b: b, ln: ln, port: int32(ln.Addr().(*net.TCPAddr).Port), timeout: 10 * time.Second}, nil
}

// serve runs until ctx ends.
func (k *kubeletServer) serve(ctx context.Context) error {
	if err := k.loadClientCA(ctx); err != nil {
		k.b.log.Info("kubelet endpoint: no client CA, only bearer tokens are accepted", "error", err.Error())
	}
	cert, err := selfSignedCert(k.b.cfg.NodeIP)
	if err != nil {
		return err
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /containerLogs/{namespace}/{pod}/{container}", k.containerLogs)
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok") })
	srv := &http.Server{
		Handler:           mux,
		ReadHeaderTimeout: 10 * time.Second,
		TLSConfig:         &tls.Config{Certificates: []tls.Certificate{cert}, ClientAuth: tls.RequestClientCert, MinVersion: tls.VersionTLS12},
	}
	done := make(chan error, 1)
	go func() { done <- srv.ServeTLS(k.ln, "", "") }()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = srv.Shutdown(sctx)
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

type caller struct {
	name, uid string
	groups    []string
	extra     map[string]authorizationv1.ExtraValue
}

func (k *kubeletServer) authenticate(r *http.Request) (*caller, error) {
	if r.TLS != nil && len(r.TLS.PeerCertificates) > 0 {
		roots := k.roots.Load()
		if roots == nil {
			return nil, errors.New("client certificates are not accepted")
		}
		inter := x509.NewCertPool()
		for _, c := range r.TLS.PeerCertificates[1:] {
			inter.AddCert(c)
		}
		leaf := r.TLS.PeerCertificates[0]
		if _, err := leaf.Verify(x509.VerifyOptions{Roots: roots, Intermediates: inter, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
			return nil, err
		}
		return &caller{name: leaf.Subject.CommonName, groups: leaf.Subject.Organization}, nil
	}
	tok, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if !ok || tok == "" {
		return nil, errors.New("no credentials")
	}
	ctx, cancel := context.WithTimeout(r.Context(), k.timeout)
	defer cancel()
	tr, err := k.b.local.AuthenticationV1().TokenReviews().Create(ctx, &authenticationv1.TokenReview{Spec: authenticationv1.TokenReviewSpec{Token: tok}}, metav1.CreateOptions{})
	if err != nil {
		return nil, err
	}
	if !tr.Status.Authenticated {
		return nil, errors.New("invalid token")
	}
	u := tr.Status.User
	c := &caller{name: u.Username, uid: u.UID, groups: u.Groups, extra: map[string]authorizationv1.ExtraValue{}}
	for key, v := range u.Extra {
		c.extra[key] = authorizationv1.ExtraValue(v)
	}
	return c, nil
}

// authorize: get nodes/proxy on the pod's node, as a kubelet asks.
func (k *kubeletServer) authorize(ctx context.Context, c *caller, node string) error {
	ctx, cancel := context.WithTimeout(ctx, k.timeout)
	defer cancel()
	sar, err := k.b.local.AuthorizationV1().SubjectAccessReviews().Create(ctx, &authorizationv1.SubjectAccessReview{
		Spec: authorizationv1.SubjectAccessReviewSpec{
			User: c.name, UID: c.uid, Groups: c.groups, Extra: c.extra,
			ResourceAttributes: &authorizationv1.ResourceAttributes{Verb: "get", Version: "v1", Resource: "nodes", Subresource: "proxy", Name: node},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		return err
	}
	if !sar.Status.Allowed {
		return fmt.Errorf("%s may not get nodes/proxy of %s", c.name, node)
	}
	return nil
}

func (k *kubeletServer) containerLogs(w http.ResponseWriter, r *http.Request) {
	ns, podName, container := r.PathValue("namespace"), r.PathValue("pod"), r.PathValue("container")
	c, err := k.authenticate(r)
	if err != nil {
		http.Error(w, "Unauthorized: "+err.Error(), http.StatusUnauthorized)
		return
	}
	var n *providerNode
	for _, cand := range k.b.runningNodes() {
		if p, err := cand.localPods.Pods(ns).Get(podName); err == nil && p.Spec.NodeName == cand.name {
			n = cand
			break
		}
	}
	if n == nil {
		http.Error(w, fmt.Sprintf("pod %s/%s is not on a virtual node of this agent", ns, podName), http.StatusNotFound)
		return
	}
	if err := k.authorize(r.Context(), c, n.name); err != nil {
		http.Error(w, "Forbidden: "+err.Error(), http.StatusForbidden)
		return
	}
	opts, err := logOptions(container, r.URL.Query())
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	rc := n.currentRemote()
	if rc == nil {
		http.Error(w, "no access to provider "+n.provider+" yet", http.StatusServiceUnavailable)
		return
	}
	stream, err := rc.client.CoreV1().Pods(rc.namespace).GetLogs(RemoteName(ns, podName), opts).Stream(r.Context())
	if err != nil {
		code := http.StatusBadGateway
		var status apierrors.APIStatus
		if errors.As(err, &status) && status.Status().Code != 0 {
			code = int(status.Status().Code)
		}
		http.Error(w, fmt.Sprintf("logs from %s: %v", n.provider, err), code)
		return
	}
	defer stream.Close()
	w.Header().Set("Content-Type", "text/plain")
	w.WriteHeader(http.StatusOK)
	flusher, _ := w.(http.Flusher)
	buf := make([]byte, 32<<10)
	for {
		nr, rerr := stream.Read(buf)
		if nr > 0 {
			if _, werr := w.Write(buf[:nr]); werr != nil {
				return
			}
			if flusher != nil {
				flusher.Flush()
			}
		}
		if rerr != nil {
			return
		}
	}
}

// logOptions reads the kubelet's containerLogs query.
func logOptions(container string, q url.Values) (*corev1.PodLogOptions, error) {
	o := &corev1.PodLogOptions{Container: container}
	boolean := func(name string, dst *bool) error {
		if v := q.Get(name); v != "" {
			b, err := strconv.ParseBool(v)
			if err != nil {
				return fmt.Errorf("%s: %w", name, err)
			}
			*dst = b
		}
		return nil
	}
	integer := func(name string, dst **int64, lowest int64) error {
		if v := q.Get(name); v != "" {
			i, err := strconv.ParseInt(v, 10, 64)
			if err != nil || i < lowest {
				return fmt.Errorf("%s: %q is not an integer >= %d", name, v, lowest)
			}
			*dst = &i
		}
		return nil
	}
	if err := errors.Join(boolean("follow", &o.Follow), boolean("previous", &o.Previous), boolean("timestamps", &o.Timestamps),
		integer("tailLines", &o.TailLines, 0), integer("limitBytes", &o.LimitBytes, 1), integer("sinceSeconds", &o.SinceSeconds, 1)); err != nil {
		return nil, err
	}
	if v := q.Get("sinceTime"); v != "" {
		t, err := time.Parse(time.RFC3339, v)
		if err != nil {
			return nil, fmt.Errorf("sinceTime: %w", err)
		}
		o.SinceTime = &metav1.Time{Time: t}
	}
	return o, nil
}

// selfSignedCert is the endpoint's serving certificate (the API server does
// not verify kubelet serving certificates unless told a CA to).
func selfSignedCert(ip string) (tls.Certificate, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, err
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	if err != nil {
		return tls.Certificate{}, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: "rb-agent virtual kubelet"},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(5 * 365 * 24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		DNSNames:     []string{"localhost"},
	}
	if parsed := net.ParseIP(ip); parsed != nil {
		tmpl.IPAddresses = []net.IP{parsed}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return tls.Certificate{}, err
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}, nil
}
