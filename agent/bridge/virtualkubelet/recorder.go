package virtualkubelet

import (
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/events"
	"k8s.io/client-go/tools/record"
)

// podControllerRecorder hands virtual-kubelet's pod controller, which takes
// a record.EventRecorder (the core/v1 Events API), the bridge's events.k8s.io
// recorder, so that the agent records through one API. The pod controller
// names no action (events.k8s.io requires one): its events are about syncing
// the pod to the provider.
type podControllerRecorder struct{ rec events.EventRecorder }

var _ record.EventRecorder = podControllerRecorder{}

func (r podControllerRecorder) Event(object runtime.Object, eventtype, reason, message string) {
	r.rec.Eventf(object, nil, eventtype, reason, "Sync", "%s", message)
}

func (r podControllerRecorder) Eventf(object runtime.Object, eventtype, reason, messageFmt string, args ...any) {
	r.rec.Eventf(object, nil, eventtype, reason, "Sync", messageFmt, args...)
}

// AnnotatedEventf drops the annotations: events.k8s.io Events carry none.
func (r podControllerRecorder) AnnotatedEventf(object runtime.Object, _ map[string]string, eventtype, reason, messageFmt string, args ...any) {
	r.Eventf(object, eventtype, reason, messageFmt, args...)
}
