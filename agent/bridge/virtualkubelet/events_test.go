package virtualkubelet

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/util/workqueue"
)

// TestLocalEvent: a provider Event about a copy, as recorded on its pod.
func TestLocalEvent(t *testing.T) {
	local := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "web-0", UID: "uid-local"}}
	remote := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "rb-rome", Name: "shop.web-0", UID: "uid-copy"}}
	first := metav1.NewTime(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))
	last := metav1.NewTime(first.Add(time.Minute))
	e := &corev1.Event{
		ObjectMeta: metav1.ObjectMeta{Namespace: "rb-rome", Name: "shop.web-0.1834", UID: "uid-event"},
		InvolvedObject: corev1.ObjectReference{Kind: "Pod", Namespace: "rb-rome", Name: "shop.web-0", UID: "uid-copy",
			FieldPath: "spec.containers{app}"},
		Type: corev1.EventTypeWarning, Reason: "BackOff",
		Message: "Back-off restarting failed container app in pod shop.web-0_rb-rome(uid-copy)",
		Source:  corev1.EventSource{Component: "kubelet", Host: "paris-node-1"},
		Count:   4, FirstTimestamp: first, LastTimestamp: last,
	}
	got := localEvent(e, local, remote, "paris", "rb-paris")
	assert.Equal(t, corev1.ObjectReference{Kind: "Pod", APIVersion: "v1", Namespace: "shop", Name: "web-0", UID: "uid-local",
		FieldPath: "spec.containers{app}"}, got.InvolvedObject)
	assert.Equal(t, "shop", got.Namespace)
	assert.Equal(t, "(on paris) Back-off restarting failed container app in pod web-0_shop(uid-local)", got.Message)
	assert.Equal(t, corev1.EventTypeWarning, got.Type)
	assert.Equal(t, "BackOff", got.Reason)
	assert.Equal(t, corev1.EventSource{Component: "kubelet", Host: "rb-paris"}, got.Source, "not the provider's node")
	assert.Equal(t, int32(4), got.Count)
	assert.Equal(t, first, got.FirstTimestamp)
	assert.Equal(t, last, got.LastTimestamp)
	assert.True(t, strings.HasPrefix(got.Name, "web-0."), got.Name)
	assert.Equal(t, got.Name, localEvent(e, local, remote, "paris", "rb-paris").Name, "the same provider Event, the same local Event")
	e2 := e.DeepCopy()
	e2.UID = "uid-event-2"
	assert.NotEqual(t, got.Name, localEvent(e2, local, remote, "paris", "rb-paris").Name)

	// events.k8s.io Events: an eventTime and a series.
	series := &corev1.Event{EventTime: metav1.NewMicroTime(first.Time), ReportingController: "example.com/controller",
		Series: &corev1.EventSeries{Count: 7, LastObservedTime: metav1.NewMicroTime(last.Time)}}
	got = localEvent(series, local, remote, "paris", "rb-paris")
	assert.Equal(t, int32(7), got.Count)
	assert.True(t, got.FirstTimestamp.Equal(&first), "%s", got.FirstTimestamp)
	assert.True(t, got.LastTimestamp.Equal(&last), "%s", got.LastTimestamp)
	assert.Equal(t, "example.com/controller", got.Source.Component)
	assert.Equal(t, int32(1), eventCount(&corev1.Event{}), "an Event happened at least once")

	long := strings.Repeat("p", validation.DNS1123SubdomainMaxLength)
	name := mirroredEventName(long, "uid")
	assert.LessOrEqual(t, len(name), validation.DNS1123SubdomainMaxLength)
	assert.Empty(t, validation.IsDNS1123Subdomain(name))
}

// TestEventMirrorOffers: the provider scheduler's Events are not recorded,
// and an update that does not raise the count recorded (a resync, a new
// resourceVersion) is no news.
func TestEventMirrorOffers(t *testing.T) {
	m := &eventMirror{pending: map[types.UID]*corev1.Event{}, written: map[types.UID]int32{},
		queue: workqueue.NewTypedRateLimitingQueue(workqueue.DefaultTypedControllerRateLimiter[types.UID]())}
	defer m.queue.ShutDown()
	ev := func(uid types.UID, reason string, count int32) *corev1.Event {
		return &corev1.Event{ObjectMeta: metav1.ObjectMeta{UID: uid}, InvolvedObject: corev1.ObjectReference{Kind: "Pod"}, Reason: reason, Count: count}
	}
	m.offer(ev("a", "Scheduled", 1))
	m.offer(ev("b", "FailedScheduling", 3))
	m.offer(&corev1.Event{ObjectMeta: metav1.ObjectMeta{UID: "c"}, InvolvedObject: corev1.ObjectReference{Kind: "Node"}, Reason: "Started"})
	assert.Empty(t, m.pending, "the scheduler's Events, and Events about other things, are not recorded")

	m.offer(ev("d", "BackOff", 1))
	m.offer(ev("d", "BackOff", 2))
	assert.Len(t, m.pending, 1, "one provider Event, its latest version")
	assert.Equal(t, int32(2), m.pending["d"].Count)
	delete(m.pending, "d")
	m.written["d"] = 2
	m.offer(ev("d", "BackOff", 2))
	assert.Empty(t, m.pending, "recorded with that count already")
	m.offer(ev("d", "BackOff", 3))
	assert.Equal(t, int32(3), m.pending["d"].Count)

	m.handler().OnDelete(ev("d", "BackOff", 3))
	assert.Empty(t, m.pending)
	assert.Empty(t, m.written, "forgotten with the provider's Event")
}
