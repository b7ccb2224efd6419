package main

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"

	"github.com/fluidos-project/resource-broker/broker/model"
	"github.com/fluidos-project/resource-broker/internal/devcerts"
)

const (
	devCACommonName  = "resource-broker development CA"
	brokerCommonName = "rb-broker"
)

var defaultBrokerHosts = []string{
	"localhost",
	"127.0.0.1",
	"::1",
	"rb-broker",
	"rb-broker.resource-broker",
	"rb-broker.resource-broker.svc",
	"rb-broker.resource-broker.svc.cluster.local",
}

type certsOptions struct {
	out         string
	clusters    []string
	brokerHosts []string
}

func newCertsCommand() *cobra.Command {
	o := &certsOptions{}
	cmd := &cobra.Command{
		Use:   "certs",
		Short: "Write a development CA and mutual-TLS certificates for the broker and clusters",
		Long: `certs writes a development certificate authority, a server certificate for
the broker and one client certificate per cluster (CN = cluster id):

  <out>/ca/ca.crt, <out>/ca/ca.key
  <out>/broker/{tls.crt,tls.key,ca.crt}
  <out>/clusters/<id>/{tls.crt,tls.key,ca.crt}

The tls.crt/tls.key/ca.crt directories have the layout of a cert-manager
Secret. If <out>/ca already exists its CA is reused, so clusters can be
added later without reissuing the others. Not for production use.`,
		Example: `  rbctl certs
  rbctl certs --out .certs --clusters madrid`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return o.run(cmd.OutOrStdout())
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.out, "out", ".certs", "output directory")
	f.StringSliceVar(&o.clusters, "clusters", []string{"rome", "paris", "berlin"},
		"cluster ids to issue client certificates for (DNS-1123 labels)")
	f.StringSliceVar(&o.brokerHosts, "broker-hosts", defaultBrokerHosts,
		"DNS names and IP addresses put in the broker server certificate")
	return cmd
}

func (o *certsOptions) run(w io.Writer) error {
	// Validate everything before writing anything.
	clusters, err := normalizeClusterIDs(o.clusters)
	if err != nil {
		return err
	}
	hosts := nonEmpty(o.brokerHosts)
	if len(hosts) == 0 {
		return errors.New("--broker-hosts must name at least one DNS name or IP address")
	}
	if o.out == "" {
		return errors.New("--out must not be empty")
	}

	ca, err := o.loadOrCreateCA(w)
	if err != nil {
		return err
	}

	broker, err := ca.IssueServer(brokerCommonName, hosts)
	if err != nil {
		return err
	}
	if err := writeTLSDir(w, filepath.Join(o.out, "broker"), broker, ca.CertPEM); err != nil {
		return err
	}

	for _, id := range clusters {
		p, err := ca.IssueClient(id)
		if err != nil {
			return err
		}
		if err := writeTLSDir(w, filepath.Join(o.out, "clusters", id), p, ca.CertPEM); err != nil {
			return err
		}
	}
	return nil
}

// loadOrCreateCA reuses <out>/ca when it exists, otherwise creates and saves
// a new CA there.
func (o *certsOptions) loadOrCreateCA(w io.Writer) (*devcerts.CA, error) {
	dir := filepath.Join(o.out, "ca")
	fi, err := os.Stat(dir)
	switch {
	case err == nil:
		if !fi.IsDir() {
			return nil, fmt.Errorf("%s exists and is not a directory", dir)
		}
		ca, err := devcerts.LoadCA(dir)
		if err != nil {
			return nil, fmt.Errorf("%s exists but its CA cannot be loaded (remove the directory to create a new CA): %w", dir, err)
		}
		fmt.Fprintf(w, "reusing existing CA in %s (CN=%q, expires %s)\n",
			dir, ca.Cert.Subject.CommonName, ca.Cert.NotAfter.UTC().Format("2006-01-02"))
		return ca, nil
	case errors.Is(err, fs.ErrNotExist):
		ca, err := devcerts.NewCA(devCACommonName)
		if err != nil {
			return nil, err
		}
		if err := ca.Save(dir); err != nil {
			return nil, err
		}
		fmt.Fprintf(w, "wrote %s\n", filepath.Join(dir, devcerts.CACertFile))
		fmt.Fprintf(w, "wrote %s\n", filepath.Join(dir, devcerts.CAKeyFile))
		return ca, nil
	default:
		return nil, err
	}
}

func writeTLSDir(w io.Writer, dir string, p devcerts.Pair, caPEM []byte) error {
	if err := devcerts.WriteTLSDir(dir, p, caPEM); err != nil {
		return err
	}
	for _, name := range []string{devcerts.TLSCertFile, devcerts.TLSKeyFile, devcerts.CACertFile} {
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
