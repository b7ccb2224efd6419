package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	rbv1 "github.com/fluidos-project/resource-broker/api/v1alpha1"
	"github.com/fluidos-project/resource-broker/internal/testbed"
	"github.com/fluidos-project/resource-broker/internal/testenv"
	"github.com/fluidos-project/resource-broker/internal/testimages"
)

// demo creates the workload in rome and prints the timeline until every pod
// runs (0), the timeout (1) or a signal (0: tear down quietly).
func demo(ctx context.Context, bed *testbed.Bed, timeout time.Duration, real bool) int {
	rome := bed.Cluster("rome")
	wc, err := client.NewWithWatch(rome.Config, client.Options{Scheme: testbed.Scheme})
	if err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		return 1
	}
	if err := wc.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace}}); err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		return 1
	}
	tl := newTimeline(bed)
	wctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	watches := []struct {
		list client.ObjectList
		opts []client.ListOption
	}{
		{&corev1.PodList{}, []client.ListOption{client.InNamespace(namespace)}},
		{&rbv1.ReservationList{}, []client.ListOption{client.InNamespace(namespace)}},
		{&corev1.NodeList{}, nil},
	}
	events := make(chan watch.Event, 256)
	var wg sync.WaitGroup
	for _, w := range watches {
		wi, err := wc.Watch(wctx, w.list, w.opts...)
		if err != nil {
			fmt.Fprintln(os.Stderr, "demo: watch:", err)
			return 1
		}
		defer wi.Stop()
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ev := range wi.ResultChan() {
				select {
				case events <- ev:
				case <-wctx.Done():
					return
				}
			}
		}()
	}

	dep, story := workload(real)
	fmt.Println()
	say("%s", bold(story))
	if real {
		if err := wc.Create(ctx, service()); err != nil {
			fmt.Fprintln(os.Stderr, "demo:", err)
			return 1
		}
	}
	if err := wc.Create(ctx, dep); err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		return 1
	}
	for {
		select {
		case <-wctx.Done():
			if ctx.Err() != nil {
				return 0
			}
			say("not every pod Running within %s; logs are in %s", timeout, rel(bed.LogDir))
			return 1
		case ev := <-events:
			if ev.Type == watch.Error {
				continue
			}
			tl.handle(wctx, ev)
			if tl.allRunning() {
				fmt.Println()
				say("%s", bold(fmt.Sprintf("all %d pods Running: %s", replicas, tl.summary())))
				if real {
					askTheContainer(ctx, bed)
					askTheService(ctx, bed)
					callFromABorrowedPod(ctx, bed)
				}
				return 0
			}
		}
	}
}

// workload is the Deployment the demo creates in rome, and how to say it.
// On real nodes its pods run the test application (an HTTP server that says
// where it runs); on stand-in nodes nothing runs, so an image name is all.
func workload(real bool) (*appsv1.Deployment, string) {
	labels := map[string]string{"app": deployment}
	cpu, mem := "3", "2Gi"
	ctr := corev1.Container{Name: "main", Image: testimages.Pause, ImagePullPolicy: corev1.PullIfNotPresent}
	story := fmt.Sprintf("rome: Deployment %s/%s, %d replicas of 3 CPU / 2Gi, schedulerName resource-broker "+
		"(rome has one 2-CPU node: nothing fits there)", namespace, deployment, replicas)
	if real {
		cpu, mem = "1500m", "256Mi"
		ctr = corev1.Container{Name: "app", Image: testimages.TestApp, ImagePullPolicy: corev1.PullIfNotPresent,
			Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: 8080}},
			Env: []corev1.EnvVar{
				{Name: "POD_NAME", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.name"}}},
				{Name: "NODE_NAME", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "spec.nodeName"}}},
				{Name: "HOST_IP", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "status.hostIP"}}},
			}}
		story = fmt.Sprintf("rome: Deployment %s/%s, %d replicas of the test app (HTTP on 8080), 1.5 CPU / 256Mi each, "+
			"schedulerName resource-broker (rome has one 1-CPU node: nothing fits there)", namespace, deployment, replicas)
	}
	res := corev1.ResourceList{corev1.ResourceCPU: resource.MustParse(cpu), corev1.ResourceMemory: resource.MustParse(mem)}
	ctr.Resources = corev1.ResourceRequirements{Requests: res, Limits: res}
	return &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: deployment},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To[int32](replicas),
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec:       corev1.PodSpec{SchedulerName: "resource-broker", Containers: []corev1.Container{ctr}},
			},
		},
	}, story
}

// askTheContainer asks each pod's container, at the pod IP rome shows,
// where it runs, and prints the answers with the provider node they name.
func askTheContainer(ctx context.Context, bed *testbed.Bed) {
	var pods corev1.PodList
	if err := bed.Cluster("rome").Client.List(ctx, &pods, client.InNamespace(namespace)); err != nil {
		say("listing the pods: %v", err)
		return
	}
	nodeOf := map[string]string{} // node IP -> "<cluster>/<node>"
	for _, c := range bed.Clusters {
		for _, n := range c.RealNodes() {
			nodeOf[n.IP] = c.Name + "/" + n.Name
		}
	}
	cl := &http.Client{Timeout: 3 * time.Second}
	for _, p := range pods.Items {
		resp, err := cl.Get("http://" + p.Status.PodIP + ":8080/")
		if err != nil {
			say("  %s at %s: %v", p.Name, p.Status.PodIP, err)
			continue
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		var a map[string]string
		_ = json.Unmarshal(body, &a)
		say("  GET http://%s:8080/ (%s, on %s in rome) -> container on %s: %s", p.Status.PodIP, p.Name, p.Spec.NodeName,
			bold(nodeOf[a["hostIP"]]), strings.TrimSpace(string(body)))
	}
}

// service is Service web in front of the workload's pods, in rome.
func service() *corev1.Service {
	return &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: deployment},
		Spec: corev1.ServiceSpec{Selector: map[string]string{"app": deployment},
			Ports: []corev1.ServicePort{{Name: "http", Port: 80, TargetPort: intstr.FromString("http")}}}}
}

// askTheService asks rome's Service a few times, at its ClusterIP: the host
// routes rome's service CIDR to a rome node, whose kube-proxy takes each
// request to one of the endpoints, the borrowed pods at the provider.
func askTheService(ctx context.Context, bed *testbed.Bed) {
	var svc corev1.Service
	if err := bed.Cluster("rome").Client.Get(ctx, client.ObjectKey{Namespace: namespace, Name: deployment}, &svc); err != nil {
		say("reading Service %s: %v", deployment, err)
		return
	}
	// The endpoints follow the pods' readiness (the EndpointSlice
	// controller, then kube-proxy): wait until all are ready.
	deadline := time.Now().Add(15 * time.Second)
	for readyEndpoints(ctx, bed, svc.Name) < replicas && time.Now().Before(deadline) {
		time.Sleep(200 * time.Millisecond)
	}
	time.Sleep(time.Second) // kube-proxy's next sync
	// A connection of its own per request: kube-proxy picks an endpoint per
	// connection.
	cl := &http.Client{Timeout: 3 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	answered := map[string]int{}
	for range 6 * replicas {
		resp, err := cl.Get("http://" + svc.Spec.ClusterIP + "/")
		if err != nil {
			say("  GET http://%s/: %v", svc.Spec.ClusterIP, err)
			return
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		var a map[string]string
		_ = json.Unmarshal(body, &a)
		answered[a["pod"]]++
	}
	var parts []string
	for _, pod := range slices.Sorted(maps.Keys(answered)) {
		parts = append(parts, fmt.Sprintf("%s %d", pod, answered[pod]))
	}
	say("  %d GETs of Service %s/%s (ClusterIP %s, through rome's kube-proxy) answered by: %s", 6*replicas, namespace, deployment,
		svc.Spec.ClusterIP, bold(strings.Join(parts, ", ")))
}

// callFromABorrowedPod runs, in a borrowed pod (kubectl exec through rome's
// virtual node), a GET of Service web by its name in rome: the pod keeps
// rome's DNS and Services (rome's agent runs --borrowed-pod-network=home).
func callFromABorrowedPod(ctx context.Context, bed *testbed.Bed) {
	rome := bed.Cluster("rome")
	var pods corev1.PodList
	if err := rome.Client.List(ctx, &pods, client.InNamespace(namespace)); err != nil || len(pods.Items) == 0 {
		say("no pod to call from (%v)", err)
		return
	}
	from := pods.Items[0]
	assets, err := testenv.AssetsDir()
	if err != nil {
		say("kubectl: %v", err)
		return
	}
	url := "http://" + deployment + "." + namespace + "/"
	cctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	out, err := exec.CommandContext(cctx, filepath.Join(assets, "kubectl"), "--kubeconfig", rome.Kubeconfig,
		"exec", "-n", namespace, from.Name, "--", "/testapp", "get", url).CombinedOutput()
	if err != nil {
		say("  from %s on %s: GET %s: %v: %s", from.Name, from.Spec.NodeName, url, err, strings.TrimSpace(string(out)))
		return
	}
	var a map[string]string
	_ = json.Unmarshal(out, &a)
	say("  from %s (borrowed, on %s): GET %s, resolved by rome's DNS -> answered by %s", from.Name, from.Spec.NodeName, url, bold(a["pod"]))
}

// readyEndpoints counts the ready endpoints of Service name in rome.
func readyEndpoints(ctx context.Context, bed *testbed.Bed, name string) int {
	var slices discoveryv1.EndpointSliceList
	if err := bed.Cluster("rome").Client.List(ctx, &slices, client.InNamespace(namespace),
		client.MatchingLabels{discoveryv1.LabelServiceName: name}); err != nil {
		return 0
	}
	n := 0
	for _, s := range slices.Items {
		for _, ep := range s.Endpoints {
			if ep.Conditions.Ready == nil || *ep.Conditions.Ready {
				n++
			}
		}
	}
	return n
}

// showTop prints what `kubectl top pod` says in rome about the borrowed pods,
// one of which burns a quarter of a CPU at the provider meanwhile. The
// numbers come from the provider's kubelet through its metrics-server, rome's
// virtual node and rome's metrics-server, each at a 15 s resolution: they
// show up within a minute or so.
func showTop(ctx context.Context, bed *testbed.Bed, assets, kubeconfig string) {
	var pods corev1.PodList
	if err := bed.Cluster("rome").Client.List(ctx, &pods, client.InNamespace(namespace)); err != nil || len(pods.Items) == 0 {
		say("kubectl top: no pod to show (%v)", err)
		return
	}
	burner := pods.Items[0]
	resp, err := (&http.Client{Timeout: 3 * time.Second}).Post("http://"+burner.Status.PodIP+":8080/burn?cpu=0.25&seconds=120", "", nil)
	if err == nil {
		resp.Body.Close()
	}
	fmt.Println()
	say("%s", bold(fmt.Sprintf("kubectl top pod -n %s in rome (%s burns 0.25 CPU at the provider for 2 min; metrics take up to a minute to come through %s)…",
		namespace, burner.Name, burner.Spec.NodeName)))
	args := []string{"--kubeconfig", kubeconfig, "top", "pod", "-n", namespace}
	deadline := time.Now().Add(2 * time.Minute)
	for {
		out, err := exec.CommandContext(ctx, filepath.Join(assets, "kubectl"), args...).CombinedOutput()
		if err == nil && topShows(string(out), pods.Items, burner.Name) || time.Now().After(deadline) {
			for _, l := range strings.Split(strings.TrimRight(string(out), "\n"), "\n") {
				say("  %s", l)
			}
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(3 * time.Second):
		}
	}
}

// topShows tells whether kubectl top's output lists every pod, burner
// using 100m or more.
func topShows(out string, pods []corev1.Pod, burner string) bool {
	cpu := map[string]string{}
	for _, l := range strings.Split(out, "\n") {
		if f := strings.Fields(l); len(f) >= 2 {
			cpu[f[0]] = f[1]
		}
	}
	for _, p := range pods {
		if _, ok := cpu[p.Name]; !ok {
			return false
		}
	}
	q, err := resource.ParseQuantity(cpu[burner])
	return err == nil && q.MilliValue() >= 100
}
