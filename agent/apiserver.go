package agent

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"strings"

	"k8s.io/client-go/rest"
	certutil "k8s.io/client-go/util/cert"
)

// APIServer is this cluster's API server as the agent advertises it and
// hands it to requesters in their grants (Options.Endpoint and CABundle).
type APIServer struct {
	// Address is the https:// URL requesters reach the API server at.
	Address string
	// CABundle is the PEM CA requesters verify its certificate with; empty:
	// their system roots.
	CABundle []byte
}

// APIServerFrom is the API server requesters are given: address and the
// contents of caFile when set (--api-server-address, --api-server-ca-file),
// else the agent's own rest config's host and CA, CAData or the contents of
// CAFile (an in-cluster config has the service account's ca.crt there).
func APIServerFrom(cfg *rest.Config, address, caFile string) (APIServer, error) {
	s := APIServer{Address: address}
	from := "--api-server-address"
	if s.Address == "" {
		s.Address, from = cfg.Host, "the API server address of the agent's kubeconfig (set --api-server-address)"
	}
	u, err := url.Parse(s.Address)
	if err != nil || u.Scheme != "https" || u.Hostname() == "" {
		return s, fmt.Errorf("%s: %q is not an https:// URL", from, s.Address)
	}
	switch {
	case caFile != "":
		if s.CABundle, err = readCABundle(caFile); err != nil {
			return s, fmt.Errorf("--api-server-ca-file: %w", err)
		}
	case len(cfg.CAData) > 0:
		s.CABundle = cfg.CAData
	case cfg.CAFile != "":
		if s.CABundle, err = readCABundle(cfg.CAFile); err != nil {
			return s, fmt.Errorf("the CA of the agent's kubeconfig (set --api-server-ca-file): %w", err)
		}
	}
	return s, nil
}

// readCABundle reads a PEM file of one or more CA certificates.
func readCABundle(path string) ([]byte, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	if _, err := certutil.ParseCertsPEM(b); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return b, nil
}

// Locality is where the agent runs, as far as it matters to which API
// server addresses other clusters can reach.
type Locality struct {
	// ServiceHost is the ClusterIP of Service default/kubernetes, which
	// the kubelet gives every pod (KUBERNETES_SERVICE_HOST); empty outside
	// a cluster.
	ServiceHost string
	// InPod says the agent reaches its API server through the in-cluster
	// config: it runs in a pod, whose loopback is its own.
	InPod bool
}

// LocalityOf is the locality of an agent whose rest config is cfg, in an
// environment read with getenv (os.Getenv). A process given a kubeconfig is
// not taken as in a pod even where KUBERNETES_SERVICE_HOST is set (a test
// bed run by CI in a pod): its loopback is the host's.
func LocalityOf(cfg *rest.Config, getenv func(string) string) Locality {
	l := Locality{ServiceHost: getenv("KUBERNETES_SERVICE_HOST")}
	if port := getenv("KUBERNETES_SERVICE_PORT"); l.ServiceHost != "" && port != "" {
		l.InPod = strings.TrimSuffix(cfg.Host, "/") == "https://"+net.JoinHostPort(l.ServiceHost, port)
	}
	return l
}

// Reach says whether requesters in other clusters can reach address:
// refuse is why only this cluster (or this pod) reaches it, and the agent
// must not advertise it; warn is why some requesters may not.
func (l Locality) Reach(address string) (refuse, warn string) {
	u, err := url.Parse(address)
	if err != nil {
		return fmt.Sprintf("%q is not a URL", address), ""
	}
	host := strings.ToLower(strings.TrimSuffix(u.Hostname(), "."))
	ip := net.ParseIP(host)
	switch {
	case l.ServiceHost != "" && host == strings.ToLower(l.ServiceHost):
		return "the ClusterIP of Service default/kubernetes (KUBERNETES_SERVICE_HOST), which only this cluster reaches", ""
	case host == "kubernetes" || host == "kubernetes.default" || strings.HasSuffix(host, ".svc") || strings.HasSuffix(host, ".svc.cluster.local"):
		return "a Service's name in this cluster's DNS, which only this cluster resolves", ""
	case ip != nil && ip.IsUnspecified():
		return "an unspecified address, which names no host", ""
	case ip != nil && (ip.IsLinkLocalUnicast() || ip.IsLinkLocalMulticast()):
		return "a link-local address, which only this network link reaches", ""
	case host == "localhost" || strings.HasSuffix(host, ".localhost") || (ip != nil && ip.IsLoopback()):
		if l.InPod {
			return "a loopback address, which in a pod is the pod itself", ""
		}
		return "", "a loopback address: only requesters on this host reach it"
	}
	return "", ""
}

// CheckAPIServerAddress refuses an address only this cluster reaches (see
// Locality.Reach) unless allowLocal, and returns the warning to log, if any.
func CheckAPIServerAddress(address string, l Locality, allowLocal bool) (warning string, err error) {
	refuse, warn := l.Reach(address)
	switch {
	case refuse == "":
		return warn, nil
	case allowLocal:
		return refuse + " (allowed by --allow-local-api-server-address)", nil
	}
	return "", errors.New("requesters would be handed the API server address " + address + ", " + refuse +
		": set --api-server-address (API_SERVER_ADDRESS in manifests/agent/config.env) to the https:// address other clusters reach this API server at, " +
		"or --allow-local-api-server-address if every requester shares this cluster's network")
}
