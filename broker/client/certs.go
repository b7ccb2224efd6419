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
		// New files, a new configuration: a session resumed is always one
		// of the certificate these files hold.
		ClientSessionCache: tls.NewLRUClientSessionCache(sessionCacheSize),
	}
}

// sessionCacheSize is how many TLS sessions a client keeps to resume: one
// per broker address it calls. A connection opened beside the idle ones (a
// burst of calls past WithIdleConns, one closed by the broker) then resumes
// the session of an earlier one: no certificate signed or verified on
// either side (the broker restores the client's certificate from its
// ticket and checks it against its current CAs on every call). A broker
// replica that did not issue the ticket, or whose files changed since,
// makes it a full handshake.
const sessionCacheSize = 8

// checkCerts reads the certificate directory again if it is due and, when it
// changed, moves to a new connection pool with the new files.
func (c *Client) checkCerts() *certdir.Files {
	f, changed, _ := c.certs.Files() // a rotation seen half-written: the last good files stay in use
	if changed {
		c.renewTransport()
	}
	return f
}
