package virtualkubelet

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"net/http"
	"strings"

	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// caller is who a request comes from.
type caller struct {
	name, uid string
	groups    []string
	extra     map[string]authorizationv1.ExtraValue
}

type callerKey struct{}

// authenticated puts authentication in front of h: a client certificate of
// the cluster's client CA (the API server's kubelet client certificate), or a
// bearer token the API server vouches for (TokenReview), as a kubelet run
// with webhook authentication accepts; anything else is 401.
func (k *kubeletServer) authenticated(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, err := k.authenticate(r)
		if err != nil {
			k.log.V(1).Info("kubelet endpoint: unauthenticated request", "path", r.URL.Path, "error", err.Error())
			http.Error(w, "Unauthorized", http.StatusUnauthorized)
			return
		}
		h.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), callerKey{}, c)))
	})
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

// authorized asks the API server (SubjectAccessReview) whether the caller may
// make the request on node (the one whose endpoint was called), with the
// attributes a kubelet asks for (requestAttributes); it answers the request
// itself when not: 403, or 500 when the review fails, as a kubelet does.
func (k *kubeletServer) authorized(w http.ResponseWriter, r *http.Request, node string) bool {
	c, _ := r.Context().Value(callerKey{}).(*caller)
	if c == nil {
		http.Error(w, "Unauthorized", http.StatusUnauthorized)
		return false
	}
	verb, subresources := requestAttributes(r.Method, r.URL.Path)
	if verb == "" {
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
		return false
	}
	for _, sub := range subresources {
		allowed, err := k.allowed(r.Context(), c, verb, sub, node)
		if err != nil {
			k.log.Error(err, "kubelet endpoint: authorization", "user", c.name, "verb", verb, "subresource", sub, "node", node)
			http.Error(w, fmt.Sprintf("Authorization error (user=%s, verb=%s, resource=nodes, subresource=%s)", c.name, verb, sub), http.StatusInternalServerError)
			return false
		}
		if allowed {
			return true
		}
	}
	k.log.V(1).Info("kubelet endpoint: forbidden", "user", c.name, "verb", verb, "subresources", subresources, "node", node, "path", r.URL.Path)
	http.Error(w, fmt.Sprintf("Forbidden (user=%s, verb=%s, resource=nodes, subresource(s)=%v) on node %s", c.name, verb, subresources, node), http.StatusForbidden)
	return false
}

func (k *kubeletServer) allowed(ctx context.Context, c *caller, verb, subresource, node string) (bool, error) {
	ctx, cancel := context.WithTimeout(ctx, k.timeout)
	defer cancel()
	sar, err := k.b.local.AuthorizationV1().SubjectAccessReviews().Create(ctx, &authorizationv1.SubjectAccessReview{
		Spec: authorizationv1.SubjectAccessReviewSpec{
			User: c.name, UID: c.uid, Groups: c.groups, Extra: c.extra,
			ResourceAttributes: &authorizationv1.ResourceAttributes{Verb: verb, Version: "v1", Resource: "nodes", Subresource: subresource, Name: node},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		return false, err
	}
	return sar.Status.Allowed, nil
}

// requestAttributes are the verb and the nodes subresources a kubelet
// authorizes a request with (k8s.io/kubernetes/pkg/kubelet/server/auth.go,
// with KubeletFineGrainedAuthz, on by default since 1.33): the request is
// allowed if any of the subresources is. The verb follows the HTTP method
// (HEAD reads, as GET: the kubelet leaves its verb empty, which no rule
// allows); "" for a method no verb stands for.
func requestAttributes(method, path string) (verb string, subresources []string) {
	switch method {
	case http.MethodGet, http.MethodHead:
		verb = "get"
	case http.MethodPost:
		verb = "create"
	case http.MethodPut:
		verb = "update"
	case http.MethodPatch:
		verb = "patch"
	case http.MethodDelete:
		verb = "delete"
	}
	// Fine-grained first, nodes/proxy as the fallback.
	switch {
	case isSubpath(path, "/pods"), isSubpath(path, "/runningpods/"):
		subresources = append(subresources, "pods")
	case isSubpath(path, "/healthz"):
		subresources = append(subresources, "healthz")
	case isSubpath(path, "/configz"):
		subresources = append(subresources, "configz")
	}
	switch {
	case isSubpath(path, "/stats/"):
		subresources = append(subresources, "stats")
	case isSubpath(path, "/metrics"):
		subresources = append(subresources, "metrics")
	case isSubpath(path, "/logs/"):
		subresources = append(subresources, "log") // as pods/log
	case isSubpath(path, "/checkpoint/"):
		subresources = append(subresources, "checkpoint")
	case isSubpath(path, "/statusz"):
		subresources = append(subresources, "statusz")
	case isSubpath(path, "/flagz"):
		subresources = append(subresources, "configz")
	default: // containerLogs, exec, attach, portForward, run, pods, ...
		subresources = append(subresources, "proxy")
	}
	return verb, subresources
}

// isSubpath: subpath is path or below it (the kubelet's).
func isSubpath(subpath, path string) bool {
	path = strings.TrimSuffix(path, "/")
	return subpath == path || (strings.HasPrefix(subpath, path) && subpath[len(path)] == '/')
}
