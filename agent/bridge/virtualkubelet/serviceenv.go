package virtualkubelet

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/util/workqueue"
)

// With HomeNetwork, the Service environment variables of a borrowed pod's
// home namespace reach its copy through ConfigMaps at the provider, one set
// per home namespace, which every copy of that namespace reads with envFrom
// before its own sources (so its own envFrom and env win, as over a
// kubelet's Service variables). Written into each copy they would cost what
// the namespace's Services do once per container and per copy: ~8 variables
// a Service, 348 KB per container at 1,000 Services (BenchmarkHomeView),
// and a pod of five containers would no longer fit in the provider's etcd.
// As with a kubelet, a container reads them when it starts or restarts.

const (
	// ServiceEnvLabel marks the ConfigMaps at the provider that carry the
	// Service variables of the home namespace the label names.
	ServiceEnvLabel = "broker.fluidos.eu/service-env"
	// serviceEnvChunk bounds the data of one such ConfigMap (the API server
	// takes at most 1 MiB): a namespace with more goes into several.
	serviceEnvChunk = 768 << 10
)

// serviceEnvName is the name at the provider of the i-th ConfigMap of
// namespace ns's Service variables. A local ConfigMap of the name
// "rb-service-env-<i>", whose copy would take it, is refused by either
// side's origin check.
func serviceEnvName(ns string, i int) string {
	return RemoteName(ns, "rb-service-env-"+strconv.Itoa(i))
}

// serviceEnvChunks splits env (sorted, no duplicates) into ConfigMap data
// of at most serviceEnvChunk bytes each; at least one, maybe empty.
func serviceEnvChunks(env []corev1.EnvVar) []map[string]string {
	chunks := []map[string]string{{}}
	size := 0
	for _, e := range env {
		n := len(e.Name) + len(e.Value)
		if size+n > serviceEnvChunk && size > 0 {
			chunks, size = append(chunks, map[string]string{}), 0
		}
		chunks[len(chunks)-1][e.Name] = e.Value
		size += n
	}
	return chunks
}

// serviceEnvs keeps, at one provider, the Service variables of the home
// namespaces whose pods this virtual node mirrors: written before a copy
// that reads them is made (attach), rewritten when a Service of the
// namespace changes, deleted once no pod of the namespace runs here.
type serviceEnvs struct {
	n     *providerNode
	queue workqueue.TypedRateLimitingInterface[string] // home namespaces to look at

	mu sync.Mutex // one write of a namespace's ConfigMaps at a time
	// written: how many ConfigMaps each namespace has at the provider. Their
	// number never shrinks while pods read them: a copy made when there were
	// more still names them all (an emptied one stays, empty).
	written map[string]int
}

func newServiceEnvs(n *providerNode) *serviceEnvs {
	return &serviceEnvs{n: n, written: map[string]int{},
		queue: workqueue.NewTypedRateLimitingQueueWithConfig(workqueue.DefaultTypedControllerRateLimiter[string](),
			workqueue.TypedRateLimitingQueueConfig[string]{Name: "service-env-" + n.name})}
}

// track looks at the namespace of a pod of this node again (its copy may
// be made or gone); servicesChanged at a namespace whose Services changed.
func (s *serviceEnvs) track(pod *corev1.Pod) {
	if s.n.b.cfg.HomeNetwork != nil {
		s.queue.Add(pod.Namespace)
	}
}

func (s *serviceEnvs) servicesChanged(ns string) {
	s.mu.Lock()
	_, ok := s.written[ns]
	s.mu.Unlock()
	if ok {
		s.queue.Add(ns)
	}
}

// run handles the queue until ctx ends.
func (s *serviceEnvs) run(ctx context.Context) {
	go func() {
		<-ctx.Done()
		s.queue.ShutDown()
	}()
	for {
		ns, shutdown := s.queue.Get()
		if shutdown {
			return
		}
		if err := s.sync(ctx, ns); err != nil && ctx.Err() == nil {
			s.n.log.Error(err, "writing the home Service variables of a namespace, retrying", "namespace", ns)
			s.queue.AddRateLimited(ns)
		} else {
			s.queue.Forget(ns)
		}
		s.queue.Done(ns)
	}
}

// sync writes the Service variables of namespace ns to the provider if a
// pod of ns that reads them is mirrored here, and deletes them otherwise.
func (s *serviceEnvs) sync(ctx context.Context, ns string) error {
	rc := s.n.currentRemote()
	if rc == nil {
		s.queue.AddAfter(ns, 10*time.Second)
		return nil
	}
	pods, err := s.n.localPods.Pods(ns).List(labels.Everything())
	if err != nil {
		return err
	}
	for _, p := range pods {
		if admitted(p) && !finished(p) && serviceLinks(p) {
			_, err := s.ensure(ctx, rc, ns)
			return err
		}
	}
	return s.delete(ctx, rc, ns)
}

// serviceLinks tells whether a pod gets its namespace's Service variables.
func serviceLinks(p *corev1.Pod) bool {
	return p.Spec.EnableServiceLinks == nil || *p.Spec.EnableServiceLinks
}

// attach makes the copy of pod read its home Service variables from the
// provider's ConfigMaps, written first, rather than carry them.
func (s *serviceEnvs) attach(ctx context.Context, rc *remoteCluster, pod *corev1.Pod, view *homeView) error {
	if view == nil || !serviceLinks(pod) {
		return nil
	}
	names, err := s.ensure(ctx, rc, pod.Namespace)
	if err != nil {
		return err
	}
	view.env, view.envFrom = nil, names
	return nil
}

// ensure writes the Service variables of namespace ns (those of Service
// default/kubernetes included) to the provider and returns the names of
// their ConfigMaps.
func (s *serviceEnvs) ensure(ctx context.Context, rc *remoteCluster, ns string) ([]string, error) {
	held, err := s.n.b.serviceEnvOf(ctx, ns)
	if err != nil {
		return nil, err
	}
	chunks := slices.Clone(held) // the cache's, never written
	s.mu.Lock()
	defer s.mu.Unlock()
	api := rc.client.CoreV1().ConfigMaps(rc.namespace)
	if _, ok := s.written[ns]; !ok {
		// The first time since the agent started: an earlier run may have
		// written more ConfigMaps, which copies still name. They are
		// numbered from 0 and only ever deleted all together.
		list, err := api.List(ctx, metav1.ListOptions{LabelSelector: ServiceEnvLabel + "=" + ns})
		if err != nil {
			return nil, err
		}
		s.written[ns] = len(list.Items)
	}
	for len(chunks) < s.written[ns] {
		chunks = append(chunks, map[string]string{})
	}
	names := make([]string, len(chunks))
	for i, data := range chunks {
		names[i] = serviceEnvName(ns, i)
		desired := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: names[i], Namespace: rc.namespace,
			Labels: map[string]string{ServiceEnvLabel: ns}}, Data: data}
		existing, err := api.Get(ctx, names[i], metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
			_, err = api.Create(ctx, desired, metav1.CreateOptions{FieldManager: FieldManager})
			if err != nil && !apierrors.IsAlreadyExists(err) {
				return nil, err
			}
		case err != nil:
			return nil, err
		case existing.Labels[ServiceEnvLabel] != ns:
			return nil, errCollision{fmt.Sprintf("configmap %s/%s at the provider does not carry the Service variables of %s", rc.namespace, names[i], ns)}
		case !maps.Equal(existing.Data, data):
			desired.ResourceVersion = existing.ResourceVersion
			if _, err := api.Update(ctx, desired, metav1.UpdateOptions{FieldManager: FieldManager}); err != nil {
				return nil, err
			}
		}
	}
	s.written[ns] = len(chunks)
	return names, nil
}

// delete removes the Service variables of namespace ns from the provider.
func (s *serviceEnvs) delete(ctx context.Context, rc *remoteCluster, ns string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	n, ok := s.written[ns]
	if !ok {
		return nil
	}
	for i := range n {
		err := rc.client.CoreV1().ConfigMaps(rc.namespace).Delete(ctx, serviceEnvName(ns, i), metav1.DeleteOptions{})
		if client404(err) != nil {
			return err
		}
	}
	delete(s.written, ns)
	return nil
}
