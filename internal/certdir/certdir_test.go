package certdir_test

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fluidos-project/resource-broker/internal/certauthority"
	"github.com/fluidos-project/resource-broker/internal/certdir"
)

func issue(t *testing.T, ca *certauthority.CA, cn string) map[string][]byte {
	t.Helper()
	pair, err := ca.IssueClient(cn)
	require.NoError(t, err)
	return map[string][]byte{certdir.CertFile: pair.CertPEM, certdir.KeyFile: pair.KeyPEM, certdir.CAFile: ca.CertPEM}
}

func newCA(t *testing.T, name string) *certauthority.CA {
	t.Helper()
	ca, err := certauthority.NewCA(name)
	require.NoError(t, err)
	return ca
}

// TestKubeletRotation: the directory is updated as the kubelet updates a
// mounted Secret (a ..data link swap); the new version is loaded as a whole.
func TestKubeletRotation(t *testing.T) {
	dir := t.TempDir()
	ca := newCA(t, "one")
	require.NoError(t, certdir.WriteAtomic(dir, issue(t, ca, "rome")))
	d, err := certdir.Open(dir, 0) // every call checks
	require.NoError(t, err)
	first := d.Current()
	assert.Equal(t, "rome", first.Cert.Leaf.Subject.CommonName)
	require.Len(t, first.CAs, 1)

	f, changed, err := d.Files()
	require.NoError(t, err)
	assert.False(t, changed)
	assert.Same(t, first, f, "same contents, same files")

	other := newCA(t, "two")
	files := issue(t, other, "milan")
	files[certdir.CAFile] = append(append([]byte{}, ca.CertPEM...), other.CertPEM...) // a CA bundle
	require.NoError(t, certdir.WriteAtomic(dir, files))
	f, changed, err = d.Files()
	require.NoError(t, err)
	assert.True(t, changed)
	assert.Equal(t, "milan", f.Cert.Leaf.Subject.CommonName)
	assert.Len(t, f.CAs, 2)
	entries, err := filepath.Glob(filepath.Join(dir, "..2*"))
	require.NoError(t, err)
	assert.Len(t, entries, 1, "the previous version's directory is gone")
}

// TestInterval: a change is noticed at the first call after the interval.
func TestInterval(t *testing.T) {
	dir := t.TempDir()
	ca := newCA(t, "one")
	require.NoError(t, certdir.WriteAtomic(dir, issue(t, ca, "rome")))
	d, err := certdir.Open(dir, 200*time.Millisecond)
	require.NoError(t, err)
	require.NoError(t, certdir.WriteAtomic(dir, issue(t, ca, "milan")))
	f, changed, _ := d.Files()
	assert.False(t, changed, "not due")
	assert.Equal(t, "rome", f.Cert.Leaf.Subject.CommonName)
	require.Eventually(t, func() bool { _, changed, _ := d.Files(); return changed }, 2*time.Second, 10*time.Millisecond)
	assert.Equal(t, "milan", d.Current().Cert.Leaf.Subject.CommonName)
}

// TestBrokenFilesKeepTheLastGood: files written in place, seen half-way
// (a key of another certificate, garbage, a missing CA), do not replace the
// files in use; the finished set does.
func TestBrokenFilesKeepTheLastGood(t *testing.T) {
	dir := t.TempDir()
	ca := newCA(t, "one")
	good := issue(t, ca, "rome")
	for name, data := range good {
		require.NoError(t, os.WriteFile(filepath.Join(dir, name), data, 0o600))
	}
	d, err := certdir.Open(dir, 0)
	require.NoError(t, err)
	first := d.Current()

	next := issue(t, ca, "milan")
	require.NoError(t, os.WriteFile(filepath.Join(dir, certdir.CertFile), next[certdir.CertFile], 0o600)) // the key is still rome's
	f, changed, err := d.Files()
	assert.ErrorContains(t, err, "key pair")
	assert.False(t, changed)
	assert.Same(t, first, f)

	require.NoError(t, os.WriteFile(filepath.Join(dir, certdir.KeyFile), next[certdir.KeyFile], 0o600))
	require.NoError(t, os.WriteFile(filepath.Join(dir, certdir.CAFile), []byte("not a certificate"), 0o600))
	_, changed, err = d.Files()
	assert.ErrorContains(t, err, "no PEM certificate")
	assert.False(t, changed)

	require.NoError(t, os.Remove(filepath.Join(dir, certdir.CAFile)))
	_, _, err = d.Files()
	assert.ErrorContains(t, err, filepath.Join(dir, certdir.CAFile)+" does not exist")

	require.NoError(t, os.WriteFile(filepath.Join(dir, certdir.CAFile), ca.CertPEM, 0o600))
	f, changed, err = d.Files()
	require.NoError(t, err)
	assert.True(t, changed)
	assert.Equal(t, "milan", f.Cert.Leaf.Subject.CommonName)

	_, err = certdir.Open(t.TempDir(), 0)
	assert.ErrorContains(t, err, "tls.crt")
}
