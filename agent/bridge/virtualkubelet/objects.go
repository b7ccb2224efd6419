package virtualkubelet

import (
	"context"
	"fmt"
	"maps"
	"sync"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
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

// localObjectChanged keeps the copies of a ConfigMap or Secret in sync.
func (b *Bridge) localObjectChanged(kind string, o metav1.Object) {
	for _, n := range b.runningNodes() {
		n.objects.changed(kind, o.GetNamespace(), o.GetName())
	}
}

// objectMirror keeps the copies of the ConfigMaps and Secrets that the pods
// of one virtual node use. It follows the node's local pods (as an informer
// handler) to know which objects are in use, updates copies when the local
// objects change, and deletes copies no pod uses any more.
type objectMirror struct {
	n *providerNode

	mu    sync.Mutex
	byPod map[string]objectRefs // local pod key -> its objects
	users map[string]int        // kind/namespace/name -> how many pods use it
}

var _ cache.ResourceEventHandler = (*objectMirror)(nil)

func newObjectMirror(n *providerNode) *objectMirror {
	return &objectMirror{n: n, byPod: map[string]objectRefs{}, users: map[string]int{}}
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
	m.n.tokens.track(p) // its token goes
	m.n.serviceEnv.track(p)
	if !unused.empty() {
		go m.deleteCopies(p.Namespace, unused)
	}
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
	defer m.mu.Unlock()
	m.setLocked(p.Namespace, p.Name, refs)
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

func (m *objectMirror) usedLocked(kind, namespace, name string) bool {
	return m.users[objectKey(kind, namespace, name)] > 0
}

// changed updates the copy of a local object that pods here use.
func (m *objectMirror) changed(kind, namespace, name string) {
	m.mu.Lock()
	used := m.usedLocked(kind, namespace, name)
	m.mu.Unlock()
	rc := m.n.currentRemote()
	objs := m.n.b.startedObjects(namespace)
	if !used || rc == nil || objs == nil {
		return
	}
	var err error
	switch kind {
	case "ConfigMap":
		err = m.copyConfigMap(m.n.ctx, rc, objs, namespace, name)
	case "Secret":
		err = m.copySecret(m.n.ctx, rc, objs, namespace, name)
	}
	if err != nil {
		m.n.log.Error(err, "updating a copy", "kind", kind, "object", namespace+"/"+name)
	} else {
		m.n.log.V(1).Info("copy updated", "kind", kind, "object", namespace+"/"+name)
	}
}

// ensure copies the objects pod uses; one that does not exist here is
// skipped (the provider's kubelet then waits for it, as ours would).
func (m *objectMirror) ensure(ctx context.Context, rc *remoteCluster, pod *corev1.Pod) error {
	refs := refsOf(pod)
	m.track(pod)
	if refs.empty() {
		return nil
	}
	objs, err := m.n.b.localObjects(ctx, pod.Namespace)
	if err != nil {
		return err
	}
	if !cache.WaitForCacheSync(ctx.Done(), objs.synced...) {
		return ctx.Err()
	}
	for _, name := range refs.ConfigMaps {
		if err := m.copyConfigMap(ctx, rc, objs, pod.Namespace, name); err != nil {
			return err
		}
	}
	for _, name := range refs.Secrets {
		if err := m.copySecret(ctx, rc, objs, pod.Namespace, name); err != nil {
			return err
		}
	}
	return nil
}

func (m *objectMirror) copyConfigMap(ctx context.Context, rc *remoteCluster, objs *localObjects, namespace, name string) error {
	local, err := objs.configMaps.Get(name)
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return err
	}
	desired := remoteConfigMap(local, m.n.mirrorParams(rc))
	api := rc.client.CoreV1().ConfigMaps(rc.namespace)
	existing, err := api.Get(ctx, desired.Name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		_, err = api.Create(ctx, desired, metav1.CreateOptions{FieldManager: FieldManager})
		return ignoreExists(err)
	}
	if err != nil {
		return err
	}
	if err := checkOrigin(existing, local.ObjectMeta, "configmap", rc.namespace); err != nil {
		return err
	}
	if equality.Semantic.DeepEqual(existing.Data, desired.Data) && equality.Semantic.DeepEqual(existing.BinaryData, desired.BinaryData) &&
		maps.Equal(existing.Labels, desired.Labels) && maps.Equal(existing.Annotations, desired.Annotations) &&
		equality.Semantic.DeepEqual(existing.Immutable, desired.Immutable) {
		return nil
	}
	if existing.Immutable != nil && *existing.Immutable {
		return m.replace(ctx, func() error { return api.Delete(ctx, desired.Name, deleteExactly(existing.UID)) },
			func() error {
				_, err := api.Create(ctx, desired, metav1.CreateOptions{FieldManager: FieldManager})
				return err
			})
	}
	desired.ResourceVersion = existing.ResourceVersion
	_, err = api.Update(ctx, desired, metav1.UpdateOptions{FieldManager: FieldManager})
	return err
}

func (m *objectMirror) copySecret(ctx context.Context, rc *remoteCluster, objs *localObjects, namespace, name string) error {
	local, err := objs.secrets.Get(name)
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return err
	}
	if local.Type == corev1.SecretTypeServiceAccountToken {
		m.n.log.Info("not copying a service account token to the provider", "secret", namespace+"/"+name)
		return nil
	}
	desired := remoteSecret(local, m.n.mirrorParams(rc))
	api := rc.client.CoreV1().Secrets(rc.namespace)
	existing, err := api.Get(ctx, desired.Name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		_, err = api.Create(ctx, desired, metav1.CreateOptions{FieldManager: FieldManager})
		return ignoreExists(err)
	}
	if err != nil {
		return err
	}
	if err := checkOrigin(existing, local.ObjectMeta, "secret", rc.namespace); err != nil {
		return err
	}
	if equality.Semantic.DeepEqual(existing.Data, desired.Data) && existing.Type == desired.Type &&
		maps.Equal(existing.Labels, desired.Labels) && maps.Equal(existing.Annotations, desired.Annotations) &&
		equality.Semantic.DeepEqual(existing.Immutable, desired.Immutable) {
		return nil
	}
	if (existing.Immutable != nil && *existing.Immutable) || existing.Type != desired.Type {
		return m.replace(ctx, func() error { return api.Delete(ctx, desired.Name, deleteExactly(existing.UID)) },
			func() error {
				_, err := api.Create(ctx, desired, metav1.CreateOptions{FieldManager: FieldManager})
				return err
			})
	}
	desired.ResourceVersion = existing.ResourceVersion
	_, err = api.Update(ctx, desired, metav1.UpdateOptions{FieldManager: FieldManager})
	return err
}

// replace deletes and creates again a copy that cannot be updated in place.
func (m *objectMirror) replace(_ context.Context, del, create func() error) error {
	if err := del(); client404(err) != nil {
		return err
	}
	return ignoreExists(create())
}

// deleteCopies removes copies that no pod of this node uses any more.
func (m *objectMirror) deleteCopies(namespace string, refs objectRefs) {
	rc := m.n.currentRemote()
	if rc == nil {
		return
	}
	ctx := m.n.ctx
	for _, name := range refs.ConfigMaps {
		err := rc.client.CoreV1().ConfigMaps(rc.namespace).Delete(ctx, RemoteName(namespace, name), metav1.DeleteOptions{})
		if client404(err) != nil {
			m.n.log.Info("deleting an unused copy", "configmap", namespace+"/"+name, "error", err.Error())
		}
	}
	for _, name := range refs.Secrets {
		err := rc.client.CoreV1().Secrets(rc.namespace).Delete(ctx, RemoteName(namespace, name), metav1.DeleteOptions{})
		if client404(err) != nil {
			m.n.log.Info("deleting an unused copy", "secret", namespace+"/"+name, "error", err.Error())
		}
	}
}

// checkOrigin refuses to overwrite an object that is not a copy of local.
func checkOrigin(existing metav1.Object, local metav1.ObjectMeta, kind, namespace string) error {
	key, _, ok := originOf(existing)
	if !ok || key != (types.NamespacedName{Namespace: local.Namespace, Name: local.Name}) {
		return errCollision{fmt.Sprintf("%s %s/%s at the provider is not a copy of %s/%s", kind, namespace, existing.GetName(), local.Namespace, local.Name)}
	}
	return nil
}

func deleteExactly(uid types.UID) metav1.DeleteOptions {
	return metav1.DeleteOptions{Preconditions: metav1.NewUIDPreconditions(string(uid))}
}

func ignoreExists(err error) error {
	if apierrors.IsAlreadyExists(err) {
		return nil
	}
	return err
}

// stripManagedFields saves the informers' memory.
func stripManagedFields(obj any) (any, error) {
	if o, ok := obj.(metav1.Object); ok {
		o.SetManagedFields(nil)
	}
	return obj, nil
}
