package server

import (
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"math/big"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fluidos-project/resource-broker/internal/certauthority"
	"github.com/fluidos-project/resource-broker/internal/certdir"
)

func serverFiles(t *testing.T, ca *certauthority.CA, caPEM []byte) map[string][]byte {
	t.Helper()
	pair, err := ca.IssueServer("rb-broker", []string{"127.0.0.1"})
	require.NoError(t, err)
	return map[string][]byte{certdir.CertFile: pair.CertPEM, certdir.KeyFile: pair.KeyPEM, certdir.CAFile: caPEM}
}

// handshake is the connection state of a client certificate of ca as the
// handshake verified it.
func handshake(t *testing.T, ca *certauthority.CA) *tls.ConnectionState {
	t.Helper()
	pair, err := ca.IssueClient("rome")
	require.NoError(t, err)
	cert, err := pair.TLSCertificate()
	require.NoError(t, err)
	leaf, err := x509.ParseCertificate(cert.Certificate[0])
	require.NoError(t, err)
	chains, err := leaf.Verify(x509.VerifyOptions{Roots: ca.Pool(), KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}})
	require.NoError(t, err)
	return &tls.ConnectionState{PeerCertificates: []*x509.Certificate{leaf}, VerifiedChains: chains}
}

// renewed is ca's certificate issued again with the same key, as
// cert-manager renews a CA with rotationPolicy: Never.
func renewed(t *testing.T, ca *certauthority.CA) []byte {
	t.Helper()
	tmpl := *ca.Cert
	tmpl.SerialNumber = big.NewInt(time.Now().UnixNano())
	tmpl.NotBefore, tmpl.NotAfter = time.Now().Add(-time.Minute), time.Now().Add(time.Hour)
	der, err := x509.CreateCertificate(rand.Reader, &tmpl, &tmpl, ca.Key.Public(), ca.Key)
	require.NoError(t, err)
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
}

// TestCertsGenerations: a new serving certificate leaves the connections'
// trust alone; a change of the client CAs makes each connection verify again:
// kept when its certificate still chains (a renewed CA with the same key),
// lost when its CA was removed.
func TestCertsGenerations(t *testing.T) {
	dir := t.TempDir()
	one, err := certauthority.NewCA("one")
	require.NoError(t, err)
	two, err := certauthority.NewCA("two")
	require.NoError(t, err)
	require.NoError(t, certdir.WriteAtomic(dir, serverFiles(t, one, one.CertPEM)))
	c, err := LoadCerts(dir, 0, testr.New(t))
	require.NoError(t, err)
	st := c.current()
	ofOne := handshake(t, one)
	assert.True(t, st.verify(ofOne))
	assert.False(t, st.verify(handshake(t, two)))
	assert.False(t, st.verify(&tls.ConnectionState{}))

	require.NoError(t, certdir.WriteAtomic(dir, serverFiles(t, one, one.CertPEM)))
	next := c.current()
	assert.NotSame(t, st, next)
	assert.Equal(t, st.caGen, next.caGen, "a new serving certificate, the same CAs")

	require.NoError(t, certdir.WriteAtomic(dir, serverFiles(t, one, renewed(t, one))))
	st = c.current()
	assert.Equal(t, next.caGen+1, st.caGen)
	assert.True(t, st.verify(ofOne), "verified again: the renewed CA has the same key")

	require.NoError(t, certdir.WriteAtomic(dir, serverFiles(t, two, two.CertPEM)))
	st = c.current()
	assert.False(t, st.verify(ofOne), "its CA was removed")
	assert.True(t, st.verify(handshake(t, two)))
	served := st.config.Certificates[0].Leaf
	require.NotNil(t, served)
	assert.NoError(t, served.CheckSignatureFrom(two.Cert))
}
