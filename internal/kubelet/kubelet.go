// Package kubelet stands in for kubelets in tests and local clusters: it
// makes Node objects look like healthy kubelets' nodes and marks pods Running
// as a kubelet would. Nothing here runs a container.
package kubelet

import (
	"context"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"
)

// ReadyNode creates a Node with no taints (the API server adds
// node.kubernetes.io/not-ready), condition Ready, and capacity as both
// capacity and allocatable.
func ReadyNode(ctx context.Context, cs kubernetes.Interface, name string, capacity corev1.ResourceList, labels map[string]string) (*corev1.Node, error) {
	node, err := cs.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}}, metav1.CreateOptions{})
	if err != nil {
		return nil, err
	}
	node.Spec.Taints = nil
	if node, err = cs.CoreV1().Nodes().Update(ctx, node, metav1.UpdateOptions{}); err != nil {
		return nil, err
	}
	node.Status.Capacity, node.Status.Allocatable = capacity, capacity
	node.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "KubeletReady",
		LastHeartbeatTime: metav1.Now(), LastTransitionTime: metav1.Now()}}
	return cs.CoreV1().Nodes().UpdateStatus(ctx, node, metav1.UpdateOptions{})
}

// MarkRunning sets a bound pod's status as a kubelet would once its
// containers started.
func MarkRunning(ctx context.Context, cs kubernetes.Interface, pod *corev1.Pod) (*corev1.Pod, error) {
	now := metav1.Now()
	pod = pod.DeepCopy()
	pod.Status.Phase = corev1.PodRunning
	pod.Status.StartTime = &now
	pod.Status.PodIP, pod.Status.HostIP = "10.244.0.10", "192.168.0.10"
	pod.Status.PodIPs = []corev1.PodIP{{IP: pod.Status.PodIP}}
	pod.Status.Conditions = []corev1.PodCondition{
		{Type: corev1.PodScheduled, Status: corev1.ConditionTrue, LastTransitionTime: now},
		{Type: corev1.PodInitialized, Status: corev1.ConditionTrue, LastTransitionTime: now},
		{Type: corev1.ContainersReady, Status: corev1.ConditionTrue, LastTransitionTime: now},
		{Type: corev1.PodReady, Status: corev1.ConditionTrue, LastTransitionTime: now},
	}
	pod.Status.ContainerStatuses = nil
	for _, c := range pod.Spec.Containers {
		pod.Status.ContainerStatuses = append(pod.Status.ContainerStatuses, corev1.ContainerStatus{
			Name: c.Name, Image: c.Image, ImageID: "sha256:0000", ContainerID: "containerd://" + pod.Name + "-" + c.Name,
			Ready: true, Started: ptr.To(true), State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: now}},
		})
	}
	return cs.CoreV1().Pods(pod.Namespace).UpdateStatus(ctx, pod, metav1.UpdateOptions{})
}
