// Package certdir reads a directory of TLS files in the layout of a
// cert-manager Secret mounted as a volume (tls.crt, tls.key, ca.crt) and
// reads it again when its contents change, for the broker's server and its
// clients to pick up rotated certificates without a restart.
//
// The kubelet updates a mounted Secret by writing the new files into a fresh
// directory and swapping the symbolic link ..data to it; tls.crt and the
// others are links through ..data. A Dir reads through the resolved ..data
// when there is one, so the three files it reads always come from one
// version of the Secret; elsewhere (files written in place) a set read in the
// middle of an update either fails to load or differs from the next read, so
// the next check loads the finished set. Changes are found by comparing
// contents (SHA-256), not modification times, on demand and at most once per
// interval: an idle process reads nothing.
package certdir

import (
	"bytes"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"
)

// Files of a kubernetes.io/tls Secret (cert-manager adds ca.crt).
const (
	CertFile = "tls.crt"
	KeyFile  = "tls.key"
	CAFile   = "ca.crt"
)

// Files is one loaded version of the directory.
type Files struct {
	Cert *tls.Certificate // its Leaf is set
	// CAs are the certificates of ca.crt, Pool the same as a pool.
	CAs  []*x509.Certificate
	Pool *x509.CertPool
	// Version is the SHA-256 of the three files' contents.
	Version [sha256.Size]byte
}

// Dir is a certificate directory, read again when it changed.
type Dir struct {
	path     string
	interval time.Duration
	now      func() time.Time

	cur  atomic.Pointer[Files]
	next atomic.Int64 // Unix nanoseconds of the next check
	mu   sync.Mutex   // one read at a time
}

// Open loads path and returns a Dir that checks it again at most every
// interval (0: at every call of Files).
func Open(path string, interval time.Duration) (*Dir, error) {
	d := &Dir{path: path, interval: interval, now: time.Now}
	f, err := d.read(nil)
	if err != nil {
		return nil, err
	}
	d.cur.Store(f)
	d.next.Store(d.now().Add(interval).UnixNano())
	return d, nil
}

// Current returns the files in use, without checking the directory.
func (d *Dir) Current() *Files { return d.cur.Load() }

// Path is the directory.
func (d *Dir) Path() string { return d.path }

// Files returns the files in use. If interval has passed since the last
// check, it reads the directory first: changed is true when that loaded a
// new version, err says why the directory did not load (the last good files
// stay in use, as a half-written rotation must not break anything). Between
// checks it costs one atomic load.
func (d *Dir) Files() (f *Files, changed bool, err error) {
	next := d.next.Load()
	now := d.now()
	if now.UnixNano() < next || !d.next.CompareAndSwap(next, now.Add(d.interval).UnixNano()) {
		return d.cur.Load(), false, nil // not due, or another caller checks
	}
	return d.Reload()
}

// Reload reads the directory now.
func (d *Dir) Reload() (f *Files, changed bool, err error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	old := d.cur.Load()
	f, err = d.read(old)
	if err != nil {
		return old, false, err
	}
	if f == old {
		return old, false, nil
	}
	d.cur.Store(f)
	return f, true, nil
}

// read loads the directory; it returns old itself when the contents are
// old's.
func (d *Dir) read(old *Files) (*Files, error) {
	dir := d.path
	// The kubelet's ..data link: read one version of the Secret.
	if resolved, err := filepath.EvalSymlinks(filepath.Join(d.path, "..data")); err == nil {
		dir = resolved
	}
	var raw [3][]byte
	for i, name := range []string{CertFile, KeyFile, CAFile} {
		data, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			return nil, fmt.Errorf("%s: %w", name, fileError(d.path, name, err))
		}
		raw[i] = data
	}
	h := sha256.New()
	for _, b := range raw {
		h.Write(b)
		h.Write([]byte{0})
	}
	var version [sha256.Size]byte
	h.Sum(version[:0])
	if old != nil && old.Version == version {
		return old, nil
	}
	pair, err := tls.X509KeyPair(raw[0], raw[1])
	if err != nil {
		return nil, fmt.Errorf("key pair %s, %s: %w", filepath.Join(d.path, CertFile), filepath.Join(d.path, KeyFile), err)
	}
	if pair.Leaf == nil {
		if pair.Leaf, err = x509.ParseCertificate(pair.Certificate[0]); err != nil {
			return nil, fmt.Errorf("certificate %s: %w", filepath.Join(d.path, CertFile), err)
		}
	}
	cas, err := parseCerts(raw[2])
	if err != nil {
		return nil, fmt.Errorf("CA %s: %w", filepath.Join(d.path, CAFile), err)
	}
	pool := x509.NewCertPool()
	for _, c := range cas {
		pool.AddCert(c)
	}
	return &Files{Cert: &pair, CAs: cas, Pool: pool, Version: version}, nil
}

func fileError(dir, name string, err error) error {
	if errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("%s does not exist", filepath.Join(dir, name))
	}
	return err
}

func parseCerts(data []byte) ([]*x509.Certificate, error) {
	var out []*x509.Certificate
	for rest := bytes.TrimSpace(data); len(rest) > 0; {
		var block *pem.Block
		block, rest = pem.Decode(rest)
		if block == nil {
			break
		}
		if block.Type != "CERTIFICATE" {
			continue
		}
		c, err := x509.ParseCertificate(block.Bytes)
		if err != nil {
			return nil, err
		}
		out = append(out, c)
	}
	if len(out) == 0 {
		return nil, errors.New("no PEM certificate found")
	}
	return out, nil
}

// WriteAtomic updates dir as the kubelet updates a mounted Secret: the files
// go into a new directory ..<timestamp>, the link ..data_tmp to it replaces
// ..data in one rename, each file name is a link through ..data, and the
// previous version's directory is removed. For tests of rotation.
func WriteAtomic(dir string, files map[string][]byte) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	version, err := os.MkdirTemp(dir, ".."+time.Now().UTC().Format("2006_01_02_15_04_05.")+"*")
	if err != nil {
		return err
	}
	for name, data := range files {
		if err := os.WriteFile(filepath.Join(version, name), data, 0o600); err != nil {
			return err
		}
	}
	old, _ := os.Readlink(filepath.Join(dir, "..data"))
	tmp := filepath.Join(dir, "..data_tmp")
	_ = os.Remove(tmp)
	if err := os.Symlink(filepath.Base(version), tmp); err != nil {
		return err
	}
	if err := os.Rename(tmp, filepath.Join(dir, "..data")); err != nil {
		return err
	}
	for name := range files {
		link := filepath.Join(dir, name)
		if target, err := os.Readlink(link); err == nil && target == filepath.Join("..data", name) {
			continue
		}
		_ = os.Remove(link)
		if err := os.Symlink(filepath.Join("..data", name), link); err != nil {
			return err
		}
	}
	if old != "" && old != filepath.Base(version) {
		return os.RemoveAll(filepath.Join(dir, old))
	}
	return nil
}
