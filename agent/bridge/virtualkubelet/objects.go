package virtualkubelet

import (
	"context"
	"strings"
	"sync"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	corev1listers "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
)

// localObjects are the ConfigMaps and Secrets of one namespace of this
// cluster as informers see them: started with the first pod of that
// namespace a virtual node mirrors, once the agent may read them there
// (mirroraccess.go), and shared by all nodes. Only the namespaces whose
// pods go to a provider are read, never the whole cluster's Secrets.
type localObjects struct {
	configMaps corev1listers.ConfigMapNamespaceLister
	secrets    corev1listers.SecretNamespaceLister
	// services, with Config.HomeNetwork only (nil otherwise): the Service
	// environment variables of the namespace's pods.
	services corev1listers.ServiceNamespaceLister
	synced   []cache.InformerSynced
}

// namespaceObjects is the localObjects of a namespace once started.
type namespaceObjects struct {
	mu   sync.Mutex // held while starting
	objs *localObjects
}

// localObjects returns the objects of namespace, starting their informers
// (and getting the right to read them) the first time.
func (b *Bridge) localObjects(ctx context.Context, namespace string) (*localObjects, error) {
	b.objectsMu.Lock()
	if b.objects == nil {
		b.objects = map[string]*namespaceObjects{}
	}
	nso := b.objects[namespace]
	if nso == nil {
		nso = &namespaceObjects{}
		b.objects[namespace] = nso
	}
	b.objectsMu.Unlock()
	nso.mu.Lock()
	defer nso.mu.Unlock()
	if nso.objs != nil {
		return nso.objs, nil
	}
	if err := b.ensureMirrorAccess(ctx, namespace); err != nil {
		return nil, err
	}
	factory := informers.NewSharedInformerFactoryWithOptions(b.local, 0, informers.WithNamespace(namespace),
		informers.WithTransform(stripManagedFields))
	cms, secrets := factory.Core().V1().ConfigMaps(), factory.Core().V1().Secrets()
	changed := func(kind string) cache.ResourceEventHandler {
		return cache.ResourceEventHandlerFuncs{
			AddFunc:    func(obj any) { b.localObjectChanged(kind, obj.(metav1.Object)) },
			UpdateFunc: func(_, obj any) { b.localObjectChanged(kind, obj.(metav1.Object)) },
		}
	}
	_, _ = cms.Informer().AddEventHandler(changed("ConfigMap"))
	_, _ = secrets.Informer().AddEventHandler(changed("Secret"))
	nso.objs = &localObjects{configMaps: cms.Lister().ConfigMaps(namespace), secrets: secrets.Lister().Secrets(namespace),
		synced: []cache.InformerSynced{cms.Informer().HasSynced, secrets.Informer().HasSynced}}
	if b.cfg.HomeNetwork != nil {
		svcs := factory.Core().V1().Services()
		servicesChanged := func() {
			for _, n := range b.runningNodes() {
				n.serviceEnv.servicesChanged(namespace)
			}
		}
		_, _ = svcs.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
			AddFunc:    func(any) { servicesChanged() },
			UpdateFunc: func(any, any) { servicesChanged() },
			DeleteFunc: func(any) { servicesChanged() },
		})
		nso.objs.services = svcs.Lister().Services(namespace)
		nso.objs.synced = append(nso.objs.synced, svcs.Informer().HasSynced)
	}
	factory.Start(b.ctx.Done())
	return nso.objs, nil
}

// startedObjects returns the objects of namespace if their informers run.
func (b *Bridge) startedObjects(namespace string) *localObjects {
	b.objectsMu.Lock()
	nso := b.objects[namespace]
	b.objectsMu.Unlock()
	if nso == nil {
		return nil
	}
	nso.mu.Lock()
	defer nso.mu.Unlock()
	return nso.objs
}

// localObjectChanged queues the copies of a ConfigMap or Secret.
func (b *Bridge) localObjectChanged(kind string, o metav1.Object) {
	for _, n := range b.runningNodes() {
		n.objects.changed(kind, o.GetNamespace(), o.GetName())
	}
}

// objectMirror knows which ConfigMaps and Secrets the pods of one virtual
// node use: it follows the node's local pods (as an informer handler) and
// counts each object's users. Its reflectors (reflection.go) keep their
// copies at the provider.
type objectMirror struct {
	n *providerNode
	// configMaps and secrets reflect the objects of each kind.
	configMaps, secrets objectReflector
	// synced: every pod the informer listed has been counted.
	synced cache.InformerSynced

	mu    sync.Mutex
	byPod map[string]objectRefs // local pod key -> its objects
	users map[string]int        // kind/namespace/name -> how many pods use it
}

var _ cache.ResourceEventHandler = (*objectMirror)(nil)

func newObjectMirror(n *providerNode) *objectMirror {
	m := &objectMirror{n: n, byPod: map[string]objectRefs{}, users: map[string]int{}}
	if n != nil {
		m.configMaps, m.secrets = newReflector(n, configMapKind{}), newReflector(n, secretKind{n})
	}
	return m
}

func objectKey(kind, namespace, name string) string { return kind + "/" + namespace + "/" + name }

// OnAdd also looks at the pod's home API token: at start-up, the tokens of
// the copies made by an earlier run are renewed when due.
func (m *objectMirror) OnAdd(obj any, _ bool) {
	p := obj.(*corev1.Pod)
	m.track(p)
	m.n.tokens.track(p)
	m.n.serviceEnv.track(p)
}

func (m *objectMirror) OnUpdate(_, obj any) {
	p := obj.(*corev1.Pod)
	m.track(p)
	if finished(p) {
		m.n.tokens.track(p)         // its token goes
		m.n.serviceEnv.track(p)     // and its namespace's variables, if it was the last
		m.n.b.enqueue(m.n.provider) // the node may be removable
	}
}

func (m *objectMirror) OnDelete(obj any) {
	if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = d.Obj
	}
	p, ok := obj.(*corev1.Pod)
	if !ok {
		return
	}
	m.mu.Lock()
	unused := m.setLocked(p.Namespace, p.Name, objectRefs{})
	m.mu.Unlock()
	m.release(p.Namespace, unused)
	m.n.tokens.track(p) // its token goes
	m.n.serviceEnv.track(p)
	m.n.b.enqueue(m.n.provider)
}

// track records the objects a pod uses; a pod not admitted uses none yet
// (nothing of it goes to the provider).
func (m *objectMirror) track(p *corev1.Pod) {
	refs := objectRefs{}
	if admitted(p) {
		refs = refsOf(p)
	}
	m.mu.Lock()
	unused := m.setLocked(p.Namespace, p.Name, refs)
	m.mu.Unlock()
	m.release(p.Namespace, unused)
}

// setLocked records the objects a pod uses and returns those no pod uses any more.
func (m *objectMirror) setLocked(namespace, name string, refs objectRefs) (unused objectRefs) {
	key := namespace + "/" + name
	old := m.byPod[key]
	if refs.empty() {
		delete(m.byPod, key)
	} else {
		m.byPod[key] = refs
	}
	for _, n := range refs.ConfigMaps {
		m.users[objectKey("ConfigMap", namespace, n)]++
	}
	for _, n := range refs.Secrets {
		m.users[objectKey("Secret", namespace, n)]++
	}
	release := func(kind string, names []string) []string {
		var gone []string
		for _, n := range names {
			k := objectKey(kind, namespace, n)
			if m.users[k]--; m.users[k] <= 0 {
				delete(m.users, k)
				gone = append(gone, n)
			}
		}
		return gone
	}
	unused.ConfigMaps = release("ConfigMap", old.ConfigMaps)
	unused.Secrets = release("Secret", old.Secrets)
	return unused
}

// release queues the objects of namespace no pod uses any more: their
// copies go.
func (m *objectMirror) release(namespace string, unused objectRefs) {
	if m.configMaps == nil { // a mirror that only counts (tests)
		return
	}
	for _, name := range unused.ConfigMaps {
		m.configMaps.enqueue(types.NamespacedName{Namespace: namespace, Name: name})
	}
	for _, name := range unused.Secrets {
		m.secrets.enqueue(types.NamespacedName{Namespace: namespace, Name: name})
	}
}

func (m *objectMirror) usedLocked(kind, namespace, name string) bool {
	return m.users[objectKey(kind, namespace, name)] > 0
}

// uses: a pod of the node uses the object; known: every pod is counted.
func (m *objectMirror) uses(kind string, key types.NamespacedName) (used, known bool) {
	m.mu.Lock()
	used = m.usedLocked(kind, key.Namespace, key.Name)
	m.mu.Unlock()
	return used, m.synced == nil || m.synced()
}

func (m *objectMirror) reflector(kind string) objectReflector {
	if kind == "Secret" {
		return m.secrets
	}
	return m.configMaps
}

// changed queues the copy of a local object that changed.
func (m *objectMirror) changed(kind, namespace, name string) {
	m.reflector(kind).enqueue(types.NamespacedName{Namespace: namespace, Name: name})
}

// resync queues every object in use: after a connection to the provider,
// the copies deleted meanwhile are made again.
func (m *objectMirror) resync() {
	m.mu.Lock()
	var keys [][2]string
	for k := range m.users {
		kind, rest, _ := strings.Cut(k, "/")
		keys = append(keys, [2]string{kind, rest})
	}
	m.mu.Unlock()
	for _, k := range keys {
		namespace, name, _ := strings.Cut(k[1], "/")
		m.changed(k[0], namespace, name)
	}
}

// run reflects until ctx ends.
func (m *objectMirror) run(ctx context.Context) {
	var wg sync.WaitGroup
	for _, r := range []objectReflector{m.configMaps, m.secrets} {
		wg.Go(func() { r.run(ctx) })
	}
	wg.Wait()
}

// ensure copies the objects pod uses now, before its copy is made; one that
// does not exist here is skipped (the provider's kubelet then waits for it,
// as ours would).
func (m *objectMirror) ensure(ctx context.Context, rc *remoteCluster, pod *corev1.Pod) error {
	refs := refsOf(pod)
	m.track(pod)
	for _, name := range refs.ConfigMaps {
		if err := m.configMaps.reflect(ctx, rc, types.NamespacedName{Namespace: pod.Namespace, Name: name}); err != nil {
			return err
		}
	}
	for _, name := range refs.Secrets {
		if err := m.secrets.reflect(ctx, rc, types.NamespacedName{Namespace: pod.Namespace, Name: name}); err != nil {
			return err
		}
	}
	return nil
}

func deleteExactly(uid types.UID) metav1.DeleteOptions {
	return metav1.DeleteOptions{Preconditions: metav1.NewUIDPreconditions(string(uid))}
}

// stripManagedFields saves the informers' memory.
func stripManagedFields(obj any) (any, error) {
	if o, ok := obj.(metav1.Object); ok {
		o.SetManagedFields(nil)
	}
	return obj, nil
}
