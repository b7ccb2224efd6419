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

// TLSConfig returns a server configuration that requires client certificates
// signed by dir/ca.crt and serves dir/tls.crt + dir/tls.key (the layout of a
// cert-manager Secret). The key pair is re-read when the files change, so a
// renewed certificate is picked up without a restart.
func TLSConfig(dir string) (*tls.Config, error) {
	caPEM, err := os.ReadFile(filepath.Join(dir, "ca.crt"))
	if err != nil {
		return nil, fmt.Errorf("read client CA: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		return nil, fmt.Errorf("%s: no PEM certificate found", filepath.Join(dir, "ca.crt"))
	}
	kp := &keyPair{cert: filepath.Join(dir, "tls.crt"), key: filepath.Join(dir, "tls.key")}
	if _, err := kp.get(nil); err != nil {
		return nil, err
	}
	return &tls.Config{
		MinVersion:     tls.VersionTLS12,
		ClientAuth:     tls.RequireAndVerifyClientCert,
		ClientCAs:      pool,
		GetCertificate: kp.get,
		NextProtos:     []string{"h2", "http/1.1"},
	}, nil
}

// keyPair caches a certificate and reloads it at most every 30 s when the
// file's modification time changed.
type keyPair struct {
	cert, key string
	mu        sync.Mutex
	loaded    *tls.Certificate
	modTime   time.Time
	checked   time.Time
}

func (k *keyPair) get(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.loaded != nil && time.Since(k.checked) < 30*time.Second {
		return k.loaded, nil
	}
	k.checked = time.Now()
	st, err := os.Stat(k.cert)
	if err != nil {
		if k.loaded != nil {
			return k.loaded, nil
		}
		return nil, fmt.Errorf("server certificate: %w", err)
	}
	if k.loaded != nil && st.ModTime().Equal(k.modTime) {
		return k.loaded, nil
	}
	c, err := tls.LoadX509KeyPair(k.cert, k.key)
	if err != nil {
		if k.loaded != nil {
			return k.loaded, nil // keep serving the old pair while a rotation is half-written
		}
		return nil, fmt.Errorf("server key pair: %w", err)
	}
	k.loaded, k.modTime = &c, st.ModTime()
	return k.loaded, nil
}
