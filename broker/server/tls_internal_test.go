package server

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fluidos-project/resource-broker/internal/devcerts"
)

func writeCerts(t *testing.T, dir string, when time.Time) *devcerts.CA {
	t.Helper()
	ca, err := devcerts.NewCA("ca")
	require.NoError(t, err)
	pair, err := ca.IssueServer("rb-broker", []string{"127.0.0.1"})
	require.NoError(t, err)
	require.NoError(t, devcerts.WriteTLSDir(dir, pair, ca.CertPEM))
	for _, f := range []string{"tls.crt", "tls.key", "ca.crt"} {
		require.NoError(t, os.Chtimes(filepath.Join(dir, f), when, when))
	}
	return ca
}

func TestTLSReloadsRotatedFiles(t *testing.T) {
	dir := t.TempDir()
	first := writeCerts(t, dir, time.Now().Add(-time.Hour))
	r := &tlsReloader{dir: dir}
	before, err := r.get(nil)
	require.NoError(t, err)
	assert.True(t, before.ClientCAs.Equal(first.Pool()))

	second := writeCerts(t, dir, time.Now())
	same, err := r.get(nil)
	require.NoError(t, err)
	assert.Same(t, before, same, "files are not re-read within checkEvery")

	r.checked = time.Time{} // as if checkEvery had passed
	after, err := r.get(nil)
	require.NoError(t, err)
	assert.True(t, after.ClientCAs.Equal(second.Pool()), "the new CA is trusted")
	assert.NotEqual(t, before.Certificates[0].Certificate[0], after.Certificates[0].Certificate[0], "the new key pair is served")

	require.NoError(t, os.WriteFile(filepath.Join(dir, "tls.key"), []byte("half-written"), 0o600))
	r.checked = time.Time{}
	kept, err := r.get(nil)
	require.NoError(t, err)
	assert.Same(t, after, kept, "a broken rotation keeps the last good configuration")
}
