// Package certs writes a certificate authority and the mutual-TLS
// certificates of a federation from it: a server certificate for the broker
// and a client certificate per cluster (CN = cluster id), each in the
// directory layout of a cert-manager Secret. An existing CA is reused, so
// clusters can be added later without reissuing the others.
package certs

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/fluidos-project/resource-broker/broker/model"
	"github.com/fluidos-project/resource-broker/internal/certauthority"
)

const (
	caCommonName     = "resource-broker CA"
	brokerCommonName = "rb-broker"
)

// DefaultBrokerHosts are the names the broker is reached by locally and
// in its cluster, as manifests/broker installs it.
var DefaultBrokerHosts = []string{
	"localhost",
	"127.0.0.1",
	"::1",
	"rb-broker",
	"rb-broker.resource-broker",
	"rb-broker.resource-broker.svc",
	"rb-broker.resource-broker.svc.cluster.local",
}

// Options are what rbctl certs is given.
type Options struct {
	// Out is the directory written: ca/, broker/, clusters/<id>/.
	Out         string
	Clusters    []string
	BrokerHosts []string
}

// Write writes the CA (unless Out has one), the broker's certificate and one
// per cluster, naming each file written to w. Nothing is written when the
// options are invalid.
func Write(o Options, w io.Writer) error {
	// Validate everything before writing anything.
	clusters, err := normalizeClusterIDs(o.Clusters)
	if err != nil {
		return err
	}
	hosts := nonEmpty(o.BrokerHosts)
	if len(hosts) == 0 {
		return errors.New("--broker-hosts must name at least one DNS name or IP address")
	}
	if o.Out == "" {
		return errors.New("--out must not be empty")
	}

	ca, err := loadOrCreateCA(filepath.Join(o.Out, "ca"), w)
	if err != nil {
		return err
	}

	broker, err := ca.IssueServer(brokerCommonName, hosts)
	if err != nil {
		return err
	}
	if err := writeTLSDir(w, filepath.Join(o.Out, "broker"), broker, ca.CertPEM); err != nil {
		return err
	}

	for _, id := range clusters {
		p, err := ca.IssueClient(id)
		if err != nil {
			return err
		}
		if err := writeTLSDir(w, filepath.Join(o.Out, "clusters", id), p, ca.CertPEM); err != nil {
			return err
		}
	}
	return nil
}

// loadOrCreateCA reuses the CA in dir when it exists, otherwise creates and
// saves a new CA there.
func loadOrCreateCA(dir string, w io.Writer) (*certauthority.CA, error) {
	fi, err := os.Stat(dir)
	switch {
	case err == nil:
		if !fi.IsDir() {
			return nil, fmt.Errorf("%s exists and is not a directory", dir)
		}
		ca, err := certauthority.LoadCA(dir)
		if err != nil {
			return nil, fmt.Errorf("%s exists but its CA cannot be loaded (remove the directory to create a new CA): %w", dir, err)
		}
		fmt.Fprintf(w, "reusing existing CA in %s (CN=%q, expires %s)\n",
			dir, ca.Cert.Subject.CommonName, ca.Cert.NotAfter.UTC().Format("2006-01-02"))
		return ca, nil
	case errors.Is(err, fs.ErrNotExist):
		ca, err := certauthority.NewCA(caCommonName)
		if err != nil {
			return nil, err
		}
		if err := ca.Save(dir); err != nil {
			return nil, err
		}
		fmt.Fprintf(w, "wrote %s\n", filepath.Join(dir, certauthority.CACertFile))
		fmt.Fprintf(w, "wrote %s\n", filepath.Join(dir, certauthority.CAKeyFile))
		return ca, nil
	default:
		return nil, err
	}
}

func writeTLSDir(w io.Writer, dir string, p certauthority.Pair, caPEM []byte) error {
	if err := certauthority.WriteTLSDir(dir, p, caPEM); err != nil {
		return err
	}
	for _, name := range []string{certauthority.TLSCertFile, certauthority.TLSKeyFile, certauthority.CACertFile} {
		fmt.Fprintf(w, "wrote %s\n", filepath.Join(dir, name))
	}
	return nil
}

// normalizeClusterIDs trims the ids and rejects empty, invalid and
// duplicate ones. An empty list is allowed (broker certificate only).
func normalizeClusterIDs(ids []string) ([]string, error) {
	seen := make(map[string]bool, len(ids))
	out := make([]string, 0, len(ids))
	for _, id := range ids {
		id = strings.TrimSpace(id)
		if id == "" {
			return nil, errors.New("--clusters: empty cluster id in the list")
		}
		if err := model.ValidateClusterID(id); err != nil {
			return nil, fmt.Errorf("--clusters: %w", err)
		}
		if seen[id] {
			return nil, fmt.Errorf("--clusters: cluster id %q given twice", id)
		}
		seen[id] = true
		out = append(out, id)
	}
	return out, nil
}

func nonEmpty(ss []string) []string {
	var out []string
	for _, s := range ss {
		if s = strings.TrimSpace(s); s != "" {
			out = append(out, s)
		}
	}
	return out
}
