package virtualkubelet

import (
	"context"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
	corelisters "k8s.io/client-go/listers/core/v1"
)

// virtual-kubelet writes a pod's status with an update of the whole pod
// its provider last reported (our snapshot of the pod at that time, status
// reflected), at the resourceVersion its informer holds now. A pod's
// status update may change its labels and annotations too, so anything
// written on the pod's metadata between our snapshot and that update
// (agent/home's deletion cost, a user's kubectl annotate) would be
// reverted. statusClient gives such an update the labels and annotations
// of the very version it is conditioned on: it writes status only.

// statusClient is the pods client of virtual-kubelet's pod controller.
type statusClient struct {
	corev1client.CoreV1Interface
	pods corelisters.PodLister // the informer virtual-kubelet reads
}

func (c statusClient) Pods(namespace string) corev1client.PodInterface {
	return statusPods{PodInterface: c.CoreV1Interface.Pods(namespace), lister: c.pods.Pods(namespace)}
}

type statusPods struct {
	corev1client.PodInterface
	lister corelisters.PodNamespaceLister
}

func (p statusPods) UpdateStatus(ctx context.Context, pod *corev1.Pod, opts metav1.UpdateOptions) (*corev1.Pod, error) {
	if cur, err := p.lister.Get(pod.Name); err == nil && cur.UID == pod.UID && cur.ResourceVersion == pod.ResourceVersion {
		pod = pod.DeepCopy()
		pod.Labels, pod.Annotations = cur.Labels, cur.Annotations
	}
	return p.PodInterface.UpdateStatus(ctx, pod, opts)
}
