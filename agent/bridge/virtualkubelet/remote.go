package virtualkubelet

import (
	"bytes"
	"context"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	corev1listers "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	metricsclient "k8s.io/metrics/pkg/client/clientset/versioned"

	rbv1 "github.com/fluidos-project/resource-broker/api/v1alpha1"
	"github.com/fluidos-project/resource-broker/broker/api"
)

// token holds the bearer token of a grant; requests read it at send time, so
// a refreshed grant takes effect without rebuilding clients or informers.
type token struct {
	mu      sync.RWMutex
	value   string
	expires time.Time
}

func (t *token) set(value string, expires time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.value, t.expires = value, expires
}

func (t *token) get() (string, time.Time) {
	t.mu.RLock()
	defer t.mu.RUnlock()
	return t.value, t.expires
}

// bearer adds the current token to each request.
type bearer struct {
	token *token
	next  http.RoundTripper
}

func (b bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	v, _ := b.token.get()
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+v)
	return b.next.RoundTrip(r)
}

// remoteCluster is the provider's API as the grant opens it: a client that
// authenticates with the tenant token only, and informers on the copies of
// this cluster's pods, ConfigMaps and Secrets in the tenant namespace
// (watched, never polled).
type remoteCluster struct {
	endpoint  string
	caBundle  []byte
	namespace string
	token     *token
	client    kubernetes.Interface
	metrics   metricsclient.Interface // the provider's metrics.k8s.io
	config    *rest.Config            // of client: the kubelet endpoint's streams (exec, attach, port-forward) dial with it
	pods      corev1listers.PodNamespaceLister
	synced    cache.InformerSynced
	// configMaps and secrets are the copies the reflectors keep (reflection.go).
	configMaps corev1listers.ConfigMapNamespaceLister
	secrets    corev1listers.SecretNamespaceLister
	stop       context.CancelFunc
}

// sameAccess: g opens the same API and namespace (only the token differs).
func (rc *remoteCluster) sameAccess(g *api.Grant) bool {
	return rc.endpoint == g.Endpoint && bytes.Equal(rc.caBundle, g.CABundle) && rc.namespace == g.Namespace
}

// restConfigFor builds the client configuration of a grant.
func restConfigFor(endpoint string, caBundle []byte, tok *token, userAgent string, log logr.Logger) *rest.Config {
	return &rest.Config{
		Host:            endpoint,
		TLSClientConfig: rest.TLSClientConfig{CAData: caBundle},
		WrapTransport:   func(rt http.RoundTripper) http.RoundTripper { return bearer{token: tok, next: rt} },
		UserAgent:       userAgent,
		QPS:             50,
		Burst:           100,
		WarningHandler:  warnings{log},
	}
}

// warnings logs the provider's API warnings, except the one about dots in pod
// names (the copies' names have one; their spec.hostname is the local name).
type warnings struct{ log logr.Logger }

func (w warnings) HandleWarningHeader(_ int, _ string, text string) {
	if !strings.Contains(text, "used in the Pod's hostname") {
		w.log.Info("warning from the provider's API server", "warning", text)
	}
}

// remoteHandlers receive the provider informers' notifications: of the
// copies of pods, ConfigMaps and Secrets, and of the Events about pods in
// the tenant namespace (nil: not watched).
type remoteHandlers struct {
	pods, configMaps, secrets, events cache.ResourceEventHandler
}

// newRemoteCluster connects to a provider with a grant and starts the
// informers; handler receives their notifications.
func newRemoteCluster(ctx context.Context, g *api.Grant, clusterID string, handler remoteHandlers, log logr.Logger) (*remoteCluster, error) {
	tok := &token{}
	tok.set(g.Token, g.ExpiresAt)
	return connect(ctx, g.Endpoint, g.CABundle, g.Namespace, tok, clusterID, handler, log)
}

// reconnect is a new connection with the same access and token: a fresh
// informer lists at once, where the old one's reflector may be backing off.
func (rc *remoteCluster) reconnect(ctx context.Context, clusterID string, handler remoteHandlers, log logr.Logger) (*remoteCluster, error) {
	return connect(ctx, rc.endpoint, rc.caBundle, rc.namespace, rc.token, clusterID, handler, log)
}

func connect(ctx context.Context, endpoint string, caBundle []byte, namespace string, tok *token, clusterID string,
	handler remoteHandlers, log logr.Logger) (*remoteCluster, error) {
	cfg := restConfigFor(endpoint, caBundle, tok, "rb-agent/"+clusterID+" (bridge)", log)
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	mc, err := metricsclient.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	ours := func(o *metav1.ListOptions) {
		o.LabelSelector = labels.SelectorFromSet(labels.Set{rbv1.RequesterLabel: clusterID}).String()
	}
	factory := informers.NewSharedInformerFactoryWithOptions(cs, 0, informers.WithNamespace(namespace),
		informers.WithTweakListOptions(ours))
	inf := factory.Core().V1().Pods()
	if _, err := inf.Informer().AddEventHandler(handler.pods); err != nil {
		return nil, err
	}
	watchErrors := func(_ context.Context, _ *cache.Reflector, err error) {
		log.V(1).Info("provider watch interrupted", "error", err.Error())
	}
	_ = inf.Informer().SetWatchErrorHandlerWithContext(watchErrors)
	// The copies of ConfigMaps and Secrets, without their managed fields
	// (the pods' are read by the pod handler).
	objects := informers.NewSharedInformerFactoryWithOptions(cs, 0, informers.WithNamespace(namespace),
		informers.WithTransform(stripManagedFields), informers.WithTweakListOptions(ours))
	cms, secrets := objects.Core().V1().ConfigMaps(), objects.Core().V1().Secrets()
	for _, w := range []struct {
		inf     cache.SharedIndexInformer
		handler cache.ResourceEventHandler
	}{{cms.Informer(), handler.configMaps}, {secrets.Informer(), handler.secrets}} {
		if w.handler != nil {
			if _, err := w.inf.AddEventHandler(w.handler); err != nil {
				return nil, err
			}
		}
		_ = w.inf.SetWatchErrorHandlerWithContext(watchErrors)
	}
	// The Events about pods, in a factory of their own: they carry no labels.
	events := informers.NewSharedInformerFactoryWithOptions(cs, 0, informers.WithNamespace(namespace),
		informers.WithTransform(stripManagedFields),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.FieldSelector = fields.OneTermEqualSelector("involvedObject.kind", "Pod").String()
		}))
	if handler.events != nil {
		ev := events.Core().V1().Events().Informer()
		if _, err := ev.AddEventHandler(handler.events); err != nil {
			return nil, err
		}
		_ = ev.SetWatchErrorHandlerWithContext(watchErrors)
	}
	ctx, cancel := context.WithCancel(ctx)
	factory.Start(ctx.Done())
	objects.Start(ctx.Done())
	events.Start(ctx.Done())
	return &remoteCluster{
		endpoint: endpoint, caBundle: caBundle, namespace: namespace, token: tok, client: cs, metrics: mc, config: cfg,
		pods: inf.Lister().Pods(namespace), synced: inf.Informer().HasSynced,
		configMaps: cms.Lister().ConfigMaps(namespace), secrets: secrets.Lister().Secrets(namespace),
		stop: func() { cancel(); factory.Shutdown(); objects.Shutdown(); events.Shutdown() },
	}, nil
}

// pod returns the remote copy of local namespace/name, if there is one.
func (rc *remoteCluster) pod(namespace, name string) (*corev1.Pod, bool) {
	p, err := rc.pods.Get(RemoteName(namespace, name))
	if err != nil {
		return nil, false
	}
	return p, true
}
