package kubelet

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
)

// LiftNotReadyTaints does the one part of kube-controller-manager's node
// lifecycle controller that a control plane without it needs: the API server
// taints every new node node.kubernetes.io/not-ready:NoSchedule, and this
// lifts the taint once the node reports Ready (and puts it back when it does
// not), until ctx ends. Nodes made by ReadyNode never carry it; this is for
// nodes others make, such as the bridge's virtual nodes.
func LiftNotReadyTaints(ctx context.Context, cs kubernetes.Interface) error {
	f := informers.NewSharedInformerFactory(cs, 0)
	inf := f.Core().V1().Nodes().Informer()
	queue := workqueue.NewTypedRateLimitingQueue(workqueue.DefaultTypedControllerRateLimiter[string]())
	enqueue := func(obj any) {
		if n, ok := obj.(*corev1.Node); ok {
			queue.Add(n.Name)
		}
	}
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{AddFunc: enqueue, UpdateFunc: func(_, o any) { enqueue(o) }}); err != nil {
		return err
	}
	f.Start(ctx.Done())
	if !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
		return fmt.Errorf("node taints: node cache did not sync")
	}
	go func() { <-ctx.Done(); queue.ShutDown(); f.Shutdown() }()
	go func() {
		for {
			name, quit := queue.Get()
			if quit {
				return
			}
			if err := syncNotReadyTaint(ctx, cs, name); err != nil && ctx.Err() == nil {
				queue.AddRateLimited(name)
			} else {
				queue.Forget(name)
			}
			queue.Done(name)
		}
	}()
	return nil
}

func syncNotReadyTaint(ctx context.Context, cs kubernetes.Interface, name string) error {
	node, err := cs.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil
	} else if err != nil {
		return err
	}
	ready, known := false, false
	for _, c := range node.Status.Conditions {
		if c.Type == corev1.NodeReady {
			known, ready = true, c.Status == corev1.ConditionTrue
		}
	}
	at := -1
	for i, t := range node.Spec.Taints {
		if t.Key == corev1.TaintNodeNotReady && t.Effect == corev1.TaintEffectNoSchedule {
			at = i
		}
	}
	switch {
	case ready && at >= 0:
		node.Spec.Taints = append(node.Spec.Taints[:at], node.Spec.Taints[at+1:]...)
	case known && !ready && at < 0:
		node.Spec.Taints = append(node.Spec.Taints, corev1.Taint{Key: corev1.TaintNodeNotReady, Effect: corev1.TaintEffectNoSchedule})
	default:
		return nil
	}
	_, err = cs.CoreV1().Nodes().Update(ctx, node, metav1.UpdateOptions{})
	if apierrors.IsNotFound(err) {
		return nil
	}
	return err // a conflict is retried with the node read again
}
