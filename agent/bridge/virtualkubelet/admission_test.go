package virtualkubelet

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	rbv1 "github.com/fluidos-project/resource-broker/api/v1alpha1"
)

func admissionPod(cpu, memory string) *corev1.Pod {
	requests := corev1.ResourceList{}
	if cpu != "" {
		requests[corev1.ResourceCPU] = resource.MustParse(cpu)
	}
	if memory != "" {
		requests[corev1.ResourceMemory] = resource.MustParse(memory)
	}
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "web-0", UID: "uid-1"},
		Spec: corev1.PodSpec{NodeName: "rb-paris", Containers: []corev1.Container{{Name: "app", Image: "rb.test/testapp:v1",
			Resources: corev1.ResourceRequirements{Requests: requests}}}},
	}
}

func admissionReservation(name, pod, provider string, phase rbv1.ReservationPhase, cpu, memory string) rbv1.Reservation {
	return rbv1.Reservation{
		ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: name},
		Spec: rbv1.ReservationSpec{PodName: pod, Resources: corev1.ResourceList{
			corev1.ResourceCPU: resource.MustParse(cpu), corev1.ResourceMemory: resource.MustParse(memory)}},
		Status: rbv1.ReservationStatus{Phase: phase, Provider: provider, ReservationID: "id-" + name},
	}
}

// TestDecide: a pod is admitted to its virtual node only with a live
// reservation at that node's provider that names it and covers its requests,
// and with requests in every container; each refusal says why and how to get
// capacity.
func TestDecide(t *testing.T) {
	pod := admissionPod("500m", "128Mi")
	active := admissionReservation("web-0-abc", "web-0", "paris", rbv1.ReservationActive, "500m", "128Mi")

	v := decide(pod, []rbv1.Reservation{active}, "paris", "rb-paris")
	assert.True(t, v.admit, v.message)
	assert.Equal(t, "web-0-abc", v.reservation.Name)
	assert.Contains(t, v.message, "reservation web-0-abc (broker id id-web-0-abc) at paris holds cpu=500m, memory=128Mi")
	reserved := admissionReservation("web-0-abc", "web-0", "paris", rbv1.ReservationReserved, "1", "1Gi")
	assert.True(t, decide(pod, []rbv1.Reservation{reserved}, "paris", "rb-paris").admit, "Reserved is live too")

	for name, c := range map[string]struct {
		rsvs []rbv1.Reservation
		pod  *corev1.Pod
		want []string
	}{
		"none": {pod: pod, want: []string{"no live broker reservation at paris names this pod, so it is not run there",
			"schedulerName: resource-broker", "virtual node rb-paris"}},
		"another pod's": {pod: pod, rsvs: []rbv1.Reservation{admissionReservation("web-1-x", "web-1", "paris", rbv1.ReservationActive, "1", "1Gi")},
			want: []string{"no live broker reservation at paris names this pod"}},
		"at another provider": {pod: pod, rsvs: []rbv1.Reservation{admissionReservation("web-0-b", "web-0", "berlin", rbv1.ReservationActive, "1", "1Gi")},
			want: []string{"(reservation web-0-b is at provider berlin)"}},
		"not reserved yet": {pod: pod, rsvs: []rbv1.Reservation{admissionReservation("web-0-p", "web-0", "", rbv1.ReservationPending, "1", "1Gi")},
			want: []string{"(reservation web-0-p is Pending)"}},
		"released": {pod: pod, rsvs: []rbv1.Reservation{admissionReservation("web-0-r", "web-0", "paris", rbv1.ReservationReleased, "1", "1Gi")},
			want: []string{"(reservation web-0-r is Released)"}},
		"too small": {pod: admissionPod("2", "128Mi"), rsvs: []rbv1.Reservation{active},
			want: []string{"reservation web-0-abc at paris holds cpu=500m, memory=128Mi, less than the pod requests (cpu=2)"}},
		"no requests": {pod: admissionPod("", ""), rsvs: []rbv1.Reservation{active},
			want: []string{"the pod is not run on paris: container app requests no cpu and no memory"}},
		"no memory request": {pod: admissionPod("100m", ""), rsvs: []rbv1.Reservation{active},
			want: []string{"container app requests no memory;"}},
	} {
		t.Run(name, func(t *testing.T) {
			v := decide(c.pod, c.rsvs, "paris", "rb-paris")
			assert.False(t, v.admit)
			for _, w := range c.want {
				assert.Contains(t, v.message, w)
			}
		})
	}

	deleting := active.DeepCopy()
	deleting.DeletionTimestamp = ptr.To(metav1.Now())
	assert.False(t, decide(pod, []rbv1.Reservation{*deleting}, "paris", "rb-paris").admit, "a reservation being deleted is not live")

	withInit := admissionPod("500m", "128Mi")
	withInit.Spec.InitContainers = []corev1.Container{{Name: "init", Image: "x"}}
	assert.Contains(t, decide(withInit, []rbv1.Reservation{active}, "paris", "rb-paris").message, "container init requests no cpu and no memory",
		"init containers too: the provider's quota requires requests of every container")
	podLevel := admissionPod("", "")
	podLevel.Spec.Resources = &corev1.ResourceRequirements{Requests: corev1.ResourceList{
		corev1.ResourceCPU: resource.MustParse("500m"), corev1.ResourceMemory: resource.MustParse("128Mi")}}
	assert.True(t, decide(podLevel, []rbv1.Reservation{active}, "paris", "rb-paris").admit, "pod-level requests are requests")
}

// TestAdmissionStatus: a refused pod is Pending NotReserved with its
// containers waiting for that reason, and admitted by its status alone once
// the admission says so; admitting clears what the refusal wrote.
func TestAdmissionStatus(t *testing.T) {
	pod := admissionPod("500m", "128Mi")
	pod.Spec.InitContainers = []corev1.Container{{Name: "init", Image: "busybox"}}
	pod.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodScheduled, Status: corev1.ConditionTrue}}
	h := &podHandler{}
	assert.False(t, admitted(pod), "a new pod")
	assert.False(t, h.handles(context.Background(), pod))

	refused := pod.DeepCopy()
	refused.Status = refusedStatus(pod, "no reservation")
	assert.Equal(t, corev1.PodPending, refused.Status.Phase)
	assert.Equal(t, ReasonNotReserved, refused.Status.Reason)
	require.Len(t, refused.Status.ContainerStatuses, 1)
	require.Len(t, refused.Status.InitContainerStatuses, 1)
	w := refused.Status.ContainerStatuses[0]
	assert.Equal(t, corev1.ContainerStatus{Name: "app", Image: "rb.test/testapp:v1", State: corev1.ContainerState{
		Waiting: &corev1.ContainerStateWaiting{Reason: ReasonNotReserved, Message: "no reservation"}}}, w)
	c := podCondition(refused, PodConditionReserved)
	require.NotNil(t, c)
	assert.Equal(t, corev1.ConditionFalse, c.Status)
	assert.Equal(t, corev1.ConditionTrue, podCondition(refused, corev1.PodScheduled).Status, "PodScheduled stays")
	assert.False(t, admitted(refused), "container statuses of a refusal are no copy's")
	assert.False(t, h.handles(context.Background(), refused))

	again := refused.DeepCopy()
	again.Status = refusedStatus(refused, "no reservation")
	assert.Equal(t, c.LastTransitionTime, podCondition(again, PodConditionReserved).LastTransitionTime, "same status, same transition time")

	deleting := refused.DeepCopy()
	deleting.DeletionTimestamp = ptr.To(metav1.Now())
	assert.True(t, h.handles(context.Background(), deleting), "virtual-kubelet finishes the deletion of every pod")

	ok := refused.DeepCopy()
	ok.Status = admittedStatus(refused, "reservation web-0-abc")
	assert.True(t, admitted(ok))
	assert.True(t, h.handles(context.Background(), ok))
	assert.Empty(t, ok.Status.Reason)
	assert.Empty(t, ok.Status.ContainerStatuses)
	assert.Empty(t, ok.Status.InitContainerStatuses)
	assert.Equal(t, ReasonReserved, podCondition(ok, PodConditionReserved).Reason)

	legacy := pod.DeepCopy()
	legacy.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "app", Ready: true}}
	assert.True(t, admitted(legacy), "running before the admission wrote its condition")
	assert.False(t, holdsNode(refused), "a refused pod does not keep its node")
	assert.True(t, holdsNode(ok))
}
