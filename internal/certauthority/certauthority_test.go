package certauthority

import (
	"bytes"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

func newCA(t *testing.T, cn string) *CA {
	t.Helper()
	ca, err := NewCA(cn)
	if err != nil {
		t.Fatalf("NewCA(%q): %v", cn, err)
	}
	return ca
}

func parseCert(t *testing.T, certPEM []byte) *x509.Certificate {
	t.Helper()
	block, rest := pem.Decode(certPEM)
	if block == nil || block.Type != "CERTIFICATE" {
		t.Fatalf("no CERTIFICATE PEM block in %q", certPEM)
	}
	if len(bytes.TrimSpace(rest)) != 0 {
		t.Fatalf("unexpected data after certificate: %q", rest)
	}
	c, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatalf("ParseCertificate: %v", err)
	}
	return c
}

func TestNewCA(t *testing.T) {
	ca := newCA(t, "test-ca")
	c := ca.Cert
	if !c.IsCA || !c.BasicConstraintsValid {
		t.Errorf("IsCA=%v BasicConstraintsValid=%v, want both true", c.IsCA, c.BasicConstraintsValid)
	}
	if c.KeyUsage&x509.KeyUsageCertSign == 0 {
		t.Errorf("KeyUsage %v lacks CertSign", c.KeyUsage)
	}
	if c.PublicKeyAlgorithm != x509.ECDSA {
		t.Errorf("PublicKeyAlgorithm = %v, want ECDSA", c.PublicKeyAlgorithm)
	}
	if c.Subject.CommonName != "test-ca" {
		t.Errorf("CN = %q", c.Subject.CommonName)
	}
	if got := time.Until(c.NotAfter); got < 9*365*24*time.Hour {
		t.Errorf("CA valid for %v, want ~10 years", got)
	}
	if !c.NotBefore.Before(time.Now().Add(-30 * time.Second)) {
		t.Errorf("NotBefore %v is not backdated", c.NotBefore)
	}
	if c.SerialNumber.BitLen() < 64 {
		t.Errorf("serial %v looks too small for a random 128-bit number", c.SerialNumber)
	}
	if !bytes.Equal(parseCert(t, ca.CertPEM).Raw, c.Raw) {
		t.Error("CertPEM does not encode Cert")
	}
	if _, err := NewCA(""); err == nil {
		t.Error("NewCA(\"\") succeeded")
	}
}

func TestIssueClient(t *testing.T) {
	ca := newCA(t, "test-ca")
	p, err := ca.IssueClient("rome")
	if err != nil {
		t.Fatal(err)
	}
	c := parseCert(t, p.CertPEM)
	if c.Subject.CommonName != "rome" {
		t.Errorf("CN = %q, want rome", c.Subject.CommonName)
	}
	if !slices.Equal(c.ExtKeyUsage, []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}) {
		t.Errorf("ExtKeyUsage = %v, want [ClientAuth]", c.ExtKeyUsage)
	}
	if c.IsCA {
		t.Error("client certificate is a CA")
	}
	if _, err := c.Verify(x509.VerifyOptions{
		Roots:     ca.Pool(),
		KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}); err != nil {
		t.Errorf("client chain does not verify: %v", err)
	}
	// A client certificate must not be usable as a server certificate.
	if _, err := c.Verify(x509.VerifyOptions{Roots: ca.Pool()}); err == nil {
		t.Error("client certificate verified for server auth")
	}
	if !strings.Contains(string(p.KeyPEM), "-----BEGIN PRIVATE KEY-----") {
		t.Errorf("key is not PKCS#8 PEM: %q", p.KeyPEM[:40])
	}
	if _, err := p.TLSCertificate(); err != nil {
		t.Errorf("TLSCertificate: %v", err)
	}
}

func TestIssueServer(t *testing.T) {
	ca := newCA(t, "test-ca")
	hosts := []string{"localhost", "127.0.0.1", "::1", "rb-broker.resource-broker.svc"}
	p, err := ca.IssueServer("rb-broker", hosts)
	if err != nil {
		t.Fatal(err)
	}
	c := parseCert(t, p.CertPEM)
	if !slices.Equal(c.DNSNames, []string{"localhost", "rb-broker.resource-broker.svc"}) {
		t.Errorf("DNSNames = %v", c.DNSNames)
	}
	if len(c.IPAddresses) != 2 || !c.IPAddresses[0].Equal(net.ParseIP("127.0.0.1")) || !c.IPAddresses[1].Equal(net.IPv6loopback) {
		t.Errorf("IPAddresses = %v", c.IPAddresses)
	}
	if !slices.Equal(c.ExtKeyUsage, []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}) {
		t.Errorf("ExtKeyUsage = %v, want [ServerAuth]", c.ExtKeyUsage)
	}
	if got := time.Until(c.NotAfter); got < 364*24*time.Hour || got > 366*24*time.Hour {
		t.Errorf("server cert valid for %v, want ~1 year", got)
	}
	if !c.NotBefore.Before(time.Now().Add(-30 * time.Second)) {
		t.Errorf("NotBefore %v is not backdated", c.NotBefore)
	}
	for _, h := range hosts {
		if _, err := c.Verify(x509.VerifyOptions{Roots: ca.Pool(), DNSName: h}); err != nil {
			t.Errorf("verify for %q: %v", h, err)
		}
	}
	if _, err := c.Verify(x509.VerifyOptions{Roots: ca.Pool(), DNSName: "evil.example"}); err == nil {
		t.Error("verified for a host not in the SANs")
	}
	if _, err := ca.IssueServer("rb-broker", nil); err == nil {
		t.Error("IssueServer without hosts succeeded")
	}
}

func TestSerialsDiffer(t *testing.T) {
	ca := newCA(t, "test-ca")
	a, _ := ca.IssueClient("a")
	b, _ := ca.IssueClient("a")
	if parseCert(t, a.CertPEM).SerialNumber.Cmp(parseCert(t, b.CertPEM).SerialNumber) == 0 {
		t.Error("two certificates got the same serial number")
	}
}

func TestIssueClientInvalidCN(t *testing.T) {
	ca := newCA(t, "test-ca")
	for _, cn := range []string{"", "Rome", "rome_1", "rome.it", "-rome", "rome-", strings.Repeat("a", 64)} {
		_, err := ca.IssueClient(cn)
		if err == nil {
			t.Errorf("IssueClient(%q) succeeded", cn)
			continue
		}
		if !strings.Contains(err.Error(), "invalid cluster id") || !strings.Contains(err.Error(), "DNS-1123") {
			t.Errorf("IssueClient(%q) error is unclear: %v", cn, err)
		}
	}
	for _, cn := range []string{"rome", "a", "cluster-1", strings.Repeat("a", 63)} {
		if _, err := ca.IssueClient(cn); err != nil {
			t.Errorf("IssueClient(%q): %v", cn, err)
		}
	}
}

func TestSaveLoadCA(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "ca")
	ca := newCA(t, "test-ca")
	if err := ca.Save(dir); err != nil {
		t.Fatal(err)
	}
	assertMode(t, filepath.Join(dir, "ca.crt"), 0o644)
	assertMode(t, filepath.Join(dir, "ca.key"), 0o600)
	keyPEM, _ := os.ReadFile(filepath.Join(dir, "ca.key"))
	if !bytes.HasPrefix(keyPEM, []byte("-----BEGIN PRIVATE KEY-----")) {
		t.Errorf("ca.key is not a PKCS#8 PEM key")
	}

	loaded, err := LoadCA(dir)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(loaded.CertPEM, ca.CertPEM) || !loaded.Cert.Equal(ca.Cert) {
		t.Error("loaded CA certificate differs")
	}
	// The loaded key must sign certificates that verify against the
	// original CA.
	p, err := loaded.IssueClient("paris")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := parseCert(t, p.CertPEM).Verify(x509.VerifyOptions{
		Roots:     ca.Pool(),
		KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}); err != nil {
		t.Errorf("cert from loaded CA does not verify: %v", err)
	}

	// Saving again over files with wrong modes fixes the modes.
	if err := os.Chmod(filepath.Join(dir, "ca.key"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := ca.Save(dir); err != nil {
		t.Fatal(err)
	}
	assertMode(t, filepath.Join(dir, "ca.key"), 0o600)
}

func TestLoadCAErrors(t *testing.T) {
	if _, err := LoadCA(t.TempDir()); err == nil || !errors.Is(err, os.ErrNotExist) {
		t.Errorf("LoadCA on empty dir: %v, want not-exist error", err)
	}

	// Key of another CA.
	dir := t.TempDir()
	a, b := newCA(t, "a"), newCA(t, "b")
	if err := a.Save(dir); err != nil {
		t.Fatal(err)
	}
	other := t.TempDir()
	if err := b.Save(other); err != nil {
		t.Fatal(err)
	}
	keyB, _ := os.ReadFile(filepath.Join(other, "ca.key"))
	if err := os.WriteFile(filepath.Join(dir, "ca.key"), keyB, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadCA(dir); err == nil || !strings.Contains(err.Error(), "does not match") {
		t.Errorf("LoadCA with mismatched key: %v", err)
	}

	// Garbage key.
	if err := os.WriteFile(filepath.Join(dir, "ca.key"), []byte("nope"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadCA(dir); err == nil {
		t.Error("LoadCA with garbage key succeeded")
	}
}

func TestWriteTLSDir(t *testing.T) {
	ca := newCA(t, "test-ca")
	p, err := ca.IssueClient("berlin")
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), "clusters", "berlin")
	if err := WriteTLSDir(dir, p, ca.CertPEM); err != nil {
		t.Fatal(err)
	}
	assertMode(t, filepath.Join(dir, "tls.crt"), 0o644)
	assertMode(t, filepath.Join(dir, "tls.key"), 0o600)
	assertMode(t, filepath.Join(dir, "ca.crt"), 0o644)
	for name, want := range map[string][]byte{"tls.crt": p.CertPEM, "tls.key": p.KeyPEM, "ca.crt": ca.CertPEM} {
		got, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil || !bytes.Equal(got, want) {
			t.Errorf("%s: content differs (err %v)", name, err)
		}
	}
	// The files load as a TLS key pair, as a pod mounting the Secret would.
	if _, err := tls.LoadX509KeyPair(filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")); err != nil {
		t.Errorf("LoadX509KeyPair: %v", err)
	}
}

// TestWriteTLSDirNarrowsExistingKey: rbctl certs writes the broker's
// certificate again over the files of an earlier run; a key file found
// readable by others is left with mode 0600, its old content replaced.
func TestWriteTLSDirNarrowsExistingKey(t *testing.T) {
	ca := newCA(t, "test-ca")
	p, err := ca.IssueServer("rb-broker", []string{"localhost"})
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	keyFile := filepath.Join(dir, "tls.key")
	if err := os.WriteFile(keyFile, []byte("an earlier key"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(keyFile, 0o644); err != nil { // whatever the umask
		t.Fatal(err)
	}
	if err := WriteTLSDir(dir, p, ca.CertPEM); err != nil {
		t.Fatal(err)
	}
	assertMode(t, keyFile, 0o600)
	if got, _ := os.ReadFile(keyFile); !bytes.Equal(got, p.KeyPEM) {
		t.Errorf("tls.key holds %q, want the new key", got)
	}
}

func assertMode(t *testing.T, path string, want os.FileMode) {
	t.Helper()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if got := fi.Mode().Perm(); got != want {
		t.Errorf("%s: mode %v, want %v", path, got, want)
	}
}

// mtlsResult is what the test server saw of one connection.
type mtlsResult struct {
	cn  string
	err error
}

// startMTLSServer listens on 127.0.0.1:0 with a certificate issued by ca and
// requires client certificates issued by ca. It handles one connection,
// answers "ok\n" after a successful handshake and reports what it saw.
func startMTLSServer(t *testing.T, ca *CA) (addr string, results <-chan mtlsResult) {
	t.Helper()
	srvPair, err := ca.IssueServer("rb-broker", []string{"localhost", "127.0.0.1", "::1"})
	if err != nil {
		t.Fatal(err)
	}
	srvCert, err := srvPair.TLSCertificate()
	if err != nil {
		t.Fatal(err)
	}
	ln, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{
		Certificates: []tls.Certificate{srvCert},
		ClientCAs:    ca.Pool(),
		ClientAuth:   tls.RequireAndVerifyClientCert,
		MinVersion:   tls.VersionTLS12,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })

	ch := make(chan mtlsResult, 1)
	go func() {
		conn, err := ln.Accept()
		if err != nil {
			ch <- mtlsResult{err: err}
			return
		}
		defer conn.Close()
		_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
		tc := conn.(*tls.Conn)
		if err := tc.Handshake(); err != nil {
			ch <- mtlsResult{err: err}
			return
		}
		st := tc.ConnectionState()
		if len(st.PeerCertificates) == 0 {
			ch <- mtlsResult{err: errors.New("no peer certificate")}
			return
		}
		_, err = io.WriteString(tc, "ok\n")
		ch <- mtlsResult{cn: st.PeerCertificates[0].Subject.CommonName, err: err}
	}()
	return ln.Addr().String(), ch
}

// dialMTLS connects to addr trusting roots, presenting cert if not nil, and
// reads the server's greeting. With TLS 1.3 a rejected client certificate
// only surfaces on the first read, hence the read.
//
// The certificate is presented through GetClientCertificate so that it is
// sent even when it was not issued by one of the CAs the server asks for (a
// crypto/tls client given Certificates silently sends none in that case,
// which would not exercise the server's chain verification).
func dialMTLS(addr string, roots *x509.CertPool, cert *tls.Certificate) (string, error) {
	conn, err := tls.DialWithDialer(&net.Dialer{Timeout: 10 * time.Second}, "tcp", addr, &tls.Config{
		RootCAs: roots,
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			if cert == nil {
				return &tls.Certificate{}, nil
			}
			return cert, nil
		},
		MinVersion: tls.VersionTLS12,
	})
	if err != nil {
		return "", err
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
	buf := make([]byte, 3)
	if _, err := io.ReadFull(conn, buf); err != nil {
		return "", err
	}
	return string(buf), nil
}

func waitResult(t *testing.T, ch <-chan mtlsResult) mtlsResult {
	t.Helper()
	select {
	case r := <-ch:
		return r
	case <-time.After(15 * time.Second):
		t.Fatal("server did not report")
		return mtlsResult{}
	}
}

func TestMTLSAcceptsIssuedClient(t *testing.T) {
	ca := newCA(t, "test-ca")
	addr, results := startMTLSServer(t, ca)

	p, err := ca.IssueClient("rome")
	if err != nil {
		t.Fatal(err)
	}
	cert, err := p.TLSCertificate()
	if err != nil {
		t.Fatal(err)
	}
	got, err := dialMTLS(addr, ca.Pool(), &cert)
	if err != nil {
		t.Fatalf("client: %v", err)
	}
	if got != "ok\n" {
		t.Errorf("client read %q", got)
	}
	r := waitResult(t, results)
	if r.err != nil {
		t.Fatalf("server: %v", r.err)
	}
	if r.cn != "rome" {
		t.Errorf("server saw CN %q, want rome", r.cn)
	}
}

func TestMTLSRejectsClientWithoutCertificate(t *testing.T) {
	ca := newCA(t, "test-ca")
	addr, results := startMTLSServer(t, ca)

	if _, err := dialMTLS(addr, ca.Pool(), nil); err == nil {
		t.Error("client without certificate was accepted")
	}
	r := waitResult(t, results)
	if r.err == nil {
		t.Fatalf("server accepted a client without certificate (CN %q)", r.cn)
	}
	t.Logf("server: %v", r.err)
	if !strings.Contains(r.err.Error(), "certificate") {
		t.Errorf("unexpected server error: %v", r.err)
	}
}

func TestMTLSRejectsClientFromOtherCA(t *testing.T) {
	ca := newCA(t, "test-ca")
	other := newCA(t, "other-ca")
	addr, results := startMTLSServer(t, ca)

	p, err := other.IssueClient("rome")
	if err != nil {
		t.Fatal(err)
	}
	cert, err := p.TLSCertificate()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := dialMTLS(addr, ca.Pool(), &cert); err == nil {
		t.Error("client with a certificate from another CA was accepted")
	}
	r := waitResult(t, results)
	if r.err == nil {
		t.Fatalf("server accepted a foreign client certificate (CN %q)", r.cn)
	}
	t.Logf("server: %v", r.err)
	var unknownAuthority x509.UnknownAuthorityError
	if !errors.As(r.err, &unknownAuthority) && !strings.Contains(r.err.Error(), "unknown authority") {
		t.Errorf("server error is not an unknown-authority error: %v", r.err)
	}
}

func TestMTLSClientRejectsServerFromOtherCA(t *testing.T) {
	ca := newCA(t, "test-ca")
	addr, results := startMTLSServer(t, ca)

	p, err := ca.IssueClient("rome")
	if err != nil {
		t.Fatal(err)
	}
	cert, err := p.TLSCertificate()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := dialMTLS(addr, newCA(t, "other-ca").Pool(), &cert); err == nil {
		t.Error("client trusted a server certificate from another CA")
	}
	if r := waitResult(t, results); r.err == nil {
		t.Error("server completed a handshake the client should have aborted")
	}
}

func TestIssueUserCarriesGroups(t *testing.T) {
	ca, err := NewCA("test CA")
	if err != nil {
		t.Fatal(err)
	}
	p, err := ca.IssueUser("system:node:n1", []string{"system:nodes"})
	if err != nil {
		t.Fatal(err)
	}
	block, _ := pem.Decode(p.CertPEM)
	cert, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	if cert.Subject.CommonName != "system:node:n1" || len(cert.Subject.Organization) != 1 || cert.Subject.Organization[0] != "system:nodes" {
		t.Fatalf("subject %v", cert.Subject)
	}
	if _, err := cert.Verify(x509.VerifyOptions{Roots: ca.Pool(), KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
		t.Fatalf("not a client certificate of the CA: %v", err)
	}
	if _, err := ca.IssueUser(" ", nil); err == nil {
		t.Fatal("an empty user name was accepted")
	}
}

// TestSignClientCSR: a member's request is signed as IssueClient issues,
// for its own key; a request for anything more is refused.
func TestSignClientCSR(t *testing.T) {
	ca := newCA(t, "members")
	csrPEM, keyPEM, err := NewClientCSR("paris")
	if err != nil {
		t.Fatal(err)
	}
	certPEM, err := ca.SignClientCSR(csrPEM, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	pair := Pair{CertPEM: certPEM, KeyPEM: keyPEM}
	if _, err := pair.TLSCertificate(); err != nil {
		t.Fatalf("the certificate is not for the request's key: %v", err)
	}
	block, _ := pem.Decode(certPEM)
	cert, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	if cert.Subject.CommonName != "paris" || !slices.Equal(cert.ExtKeyUsage, []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}) {
		t.Errorf("CN %q, usages %v: want paris, client auth only", cert.Subject.CommonName, cert.ExtKeyUsage)
	}
	if d := cert.NotAfter.Sub(cert.NotBefore); d != time.Hour+clockSkew {
		t.Errorf("valid for %s, want 1h (and the clock skew)", d)
	}
	if _, err := cert.Verify(x509.VerifyOptions{Roots: ca.Pool(), KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
		t.Errorf("not a client certificate of the CA: %v", err)
	}

	// Subject alternative names: a member's certificate names its cluster only.
	key, err := parseKeyPEM(keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{Subject: pkix.Name{CommonName: "paris"}, DNSNames: []string{"broker.example"}}, key)
	if err != nil {
		t.Fatal(err)
	}
	withSAN := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der})
	for name, tc := range map[string]struct {
		csr  []byte
		want string
	}{
		"SANs":      {withSAN, "asks for subject alternative names"},
		"not a CSR": {certPEM, "no PEM CERTIFICATE REQUEST block"},
		"tampered":  {bytes.Replace(csrPEM, csrPEM[60:64], []byte("AAAA"), 1), "certauthority:"},
	} {
		if _, err := ca.SignClientCSR(tc.csr, time.Hour); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: SignClientCSR: %v, want an error with %q", name, err, tc.want)
		}
	}
	if _, _, err := NewClientCSR("Paris"); err == nil {
		t.Error("NewClientCSR(\"Paris\"): an invalid cluster id accepted")
	}
}
