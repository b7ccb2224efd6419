package resourcebroker

import (
	"context"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// The API calls of the plugin (creating and deleting Reservations) never run
// on the scheduling path: PostFilter and PostBind put a small item on this
// queue and return; workers make the calls, retry failures with back-off,
// and give up after maxAttempts. A burst of pods that fit nowhere is a burst
// of creates, each one API round trip: several workers make them side by
// side rather than one after the other.

type opKind int

const (
	opCreate opKind = iota
	opDelete
)

type op struct {
	kind      opKind
	namespace string
	name      string    // reservation name
	podName   string    // opCreate: the pod to make it for
	uid       types.UID // opCreate: the pod's UID; opDelete: the reservation's UID
}

const (
	workers     = 8
	maxAttempts = 8
)

type worker struct {
	client dynamic.Interface
	queue  workqueue.TypedRateLimitingInterface[op]
	// build returns the reservation to create for pod namespace/name with
	// that UID, or nil when the pod is gone, replaced or already bound.
	build func(namespace, name string, uid types.UID) *unstructured.Unstructured
	// done is told the outcome of every create (err nil on success, also
	// when it already existed), once it is final.
	done func(o op, err error)

	mu       sync.Mutex
	inflight map[types.UID]op // pod UID -> create not yet seen by the cache
}

func newWorker(client dynamic.Interface) *worker {
	return &worker{
		client: client,
		queue: workqueue.NewTypedRateLimitingQueueWithConfig(
			workqueue.NewTypedItemExponentialFailureRateLimiter[op](50*time.Millisecond, 10*time.Second),
			workqueue.TypedRateLimitingQueueConfig[op]{Name: "resource-broker"}),
		inflight: map[types.UID]op{},
	}
}

func (w *worker) run(ctx context.Context) {
	for i := 0; i < workers; i++ {
		go wait.UntilWithContext(ctx, func(ctx context.Context) {
			for w.next(ctx) {
			}
		}, time.Second)
	}
	go func() {
		<-ctx.Done()
		w.queue.ShutDown()
	}()
}

// create asks for the reservation of pod; false when one is already on its way.
func (w *worker) create(pod *v1.Pod, name string) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	if _, ok := w.inflight[pod.UID]; ok {
		return false
	}
	o := op{kind: opCreate, namespace: pod.Namespace, name: name, podName: pod.Name, uid: pod.UID}
	w.inflight[pod.UID] = o
	w.queue.Add(o)
	return true
}

// creating tells whether a create for the pod is queued or running.
func (w *worker) creating(uid types.UID) (op, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	o, ok := w.inflight[uid]
	return o, ok
}

// inflightIn counts the creates on their way in namespace ns.
func (w *worker) inflightIn(ns string) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	n := 0
	for _, o := range w.inflight {
		if o.namespace == ns {
			n++
		}
	}
	return n
}

// forget drops the in-flight mark of pod uid (its reservation reached the
// cache, or the pod is gone).
func (w *worker) forget(uid types.UID) {
	w.mu.Lock()
	defer w.mu.Unlock()
	delete(w.inflight, uid)
}

// delete asks for the reservation namespace/name (only if its UID is still uid) to be deleted.
func (w *worker) delete(namespace, name string, uid types.UID) {
	w.queue.Add(op{kind: opDelete, namespace: namespace, name: name, uid: uid})
}

func (w *worker) next(ctx context.Context) bool {
	o, shutdown := w.queue.Get()
	if shutdown {
		return false
	}
	defer w.queue.Done(o)
	logger := klog.FromContext(ctx).WithValues("reservation", klog.KRef(o.namespace, o.name))
	err := w.do(ctx, o)
	if err == nil {
		w.queue.Forget(o)
		if o.kind == opCreate && w.done != nil {
			w.done(o, nil)
		}
		return true
	}
	if w.queue.NumRequeues(o) < maxAttempts-1 && ctx.Err() == nil {
		logger.V(2).Info("Retrying a broker reservation request", "op", o.kind, "err", err)
		w.queue.AddRateLimited(o)
		return true
	}
	logger.Error(err, "Giving up on a broker reservation request", "op", o.kind)
	w.queue.Forget(o)
	if o.kind == opCreate {
		w.forget(o.uid)
		if w.done != nil {
			w.done(o, err)
		}
	}
	return true
}

func (w *worker) do(ctx context.Context, o op) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	rc := w.client.Resource(reservationGVR).Namespace(o.namespace)
	switch o.kind {
	case opCreate:
		u := w.build(o.namespace, o.podName, o.uid)
		if u == nil {
			w.forget(o.uid)
			return nil
		}
		_, err := rc.Create(ctx, u, metav1.CreateOptions{FieldManager: "rb-scheduler"})
		if apierrors.IsAlreadyExists(err) {
			return nil
		}
		return err
	case opDelete:
		uid := o.uid
		err := rc.Delete(ctx, o.name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid}})
		if apierrors.IsNotFound(err) || apierrors.IsConflict(err) {
			return nil // gone already, or replaced by another one (not ours to delete)
		}
		return err
	}
	return nil
}

func toUnstructured(obj runtime.Object) (*unstructured.Unstructured, error) {
	m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(obj)
	if err != nil {
		return nil, err
	}
	return &unstructured.Unstructured{Object: m}, nil
}
