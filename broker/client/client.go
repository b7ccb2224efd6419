// Package client is the typed Go client of the broker's v2 HTTP API, used by
// the cluster agents and rbctl.
//
// A Client speaks mutual TLS: its identity is the common name of its client
// certificate, which the broker takes as the cluster id. New reads the
// certificate from a directory in the layout of a cert-manager Secret
// (tls.crt, tls.key, ca.crt) and picks up a renewed key pair and a rotated
// CA without a restart.
//
// Errors from the broker are *APIError; IsNoCapacity, IsNotFound,
// IsForbidden, IsConflict and IsRetryable classify any error a method
// returns. Calls that are idempotent on the broker (every GET, advertising,
// reserving with a client-chosen id, releasing) are retried a few times with
// back-off on transport errors and 5xx answers (see WithRetries); anything
// else is left to the caller.
package client

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/fluidos-project/resource-broker/broker/api"
	"github.com/fluidos-project/resource-broker/internal/backoff"
	"github.com/fluidos-project/resource-broker/internal/certdir"
)

// Defaults of the options.
const (
	DefaultTimeout           = 30 * time.Second
	DefaultRetries           = 3
	DefaultBackoff           = 250 * time.Millisecond
	DefaultCertCheckInterval = 30 * time.Second
	DefaultStreamIdleTimeout = time.Minute
	DefaultIdleConns         = 16

	maxBackoff       = 5 * time.Second
	maxRetryAfter    = 2 * maxBackoff // the longest Retry-After a call waits before retrying
	maxResponseBytes = 16 << 20
	maxErrorBytes    = 64 << 10
)

type config struct {
	timeout           time.Duration
	retries           int
	backoff           time.Duration
	certCheckInterval time.Duration
	streamIdle        time.Duration
	userAgent         string
	idleConns         int
}

// Option configures a Client.
type Option func(*config)

// WithTimeout bounds each call (each attempt, when retried) from sending the
// request to reading the whole answer; for Events it bounds only the wait for
// the stream's headers. Default DefaultTimeout.
func WithTimeout(d time.Duration) Option { return func(c *config) { c.timeout = d } }

// WithRetries sets how many times an idempotent call is retried after a
// transport error, a 5xx or a 429 answer, and the first back-off, which
// doubles on each retry (internal/backoff: with jitter, at most 5s, or the
// server's Retry-After; an answer whose Retry-After exceeds 10s is returned,
// for the caller to wait). max <= 0 disables retries. Default DefaultRetries
// and DefaultBackoff.
func WithRetries(max int, backoff time.Duration) Option {
	return func(c *config) { c.retries, c.backoff = max, backoff }
}

// WithCertCheckInterval sets how often, at most, New's client reads its
// certificate directory again to notice a renewal or a CA rotation. Default
// DefaultCertCheckInterval.
func WithCertCheckInterval(d time.Duration) Option {
	return func(c *config) { c.certCheckInterval = d }
}

// WithStreamIdleTimeout ends an event stream on which nothing, not even the
// broker's keep-alive comments (every few seconds), arrived for d: it catches
// a connection that died silently. 0 disables. Default DefaultStreamIdleTimeout.
func WithStreamIdleTimeout(d time.Duration) Option {
	return func(c *config) { c.streamIdle = d }
}

// WithIdleConns sets how many idle connections to the broker the client
// keeps for later calls (at least 1). Default DefaultIdleConns. A process
// holding thousands of clients (hack/scale's members) keeps one each, so that
// the connections of its members' overlapping calls do not pile up idle.
func WithIdleConns(n int) Option { return func(c *config) { c.idleConns = max(1, n) } }

// WithUserAgent sets the User-Agent header.
func WithUserAgent(ua string) Option { return func(c *config) { c.userAgent = ua } }

// Client calls the broker's v2 API. It is safe for concurrent use.
type Client struct {
	base  string // scheme://host[:port][/prefix], without a trailing slash
	cfg   config
	certs *certdir.Dir      // New: the reloading certificate directory
	leaf  *x509.Certificate // NewWithTLS: the static certificate, if any

	mu      sync.RWMutex
	tr      *http.Transport
	trFiles *certdir.Files // the files tr's TLS configuration was made of (New)
}

// New returns a client of the broker at baseURL (https://host:port) that
// authenticates with certDir/tls.crt and tls.key and trusts the broker
// certificates signed by certDir/ca.crt. The directory is read again when
// its files change (checked at most every WithCertCheckInterval, before a
// call; a kubelet's update of a mounted Secret is read as a whole): new
// connections then present the new certificate and trust the new ca.crt,
// and idle ones are closed.
func New(baseURL, certDir string, opts ...Option) (*Client, error) {
	cfg := newConfig(opts)
	certs, err := certdir.Open(certDir, cfg.certCheckInterval)
	if err != nil {
		return nil, fmt.Errorf("client certificate: %w", err)
	}
	c, err := newClient(baseURL, tlsConfigFor(certs.Current()), cfg)
	if err != nil {
		return nil, err
	}
	c.certs, c.trFiles = certs, certs.Current()
	return c, nil
}

// NewWithTLS returns a client with a TLS configuration of the caller's (its
// client certificate, root CAs); the configuration is cloned, raised to
// TLS 1.2 at least and given a session cache if it has none. Nothing is
// reloaded.
func NewWithTLS(baseURL string, tlsConfig *tls.Config, opts ...Option) (*Client, error) {
	if tlsConfig == nil {
		return nil, errors.New("client: nil TLS configuration")
	}
	cfg := tlsConfig.Clone()
	if cfg.MinVersion < tls.VersionTLS12 {
		cfg.MinVersion = tls.VersionTLS12
	}
	if cfg.ClientSessionCache == nil {
		cfg.ClientSessionCache = tls.NewLRUClientSessionCache(sessionCacheSize)
	}
	c, err := newClient(baseURL, cfg, newConfig(opts))
	if err != nil {
		return nil, err
	}
	if len(cfg.Certificates) > 0 && len(cfg.Certificates[0].Certificate) > 0 {
		c.leaf = cfg.Certificates[0].Leaf
		if c.leaf == nil {
			c.leaf, _ = x509.ParseCertificate(cfg.Certificates[0].Certificate[0])
		}
	}
	return c, nil
}

func newConfig(opts []Option) config {
	cfg := config{
		timeout:           DefaultTimeout,
		retries:           DefaultRetries,
		backoff:           DefaultBackoff,
		certCheckInterval: DefaultCertCheckInterval,
		streamIdle:        DefaultStreamIdleTimeout,
		userAgent:         "rb-client",
		idleConns:         DefaultIdleConns,
	}
	for _, o := range opts {
		o(&cfg)
	}
	if cfg.retries < 0 {
		cfg.retries = 0
	}
	if cfg.backoff <= 0 {
		cfg.backoff = DefaultBackoff
	}
	return cfg
}

func newClient(baseURL string, tlsCfg *tls.Config, cfg config) (*Client, error) {
	u, err := url.Parse(baseURL)
	if err != nil {
		return nil, fmt.Errorf("client: broker URL: %w", err)
	}
	if u.Scheme != "https" || u.Host == "" {
		return nil, fmt.Errorf("client: broker URL %q: must be https://host[:port]", baseURL)
	}
	if u.RawQuery != "" || u.Fragment != "" {
		return nil, fmt.Errorf("client: broker URL %q: must not have a query or fragment", baseURL)
	}
	base := u.Scheme + "://" + u.Host + strings.TrimRight(u.EscapedPath(), "/")
	return &Client{base: base, cfg: cfg, tr: newTransport(tlsCfg, cfg.idleConns)}, nil
}

// newTransport keeps connections alive and speaks HTTP/1.1: the broker also
// offers HTTP/2, but on its benchmark (BenchmarkHTTPReserve in broker/server,
// replay-https-mtls against replay-https-mtls-http2) HTTP/2 cost about a
// quarter more CPU per request, client and server together.
func newTransport(tlsCfg *tls.Config, idleConns int) *http.Transport {
	d := &net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}
	return &http.Transport{
		Proxy:                 http.ProxyFromEnvironment,
		DialContext:           d.DialContext,
		TLSClientConfig:       tlsCfg,
		TLSHandshakeTimeout:   10 * time.Second,
		MaxIdleConns:          max(64, idleConns),
		MaxIdleConnsPerHost:   idleConns,
		IdleConnTimeout:       90 * time.Second,
		ExpectContinueTimeout: time.Second,
	}
}

// renewTransport starts a new connection pool with the files of a renewal
// or rotation, so that every later request presents the new certificate and
// trusts the new CAs: connections of the old pool are closed once idle (those
// in use finish first).
func (c *Client) renewTransport() {
	c.mu.Lock()
	f := c.certs.Current() // the latest, whichever caller noticed which change
	if f == c.trFiles {
		c.mu.Unlock()
		return
	}
	old := c.tr
	c.tr, c.trFiles = old.Clone(), f
	c.tr.TLSClientConfig = tlsConfigFor(f)
	c.mu.Unlock()
	old.CloseIdleConnections()
}

func (c *Client) httpClient(stream bool) *http.Client {
	if c.certs != nil {
		c.checkCerts() // notice a rotation before picking the pool
	}
	c.mu.RLock()
	tr := c.tr
	c.mu.RUnlock()
	hc := &http.Client{
		Transport: tr,
		// The API never redirects; a redirect is answered as an error.
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
	if !stream {
		hc.Timeout = c.cfg.timeout
	}
	return hc
}

// CloseIdleConnections closes the connections kept alive for later calls.
func (c *Client) CloseIdleConnections() {
	c.mu.RLock()
	defer c.mu.RUnlock()
	c.tr.CloseIdleConnections()
}

// Identity returns the cluster id the broker sees: the common name of the
// client certificate in use ("" if NewWithTLS got no static certificate).
func (c *Client) Identity() string {
	if leaf := c.Certificate(); leaf != nil {
		return leaf.Subject.CommonName
	}
	return ""
}

// Certificate returns the client certificate in use (after a renewal, the
// new one), or nil if NewWithTLS got no static certificate.
func (c *Client) Certificate() *x509.Certificate {
	if c.certs != nil {
		return c.checkCerts().Cert.Leaf
	}
	return c.leaf
}

// BaseURL returns the broker URL the client calls.
func (c *Client) BaseURL() string { return c.base }

// Advertise publishes the advertisement of cluster id, which must be the
// client's own identity, and returns the cluster as the broker stored it.
// Retried on transport errors and 5xx.
func (c *Client) Advertise(ctx context.Context, id string, a api.Advertisement) (api.Cluster, error) {
	var out api.Cluster
	if err := requireID("cluster id", id); err != nil {
		return out, err
	}
	err := c.call(ctx, http.MethodPut, "/api/v2/clusters/"+url.PathEscape(id)+"/advertisement", nil, a, true, &out)
	return out, err
}

// Heartbeat tells the broker that cluster id's advertisement is still the
// one it stored under digest (api.Cluster.Digest, from Advertise): only the
// cluster's liveness is refreshed. IsAdvertisementNeeded(err): the broker
// wants the full advertisement now.
func (c *Client) Heartbeat(ctx context.Context, id, digest string) (api.Heartbeat, error) {
	var out api.Heartbeat
	if err := requireID("cluster id", id); err != nil {
		return out, err
	}
	err := c.call(ctx, http.MethodPut, "/api/v2/clusters/"+url.PathEscape(id)+"/heartbeat", nil, api.HeartbeatRequest{Digest: digest}, true, &out)
	return out, err
}

// Clusters lists every cluster the broker knows, live or stale, by id. It
// reads the broker's pages (api.DefaultPageSize clusters each) one after the
// other; each page is retried on its own.
func (c *Client) Clusters(ctx context.Context) ([]api.Cluster, error) {
	out := []api.Cluster{}
	err := c.pages(ctx, "/api/v2/clusters", func(cont string) (string, error) {
		var page api.ClusterList
		err := c.call(ctx, http.MethodGet, "/api/v2/clusters", withContinue(nil, cont), nil, true, &page)
		out = append(out, page.Items...)
		return page.Continue, err
	})
	return out, err
}

// Cluster reads one cluster.
func (c *Client) Cluster(ctx context.Context, id string) (api.Cluster, error) {
	var out api.Cluster
	if err := requireID("cluster id", id); err != nil {
		return out, err
	}
	err := c.call(ctx, http.MethodGet, "/api/v2/clusters/"+url.PathEscape(id), nil, nil, true, &out)
	return out, err
}

// Leave removes the caller's cluster, id, from the federation (rbctl
// leave): the broker forgets its advertisement and it is no candidate any
// more until it advertises again. Refused (IsConflict) while live
// reservations name it; IsNotFound when the broker holds no advertisement
// of it. Not retried: a second call after a lost answer would say not found.
func (c *Client) Leave(ctx context.Context, id string) error {
	if err := requireID("cluster id", id); err != nil {
		return err
	}
	return c.call(ctx, http.MethodDelete, "/api/v2/clusters/"+url.PathEscape(id), nil, nil, false, nil)
}

// Reserve asks the broker to choose a provider and lock capacity for r. r.ID
// is chosen by the caller and makes the call idempotent: asking again with
// the same id returns the first decision, so the call is retried on
// transport errors and 5xx. A refusal because nothing fits is an *APIError
// for which IsNoCapacity is true, with the rejections by reason.
func (c *Client) Reserve(ctx context.Context, r api.ReservationRequest) (api.Reservation, error) {
	var out api.Reservation
	if err := requireID("reservation id", r.ID); err != nil {
		return out, err
	}
	err := c.call(ctx, http.MethodPost, "/api/v2/reservations", nil, r, true, &out)
	return out, err
}

// Reservation reads a reservation the caller is a party to; its grant is
// shown to the requester only.
func (c *Client) Reservation(ctx context.Context, id string) (api.Reservation, error) {
	var out api.Reservation
	if err := requireID("reservation id", id); err != nil {
		return out, err
	}
	err := c.call(ctx, http.MethodGet, "/api/v2/reservations/"+url.PathEscape(id), nil, nil, true, &out)
	return out, err
}

// Role values for Reservations.
const (
	RoleRequester = "requester"
	RoleProvider  = "provider"
)

// Reservations lists the caller's live reservations as requester
// (RoleRequester), as provider (RoleProvider), or both (""). It reads the
// broker's pages one after the other (each retried on its own) and returns
// each reservation once: every reservation live from the first page to the
// last is in it; one that began or ended meanwhile may or may not be.
func (c *Client) Reservations(ctx context.Context, role string) ([]api.Reservation, error) {
	var q url.Values
	if role != "" {
		q = url.Values{"role": {role}}
	}
	out := []api.Reservation{}
	seen := map[[2]string]bool{} // a page may repeat an earlier one's reservation
	err := c.pages(ctx, "/api/v2/reservations", func(cont string) (string, error) {
		var page api.ReservationList
		err := c.call(ctx, http.MethodGet, "/api/v2/reservations", withContinue(q, cont), nil, true, &page)
		for _, r := range page.Items {
			if k := [2]string{r.Requester, r.ID}; !seen[k] {
				seen[k] = true
				out = append(out, r)
			}
		}
		return page.Continue, err
	})
	return out, err
}

// maxPages bounds a listing: a broker that kept answering with a continue
// token would otherwise hold the caller forever.
const maxPages = 10_000

// pages calls page with each continue token, "" first, until one returns
// none.
func (c *Client) pages(ctx context.Context, path string, page func(cont string) (string, error)) error {
	cont := ""
	for range maxPages {
		next, err := page(cont)
		if err != nil || next == "" {
			return err
		}
		if next == cont {
			return fmt.Errorf("client: GET %s: the broker answered the same continue token twice", path)
		}
		cont = next
		if err := ctx.Err(); err != nil {
			return err
		}
	}
	return fmt.Errorf("client: GET %s: more than %d pages", path, maxPages)
}

// withContinue returns q with ?continue=cont added (q itself unchanged).
func withContinue(q url.Values, cont string) url.Values {
	if cont == "" {
		return q
	}
	out := url.Values{"continue": {cont}}
	for k, v := range q {
		out[k] = v
	}
	return out
}

// Release ends a reservation (as its requester or provider) and returns it
// in its final phase. Releasing an ended reservation changes nothing and
// succeeds, so the call is retried on transport errors and 5xx.
func (c *Client) Release(ctx context.Context, id string) (api.Reservation, error) {
	var out api.Reservation
	if err := requireID("reservation id", id); err != nil {
		return out, err
	}
	err := c.call(ctx, http.MethodDelete, "/api/v2/reservations/"+url.PathEscape(id), nil, nil, true, &out)
	return out, err
}

// Grant hands the requester of reservation id its access, as the provider;
// the reservation becomes Active. Not retried: each grant notifies the
// requester. A reservation that has ended answers IsConflict.
func (c *Client) Grant(ctx context.Context, id string, g api.Grant) (api.Reservation, error) {
	var out api.Reservation
	if err := requireID("reservation id", id); err != nil {
		return out, err
	}
	err := c.call(ctx, http.MethodPost, "/api/v2/reservations/"+url.PathEscape(id)+"/grant", nil, g, false, &out)
	return out, err
}

// ProvidedReservation reads, as its provider, the reservation id of
// requester (ids are scoped per requester).
func (c *Client) ProvidedReservation(ctx context.Context, requester, id string) (api.Reservation, error) {
	var out api.Reservation
	if err := requireID("reservation id", id); err != nil {
		return out, err
	}
	err := c.call(ctx, http.MethodGet, "/api/v2/reservations/"+url.PathEscape(id), url.Values{"requester": {requester}}, nil, true, &out)
	return out, err
}

// GrantTo hands requester its access to reservation id, as the provider
// (Grant for a requester's reservation: the id is scoped by requester).
// Not retried: each grant notifies the requester. A reservation that has
// ended answers IsConflict.
func (c *Client) GrantTo(ctx context.Context, requester, id string, g api.Grant) (api.Reservation, error) {
	var out api.Reservation
	if err := requireID("reservation id", id); err != nil {
		return out, err
	}
	err := c.call(ctx, http.MethodPost, "/api/v2/reservations/"+url.PathEscape(id)+"/grant", url.Values{"requester": {requester}}, g, false, &out)
	return out, err
}

// Renew extends the caller's leases (at most api.MaxRenewBatch ids per
// call; the caller splits larger sets). Renewing is idempotent, so the call
// is retried on transport errors and 5xx.
func (c *Client) Renew(ctx context.Context, ids []string) (api.RenewResponse, error) {
	var out api.RenewResponse
	if len(ids) > api.MaxRenewBatch {
		return out, fmt.Errorf("client: %d ids, at most %d per renewal", len(ids), api.MaxRenewBatch)
	}
	err := c.call(ctx, http.MethodPost, "/api/v2/renewals", nil, api.RenewRequest{IDs: ids}, true, &out)
	return out, err
}

// RenewFor renews, as the provider this client is, requester's leases placed
// here (ids as the requester chose them): while this provider still hears
// the requester, its reservations live on though it cannot reach the broker.
func (c *Client) RenewFor(ctx context.Context, requester string, ids []string) (api.RenewResponse, error) {
	var out api.RenewResponse
	if err := requireID("requester", requester); err != nil {
		return out, err
	}
	if len(ids) > api.MaxRenewBatch {
		return out, fmt.Errorf("client: %d ids, at most %d per renewal", len(ids), api.MaxRenewBatch)
	}
	err := c.call(ctx, http.MethodPost, "/api/v2/renewals", url.Values{"requester": {requester}}, api.RenewRequest{IDs: ids}, true, &out)
	return out, err
}

// QuietRequesters asks, as the provider this client is, which of
// requesters (at most api.MaxQuietRequesters) have not renewed their own
// leases within a third of their shortest lease: RenewFor is needed for
// those alone. Idempotent, so retried.
func (c *Client) QuietRequesters(ctx context.Context, requesters []string) ([]string, error) {
	if len(requesters) > api.MaxQuietRequesters {
		return nil, fmt.Errorf("client: %d requesters, at most %d per call", len(requesters), api.MaxQuietRequesters)
	}
	var out api.QuietResponse
	err := c.call(ctx, http.MethodPost, "/api/v2/renewals/quiet", nil, api.QuietRequest{Requesters: requesters}, true, &out)
	return out.Quiet, err
}

func requireID(what, id string) error {
	if id == "" {
		return fmt.Errorf("client: %s must not be empty", what)
	}
	return nil
}

// call sends one API request, retrying it when idempotent, and decodes a 2xx
// answer into out.
func (c *Client) call(ctx context.Context, method, path string, query url.Values, body any, idempotent bool, out any) error {
	var payload []byte
	if body != nil {
		var err error
		if payload, err = json.Marshal(body); err != nil {
			return fmt.Errorf("client: encode %s %s: %w", method, path, err)
		}
	}
	target := c.base + path
	if len(query) > 0 {
		target += "?" + query.Encode()
	}
	attempts := 1
	if idempotent {
		attempts += c.cfg.retries
	}
	retry := backoff.Exponential(c.cfg.backoff, maxBackoff)
	var err error
	for attempt := 0; attempt < attempts; attempt++ {
		if attempt > 0 {
			if !sleep(ctx, retryAfter(retry.Step(), err)) {
				return err
			}
		}
		err = c.once(ctx, method, path, target, payload, out)
		if err == nil || !IsRetryable(err) || ctx.Err() != nil {
			return err
		}
		// The broker asks for a longer wait than a retry here would give
		// (a shed advertisement: the backlog's time to drain): the caller's
		// own back-off waits it, rather than a retry coming back too soon.
		if ra, ok := RetryAfter(err); ok && ra > maxRetryAfter {
			return err
		}
	}
	return err
}

func (c *Client) once(ctx context.Context, method, path, target string, payload []byte, out any) error {
	var rd io.Reader
	if payload != nil {
		rd = bytes.NewReader(payload)
	}
	req, err := http.NewRequestWithContext(ctx, method, target, rd)
	if err != nil {
		return fmt.Errorf("client: %w", err)
	}
	req.Header.Set("Accept", "application/json")
	req.Header.Set("User-Agent", c.cfg.userAgent)
	if payload != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.httpClient(false).Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		data, _ := io.ReadAll(io.LimitReader(resp.Body, maxErrorBytes))
		return newAPIError(method, path, resp, data)
	}
	data, err := io.ReadAll(io.LimitReader(resp.Body, maxResponseBytes+1))
	if err != nil {
		return err // a transport error while reading: retryable
	}
	if len(data) > maxResponseBytes {
		return fmt.Errorf("client: %s %s: answer larger than %d bytes", method, path, maxResponseBytes)
	}
	if out == nil {
		return nil
	}
	if err := json.Unmarshal(data, out); err != nil {
		return fmt.Errorf("client: %s %s: decode answer: %w", method, path, err)
	}
	return nil
}

// retryAfter is the wait d of the back-off, or the server's Retry-After
// when it asked for longer (at most maxRetryAfter: call does not retry
// answers that ask for more).
func retryAfter(d time.Duration, lastErr error) time.Duration {
	if ra, ok := RetryAfter(lastErr); ok && ra > d {
		d = min(ra, maxRetryAfter)
	}
	return d
}

func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

func jsonUnmarshal(data []byte, v any) error { return json.Unmarshal(data, v) }
