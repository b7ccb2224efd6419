package testenv

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"

	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/fluidos-project/resource-broker/internal/certauthority"
)

// WithServingCert makes the API server listen on address (an IP; the port
// is picked by envtest) and serve a certificate of ca that names address,
// localhost, 127.0.0.1 and sans (e.g. the ClusterIP of Service kubernetes
// and its DNS names), with address as its advertised address: what a pod
// needs to reach the API server through Service kubernetes and verify it
// with its service account's ca.crt (kube-controller-manager's
// --root-ca-file = ca). dir receives the certificates (envtest's CertDir,
// kept), among them a service-account signing key of its own
// (sa-signer.key, sa-signer.crt) as envtest would write it.
func WithServingCert(ca *certauthority.CA, dir, address string, sans ...string) Option {
	return func(o *options) {
		WithAPIServerArg("advertise-address", address)(o)
		o.prepare = append(o.prepare, func(env *envtest.Environment) error {
			// envtest listens on loopback unless given both host and port.
			l, err := net.Listen("tcp", net.JoinHostPort(address, "0"))
			if err != nil {
				return fmt.Errorf("API server address: %w", err)
			}
			port := l.Addr().(*net.TCPAddr).Port
			l.Close()
			api := env.ControlPlane.GetAPIServer()
			api.CertDir = dir
			api.SecureServing.ListenAddr.Address = address
			api.SecureServing.ListenAddr.Port = strconv.Itoa(port)
			api.SecureServing.CA = ca.CertPEM
			return writeServingCerts(ca, dir, address, sans)
		})
	}
}

// writeServingCerts writes the files envtest would otherwise generate
// (it generates none when apiserver.crt exists).
func writeServingCerts(ca *certauthority.CA, dir, address string, sans []string) error {
	serving, err := ca.IssueServer("kube-apiserver", append([]string{address, "localhost", "127.0.0.1"}, sans...))
	if err != nil {
		return err
	}
	saSigner, err := certauthority.NewCA("service-account signer")
	if err != nil {
		return err
	}
	saKey, err := saSigner.KeyPEM()
	if err != nil {
		return err
	}
	for name, data := range map[string][]byte{
		"apiserver.crt": serving.CertPEM, "apiserver.key": serving.KeyPEM,
		"sa-signer.crt": saSigner.CertPEM, "sa-signer.key": saKey,
	} {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o600); err != nil {
			return fmt.Errorf("API server certificates: %w", err)
		}
	}
	return nil
}
