package bridgetest

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"math/big"
	"net"
	"net/http"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/utils/ptr"
)

// Kubelet plays the kubelet of one node for the pods of one namespace: it
// binds new pods to its node, reports them Running (ready containers, an
// IP), and completes deletions (containers stopped, pod deleted with grace
// 0); it serves containerLogs like a kubelet endpoint.
type Kubelet struct {
	c         *Cluster
	Node      string
	Namespace string
	Port      int32

	mu      sync.Mutex
	events  map[string]KubeletEvent // pod name -> what happened
	paused  bool
	lastIP  int
	queue   workqueue.TypedRateLimitingInterface[string]
	stopped chan struct{}
}

// KubeletEvent records when the kubelet saw a pod, ran it, and the grace
// period of its deletion.
type KubeletEvent struct {
	Seen, Running time.Time
	DeleteGrace   *int64
	Deleted       time.Time
}

// RunKubelet starts a kubelet for node (created Ready, with capacity) until the test ends.
func (c *Cluster) RunKubelet(node, namespace string, capacity corev1.ResourceList) *Kubelet {
	c.t.Helper()
	k := &Kubelet{c: c, Node: node, Namespace: namespace, events: map[string]KubeletEvent{}, stopped: make(chan struct{}),
		queue: workqueue.NewTypedRateLimitingQueue(workqueue.DefaultTypedControllerRateLimiter[string]())}
	k.serveLogs(c.t)
	c.ReadyNode(node, capacity, k.Port)
	factory := informers.NewSharedInformerFactoryWithOptions(c.Clientset, 0, informers.WithNamespace(namespace))
	inf := factory.Core().V1().Pods().Informer()
	enqueue := func(obj any) {
		if key, err := cache.DeletionHandlingMetaNamespaceKeyFunc(obj); err == nil {
			k.queue.Add(key)
		}
	}
	_, _ = inf.AddEventHandler(cache.ResourceEventHandlerFuncs{AddFunc: enqueue, UpdateFunc: func(_, o any) { enqueue(o) }})
	ctx, cancel := context.WithCancel(context.Background())
	factory.Start(ctx.Done())
	go func() {
		defer close(k.stopped)
		for {
			key, quit := k.queue.Get()
			if quit {
				return
			}
			if err := k.sync(ctx, key); err != nil {
				k.queue.AddRateLimited(key)
			} else {
				k.queue.Forget(key)
			}
			k.queue.Done(key)
		}
	}()
	c.t.Cleanup(func() {
		cancel()
		k.queue.ShutDown()
		<-k.stopped
		factory.Shutdown()
	})
	return k
}

// Pause stops the kubelet from acting (pods stay as they are) until Resume.
func (k *Kubelet) Pause() { k.mu.Lock(); k.paused = true; k.mu.Unlock() }

// Resume lets it act again on every pod.
func (k *Kubelet) Resume() {
	k.mu.Lock()
	k.paused = false
	k.mu.Unlock()
	pods, err := k.c.Clientset.CoreV1().Pods(k.Namespace).List(context.Background(), metav1.ListOptions{})
	if err == nil {
		for _, p := range pods.Items {
			k.queue.Add(k.Namespace + "/" + p.Name)
		}
	}
}

// Event returns what the kubelet did with a pod.
func (k *Kubelet) Event(pod string) KubeletEvent {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.events[pod]
}

func (k *Kubelet) record(pod string, fn func(*KubeletEvent)) {
	k.mu.Lock()
	defer k.mu.Unlock()
	e := k.events[pod]
	fn(&e)
	k.events[pod] = e
}

func (k *Kubelet) sync(ctx context.Context, key string) error {
	k.mu.Lock()
	paused := k.paused
	k.mu.Unlock()
	if paused {
		return nil
	}
	_, name, _ := cache.SplitMetaNamespaceKey(key)
	pods := k.c.Clientset.CoreV1().Pods(k.Namespace)
	pod, err := pods.Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return err
	}
	k.record(name, func(e *KubeletEvent) {
		if e.Seen.IsZero() {
			e.Seen = time.Now()
		}
	})
	switch {
	case pod.DeletionTimestamp != nil:
		k.record(name, func(e *KubeletEvent) { e.DeleteGrace = pod.DeletionGracePeriodSeconds })
		err := pods.Delete(ctx, name, metav1.DeleteOptions{GracePeriodSeconds: new(int64), Preconditions: metav1.NewUIDPreconditions(string(pod.UID))})
		if err == nil || apierrors.IsNotFound(err) {
			k.record(name, func(e *KubeletEvent) { e.Deleted = time.Now() })
			return nil
		}
		return err
	case pod.Spec.NodeName == "":
		return pods.Bind(ctx, &corev1.Binding{ObjectMeta: metav1.ObjectMeta{Name: name, UID: pod.UID},
			Target: corev1.ObjectReference{Kind: "Node", Name: k.Node}}, metav1.CreateOptions{})
	case pod.Spec.NodeName == k.Node && pod.Status.Phase != corev1.PodRunning &&
		pod.Status.Phase != corev1.PodSucceeded && pod.Status.Phase != corev1.PodFailed:
		k.mu.Lock()
		k.lastIP++
		ip := fmt.Sprintf("10.244.1.%d", k.lastIP%250+2)
		k.mu.Unlock()
		now := metav1.Now()
		pod.Status = corev1.PodStatus{
			Phase: corev1.PodRunning, HostIP: "127.0.0.1", HostIPs: []corev1.HostIP{{IP: "127.0.0.1"}},
			PodIP: ip, PodIPs: []corev1.PodIP{{IP: ip}}, StartTime: &now, QOSClass: pod.Status.QOSClass,
			Conditions: []corev1.PodCondition{
				{Type: corev1.PodScheduled, Status: corev1.ConditionTrue, LastTransitionTime: now},
				{Type: corev1.PodInitialized, Status: corev1.ConditionTrue, LastTransitionTime: now},
				{Type: corev1.ContainersReady, Status: corev1.ConditionTrue, LastTransitionTime: now},
				{Type: corev1.PodReady, Status: corev1.ConditionTrue, LastTransitionTime: now},
			},
		}
		for i, c := range pod.Spec.Containers {
			pod.Status.ContainerStatuses = append(pod.Status.ContainerStatuses, corev1.ContainerStatus{
				Name: c.Name, Image: c.Image, ImageID: "docker.io/library/" + c.Image + "@sha256:0123",
				ContainerID: fmt.Sprintf("containerd://%s-%d", pod.UID, i), Ready: true, Started: ptr.To(true),
				State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: now}},
			})
		}
		if _, err := pods.UpdateStatus(ctx, pod, metav1.UpdateOptions{}); err != nil {
			return err
		}
		k.record(name, func(e *KubeletEvent) { e.Running = time.Now() })
	}
	return nil
}

// serveLogs answers containerLogs with one line naming the pod and container.
func (k *Kubelet) serveLogs(t testing.TB) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	k.Port = int32(ln.Addr().(*net.TCPAddr).Port)
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, _ := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	mux := http.NewServeMux()
	mux.HandleFunc("GET /containerLogs/{namespace}/{pod}/{container}", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "log of %s/%s container %s on %s\n", r.PathValue("namespace"), r.PathValue("pod"), r.PathValue("container"), k.Node)
	})
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second,
		TLSConfig: &tls.Config{Certificates: []tls.Certificate{{Certificate: [][]byte{der}, PrivateKey: key}}}}
	go func() { _ = srv.ServeTLS(ln, "", "") }()
	t.Cleanup(func() { _ = srv.Close() })
}
