package main

import (
	"crypto/tls"
	"net"
	"net/http"
	"net/url"
	"time"

	"github.com/fluidos-project/resource-broker/broker/dashboard"
	"github.com/fluidos-project/resource-broker/internal/certauthority"
	"github.com/fluidos-project/resource-broker/internal/testbed"
)

// dashboardProxy is where the demo serves the brokers' dashboard.
type dashboardProxy struct{ url, certDir string }

// startDashboard serves the brokers' web dashboard on loopback, as
// rb-dashboard does: a proxy that presents the operator's certificate
// (written to certDir for rb-dashboard) to the brokers. Port 8080 when it is
// free. It lives as long as the demo.
func startDashboard(bed *testbed.Bed, certDir string) (dashboardProxy, error) {
	pair, err := bed.CA.IssueClient(testbed.Operator)
	if err != nil {
		return dashboardProxy{}, err
	}
	if err := certauthority.WriteTLSDir(certDir, pair, bed.CA.CertPEM); err != nil {
		return dashboardProxy{}, err
	}
	cert, err := pair.TLSCertificate()
	if err != nil {
		return dashboardProxy{}, err
	}
	u, err := url.Parse(bed.BrokerURL)
	if err != nil {
		return dashboardProxy{}, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:8080")
	if err != nil {
		if ln, err = net.Listen("tcp", "127.0.0.1:0"); err != nil {
			return dashboardProxy{}, err
		}
	}
	h := dashboard.NewProxy(u, &tls.Config{MinVersion: tls.VersionTLS12, RootCAs: bed.CA.Pool(), Certificates: []tls.Certificate{cert}})
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	return dashboardProxy{url: "http://" + ln.Addr().String() + dashboard.Path, certDir: certDir}, nil
}
