package resourcebroker_test

import (
	"context"
	"testing"
	"time"

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
	"k8s.io/controller-manager/pkg/informerfactory"
	"k8s.io/klog/v2"
	"k8s.io/kubernetes/pkg/controller/garbagecollector"
	"sigs.k8s.io/controller-runtime/pkg/client"

	brokerv1alpha1 "github.com/fluidos-project/resource-broker/api/v1alpha1"
)

// startGarbageCollector runs kube-controller-manager's garbage collector
// in-process against the test control plane (envtest runs no
// kube-controller-manager) until the test ends.
func startGarbageCollector(t *testing.T) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	cfg := rest.CopyConfig(restCfg)
	rest.AddUserAgent(cfg, "garbage-collector")
	kube, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	meta, err := metadata.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	mapper := restmapper.NewDeferredDiscoveryRESTMapper(cacheddiscovery.NewMemCacheClient(kube.Discovery()))
	mapper.Reset()
	typed := informers.NewSharedInformerFactory(kube, 0)
	metaInformers := metadatainformer.NewSharedInformerFactory(meta, 0)
	started := make(chan struct{})
	gc, err := garbagecollector.NewGarbageCollector(ctx, kube, meta, mapper, garbagecollector.DefaultIgnoredResources(),
		informerfactory.NewInformerFactory(typed, metaInformers), started)
	if err != nil {
		t.Fatal(err)
	}
	typed.Start(ctx.Done())
	metaInformers.Start(ctx.Done())
	close(started)
	go wait.Until(mapper.Reset, 5*time.Second, ctx.Done())
	go gc.Run(ctx, 2, 30*time.Second)
	go gc.Sync(ctx, kube.Discovery(), 5*time.Second)
	t.Cleanup(func() {
		cancel()
		typed.Shutdown()
		metaInformers.Shutdown()
	})
	waitFor(t, 60*time.Second, "garbage collector synced", func() (bool, error) { return gc.IsSynced(klog.Background()), nil })
}

func TestPodDeletedReservationGarbageCollected(t *testing.T) {
	localNodes(t)
	ns := newNamespace(t)
	ctx := context.Background()
	pod := createPod(t, newPod(ns, "doomed", "3", "1Gi"))
	rsv := waitReservation(t, pod, bindTimeout)
	checkOwner(t, rsv, pod)
	// A reservation made by hand (no owner) for another pod stays.
	keep := &brokerv1alpha1.Reservation{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "by-hand"},
		Spec:       brokerv1alpha1.ReservationSpec{Resources: rsv.Spec.Resources, PodName: "someone-else"},
	}
	if err := cl.Create(ctx, keep); err != nil {
		t.Fatal(err)
	}

	startGarbageCollector(t)
	zero := int64(0)
	if err := cs.CoreV1().Pods(ns).Delete(ctx, pod.Name, metav1.DeleteOptions{GracePeriodSeconds: &zero}); err != nil {
		t.Fatal(err)
	}
	began := time.Now()
	waitFor(t, 60*time.Second, "reservation garbage-collected", func() (bool, error) {
		err := cl.Get(ctx, client.ObjectKeyFromObject(rsv), &brokerv1alpha1.Reservation{})
		return apierrors.IsNotFound(err), client.IgnoreNotFound(err)
	})
	t.Logf("reservation garbage-collected %s after its pod was deleted", time.Since(began).Round(time.Millisecond))
	if err := cl.Get(ctx, client.ObjectKeyFromObject(keep), &brokerv1alpha1.Reservation{}); err != nil {
		t.Errorf("the ownerless reservation: %v", err)
	}
}
