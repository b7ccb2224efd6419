package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/cli-runtime/pkg/genericclioptions"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	ctrlclient "sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/fluidos-project/resource-broker/api/v1alpha1"
	"github.com/fluidos-project/resource-broker/broker/client"
	"github.com/fluidos-project/resource-broker/internal/certdir"
)

const (
	defaultAgentNamespace = "resource-broker"
	// agentSecretName holds a member's client certificate (CN = cluster id),
	// mounted by its agent (manifests/agent).
	agentSecretName     = "rb-agent-tls"
	agentDeploymentName = "rb-agent"
	brokerURLEnv        = "BROKER_URL"
)

// globalOptions are the persistent flags: where the member's identity and
// the broker are.
type globalOptions struct {
	kube           *genericclioptions.ConfigFlags
	brokerURL      string
	certDir        string
	agentNamespace string
}

// useKube says whether names and the identity come from a kubeconfig:
// always, unless --cert-dir names the identity and no --context is given.
func (g *globalOptions) useKube() bool {
	return g.certDir == "" || *g.kube.Context != ""
}

var scheme = func() *runtime.Scheme {
	s := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(s); err != nil {
		panic(err)
	}
	if err := v1alpha1.AddToScheme(s); err != nil {
		panic(err)
	}
	return s
}()

// kubeClient is a client of the --context cluster.
func (g *globalOptions) kubeClient() (ctrlclient.Client, error) {
	// A kubeconfig without a current context would make client-go fall back
	// to localhost:8080 (or the in-cluster config): act as no cluster then.
	if g.contextName() == "" {
		return nil, g.noKubeconfig(clientcmd.ErrEmptyConfig)
	}
	cfg, err := g.kube.ToRESTConfig()
	if err != nil {
		return nil, g.noKubeconfig(err)
	}
	return newKubeClient(cfg)
}

func newKubeClient(cfg *rest.Config) (ctrlclient.Client, error) {
	cfg = rest.CopyConfig(cfg)
	cfg.UserAgent = "rbctl"
	return ctrlclient.New(cfg, ctrlclient.Options{Scheme: scheme})
}

// namespace is -n, else the kubeconfig context's namespace, else default.
func (g *globalOptions) namespace() (string, error) {
	ns, _, err := g.kube.ToRawKubeConfigLoader().Namespace()
	if err != nil {
		return "", g.noKubeconfig(err)
	}
	return ns, nil
}

func (g *globalOptions) noKubeconfig(err error) error {
	if clientcmd.IsEmptyConfig(err) {
		return errors.New("no member cluster to act as: pass --context <a member's kubeconfig context> " +
			"(rbctl reads its Secret " + g.agentNamespace + "/" + agentSecretName + "), or --cert-dir <directory with tls.crt, tls.key, ca.crt> " +
			"and --broker-url")
	}
	return fmt.Errorf("kubeconfig: %w", err)
}

// client returns a broker client acting as the member: with the
// certificate of --cert-dir, or of the member's Secret.
func (g *globalOptions) client(ctx context.Context) (*client.Client, error) {
	opts := []client.Option{client.WithUserAgent("rbctl"), client.WithRetries(1, client.DefaultBackoff)}
	if g.certDir != "" {
		if g.brokerURL == "" {
			return nil, errors.New("--cert-dir needs --broker-url (or RB_BROKER_URL): the broker to call")
		}
		c, err := client.New(g.brokerURL, g.certDir, opts...)
		if err != nil {
			return nil, fmt.Errorf("%w (--cert-dir must hold tls.crt, tls.key and ca.crt, as rbctl certs writes them)", err)
		}
		return c, nil
	}
	kc, err := g.kubeClient()
	if err != nil {
		return nil, err
	}
	cfg, err := g.memberTLS(ctx, kc)
	if err != nil {
		return nil, err
	}
	url := g.brokerURL
	if url == "" {
		if url, err = g.agentBrokerURL(ctx, kc); err != nil {
			return nil, err
		}
	}
	return client.NewWithTLS(url, cfg, opts...)
}

// memberTLS is the member's identity from its Secret.
func (g *globalOptions) memberTLS(ctx context.Context, kc ctrlclient.Client) (*tls.Config, error) {
	var s corev1.Secret
	key := ctrlclient.ObjectKey{Namespace: g.agentNamespace, Name: agentSecretName}
	if err := kc.Get(ctx, key, &s); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, fmt.Errorf("context %q has no Secret %s: is it a member? (rbctl join makes one; or pass --cert-dir)", g.contextName(), key)
		}
		return nil, fmt.Errorf("reading the member's certificate: %w", err)
	}
	cert, err := tls.X509KeyPair(s.Data[certdir.CertFile], s.Data[certdir.KeyFile])
	if err != nil {
		return nil, fmt.Errorf("Secret %s: %w", key, err)
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(s.Data[certdir.CAFile]) {
		return nil, fmt.Errorf("Secret %s: no PEM certificate in %s", key, certdir.CAFile)
	}
	return &tls.Config{Certificates: []tls.Certificate{cert}, RootCAs: roots, MinVersion: tls.VersionTLS12}, nil
}

// agentBrokerURL is the BROKER_URL the member's agent is given (its env or
// the ConfigMaps it takes its env from, manifests/agent).
func (g *globalOptions) agentBrokerURL(ctx context.Context, kc ctrlclient.Client) (string, error) {
	var d appsv1.Deployment
	key := ctrlclient.ObjectKey{Namespace: g.agentNamespace, Name: agentDeploymentName}
	notFound := fmt.Errorf("no broker URL: pass --broker-url (or RB_BROKER_URL); the Deployment %s of context %q does not set %s", key, g.contextName(), brokerURLEnv)
	if err := kc.Get(ctx, key, &d); err != nil {
		if apierrors.IsNotFound(err) {
			return "", notFound
		}
		return "", fmt.Errorf("reading the member's agent for its broker URL: %w", err)
	}
	for _, c := range d.Spec.Template.Spec.Containers {
		for _, e := range c.Env {
			if e.Name == brokerURLEnv && e.Value != "" {
				return e.Value, nil
			}
		}
		for _, from := range c.EnvFrom {
			if from.ConfigMapRef == nil {
				continue
			}
			var cm corev1.ConfigMap
			if err := kc.Get(ctx, ctrlclient.ObjectKey{Namespace: g.agentNamespace, Name: from.ConfigMapRef.Name}, &cm); err != nil {
				return "", fmt.Errorf("reading the member's agent configuration for its broker URL: %w", err)
			}
			if u := cm.Data[from.Prefix+brokerURLEnv]; u != "" {
				return u, nil
			}
		}
	}
	return "", notFound
}

func (g *globalOptions) contextName() string {
	if c := *g.kube.Context; c != "" {
		return c
	}
	raw, err := g.kube.ToRawKubeConfigLoader().RawConfig()
	if err != nil {
		return ""
	}
	return raw.CurrentContext
}

// restConfigFor is the REST configuration of another context of the same
// kubeconfig (the broker's cluster, for join and leave).
func (g *globalOptions) restConfigFor(contextName string) (*rest.Config, error) {
	raw, err := g.kube.ToRawKubeConfigLoader().RawConfig()
	if err != nil {
		return nil, g.noKubeconfig(err)
	}
	if _, ok := raw.Contexts[contextName]; !ok {
		return nil, fmt.Errorf("kubeconfig has no context %q", contextName)
	}
	return clientcmd.NewDefaultClientConfig(raw, &clientcmd.ConfigOverrides{CurrentContext: contextName}).ClientConfig()
}

// reservationByName resolves a Reservation object's name (in -n's
// namespace) to the object, whose status holds the broker's id.
func (g *globalOptions) reservationByName(ctx context.Context, kc ctrlclient.Client, name string) (*v1alpha1.Reservation, error) {
	ns, err := g.namespace()
	if err != nil {
		return nil, err
	}
	var r v1alpha1.Reservation
	if err := kc.Get(ctx, ctrlclient.ObjectKey{Namespace: ns, Name: name}, &r); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, fmt.Errorf("reservation %q not found in namespace %q of context %q (a provider names the broker's id with --role provider)", name, ns, g.contextName())
		}
		return nil, err
	}
	if r.Status.ReservationID == "" {
		return &r, fmt.Errorf("reservation %s/%s has no broker id yet (phase %q): the broker has not decided it", ns, name, r.Status.Phase)
	}
	return &r, nil
}
