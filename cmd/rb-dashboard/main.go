// Command rb-dashboard serves the broker's web dashboard to a browser on
// the operator's machine: it forwards the pages of the broker's
// /dashboard/ over mutual TLS with the operator's client certificate, as
// kubectl proxy does for the Kubernetes API, so the browser needs no client
// certificate of its own (the pages themselves are served by the broker).
package main

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/fluidos-project/resource-broker/broker/dashboard"
	"github.com/fluidos-project/resource-broker/internal/certdir"
	"github.com/fluidos-project/resource-broker/internal/version"
)

func main() {
	if err := newCommand().Execute(); err != nil {
		fmt.Fprintln(os.Stderr, "rb-dashboard:", err)
		os.Exit(1)
	}
}

func newCommand() *cobra.Command {
	var brokerURL, certDir, listen string
	cmd := &cobra.Command{
		Use:   "rb-dashboard",
		Short: "Serve the broker's web dashboard on this machine, with an operator's client certificate",
		Long: "rb-dashboard forwards the broker's read-only dashboard (/dashboard/) to a browser on this machine, " +
			"presenting the operator's client certificate of --cert-dir to the broker (whose --dashboard-operators names it). " +
			"Keep --listen-address on loopback: whoever reaches it reads the dashboard as that operator.",
		SilenceUsage:  true,
		SilenceErrors: true,
		Args:          cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			return run(ctx, brokerURL, certDir, listen)
		},
	}
	f := cmd.Flags()
	f.StringVar(&brokerURL, "broker-url", "https://127.0.0.1:8443", "the broker's API (https://host:port)")
	f.StringVar(&certDir, "cert-dir", "", "required: the operator's tls.crt, tls.key and ca.crt (the CA of the broker's certificate); read again when they change")
	f.StringVar(&listen, "listen-address", "127.0.0.1:8080", "where the browser opens the dashboard")
	version.AddFlag(cmd)
	return cmd
}

func run(ctx context.Context, brokerURL, certDir, listen string) error {
	u, err := url.Parse(brokerURL)
	if err != nil || u.Scheme != "https" || u.Host == "" {
		return fmt.Errorf("--broker-url %q: want https://host:port", brokerURL)
	}
	if certDir == "" {
		return errors.New("--cert-dir is required: the operator's client certificate")
	}
	certs, err := certdir.Open(certDir, 10*time.Second)
	if err != nil {
		return fmt.Errorf("--cert-dir: %w", err)
	}
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: dashboard.NewProxy(u, tlsConfig(certs)), ReadHeaderTimeout: 5 * time.Second}
	fmt.Printf("rb-dashboard: the dashboard of %s is at http://%s/dashboard/ (as %s)\n", brokerURL, ln.Addr(), certs.Current().Cert.Leaf.Subject.CommonName)
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	}()
	if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// tlsConfig presents the directory's current certificate (read again when
// it changes) and trusts the broker certificates its ca.crt signed (as read
// at start).
func tlsConfig(certs *certdir.Dir) *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS12,
		RootCAs:    certs.Current().Pool,
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			f, _, err := certs.Files()
			if err != nil {
				return nil, err
			}
			return f.Cert, nil
		},
	}
}
