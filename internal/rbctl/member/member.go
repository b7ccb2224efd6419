// Package member is how rbctl acts as one member cluster: a client of a
// kubeconfig context, the member's identity (its client certificate in the
// Secret its agent mounts, or a certificate directory), the broker's URL
// (given, or the one the member's agent is given) and the broker client made
// of them, and Reservation objects resolved to the broker's ids. Every verb
// that talks to the broker or to a member's cluster starts here.
package member

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
	"github.com/fluidos-project/resource-broker/broker/api"
	"github.com/fluidos-project/resource-broker/broker/client"
	"github.com/fluidos-project/resource-broker/internal/certdir"
)

const (
	// DefaultAgentNamespace is where manifests/agent installs the agent and
	// its Secret, and manifests/broker the broker.
	DefaultAgentNamespace = "resource-broker"
	// SecretName holds a member's client certificate (CN = cluster id),
	// mounted by its agent (manifests/agent).
	SecretName = "rb-agent-tls"
	// AgentDeployment is the member's agent, whose env names the broker.
	AgentDeployment = "rb-agent"
	brokerURLEnv    = "BROKER_URL"
)

// Options say where the member's identity and the broker are: rbctl's
// persistent flags.
type Options struct {
	Kube           *genericclioptions.ConfigFlags
	BrokerURL      string
	CertDir        string
	AgentNamespace string
}

// UseKube says whether names and the identity come from a kubeconfig:
// always, unless --cert-dir names the identity and no --context is given.
func (o *Options) UseKube() bool {
	return o.CertDir == "" || *o.Kube.Context != ""
}

// Context is --context as given ("" if not).
func (o *Options) Context() string { return *o.Kube.Context }

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

// KubeClient is a client of the --context cluster.
func (o *Options) KubeClient() (ctrlclient.Client, error) {
	// A kubeconfig without a current context would make client-go fall back
	// to localhost:8080 (or the in-cluster config): act as no cluster then.
	if o.ContextName() == "" {
		return nil, o.noKubeconfig(clientcmd.ErrEmptyConfig)
	}
	cfg, err := o.Kube.ToRESTConfig()
	if err != nil {
		return nil, o.noKubeconfig(err)
	}
	return NewKubeClient(cfg)
}

// NewKubeClient is a client of cfg's cluster that knows the built-in types
// and rbctl's CRDs.
func NewKubeClient(cfg *rest.Config) (ctrlclient.Client, error) {
	cfg = rest.CopyConfig(cfg)
	cfg.UserAgent = "rbctl"
	return ctrlclient.New(cfg, ctrlclient.Options{Scheme: scheme})
}

// Namespace is -n, else the kubeconfig context's namespace, else default.
func (o *Options) Namespace() (string, error) {
	ns, _, err := o.Kube.ToRawKubeConfigLoader().Namespace()
	if err != nil {
		return "", o.noKubeconfig(err)
	}
	return ns, nil
}

func (o *Options) noKubeconfig(err error) error {
	if clientcmd.IsEmptyConfig(err) {
		return errors.New("no member cluster to act as: pass --context <a member's kubeconfig context> " +
			"(rbctl reads its Secret " + o.AgentNamespace + "/" + SecretName + "), or --cert-dir <directory with tls.crt, tls.key, ca.crt> " +
			"and --broker-url")
	}
	return fmt.Errorf("kubeconfig: %w", err)
}

// BrokerClient returns a broker client acting as the member: with the
// certificate of --cert-dir, or of the member's Secret.
func (o *Options) BrokerClient(ctx context.Context) (*client.Client, error) {
	opts := []client.Option{client.WithUserAgent("rbctl"), client.WithRetries(1, client.DefaultBackoff)}
	if o.CertDir != "" {
		if o.BrokerURL == "" {
			return nil, errors.New("--cert-dir needs --broker-url (or RB_BROKER_URL): the broker to call")
		}
		c, err := client.New(o.BrokerURL, o.CertDir, opts...)
		if err != nil {
			return nil, fmt.Errorf("%w (--cert-dir must hold tls.crt, tls.key and ca.crt, as rbctl certs writes them)", err)
		}
		return c, nil
	}
	kc, err := o.KubeClient()
	if err != nil {
		return nil, err
	}
	cfg, err := o.TLS(ctx, kc)
	if err != nil {
		return nil, err
	}
	url := o.BrokerURL
	if url == "" {
		if url, err = o.agentBrokerURL(ctx, kc); err != nil {
			return nil, err
		}
	}
	return client.NewWithTLS(url, cfg, opts...)
}

// TLS is the member's identity from its Secret, read with kc.
func (o *Options) TLS(ctx context.Context, kc ctrlclient.Client) (*tls.Config, error) {
	var s corev1.Secret
	key := ctrlclient.ObjectKey{Namespace: o.AgentNamespace, Name: SecretName}
	if err := kc.Get(ctx, key, &s); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, fmt.Errorf("context %q has no Secret %s: is it a member? (rbctl join makes one; or pass --cert-dir)", o.ContextName(), key)
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
func (o *Options) agentBrokerURL(ctx context.Context, kc ctrlclient.Client) (string, error) {
	var d appsv1.Deployment
	key := ctrlclient.ObjectKey{Namespace: o.AgentNamespace, Name: AgentDeployment}
	notFound := fmt.Errorf("no broker URL: pass --broker-url (or RB_BROKER_URL); the Deployment %s of context %q does not set %s", key, o.ContextName(), brokerURLEnv)
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
			if err := kc.Get(ctx, ctrlclient.ObjectKey{Namespace: o.AgentNamespace, Name: from.ConfigMapRef.Name}, &cm); err != nil {
				return "", fmt.Errorf("reading the member's agent configuration for its broker URL: %w", err)
			}
			if u := cm.Data[from.Prefix+brokerURLEnv]; u != "" {
				return u, nil
			}
		}
	}
	return "", notFound
}

// ContextName is --context, else the kubeconfig's current context.
func (o *Options) ContextName() string {
	if c := *o.Kube.Context; c != "" {
		return c
	}
	raw, err := o.Kube.ToRawKubeConfigLoader().RawConfig()
	if err != nil {
		return ""
	}
	return raw.CurrentContext
}

// RESTConfigFor is the REST configuration of another context of the same
// kubeconfig (the broker's cluster, for join and leave).
func (o *Options) RESTConfigFor(contextName string) (*rest.Config, error) {
	raw, err := o.Kube.ToRawKubeConfigLoader().RawConfig()
	if err != nil {
		return nil, o.noKubeconfig(err)
	}
	if _, ok := raw.Contexts[contextName]; !ok {
		return nil, fmt.Errorf("kubeconfig has no context %q", contextName)
	}
	return clientcmd.NewDefaultClientConfig(raw, &clientcmd.ConfigOverrides{CurrentContext: contextName}).ClientConfig()
}

// ReservationByName resolves a Reservation object's name (in -n's
// namespace) to the object, whose status holds the broker's id. An object
// the broker has no id for yet comes with an error.
func (o *Options) ReservationByName(ctx context.Context, kc ctrlclient.Client, name string) (*v1alpha1.Reservation, error) {
	ns, err := o.Namespace()
	if err != nil {
		return nil, err
	}
	var r v1alpha1.Reservation
	if err := kc.Get(ctx, ctrlclient.ObjectKey{Namespace: ns, Name: name}, &r); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, fmt.Errorf("reservation %q not found in namespace %q of context %q (a provider names the broker's id with --role provider)", name, ns, o.ContextName())
		}
		return nil, err
	}
	if r.Status.ReservationID == "" {
		return &r, fmt.Errorf("reservation %s/%s has no broker id yet (phase %q): the broker has not decided it", ns, name, r.Status.Phase)
	}
	return &r, nil
}

// ProvidedReservation finds a live reservation the member of c provides by
// the broker's id: reading it needs its requester, which the list has.
func ProvidedReservation(ctx context.Context, c *client.Client, id string) (api.Reservation, error) {
	list, err := c.Reservations(ctx, client.RoleProvider)
	if err != nil {
		return api.Reservation{}, err
	}
	for _, r := range list {
		if r.ID == id {
			return c.ProvidedReservation(ctx, r.Requester, id)
		}
	}
	return api.Reservation{}, &client.APIError{StatusCode: 404, Reason: api.ReasonNotFound, Message: "no live reservation " + id + " provided by " + c.Identity()}
}

// ValidateRole checks a --role flag: empty (both, or the requester's view),
// requester or provider.
func ValidateRole(role string) error {
	switch role {
	case "", client.RoleRequester, client.RoleProvider:
		return nil
	}
	return fmt.Errorf("--role %q: must be requester or provider", role)
}
