package server

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"

	"github.com/fluidos-project/resource-broker/internal/certdir"
)

// DefaultCertCheckInterval is how often, at most, Certs reads its directory
// again to notice a rotation.
const DefaultCertCheckInterval = 10 * time.Second

// Certs is the broker's side of mutual TLS: the serving key pair (tls.crt,
// tls.key) and the CAs that sign client certificates (ca.crt) from a
// directory in the layout of a cert-manager Secret, read again when the files
// change (at most every check interval, on the next handshake or request),
// so that cert-manager's renewals and a CA rotation take effect without a
// restart: new connections get the new serving certificate and are verified
// against the new CAs. A connection made before the CAs changed is verified
// again, against the new CAs, on its next request: a client certificate of
// a CA that was removed is refused there too, not only at the next
// handshake.
type Certs struct {
	dir   *certdir.Dir
	log   logr.Logger
	mu    sync.Mutex // one update of state at a time
	state atomic.Pointer[certState]
}

// certState is what one version of the directory serves.
type certState struct {
	files   *certdir.Files
	config  *tls.Config
	trusted map[string]struct{} // DER of the client CAs
	caGen   uint64              // bumped when the client CAs change
}

// LoadCerts loads dir and checks it again at most every interval.
func LoadCerts(dir string, interval time.Duration, log logr.Logger) (*Certs, error) {
	d, err := certdir.Open(dir, interval)
	if err != nil {
		return nil, fmt.Errorf("TLS: %w", err)
	}
	c := &Certs{dir: d, log: log}
	c.state.Store(c.newState(d.Current(), nil))
	return c, nil
}

// TLSConfig is the listener's configuration: each handshake gets the
// configuration of the current files.
func (c *Certs) TLSConfig() *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS12,
		ClientAuth: tls.RequireAndVerifyClientCert,
		NextProtos: []string{"h2", "http/1.1"},
		GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) {
			return c.current().config, nil
		},
	}
}

// current returns the state of the current files, after checking the
// directory if it is due.
func (c *Certs) current() *certState {
	_, changed, err := c.dir.Files()
	if err != nil {
		c.log.Error(err, "TLS files did not load: serving the last good ones", "dir", c.dir.Path())
	}
	if !changed {
		return c.state.Load()
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	old := c.state.Load()
	if f := c.dir.Current(); f != old.files {
		c.state.Store(c.newState(f, old))
	}
	return c.state.Load()
}

func (c *Certs) newState(f *certdir.Files, old *certState) *certState {
	st := &certState{files: f, trusted: make(map[string]struct{}, len(f.CAs)), config: &tls.Config{
		MinVersion:   tls.VersionTLS12,
		ClientAuth:   tls.RequireAndVerifyClientCert,
		ClientCAs:    f.Pool,
		Certificates: []tls.Certificate{*f.Cert},
		NextProtos:   []string{"h2", "http/1.1"},
	}}
	subjects := make([]string, len(f.CAs))
	for i, ca := range f.CAs {
		st.trusted[string(ca.Raw)] = struct{}{}
		subjects[i] = ca.Subject.String()
	}
	caChanged := old == nil || len(old.trusted) != len(st.trusted)
	if old != nil {
		st.caGen = old.caGen
		for der := range st.trusted {
			if _, ok := old.trusted[der]; !ok {
				caChanged = true
			}
		}
		if caChanged {
			st.caGen++
		}
	}
	leaf := f.Cert.Leaf
	c.log.Info("TLS files loaded", "dir", c.dir.Path(), "serial", leaf.SerialNumber.String(), "subject", leaf.Subject.String(),
		"notAfter", leaf.NotAfter, "clientCAs", strings.Join(subjects, "; "), "clientCAsChanged", caChanged)
	return st
}

// connTrust remembers, for one connection, whether its client certificate
// chains to the client CAs of one generation: (generation+1)<<1 | trusted,
// 0 until checked.
type connTrust struct{ v atomic.Uint64 }

type connTrustKey struct{}

// connContext gives each connection its connTrust (http.Server.ConnContext).
func connContext(ctx context.Context, _ net.Conn) context.Context {
	return context.WithValue(ctx, connTrustKey{}, new(connTrust))
}

// trusts tells whether the client certificate of r's connection chains to
// the current client CAs. It verifies again only when the CAs changed since
// the connection's last check; otherwise it costs a few atomic loads.
func (c *Certs) trusts(r *http.Request) bool {
	st := c.current()
	ct, _ := r.Context().Value(connTrustKey{}).(*connTrust)
	if ct != nil {
		if v := ct.v.Load(); v>>1 == st.caGen+1 {
			return v&1 == 1
		}
	}
	ok := st.verify(r.TLS)
	if ct != nil {
		v := (st.caGen + 1) << 1
		if ok {
			v |= 1
		}
		ct.v.Store(v)
	}
	return ok
}

// verify checks a connection's client certificate against the state's CAs:
// the root it was verified with at the handshake, if still trusted, or else a
// new verification (a renewed CA with the same key keeps its certificates).
func (st *certState) verify(cs *tls.ConnectionState) bool {
	if cs == nil || len(cs.PeerCertificates) == 0 {
		return false
	}
	for _, chain := range cs.VerifiedChains {
		if _, ok := st.trusted[string(chain[len(chain)-1].Raw)]; ok {
			return true
		}
	}
	inter := x509.NewCertPool()
	for _, c := range cs.PeerCertificates[1:] {
		inter.AddCert(c)
	}
	_, err := cs.PeerCertificates[0].Verify(x509.VerifyOptions{Roots: st.files.Pool, Intermediates: inter,
		KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}})
	return err == nil
}
