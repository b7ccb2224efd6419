package main

import (
	"bytes"
	"crypto/x509"
	"encoding/pem"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/fluidos-project/resource-broker/internal/certauthority"
	"github.com/fluidos-project/resource-broker/internal/rbctl/certs"
)

// runRbctl runs the rbctl command tree with args and returns its stdout.
func runRbctl(t *testing.T, args ...string) (string, error) {
	t.Helper()
	var out bytes.Buffer
	root := newRootCommand()
	root.SetOut(&out)
	root.SetErr(&out)
	root.SetArgs(args)
	err := root.Execute()
	return out.String(), err
}

func readCert(t *testing.T, path string) *x509.Certificate {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	block, _ := pem.Decode(data)
	if block == nil {
		t.Fatalf("%s: no PEM block", path)
	}
	c, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return c
}

func checkMode(t *testing.T, path string, want os.FileMode) {
	t.Helper()
	fi, err := os.Stat(path)
	if err != nil {
		t.Error(err)
		return
	}
	if got := fi.Mode().Perm(); got != want {
		t.Errorf("%s: mode %v, want %v", path, got, want)
	}
}

// checkTLSDir checks a tls.crt/tls.key/ca.crt directory and returns its
// leaf certificate after verifying it against the CA with the given usage.
func checkTLSDir(t *testing.T, dir string, caPEM []byte, usage x509.ExtKeyUsage) *x509.Certificate {
	t.Helper()
	checkMode(t, filepath.Join(dir, "tls.crt"), 0o644)
	checkMode(t, filepath.Join(dir, "tls.key"), 0o600)
	checkMode(t, filepath.Join(dir, "ca.crt"), 0o644)
	gotCA, err := os.ReadFile(filepath.Join(dir, "ca.crt"))
	if err != nil || !bytes.Equal(gotCA, caPEM) {
		t.Errorf("%s/ca.crt is not the CA certificate (err %v)", dir, err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(caPEM)
	leaf := readCert(t, filepath.Join(dir, "tls.crt"))
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: pool, KeyUsages: []x509.ExtKeyUsage{usage}}); err != nil {
		t.Errorf("%s/tls.crt does not verify against the CA: %v", dir, err)
	}
	return leaf
}

func TestCertsWritesLayoutAndReusesCA(t *testing.T) {
	out := filepath.Join(t.TempDir(), ".certs")

	stdout, err := runRbctl(t, "certs", "--out", out)
	if err != nil {
		t.Fatalf("rbctl certs: %v\n%s", err, stdout)
	}

	caPath := filepath.Join(out, "ca", "ca.crt")
	checkMode(t, caPath, 0o644)
	checkMode(t, filepath.Join(out, "ca", "ca.key"), 0o600)
	caPEM, err := os.ReadFile(caPath)
	if err != nil {
		t.Fatal(err)
	}
	if !readCert(t, caPath).IsCA {
		t.Error("ca.crt is not a CA")
	}

	broker := checkTLSDir(t, filepath.Join(out, "broker"), caPEM, x509.ExtKeyUsageServerAuth)
	for _, h := range certs.DefaultBrokerHosts {
		if err := broker.VerifyHostname(h); err != nil {
			t.Errorf("broker certificate: %v", err)
		}
	}

	for _, id := range []string{"rome", "paris", "berlin"} {
		c := checkTLSDir(t, filepath.Join(out, "clusters", id), caPEM, x509.ExtKeyUsageClientAuth)
		if c.Subject.CommonName != id {
			t.Errorf("clusters/%s: CN %q", id, c.Subject.CommonName)
		}
	}

	// One line per file written: 2 CA files + 3 broker + 3 per cluster.
	lines := strings.Split(strings.TrimSpace(stdout), "\n")
	if len(lines) != 2+3+3*3 {
		t.Errorf("got %d output lines, want 14:\n%s", len(lines), stdout)
	}
	if !slices.Contains(lines, "wrote "+filepath.Join(out, "clusters", "paris", "tls.key")) {
		t.Errorf("output does not mention clusters/paris/tls.key:\n%s", stdout)
	}

	// Second run: adds a cluster with the same CA.
	stdout, err = runRbctl(t, "certs", "--out", out, "--clusters", "madrid")
	if err != nil {
		t.Fatalf("second rbctl certs: %v\n%s", err, stdout)
	}
	if !strings.Contains(stdout, "reusing existing CA in "+filepath.Join(out, "ca")) {
		t.Errorf("second run does not say it reuses the CA:\n%s", stdout)
	}
	if strings.Contains(stdout, "wrote "+caPath) {
		t.Errorf("second run rewrote the CA:\n%s", stdout)
	}
	caPEM2, err := os.ReadFile(caPath)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(caPEM, caPEM2) {
		t.Fatal("CA certificate changed on the second run")
	}
	c := checkTLSDir(t, filepath.Join(out, "clusters", "madrid"), caPEM, x509.ExtKeyUsageClientAuth)
	if c.Subject.CommonName != "madrid" {
		t.Errorf("clusters/madrid: CN %q", c.Subject.CommonName)
	}
	// Earlier clusters are still valid under the same CA.
	checkTLSDir(t, filepath.Join(out, "clusters", "rome"), caPEM, x509.ExtKeyUsageClientAuth)

	// The written CA is loadable by the library.
	if _, err := certauthority.LoadCA(filepath.Join(out, "ca")); err != nil {
		t.Errorf("LoadCA: %v", err)
	}
}

func TestCertsCustomBrokerHosts(t *testing.T) {
	out := t.TempDir()
	if stdout, err := runRbctl(t, "certs", "--out", out, "--clusters", "", "--broker-hosts", "broker.example,10.0.0.7"); err != nil {
		t.Fatalf("rbctl certs: %v\n%s", err, stdout)
	}
	caPEM, err := os.ReadFile(filepath.Join(out, "ca", "ca.crt"))
	if err != nil {
		t.Fatal(err)
	}
	b := checkTLSDir(t, filepath.Join(out, "broker"), caPEM, x509.ExtKeyUsageServerAuth)
	if !slices.Equal(b.DNSNames, []string{"broker.example"}) || len(b.IPAddresses) != 1 || b.IPAddresses[0].String() != "10.0.0.7" {
		t.Errorf("SANs = %v %v", b.DNSNames, b.IPAddresses)
	}
	if _, err := os.Stat(filepath.Join(out, "clusters")); !os.IsNotExist(err) {
		t.Errorf("clusters/ written with an empty --clusters: %v", err)
	}
}

func TestCertsRejectsBadInput(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"uppercase id", []string{"--clusters", "rome,Paris"}, `invalid cluster id "Paris"`},
		{"dotted id", []string{"--clusters", "rome.it"}, `invalid cluster id "rome.it"`},
		{"empty id", []string{"--clusters", "rome,,paris"}, "empty cluster id"},
		{"duplicate id", []string{"--clusters", "rome,rome"}, `"rome" given twice`},
		{"no broker hosts", []string{"--broker-hosts", ""}, "--broker-hosts"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out := filepath.Join(t.TempDir(), ".certs")
			_, err := runRbctl(t, append([]string{"certs", "--out", out}, tc.args...)...)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want it to contain %q", err, tc.want)
			}
			// Nothing is written when the input is invalid.
			if _, err := os.Stat(out); !os.IsNotExist(err) {
				t.Errorf("%s was created despite the error", out)
			}
		})
	}
}

func TestCertsBrokenCADir(t *testing.T) {
	out := t.TempDir()
	if err := os.MkdirAll(filepath.Join(out, "ca"), 0o755); err != nil {
		t.Fatal(err)
	}
	_, err := runRbctl(t, "certs", "--out", out)
	if err == nil || !strings.Contains(err.Error(), "cannot be loaded") {
		t.Fatalf("error %v, want a clear CA load error", err)
	}
}
