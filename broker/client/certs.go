package client

import (
	"crypto/tls"

	"github.com/fluidos-project/resource-broker/internal/certdir"
)

// Files of a cert-manager (kubernetes.io/tls) Secret mounted as a volume.
const (
	CertFile = certdir.CertFile
	KeyFile  = certdir.KeyFile
	CAFile   = certdir.CAFile
)

// tlsConfigFor is the client configuration of one version of the
// certificate directory: its key pair, and its ca.crt as the CAs that sign
// the broker's certificate.
func tlsConfigFor(f *certdir.Files) *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS12,
		RootCAs:    f.Pool,
		// Always the pair, even if the broker names other acceptable CAs
		// (after a CA rotation): its refusal then says why.
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return f.Cert, nil },
	}
}

// checkCerts reads the certificate directory again if it is due and, when it
// changed, moves to a new connection pool with the new files.
func (c *Client) checkCerts() *certdir.Files {
	f, changed, _ := c.certs.Files() // a rotation seen half-written: the last good files stay in use
	if changed {
		c.renewTransport()
	}
	return f
}
