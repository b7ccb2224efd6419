// Package certauthority is the certificate authority of a federation's
// mutual TLS: an ECDSA P-256 CA that issues the broker's server certificate
// and the members' client certificates (CN = cluster id), and signs the
// members' certificate signing requests.
//
// rbctl certs creates the CA (or reuses the one it finds) and issues the
// broker's certificate, and clusters' ones when asked; rbctl join makes a
// member's key and request (NewClientCSR), and rbctl join (with --ca-dir) or
// rbctl join approve loads the CA to sign the request (SignClientCSR). The
// test harnesses (brokertest, testenv, testbed) make throwaway CAs with it.
//
// Keys: a CA's key is generated and held in memory; Save writes it, PEM
// PKCS #8 and unencrypted, to ca.key with mode 0600 (ca.crt 0644), and
// LoadCA reads it back. The file's mode is its only protection: keep the
// directory where only the CA's operators can read it. A leaf's key is
// generated in memory and returned with its certificate (Pair); WriteTLSDir
// writes it to tls.key with mode 0600. Files written over existing ones get
// exactly these modes. There is no revocation: a certificate is valid until
// it expires (a year at most) or the CA is replaced.
package certauthority

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/fluidos-project/resource-broker/broker/model"
)

// File names used by Save, LoadCA and WriteTLSDir. The TLS directory layout
// matches the keys of a cert-manager (kubernetes.io/tls) Secret.
const (
	CACertFile  = "ca.crt"
	CAKeyFile   = "ca.key"
	TLSCertFile = "tls.crt"
	TLSKeyFile  = "tls.key"
)

const (
	caValidity   = 10 * 365 * 24 * time.Hour
	leafValidity = 365 * 24 * time.Hour
	// clockSkew backdates NotBefore so that freshly issued certificates are
	// accepted by peers whose clock is slightly behind.
	clockSkew = time.Minute
)

// CA is a certificate authority: its certificate and its private key.
type CA struct {
	Cert    *x509.Certificate
	Key     crypto.Signer
	CertPEM []byte
}

// Pair is a PEM certificate and key.
type Pair struct {
	CertPEM, KeyPEM []byte
}

// NewCA creates a self-signed ECDSA P-256 CA valid for 10 years.
func NewCA(commonName string) (*CA, error) {
	if strings.TrimSpace(commonName) == "" {
		return nil, errors.New("certauthority: CA common name must not be empty")
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("certauthority: generating CA key: %w", err)
	}
	serial, err := randomSerial()
	if err != nil {
		return nil, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: commonName},
		NotBefore:             now.Add(-clockSkew),
		NotAfter:              now.Add(caValidity),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return nil, fmt.Errorf("certauthority: creating CA certificate: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("certauthority: parsing CA certificate: %w", err)
	}
	return &CA{
		Cert:    cert,
		Key:     key,
		CertPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
	}, nil
}

// LoadCA reads dir/ca.crt (PEM certificate) and dir/ca.key (PEM PKCS#8
// private key) and checks that they belong together.
func LoadCA(dir string) (*CA, error) {
	certPath := filepath.Join(dir, CACertFile)
	keyPath := filepath.Join(dir, CAKeyFile)

	certPEM, err := os.ReadFile(certPath)
	if err != nil {
		return nil, fmt.Errorf("certauthority: reading CA certificate: %w", err)
	}
	keyPEM, err := os.ReadFile(keyPath)
	if err != nil {
		return nil, fmt.Errorf("certauthority: reading CA key: %w", err)
	}

	certBlock, _ := pem.Decode(certPEM)
	if certBlock == nil || certBlock.Type != "CERTIFICATE" {
		return nil, fmt.Errorf("certauthority: %s: no PEM CERTIFICATE block", certPath)
	}
	cert, err := x509.ParseCertificate(certBlock.Bytes)
	if err != nil {
		return nil, fmt.Errorf("certauthority: %s: %w", certPath, err)
	}
	if !cert.IsCA {
		return nil, fmt.Errorf("certauthority: %s: certificate is not a CA", certPath)
	}

	key, err := parseKeyPEM(keyPEM)
	if err != nil {
		return nil, fmt.Errorf("certauthority: %s: %w", keyPath, err)
	}
	if !publicKeysEqual(cert.PublicKey, key.Public()) {
		return nil, fmt.Errorf("certauthority: %s does not match the certificate in %s", keyPath, certPath)
	}

	return &CA{
		Cert:    cert,
		Key:     key,
		CertPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: cert.Raw}),
	}, nil
}

// Save writes dir/ca.crt (mode 0644) and dir/ca.key (mode 0600), creating
// dir if needed.
func (ca *CA) Save(dir string) error {
	keyPEM, err := marshalKeyPEM(ca.Key)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("certauthority: %w", err)
	}
	if err := writeFile(filepath.Join(dir, CACertFile), ca.CertPEM, 0o644); err != nil {
		return err
	}
	return writeFile(filepath.Join(dir, CAKeyFile), keyPEM, 0o600)
}

// IssueServer issues a server certificate (ExtKeyUsageServerAuth, valid for
// one year). Each host is put in the subject alternative names: as an IP
// address if it parses as one, as a DNS name otherwise.
func (ca *CA) IssueServer(commonName string, hosts []string) (Pair, error) {
	if strings.TrimSpace(commonName) == "" {
		return Pair{}, errors.New("certauthority: server common name must not be empty")
	}
	tmpl := &x509.Certificate{
		Subject:     pkix.Name{CommonName: commonName},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	for _, h := range hosts {
		h = strings.TrimSpace(h)
		if h == "" {
			continue
		}
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	if len(tmpl.IPAddresses)+len(tmpl.DNSNames) == 0 {
		return Pair{}, fmt.Errorf("certauthority: server certificate %q needs at least one host (DNS name or IP)", commonName)
	}
	return ca.issue(tmpl)
}

// IssueClient issues a client certificate (ExtKeyUsageClientAuth, valid for
// one year) whose subject common name is the cluster identity. The name must
// be a DNS-1123 label because cluster ids become namespace names.
func (ca *CA) IssueClient(commonName string) (Pair, error) {
	if err := model.ValidateClusterID(commonName); err != nil {
		return Pair{}, fmt.Errorf("certauthority: %w", err)
	}
	tmpl := &x509.Certificate{
		Subject:     pkix.Name{CommonName: commonName},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	return ca.issue(tmpl)
}

// IssueUser issues a Kubernetes user's client certificate: common name the
// user name, organizations its groups (e.g. system:node:n1 in system:nodes),
// as an API server or a kubelet reads them from a certificate.
func (ca *CA) IssueUser(name string, groups []string) (Pair, error) {
	if strings.TrimSpace(name) == "" {
		return Pair{}, errors.New("certauthority: user name must not be empty")
	}
	tmpl := &x509.Certificate{
		Subject:     pkix.Name{CommonName: name, Organization: groups},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	return ca.issue(tmpl)
}

// WriteTLSDir writes dir/tls.crt (0644), dir/tls.key (0600) and dir/ca.crt
// (0644), the layout of a cert-manager Secret mounted as a volume. dir is
// created if needed.
func WriteTLSDir(dir string, p Pair, caPEM []byte) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("certauthority: %w", err)
	}
	if err := writeFile(filepath.Join(dir, TLSCertFile), p.CertPEM, 0o644); err != nil {
		return err
	}
	if err := writeFile(filepath.Join(dir, TLSKeyFile), p.KeyPEM, 0o600); err != nil {
		return err
	}
	return writeFile(filepath.Join(dir, CACertFile), caPEM, 0o644)
}

// TLSCertificate parses the pair for use in a tls.Config.
func (p Pair) TLSCertificate() (tls.Certificate, error) {
	c, err := tls.X509KeyPair(p.CertPEM, p.KeyPEM)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("certauthority: %w", err)
	}
	return c, nil
}

// Pool returns a new certificate pool holding only the CA certificate, for
// tls.Config.RootCAs (clients) or tls.Config.ClientCAs (servers).
func (ca *CA) Pool() *x509.CertPool {
	pool := x509.NewCertPool()
	pool.AddCert(ca.Cert)
	return pool
}

// issue fills in the common fields of a leaf certificate and signs it.
func (ca *CA) issue(tmpl *x509.Certificate) (Pair, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return Pair{}, fmt.Errorf("certauthority: generating key: %w", err)
	}
	certPEM, err := ca.sign(tmpl, key.Public(), leafValidity)
	if err != nil {
		return Pair{}, err
	}
	keyPEM, err := marshalKeyPEM(key)
	if err != nil {
		return Pair{}, err
	}
	return Pair{CertPEM: certPEM, KeyPEM: keyPEM}, nil
}

// SignClientCSR signs a cluster's certificate signing request (PEM
// "CERTIFICATE REQUEST") as IssueClient would issue it: CN the cluster id,
// client authentication only, valid for validity (at most the CA's own
// end). The request must be signed by its key, name a valid cluster id and
// ask for no subject alternative names: a member certificate names a
// cluster, nothing else.
func (ca *CA) SignClientCSR(csrPEM []byte, validity time.Duration) ([]byte, error) {
	csr, err := ParseCSR(csrPEM)
	if err != nil {
		return nil, err
	}
	if err := model.ValidateClusterID(csr.Subject.CommonName); err != nil {
		return nil, fmt.Errorf("certauthority: certificate request: %w", err)
	}
	if len(csr.DNSNames)+len(csr.IPAddresses)+len(csr.EmailAddresses)+len(csr.URIs) > 0 {
		return nil, fmt.Errorf("certauthority: certificate request for %q asks for subject alternative names; a member certificate names only its cluster", csr.Subject.CommonName)
	}
	if validity <= 0 || validity > leafValidity {
		validity = leafValidity
	}
	tmpl := &x509.Certificate{
		Subject:     pkix.Name{CommonName: csr.Subject.CommonName},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	return ca.sign(tmpl, csr.PublicKey, validity)
}

// ParseCSR parses a PEM certificate signing request ("CERTIFICATE REQUEST")
// and checks that it is signed by the key it asks a certificate for.
func ParseCSR(csrPEM []byte) (*x509.CertificateRequest, error) {
	block, _ := pem.Decode(csrPEM)
	if block == nil || block.Type != "CERTIFICATE REQUEST" {
		return nil, errors.New("certauthority: no PEM CERTIFICATE REQUEST block")
	}
	csr, err := x509.ParseCertificateRequest(block.Bytes)
	if err != nil {
		return nil, fmt.Errorf("certauthority: %w", err)
	}
	if err := csr.CheckSignature(); err != nil {
		return nil, fmt.Errorf("certauthority: certificate request: %w", err)
	}
	return csr, nil
}

// NewClientCSR returns a new key and a certificate signing request for it
// with CN = id, as SignClientCSR signs it.
func NewClientCSR(id string) (csrPEM, keyPEM []byte, err error) {
	if err := model.ValidateClusterID(id); err != nil {
		return nil, nil, fmt.Errorf("certauthority: %w", err)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, fmt.Errorf("certauthority: generating key: %w", err)
	}
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{Subject: pkix.Name{CommonName: id}}, key)
	if err != nil {
		return nil, nil, fmt.Errorf("certauthority: certificate request: %w", err)
	}
	if keyPEM, err = marshalKeyPEM(key); err != nil {
		return nil, nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der}), keyPEM, nil
}

// sign fills in the common fields of a leaf certificate for pub and signs it.
func (ca *CA) sign(tmpl *x509.Certificate, pub crypto.PublicKey, validity time.Duration) ([]byte, error) {
	serial, err := randomSerial()
	if err != nil {
		return nil, err
	}
	now := time.Now()
	tmpl.SerialNumber = serial
	tmpl.NotBefore = now.Add(-clockSkew)
	tmpl.NotAfter = now.Add(validity)
	if tmpl.NotAfter.After(ca.Cert.NotAfter) {
		tmpl.NotAfter = ca.Cert.NotAfter
	}
	tmpl.KeyUsage = x509.KeyUsageDigitalSignature
	tmpl.BasicConstraintsValid = true
	tmpl.IsCA = false

	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, pub, ca.Key)
	if err != nil {
		return nil, fmt.Errorf("certauthority: signing certificate %q: %w", tmpl.Subject.CommonName, err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), nil
}

// randomSerial returns a random positive 128-bit serial number.
func randomSerial() (*big.Int, error) {
	limit := new(big.Int).Lsh(big.NewInt(1), 128)
	for {
		n, err := rand.Int(rand.Reader, limit)
		if err != nil {
			return nil, fmt.Errorf("certauthority: generating serial number: %w", err)
		}
		if n.Sign() > 0 {
			return n, nil
		}
	}
}

// KeyPEM is the CA's private key in PEM (PKCS #8), as Save writes it.
func (ca *CA) KeyPEM() ([]byte, error) { return marshalKeyPEM(ca.Key) }

func marshalKeyPEM(key crypto.Signer) ([]byte, error) {
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, fmt.Errorf("certauthority: marshalling private key: %w", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), nil
}

func parseKeyPEM(keyPEM []byte) (crypto.Signer, error) {
	block, _ := pem.Decode(keyPEM)
	if block == nil || block.Type != "PRIVATE KEY" {
		return nil, errors.New("no PEM PRIVATE KEY (PKCS#8) block")
	}
	k, err := x509.ParsePKCS8PrivateKey(block.Bytes)
	if err != nil {
		return nil, err
	}
	signer, ok := k.(crypto.Signer)
	if !ok {
		return nil, fmt.Errorf("unsupported private key type %T", k)
	}
	return signer, nil
}

func publicKeysEqual(a, b crypto.PublicKey) bool {
	ea, ok := a.(interface{ Equal(crypto.PublicKey) bool })
	return ok && ea.Equal(b)
}

// writeFile writes data to path with exactly perm, also when the file
// already existed with another mode (os.WriteFile only applies perm, minus
// the umask, on creation). An existing file is narrowed before the new
// content is written so a key is never readable with a wider mode.
func writeFile(path string, data []byte, perm os.FileMode) error {
	if err := os.Chmod(path, perm); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("certauthority: %w", err)
	}
	if err := os.WriteFile(path, data, perm); err != nil {
		return fmt.Errorf("certauthority: %w", err)
	}
	if err := os.Chmod(path, perm); err != nil {
		return fmt.Errorf("certauthority: %w", err)
	}
	return nil
}
