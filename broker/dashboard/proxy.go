package dashboard

import (
	"crypto/tls"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strings"
)

// NewProxy returns a handler that forwards the dashboard's pages to the
// broker at broker (https://host:port) over mutual TLS with tlsConfig, which
// holds an operator's client certificate: what rb-dashboard serves on the
// operator's machine, as kubectl proxy does for the Kubernetes API, for a
// browser that holds no client certificate of its own (importing one into
// a browser works too: then it opens the broker's /dashboard/ directly). Only
// reads of /dashboard/ are forwarded; / redirects there.
func NewProxy(broker *url.URL, tlsConfig *tls.Config) http.Handler {
	rp := &httputil.ReverseProxy{
		Rewrite: func(r *httputil.ProxyRequest) {
			r.SetURL(broker)
			r.Out.Host = broker.Host
			r.Out.Header.Del("Cookie") // the dashboard uses none; nothing of the browser's other sites goes to the broker
		},
		Transport: &http.Transport{TLSClientConfig: tlsConfig, ForceAttemptHTTP2: true, MaxIdleConnsPerHost: 16},
		// text/event-stream (the live updates) is flushed as it comes.
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case r.URL.Path == "/":
			http.Redirect(w, r, Path, http.StatusFound)
		case !strings.HasPrefix(r.URL.Path, Path):
			http.Error(w, "not found: this proxy serves the broker's dashboard under "+Path, http.StatusNotFound)
		case r.Method != http.MethodGet && r.Method != http.MethodHead:
			http.Error(w, "the dashboard is read-only", http.StatusMethodNotAllowed)
		default:
			rp.ServeHTTP(w, r)
		}
	})
}
