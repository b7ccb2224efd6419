package resourcebroker

import (
	"context"
	"fmt"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	schedv1alpha1 "sigs.k8s.io/scheduler-plugins/apis/scheduling/v1alpha1"

	brokerv1alpha1 "github.com/fluidos-project/resource-broker/api/v1alpha1"
)

// Gangs. A pod labelled scheduling.x-k8s.io/pod-group belongs to that
// PodGroup (scheduler-plugins' coscheduling API): its Reservation names the
// group and its minMember (spec.group), and the agent asks the broker for the
// group's members together, all or nothing. The Coscheduling plugin, in the
// same profile, holds the members at Permit until minMember of them are
// placed, so that they are bound together.

var podGroupGVR = schedv1alpha1.SchemeGroupVersion.WithResource("podgroups")

// podGroupTimeout bounds the read of a pod's PodGroup.
const podGroupTimeout = 10 * time.Second

// podGroup returns the gang pod belongs to, read from its PodGroup; nil
// when the pod names none.
func (pl *ResourceBroker) podGroup(pod *v1.Pod) (*brokerv1alpha1.ReservationGroup, error) {
	name := pod.Labels[schedv1alpha1.PodGroupLabel]
	if name == "" {
		return nil, nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), podGroupTimeout)
	defer cancel()
	u, err := pl.dyn.Resource(podGroupGVR).Namespace(pod.Namespace).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return nil, fmt.Errorf("pod group %s (label %s): %w", name, schedv1alpha1.PodGroupLabel, err)
	}
	var pg schedv1alpha1.PodGroup
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &pg); err != nil {
		return nil, fmt.Errorf("pod group %s: %w", name, err)
	}
	return &brokerv1alpha1.ReservationGroup{Name: name, MinMember: max(pg.Spec.MinMember, 1)}, nil
}
