package testenv

import (
	"fmt"
	"os"
	"path/filepath"

	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/fluidos-project/resource-broker/internal/certauthority"
)

// WithClientCA makes ca the API server's client CA (--client-ca-file) and
// the issuer of every user envtest adds (AddUser), instead of a CA whose key
// envtest keeps to itself. With the key in hand a test bed can sign what a
// real cluster's CA signs: the kubelets' and kube-controller-manager's
// credentials and the API server's client certificate towards kubelets.
func WithClientCA(ca *certauthority.CA) Option {
	return WithEnvironment(func(env *envtest.Environment) {
		env.ControlPlane.GetAPIServer().SecureServing.Authn = &caAuthn{ca: ca}
	})
}

// ClientCAFile is the file name of the client CA in the API server's
// certificate directory (envtest's APIServer.CertDir) under WithClientCA.
const ClientCAFile = "client-ca.crt"

// caAuthn is an envtest.Authn issuing client certificates from a CA we hold.
type caAuthn struct {
	ca  *certauthority.CA
	dir string
}

var _ envtest.Authn = (*caAuthn)(nil)

func (a *caAuthn) Configure(workDir string, args *envtest.Arguments) error {
	a.dir = workDir
	args.Set("client-ca-file", filepath.Join(workDir, ClientCAFile))
	return nil
}

func (a *caAuthn) Start() error {
	if a.dir == "" {
		return fmt.Errorf("client CA: Start before Configure")
	}
	return os.WriteFile(filepath.Join(a.dir, ClientCAFile), a.ca.CertPEM, 0o644)
}

func (a *caAuthn) AddUser(user envtest.User, base *rest.Config) (*rest.Config, error) {
	pair, err := a.ca.IssueUser(user.Name, user.Groups)
	if err != nil {
		return nil, err
	}
	cfg := rest.CopyConfig(base)
	cfg.CertData, cfg.KeyData = pair.CertPEM, pair.KeyPEM
	return cfg, nil
}

func (a *caAuthn) Stop() error { return nil }
