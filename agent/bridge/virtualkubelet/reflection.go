package virtualkubelet

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
)

// Reflection keeps at the provider, in the tenant namespace, a copy of each
// ConfigMap and Secret the pods of a virtual node use, named
// RemoteName(namespace, name) and marked with its origin (mirrorMeta), as
// Liqo's virtual kubelet reflects objects. A node has one reflector per
// kind; it is level-based: the key of a local object is queued when the
// object changes here, when a pod of the node starts or stops using it, and
// when its copy changes or goes at the provider (an informer on the copies,
// filtered by rbv1.RequesterLabel; remote.go). Reconciling a key makes the
// copy what it should be:
//   - a used object is written with server-side apply (FieldManager,
//     forced): an edit at the provider is undone, a deleted copy made
//     again. A copy apply cannot bring there (immutable data changed, a
//     Secret's type changed, data keys another manager owns) is deleted and
//     made anew;
//   - an object no pod uses any more loses its copy;
//   - an object at the provider that is not our copy is never written nor
//     deleted (errCollision).
//
// The kinds differ only in what a reflectedKind says
// (reflection_configmap.go, reflection_secret.go).

// reflectedKind is what the reflector needs to know of one kind of object.
type reflectedKind[T metav1.Object, A any] interface {
	// kind names it in the usage counts, logs and metrics ("ConfigMap").
	kind() string
	// local reads the objects of a namespace of this cluster.
	local(objs *localObjects) objectGetter[T]
	// cached reads the copies as the provider's informer sees them (nil: no informer).
	cached(rc *remoteCluster) objectGetter[T]
	// api writes the copies.
	api(rc *remoteCluster) objectAPI[T, A]
	// copyOf is the copy local should have, and its apply configuration;
	// false: local is not copied.
	copyOf(local T, p mirrorParams) (T, A, bool)
	// sameContent: existing holds what a pod reads of desired (data,
	// immutability, type).
	sameContent(existing, desired T) bool
	// mustReplace: apply cannot turn existing into desired.
	mustReplace(existing, desired T) bool
}

// objectGetter reads a cache (a namespace lister is one).
type objectGetter[T any] interface {
	Get(name string) (T, error)
}

// objectAPI is the provider's API of one kind in the tenant namespace
// (client-go's typed clients are ones).
type objectAPI[T any, A any] interface {
	Get(ctx context.Context, name string, opts metav1.GetOptions) (T, error)
	Apply(ctx context.Context, cfg A, opts metav1.ApplyOptions) (T, error)
	Delete(ctx context.Context, name string, opts metav1.DeleteOptions) error
}

// objectReflector is a reflector of any kind.
type objectReflector interface {
	// enqueue reconciles the copy of a local object soon.
	enqueue(key types.NamespacedName)
	// reflect reconciles it now.
	reflect(ctx context.Context, rc *remoteCluster, key types.NamespacedName) error
	// copyEvents is the handler of the provider's informer on the copies.
	copyEvents() cache.ResourceEventHandler
	run(ctx context.Context)
}

// Outcomes of a reflection, as rb_agent_reflections_total counts them.
const (
	reflectionApplied  = "applied"
	reflectionReplaced = "replaced"
	reflectionDeleted  = "deleted"
	reflectionFailed   = "failed"
)

var reflections = prometheus.NewCounterVec(prometheus.CounterOpts{
	Name: "rb_agent_reflections_total",
	Help: "Writes of the copies of ConfigMaps and Secrets at the providers, by kind and outcome (applied, replaced, deleted, failed).",
}, []string{"kind", "outcome"})

func init() { ctrlmetrics.Registry.MustRegister(reflections) }

// errUsageUnknown: the node's pods are not all known yet (transient).
var errUsageUnknown = errors.New("the pods of the node are not all known yet")

// reflectionWorkers per kind and node.
const reflectionWorkers = 2

type reflector[T metav1.Object, A any] struct {
	n     *providerNode
	k     reflectedKind[T, A]
	queue workqueue.TypedRateLimitingInterface[types.NamespacedName] // local objects
}

func newReflector[T metav1.Object, A any](n *providerNode, k reflectedKind[T, A]) *reflector[T, A] {
	return &reflector[T, A]{n: n, k: k, queue: workqueue.NewTypedRateLimitingQueueWithConfig(
		workqueue.NewTypedItemExponentialFailureRateLimiter[types.NamespacedName](100*time.Millisecond, 30*time.Second),
		workqueue.TypedRateLimitingQueueConfig[types.NamespacedName]{Name: "rb-reflect-" + strings.ToLower(k.kind()) + "-" + n.provider})}
}

func (r *reflector[T, A]) enqueue(key types.NamespacedName) { r.queue.Add(key) }

// copyEvents queues the local object of a copy that changed or went.
func (r *reflector[T, A]) copyEvents() cache.ResourceEventHandler {
	changed := func(obj any) {
		if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
			obj = d.Obj
		}
		if o, ok := obj.(metav1.Object); ok {
			if key, ok := copyKey(o); ok {
				r.enqueue(key)
			}
		}
	}
	return cache.ResourceEventHandlerFuncs{
		AddFunc:    changed,
		UpdateFunc: func(_, obj any) { changed(obj) },
		DeleteFunc: changed,
	}
}

func (r *reflector[T, A]) run(ctx context.Context) {
	go func() {
		<-ctx.Done()
		r.queue.ShutDown()
	}()
	var wg sync.WaitGroup
	for range reflectionWorkers {
		wg.Go(func() {
			for r.next(ctx) {
			}
		})
	}
	wg.Wait()
}

// next reconciles one key: transient failures are retried with a growing
// delay, a collision is not (the object at the provider is left alone).
func (r *reflector[T, A]) next(ctx context.Context) bool {
	key, quit := r.queue.Get()
	if quit {
		return false
	}
	defer r.queue.Done(key)
	rc := r.n.currentRemote()
	if rc == nil {
		r.queue.Forget(key) // a connection queues every object in use again (resync)
		return true
	}
	err := r.reflect(ctx, rc, key)
	switch {
	case err == nil || ctx.Err() != nil:
		r.queue.Forget(key)
	case permanent(err):
		r.n.log.Error(err, "not reflecting", "kind", r.k.kind(), "object", key.String())
		r.queue.Forget(key)
	default:
		r.n.log.V(1).Info("reflecting, retrying", "kind", r.k.kind(), "object", key.String(), "error", err.Error())
		r.queue.AddRateLimited(key)
	}
	return true
}

func (r *reflector[T, A]) reflect(ctx context.Context, rc *remoteCluster, key types.NamespacedName) error {
	outcome, err := r.sync(ctx, rc, key)
	switch {
	case err != nil && !errors.Is(err, errUsageUnknown):
		reflections.WithLabelValues(r.k.kind(), reflectionFailed).Inc()
	case outcome != "":
		reflections.WithLabelValues(r.k.kind(), outcome).Inc()
		r.n.log.V(1).Info("reflected", "kind", r.k.kind(), "object", key.String(), "outcome", outcome)
	}
	return err
}

// sync makes the copy of key what it should be and says what it did ("":
// nothing).
func (r *reflector[T, A]) sync(ctx context.Context, rc *remoteCluster, key types.NamespacedName) (string, error) {
	used, known := r.n.objects.uses(r.k.kind(), key)
	if !known {
		return "", errUsageUnknown
	}
	if !used {
		return r.deleteCopy(ctx, rc, key)
	}
	objs, err := r.n.b.localObjects(ctx, key.Namespace)
	if err != nil {
		return "", err
	}
	if !cache.WaitForCacheSync(ctx.Done(), objs.synced...) {
		return "", ctx.Err()
	}
	local, err := r.k.local(objs).Get(key.Name)
	if apierrors.IsNotFound(err) {
		return "", nil // the provider's kubelet waits for it, as ours would
	}
	if err != nil {
		return "", err
	}
	// A copy's metadata needs no more than these (no node, no reservation).
	desired, cfg, ok := r.k.copyOf(local, mirrorParams{clusterID: r.n.b.cfg.ClusterID, namespace: rc.namespace})
	if !ok {
		return "", nil
	}
	existing, found, err := r.current(ctx, rc, desired.GetName())
	if err != nil {
		return "", err
	}
	if found {
		if err := checkOrigin(existing, key, r.k.kind(), rc.namespace); err != nil {
			return "", err
		}
		if r.upToDate(existing, desired) {
			return "", nil
		}
		if r.k.mustReplace(existing, desired) {
			return r.replace(ctx, rc, existing, cfg)
		}
	}
	applied, err := r.k.api(rc).Apply(ctx, cfg, metav1.ApplyOptions{FieldManager: FieldManager, Force: true})
	if err != nil {
		return "", err
	}
	if !r.k.sameContent(applied, desired) {
		// Data keys another manager added: apply leaves what it does not own.
		return r.replace(ctx, rc, applied, cfg)
	}
	return reflectionApplied, nil
}

// upToDate: existing is desired, marks of origin included.
func (r *reflector[T, A]) upToDate(existing, desired T) bool {
	return r.k.sameContent(existing, desired) && maps.Equal(existing.GetLabels(), desired.GetLabels()) &&
		maps.Equal(existing.GetAnnotations(), desired.GetAnnotations())
}

// current is the object at the provider under the copy's name: the
// informer's, else read (an object not labelled as our copies are is not
// in the informer, and must not be overwritten either).
func (r *reflector[T, A]) current(ctx context.Context, rc *remoteCluster, name string) (T, bool, error) {
	if cached := r.k.cached(rc); cached != nil {
		if o, err := cached.Get(name); err == nil {
			return o, true, nil
		}
	}
	o, err := r.k.api(rc).Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return o, false, nil
	}
	return o, err == nil, err
}

// replace deletes existing, exactly that object, and makes the copy anew.
func (r *reflector[T, A]) replace(ctx context.Context, rc *remoteCluster, existing T, cfg A) (string, error) {
	api := r.k.api(rc)
	if err := api.Delete(ctx, existing.GetName(), deleteExactly(existing.GetUID())); client404(err) != nil {
		return "", err
	}
	if _, err := api.Apply(ctx, cfg, metav1.ApplyOptions{FieldManager: FieldManager, Force: true}); err != nil {
		return "", err
	}
	return reflectionReplaced, nil
}

// deleteCopy deletes the copy of key, if there is one.
func (r *reflector[T, A]) deleteCopy(ctx context.Context, rc *remoteCluster, key types.NamespacedName) (string, error) {
	existing, found, err := r.current(ctx, rc, RemoteName(key.Namespace, key.Name))
	if err != nil || !found {
		return "", err
	}
	if origin, _, ok := originOf(existing); !ok || origin != key {
		return "", nil // not ours
	}
	err = r.k.api(rc).Delete(ctx, existing.GetName(), deleteExactly(existing.GetUID()))
	if client404(err) != nil && !apierrors.IsConflict(err) {
		return "", err
	}
	return reflectionDeleted, nil
}

// copyKey is the local object whose copy's name o holds: as its marks of
// origin say, else as its name says (an object someone else made or marked
// under the name of a copy: when it changes or goes, the copy is due).
func copyKey(o metav1.Object) (types.NamespacedName, bool) {
	if key, _, ok := originOf(o); ok {
		return key, true
	}
	namespace, name, ok := strings.Cut(o.GetName(), ".") // a namespace has no dots
	if !ok {
		return types.NamespacedName{}, false
	}
	return types.NamespacedName{Namespace: namespace, Name: name}, true
}

// checkOrigin refuses to overwrite an object that is not the copy of key.
func checkOrigin(existing metav1.Object, key types.NamespacedName, kind, namespace string) error {
	if origin, _, ok := originOf(existing); !ok || origin != key {
		return errCollision{fmt.Sprintf("%s %s/%s at the provider is not a copy of %s", strings.ToLower(kind), namespace, existing.GetName(), key)}
	}
	return nil
}
