package testbed

import (
	"context"
	"fmt"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	cacheddiscovery "k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/metadata/metadatainformer"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/restmapper"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/controller-manager/pkg/informerfactory"
	"k8s.io/klog/v2"
	"k8s.io/kubernetes/pkg/controller/deployment"
	"k8s.io/kubernetes/pkg/controller/garbagecollector"
	namespacecontroller "k8s.io/kubernetes/pkg/controller/namespace"
	"k8s.io/kubernetes/pkg/controller/replicaset"

	"github.com/fluidos-project/resource-broker/internal/kubelet"
)

// The bed runs, in-process, the parts of kube-controller-manager a member
// cluster needs for the flow (envtest runs none): in a requester, the
// Deployment and ReplicaSet controllers (workloads make pods) and the
// garbage collector (a deleted pod takes its Reservation with it); in every
// cluster, the namespace controller (a deleted tenant namespace really goes),
// the part of the node lifecycle controller that lifts the not-ready taint,
// and the kubelet stand-in.

func clientFor(cfg *rest.Config, agent string) (*rest.Config, kubernetes.Interface, error) {
	cfg = rest.CopyConfig(cfg)
	rest.AddUserAgent(cfg, agent)
	cfg.QPS, cfg.Burst = 200, 400
	cfg.WarningHandler = rest.NoWarnings{} // deprecated Endpoints, listed by the namespace controller and the GC
	cs, err := kubernetes.NewForConfig(cfg)
	return cfg, cs, err
}

// startWorkloadControllers runs the Deployment and ReplicaSet controllers.
func startWorkloadControllers(ctx context.Context, cfg *rest.Config) error {
	_, cs, err := clientFor(cfg, "testbed-workload-controllers")
	if err != nil {
		return err
	}
	f := informers.NewSharedInformerFactory(cs, 0)
	dc, err := deployment.NewDeploymentController(ctx, f.Apps().V1().Deployments(), f.Apps().V1().ReplicaSets(), f.Core().V1().Pods(), cs)
	if err != nil {
		return err
	}
	rsc := replicaset.NewReplicaSetController(ctx, f.Apps().V1().ReplicaSets(), f.Core().V1().Pods(), cs, replicaset.BurstReplicas)
	f.Start(ctx.Done())
	go dc.Run(ctx, 2)
	go rsc.Run(ctx, 2)
	go func() { <-ctx.Done(); f.Shutdown() }()
	return nil
}

// startGarbageCollector runs kube-controller-manager's garbage collector and
// returns once it has synced.
func startGarbageCollector(ctx context.Context, cfg *rest.Config) error {
	cfg, kube, err := clientFor(cfg, "testbed-garbage-collector")
	if err != nil {
		return err
	}
	meta, err := metadata.NewForConfig(cfg)
	if err != nil {
		return err
	}
	mapper := restmapper.NewDeferredDiscoveryRESTMapper(cacheddiscovery.NewMemCacheClient(kube.Discovery()))
	mapper.Reset()
	typed := informers.NewSharedInformerFactory(kube, 0)
	metaInformers := metadatainformer.NewSharedInformerFactory(meta, 0)
	started := make(chan struct{})
	gc, err := garbagecollector.NewGarbageCollector(ctx, kube, meta, mapper, garbagecollector.DefaultIgnoredResources(),
		informerfactory.NewInformerFactory(typed, metaInformers), started)
	if err != nil {
		return err
	}
	typed.Start(ctx.Done())
	metaInformers.Start(ctx.Done())
	close(started)
	go wait.Until(mapper.Reset, 5*time.Second, ctx.Done())
	go gc.Run(ctx, 4, 30*time.Second)
	go gc.Sync(ctx, kube.Discovery(), 5*time.Second)
	go func() { <-ctx.Done(); typed.Shutdown(); metaInformers.Shutdown() }()
	return wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 90*time.Second, true, func(context.Context) (bool, error) {
		return gc.IsSynced(klog.FromContext(ctx)), nil
	})
}

// startNamespaceController finalizes deleted namespaces: it deletes what they
// hold, then the namespace.
func startNamespaceController(ctx context.Context, cfg *rest.Config) error {
	cfg, cs, err := clientFor(cfg, "testbed-namespace-controller")
	if err != nil {
		return err
	}
	meta, err := metadata.NewForConfig(cfg)
	if err != nil {
		return err
	}
	f := informers.NewSharedInformerFactory(cs, 5*time.Minute) // the controller's resync period
	nc := namespacecontroller.NewNamespaceController(ctx, cs, meta, cs.Discovery().ServerPreferredNamespacedResources,
		f.Core().V1().Namespaces(), 5*time.Minute, corev1.FinalizerKubernetes)
	f.Start(ctx.Done())
	go nc.Run(ctx, 2)
	go func() { <-ctx.Done(); f.Shutdown() }()
	return nil
}

// startNodeTaints runs kubelet.LiftNotReadyTaints for one cluster of the bed.
func startNodeTaints(ctx context.Context, cfg *rest.Config) error {
	_, cs, err := clientFor(cfg, "testbed-node-lifecycle")
	if err != nil {
		return err
	}
	return kubelet.LiftNotReadyTaints(ctx, cs)
}

// kubeletStandIn plays the kubelets of a cluster's real nodes (those the bed
// made, never virtual nodes): a pod bound to one is marked Running at once,
// and a pod deleted there is removed (its containers "stopped") at once.
type kubeletStandIn struct {
	cs    kubernetes.Interface
	mu    sync.RWMutex
	nodes map[string]bool
	queue workqueue.TypedRateLimitingInterface[string]
	pods  cache.Indexer
}

func (k *kubeletStandIn) addNode(name string) {
	k.mu.Lock()
	k.nodes[name] = true
	k.mu.Unlock()
}

func (k *kubeletStandIn) removeNode(name string) {
	k.mu.Lock()
	delete(k.nodes, name)
	k.mu.Unlock()
}

func (k *kubeletStandIn) real(node string) bool {
	k.mu.RLock()
	defer k.mu.RUnlock()
	return k.nodes[node]
}

func newKubeletStandIn(cfg *rest.Config) (*kubeletStandIn, error) {
	_, cs, err := clientFor(cfg, "testbed-kubelet")
	if err != nil {
		return nil, err
	}
	return &kubeletStandIn{cs: cs, nodes: map[string]bool{},
		queue: workqueue.NewTypedRateLimitingQueue(workqueue.DefaultTypedControllerRateLimiter[string]())}, nil
}

func (k *kubeletStandIn) start(ctx context.Context) error {
	f := informers.NewSharedInformerFactory(k.cs, 0)
	inf := f.Core().V1().Pods().Informer()
	enqueue := func(obj any) {
		if pod, ok := obj.(*corev1.Pod); ok && pod.Spec.NodeName != "" && k.real(pod.Spec.NodeName) {
			if key, err := cache.MetaNamespaceKeyFunc(pod); err == nil {
				k.queue.Add(key)
			}
		}
	}
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: enqueue, UpdateFunc: func(_, obj any) { enqueue(obj) },
	}); err != nil {
		return err
	}
	k.pods = inf.GetIndexer()
	f.Start(ctx.Done())
	if !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
		return fmt.Errorf("kubelet stand-in: pod cache did not sync")
	}
	go func() { <-ctx.Done(); k.queue.ShutDown(); f.Shutdown() }()
	for range 2 {
		go func() {
			for k.next(ctx) {
			}
		}()
	}
	return nil
}

func (k *kubeletStandIn) next(ctx context.Context) bool {
	key, quit := k.queue.Get()
	if quit {
		return false
	}
	defer k.queue.Done(key)
	if err := k.sync(ctx, key); err != nil && ctx.Err() == nil {
		klog.FromContext(ctx).V(2).Info("kubelet stand-in: retrying", "pod", key, "err", err.Error())
		k.queue.AddRateLimited(key)
		return true
	}
	k.queue.Forget(key)
	return true
}

func (k *kubeletStandIn) sync(ctx context.Context, key string) error {
	obj, ok, err := k.pods.GetByKey(key)
	if err != nil || !ok {
		return err
	}
	pod := obj.(*corev1.Pod)
	if !k.real(pod.Spec.NodeName) {
		return nil
	}
	if pod.DeletionTimestamp != nil {
		zero := int64(0)
		err := k.cs.CoreV1().Pods(pod.Namespace).Delete(ctx, pod.Name, metav1.DeleteOptions{
			GracePeriodSeconds: &zero, Preconditions: &metav1.Preconditions{UID: &pod.UID}})
		if apierrors.IsNotFound(err) || apierrors.IsConflict(err) {
			return nil
		}
		return err
	}
	switch pod.Status.Phase {
	case corev1.PodRunning, corev1.PodSucceeded, corev1.PodFailed:
		return nil
	}
	_, err = kubelet.MarkRunning(ctx, k.cs, pod)
	if apierrors.IsNotFound(err) {
		return nil
	}
	return err
}
