package server

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"
)

// TLSConfig returns a server configuration that serves dir/tls.crt +
// dir/tls.key and requires client certificates signed by dir/ca.crt (the
// layout of a cert-manager Secret). All three files are re-read when they
// change, so cert-manager's renewals of the key pair or the CA are picked up
// without a restart.
func TLSConfig(dir string) (*tls.Config, error) {
	r := &tlsReloader{dir: dir}
	if _, err := r.load(); err != nil {
		return nil, err
	}
	return &tls.Config{
		MinVersion:         tls.VersionTLS12,
		ClientAuth:         tls.RequireAndVerifyClientCert,
		NextProtos:         []string{"h2", "http/1.1"},
		GetConfigForClient: r.get,
	}, nil
}

// tlsReloader keeps the per-connection configuration and rebuilds it, at most
// every checkEvery, when a file's modification time changed.
type tlsReloader struct {
	dir string

	mu      sync.Mutex
	current *tls.Config
	stamp   string
	checked time.Time
}

const checkEvery = 10 * time.Second

func (r *tlsReloader) files() []string {
	return []string{filepath.Join(r.dir, "tls.crt"), filepath.Join(r.dir, "tls.key"), filepath.Join(r.dir, "ca.crt")}
}

func (r *tlsReloader) get(*tls.ClientHelloInfo) (*tls.Config, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.current != nil && time.Since(r.checked) < checkEvery {
		return r.current, nil
	}
	r.checked = time.Now()
	cfg, err := r.loadLocked()
	if err != nil && r.current != nil {
		return r.current, nil // keep serving while a rotation is half-written
	}
	return cfg, err
}

func (r *tlsReloader) load() (*tls.Config, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.loadLocked()
}

func (r *tlsReloader) loadLocked() (*tls.Config, error) {
	stamp := ""
	for _, f := range r.files() {
		st, err := os.Stat(f)
		if err != nil {
			return nil, fmt.Errorf("TLS: %w", err)
		}
		stamp += st.ModTime().String() + "|"
	}
	if r.current != nil && stamp == r.stamp {
		return r.current, nil
	}
	files := r.files()
	pair, err := tls.LoadX509KeyPair(files[0], files[1])
	if err != nil {
		return nil, fmt.Errorf("TLS: server key pair: %w", err)
	}
	caPEM, err := os.ReadFile(files[2])
	if err != nil {
		return nil, fmt.Errorf("TLS: client CA: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		return nil, fmt.Errorf("TLS: %s holds no PEM certificate", files[2])
	}
	r.current = &tls.Config{
		MinVersion:   tls.VersionTLS12,
		ClientAuth:   tls.RequireAndVerifyClientCert,
		ClientCAs:    pool,
		Certificates: []tls.Certificate{pair},
		NextProtos:   []string{"h2", "http/1.1"},
	}
	r.stamp = stamp
	return r.current, nil
}
