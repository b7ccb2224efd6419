package client

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"
)

// Files of a cert-manager (kubernetes.io/tls) Secret mounted as a volume.
const (
	CertFile = "tls.crt"
	KeyFile  = "tls.key"
	CAFile   = "ca.crt"
)

// keyPair caches the client certificate of a cert directory and re-reads it,
// at most once per interval, when the files' contents changed: cert-manager
// renews certificates in place. A pair that does not load (a rotation seen
// half-written) is ignored until the next check; the old one stays in use.
type keyPair struct {
	certFile, keyFile string
	interval          time.Duration
	now               func() time.Time

	mu              sync.Mutex
	cert            *tls.Certificate // Leaf is set
	certPEM, keyPEM []byte
	checked         time.Time
	onChange        func() // called (without mu) after a new pair was loaded
}

func loadKeyPair(dir string, interval time.Duration) (*keyPair, error) {
	k := &keyPair{
		certFile: filepath.Join(dir, CertFile),
		keyFile:  filepath.Join(dir, KeyFile),
		interval: interval,
		now:      time.Now,
	}
	certPEM, keyPEM, c, err := k.read()
	if err != nil {
		return nil, err
	}
	k.cert, k.certPEM, k.keyPEM, k.checked = c, certPEM, keyPEM, k.now()
	return k, nil
}

func (k *keyPair) read() (certPEM, keyPEM []byte, c *tls.Certificate, err error) {
	if certPEM, err = os.ReadFile(k.certFile); err != nil {
		return nil, nil, nil, fmt.Errorf("client certificate: %w", err)
	}
	if keyPEM, err = os.ReadFile(k.keyFile); err != nil {
		return nil, nil, nil, fmt.Errorf("client key: %w", err)
	}
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("client key pair %s, %s: %w", k.certFile, k.keyFile, err)
	}
	if pair.Leaf == nil {
		if pair.Leaf, err = x509.ParseCertificate(pair.Certificate[0]); err != nil {
			return nil, nil, nil, fmt.Errorf("client certificate %s: %w", k.certFile, err)
		}
	}
	return certPEM, keyPEM, &pair, nil
}

// current returns the pair in use, after re-reading the files if the check
// interval has passed; changed is true when a new pair was loaded just now.
func (k *keyPair) current() (c *tls.Certificate, changed bool) {
	k.mu.Lock()
	if k.now().Sub(k.checked) < k.interval {
		c = k.cert
		k.mu.Unlock()
		return c, false
	}
	k.checked = k.now()
	certPEM, keyPEM, fresh, err := k.read()
	if err == nil && (!bytes.Equal(certPEM, k.certPEM) || !bytes.Equal(keyPEM, k.keyPEM)) {
		k.cert, k.certPEM, k.keyPEM = fresh, certPEM, keyPEM
		changed = true
	}
	c, onChange := k.cert, k.onChange
	k.mu.Unlock()
	if changed && onChange != nil {
		onChange()
	}
	return c, changed
}

// getClientCertificate is tls.Config.GetClientCertificate.
func (k *keyPair) getClientCertificate(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
	c, _ := k.current()
	return c, nil
}

func loadCAPool(dir string) (*x509.CertPool, error) {
	path := filepath.Join(dir, CAFile)
	caPEM, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("broker CA: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		return nil, fmt.Errorf("broker CA %s: no PEM certificate found", path)
	}
	return pool, nil
}
