package virtualkubelet

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
)

// skippedEventReasons are the provider's Events about a copy that are not
// recorded on its pod: its scheduler's. The pod was scheduled here, to the
// virtual node (its Scheduled Event says so), and the provider's nodes are
// none of this cluster's; a copy the provider's scheduler leaves unplaced
// is reported as ProviderUnschedulable after --provider-unschedulable-after
// (a FailedScheduling while it preempts the reservation's placeholder is
// expected, and would only alarm).
var skippedEventReasons = map[string]bool{"Scheduled": true, "FailedScheduling": true}

// eventMirror records the provider's Events about the copies on their pods,
// from one watch of the Events about pods in the tenant namespace. Each
// provider Event becomes one local Event with the same type and reason, its
// message prefixed "(on <provider>)" with the provider's names of the copy
// and of its objects replaced by the local ones, and its count: a count
// that grows at the provider updates the same local Event. The local Event's
// name derives from the provider Event's UID, so an agent that restarts (and
// lists every Event again) finds the ones it recorded instead of adding
// more. Writes are queued, at most 10 per second after a burst of 100, and
// the updates of one Event that pile up meanwhile are written once.
type eventMirror struct {
	h     *podHandler
	queue workqueue.TypedRateLimitingInterface[types.UID]

	mu      sync.Mutex
	pending map[types.UID]*corev1.Event // provider Events to record, their latest version
	written map[types.UID]int32         // provider Events recorded, with the count recorded
	tries   map[types.UID]int           // waits for the copy to reach the informer
}

// eventMirror starts the pod handler's event mirror, once.
func (h *podHandler) eventMirror() *eventMirror {
	h.eventOnce.Do(func() {
		h.events = &eventMirror{h: h, pending: map[types.UID]*corev1.Event{}, written: map[types.UID]int32{}, tries: map[types.UID]int{},
			queue: workqueue.NewTypedRateLimitingQueueWithConfig(workqueue.DefaultTypedControllerRateLimiter[types.UID](),
				workqueue.TypedRateLimitingQueueConfig[types.UID]{Name: "rb-events-" + h.n.provider})}
		h.n.goRun(h.events.run)
	})
	return h.events
}

// handler receives the provider's Events about pods.
func (m *eventMirror) handler() cache.ResourceEventHandler {
	return cache.ResourceEventHandlerFuncs{
		AddFunc:    m.offer,
		UpdateFunc: func(_, obj any) { m.offer(obj) },
		DeleteFunc: func(obj any) {
			if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = d.Obj
			}
			if e, ok := obj.(*corev1.Event); ok {
				m.mu.Lock()
				delete(m.written, e.UID)
				delete(m.pending, e.UID)
				delete(m.tries, e.UID)
				m.mu.Unlock()
			}
		},
	}
}

func (m *eventMirror) offer(obj any) {
	e, ok := obj.(*corev1.Event)
	if !ok || e.InvolvedObject.Kind != "Pod" || skippedEventReasons[e.Reason] {
		return
	}
	m.mu.Lock()
	recorded, seen := m.written[e.UID]
	news := !seen || eventCount(e) > recorded // not a resync, nor a change we do not show
	if news {
		m.pending[e.UID] = e
	}
	m.mu.Unlock()
	if news {
		m.queue.AddRateLimited(e.UID)
	}
}

func (m *eventMirror) run() {
	ctx := m.h.n.ctx
	go func() {
		<-ctx.Done()
		m.queue.ShutDown()
	}()
	for {
		uid, quit := m.queue.Get()
		if quit {
			return
		}
		err := m.sync(ctx, uid)
		switch {
		case errors.Is(err, errCopyNotSeen):
			m.queue.AddAfter(uid, time.Second)
		case err != nil && ctx.Err() == nil && m.queue.NumRequeues(uid) < 5:
			m.h.n.log.V(1).Info("recording a provider Event, retrying", "error", err.Error())
			m.queue.AddRateLimited(uid)
		default:
			if err != nil && ctx.Err() == nil {
				m.h.n.log.Info("could not record a provider Event", "error", err.Error())
			}
			m.queue.Forget(uid)
		}
		m.queue.Done(uid)
	}
}

// errCopyNotSeen: the Event is about a copy the pod informer has not seen yet.
var errCopyNotSeen = errors.New("copy not seen yet")

// sync records one provider Event on its pod.
func (m *eventMirror) sync(ctx context.Context, uid types.UID) error {
	m.mu.Lock()
	e := m.pending[uid]
	delete(m.pending, uid)
	recorded, seen := m.written[uid]
	m.mu.Unlock()
	if e == nil || (seen && eventCount(e) <= recorded) {
		return nil
	}
	local, remote, ok := m.podOf(e)
	if !ok {
		m.mu.Lock()
		defer m.mu.Unlock()
		if m.tries[uid]++; m.tries[uid] > 5 {
			delete(m.tries, uid)
			return nil // a copy gone, or not ours
		}
		if _, newer := m.pending[uid]; !newer {
			m.pending[uid] = e
		}
		return errCopyNotSeen
	}
	ev := localEvent(e, local, remote, m.h.n.provider, m.h.n.name)
	events := m.h.n.b.local.CoreV1().Events(ev.Namespace)
	update := func() error {
		patch, err := json.Marshal(map[string]any{"count": ev.Count, "lastTimestamp": ev.LastTimestamp, "message": ev.Message})
		if err != nil {
			return err
		}
		_, err = events.Patch(ctx, ev.Name, types.MergePatchType, patch, metav1.PatchOptions{})
		return err
	}
	var err error
	if seen {
		if err = update(); apierrors.IsNotFound(err) {
			_, err = events.Create(ctx, ev, metav1.CreateOptions{})
		}
	} else if _, err = events.Create(ctx, ev, metav1.CreateOptions{}); apierrors.IsAlreadyExists(err) {
		err = update() // recorded by an earlier run of the agent
	}
	if err != nil {
		m.mu.Lock()
		if _, newer := m.pending[uid]; !newer {
			m.pending[uid] = e
		}
		m.mu.Unlock()
		return err
	}
	m.mu.Lock()
	m.written[uid] = ev.Count
	delete(m.tries, uid)
	m.mu.Unlock()
	return nil
}

// podOf finds the copy an Event is about, and its pod.
func (m *eventMirror) podOf(e *corev1.Event) (local, remote *corev1.Pod, ok bool) {
	rc := m.h.n.currentRemote()
	if rc == nil {
		return nil, nil, false
	}
	remote, err := rc.pods.Get(e.InvolvedObject.Name)
	if err != nil || remote.UID != e.InvolvedObject.UID {
		return nil, nil, false
	}
	key, uid, ok := originOf(remote)
	if !ok {
		return nil, nil, false
	}
	local, err = m.h.n.localPods.Pods(key.Namespace).Get(key.Name)
	if err != nil || local.UID != uid {
		return nil, nil, false
	}
	return local, remote, true
}

// localEvent is the provider Event e about the copy remote, recorded on its
// pod local (on virtual node node of provider).
func localEvent(e *corev1.Event, local, remote *corev1.Pod, provider, node string) *corev1.Event {
	first, last := eventTimes(e)
	return &corev1.Event{
		ObjectMeta: metav1.ObjectMeta{Name: mirroredEventName(local.Name, e.UID), Namespace: local.Namespace},
		InvolvedObject: corev1.ObjectReference{Kind: "Pod", APIVersion: "v1", Namespace: local.Namespace, Name: local.Name,
			UID: local.UID, FieldPath: e.InvolvedObject.FieldPath},
		Type:    e.Type,
		Reason:  e.Reason,
		Message: fmt.Sprintf("(on %s) %s", provider, localizer(local, remote).Replace(e.Message)),
		// kubectl describe shows "<component>, <host>": e.g. the kubelet, of the virtual node.
		Source:         corev1.EventSource{Component: cmp.Or(e.Source.Component, e.ReportingController), Host: node},
		FirstTimestamp: first,
		LastTimestamp:  last,
		Count:          eventCount(e),
	}
}

// mirroredEventName is the name of the local Event recording the provider
// Event uid on pod podName (as the recorder names them: "<pod>.<suffix>").
func mirroredEventName(podName string, uid types.UID) string {
	sum := sha256.Sum256([]byte(uid))
	suffix := hex.EncodeToString(sum[:8])
	if max := validation.DNS1123SubdomainMaxLength - len(suffix) - 1; len(podName) > max {
		podName = strings.TrimRight(podName[:max], "-.")
	}
	return podName + "." + suffix
}

// eventCount is how often an Event happened: its count, or its series'.
func eventCount(e *corev1.Event) int32 {
	if e.Series != nil && e.Series.Count > e.Count {
		return e.Series.Count
	}
	return max(e.Count, 1)
}

// eventTimes are when an Event first and last happened, whichever API
// (core/v1 Events or events.k8s.io, which sets eventTime and a series)
// recorded it.
func eventTimes(e *corev1.Event) (first, last metav1.Time) {
	first, last = e.FirstTimestamp, e.LastTimestamp
	if first.IsZero() {
		first = metav1.NewTime(e.EventTime.Time)
	}
	if e.Series != nil && e.Series.LastObservedTime.After(last.Time) {
		last = metav1.NewTime(e.Series.LastObservedTime.Time)
	}
	if last.IsZero() {
		last = first
	}
	return first, last
}
