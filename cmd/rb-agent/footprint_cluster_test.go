package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/fluidos-project/resource-broker/agent/provider"
	rbv1 "github.com/fluidos-project/resource-broker/api/v1alpha1"
	"github.com/fluidos-project/resource-broker/internal/brokertest"
	"github.com/fluidos-project/resource-broker/internal/testenv"
)

// The cluster of BenchmarkAgentFootprint (footprint_bench_test.go): the API
// server with its nodes and pods, the broker, the churn, and when rb-agent
// has advertised it all.

// footprintFixture is the API server, the broker and the binaries.
type footprintFixture struct {
	cfg        footprintConfig
	dir        string
	restConfig *rest.Config
	cs         *kubernetes.Clientset
	client     client.Client
	kubeconfig string
	brokerURL  string
	certDir    string
	agentBin   string
	pods       []types.NamespacedName // created pods (churn picks from them)
}

func newFootprintFixture(b *testing.B, cfg footprintConfig) *footprintFixture {
	b.Helper()
	fx := &footprintFixture{cfg: cfg, dir: b.TempDir()}

	// rb-agent, built from this directory (go test runs in the package directory).
	fx.agentBin = filepath.Join(fx.dir, "rb-agent")
	began := time.Now()
	if out, err := exec.Command("go", "build", "-o", fx.agentBin, ".").CombinedOutput(); err != nil {
		b.Fatalf("go build rb-agent: %v\n%s", err, out)
	}
	b.Logf("built rb-agent in %s", time.Since(began).Round(time.Millisecond))

	env, err := testenv.New(testenv.WithCRDDirectories(testenv.ModulePath(b, "manifests", "crds")))
	if err != nil {
		b.Fatal(err)
	}
	if _, err := env.Start(); err != nil {
		_ = env.Stop()
		b.Fatalf("starting the control plane: %v", err)
	}
	b.Cleanup(func() {
		if err := env.Stop(); err != nil {
			b.Errorf("stopping the control plane: %v", err)
		}
	})
	user, err := env.AddUser(envtest.User{Name: "footprint-admin", Groups: []string{"system:masters"}}, nil)
	if err != nil {
		b.Fatal(err)
	}
	kc, err := user.KubeConfig()
	if err != nil {
		b.Fatal(err)
	}
	fx.kubeconfig = filepath.Join(fx.dir, "kubeconfig")
	if err := os.WriteFile(fx.kubeconfig, kc, 0o600); err != nil {
		b.Fatal(err)
	}
	fx.restConfig = user.Config()
	fx.restConfig.QPS, fx.restConfig.Burst = -1, 0 // no client-side rate limit: the API server is the limit
	if fx.cs, err = kubernetes.NewForConfig(fx.restConfig); err != nil {
		b.Fatal(err)
	}
	scheme := runtime.NewScheme()
	_ = clientgoscheme.AddToScheme(scheme)
	_ = rbv1.AddToScheme(scheme)
	if fx.client, err = client.New(fx.restConfig, client.Options{Scheme: scheme}); err != nil {
		b.Fatal(err)
	}
	for _, obj := range []client.Object{
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: footprintNamespace}},
		provider.NewTenantClusterRole(),
	} {
		if err := fx.client.Create(context.Background(), obj); err != nil {
			b.Fatal(err)
		}
	}

	brk := brokertest.Start(b, brokertest.Options{})
	fx.brokerURL, fx.certDir = brk.URL, brk.ClusterCertDir(footprintClusterID)
	return fx
}

// populate creates the nodes, then the pods bound to them, Running.
func (fx *footprintFixture) populate(ctx context.Context, b *testing.B) {
	b.Helper()
	cfg := fx.cfg
	for i := range cfg.namespaces {
		ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("shop-%02d", i),
			Labels: map[string]string{"team": fmt.Sprintf("team-%d", i%7)}}}
		if _, err := fx.cs.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil {
			b.Fatal(err)
		}
	}
	if err := parallel(ctx, cfg.nodes, 16, func(i int) error {
		return createNode(ctx, fx.cs, nodeName(i))
	}); err != nil {
		b.Fatalf("creating nodes: %v", err)
	}
	fx.pods = make([]types.NamespacedName, cfg.pods)
	if err := parallel(ctx, cfg.pods, 32, func(i int) error {
		ns := fmt.Sprintf("shop-%02d", i%cfg.namespaces)
		p := footprintPod(ns, fmt.Sprintf("web-%05d", i), nodeName(i%cfg.nodes), i)
		created, err := fx.cs.CoreV1().Pods(ns).Create(ctx, p, metav1.CreateOptions{})
		if err != nil {
			return err
		}
		markRunning(created, i)
		if _, err := fx.cs.CoreV1().Pods(ns).UpdateStatus(ctx, created, metav1.UpdateOptions{}); err != nil {
			return err
		}
		fx.pods[i] = types.NamespacedName{Namespace: ns, Name: p.Name}
		return nil
	}); err != nil {
		b.Fatalf("creating pods: %v", err)
	}
}

func nodeName(i int) string { return fmt.Sprintf("worker-%04d", i) }

// parallel runs fn(0..n-1) on workers goroutines and returns the first error.
func parallel(ctx context.Context, n, workers int, fn func(i int) error) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	var next atomic.Int64
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for ctx.Err() == nil {
				i := int(next.Add(1) - 1)
				if i >= n {
					return
				}
				var err error
				for attempt := range 5 { // a loaded API server answers 429 or times out now and then
					if err = fn(i); err == nil || ctx.Err() != nil {
						break
					}
					time.Sleep(time.Duration(attempt+1) * 200 * time.Millisecond)
				}
				if err != nil {
					cancel(err)
					return
				}
			}
		})
	}
	wg.Wait()
	return context.Cause(ctx)
}

// createNode creates a node the way a kubelet registers one, then reports
// it Ready with a realistic status (addresses, node info, images).
func createNode(ctx context.Context, cs kubernetes.Interface, name string) error {
	zone := fmt.Sprintf("eu-west-1%c", 'a'+name[len(name)-1]%3)
	node := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{
			corev1.LabelHostname: name, corev1.LabelOSStable: "linux", corev1.LabelArchStable: "amd64",
			corev1.LabelInstanceTypeStable: "m6i.8xlarge", corev1.LabelTopologyZone: zone, corev1.LabelTopologyRegion: "eu-west-1",
			"node.kubernetes.io/pool": "general",
		}, Annotations: map[string]string{
			"node.alpha.kubernetes.io/ttl": "0", "volumes.kubernetes.io/controller-managed-attach-detach": "true",
		}},
		Spec: corev1.NodeSpec{PodCIDR: "10.244.0.0/24", PodCIDRs: []string{"10.244.0.0/24"}, ProviderID: "aws:///" + zone + "/i-0" + name},
	}
	created, err := cs.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{})
	if err != nil {
		return err
	}
	capacity := corev1.ResourceList{
		corev1.ResourceCPU: resource.MustParse(nodeCPU), corev1.ResourceMemory: resource.MustParse(nodeMemory),
		corev1.ResourcePods: resource.MustParse("110"), corev1.ResourceEphemeralStorage: resource.MustParse("200Gi"),
	}
	now := metav1.Now()
	st := &created.Status
	st.Capacity, st.Allocatable = capacity, capacity
	st.Conditions = []corev1.NodeCondition{
		{Type: corev1.NodeMemoryPressure, Status: corev1.ConditionFalse, Reason: "KubeletHasSufficientMemory", Message: "kubelet has sufficient memory available", LastHeartbeatTime: now, LastTransitionTime: now},
		{Type: corev1.NodeDiskPressure, Status: corev1.ConditionFalse, Reason: "KubeletHasNoDiskPressure", Message: "kubelet has no disk pressure", LastHeartbeatTime: now, LastTransitionTime: now},
		{Type: corev1.NodePIDPressure, Status: corev1.ConditionFalse, Reason: "KubeletHasSufficientPID", Message: "kubelet has sufficient PID available", LastHeartbeatTime: now, LastTransitionTime: now},
		{Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "KubeletReady", Message: "kubelet is posting ready status", LastHeartbeatTime: now, LastTransitionTime: now},
	}
	st.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "10.0.1.17"}, {Type: corev1.NodeHostName, Address: name},
		{Type: corev1.NodeInternalDNS, Address: name + ".eu-west-1.compute.internal"}}
	st.DaemonEndpoints.KubeletEndpoint.Port = 10250
	st.NodeInfo = corev1.NodeSystemInfo{MachineID: "ec2" + name, SystemUUID: "ec2" + name, BootID: "b00t-" + name, KernelVersion: "6.1.0-aws",
		OSImage: "Amazon Linux 2023", ContainerRuntimeVersion: "containerd://1.7.27", KubeletVersion: "v1.35.0",
		OperatingSystem: "linux", Architecture: "amd64"}
	for i := range 25 {
		st.Images = append(st.Images, corev1.ContainerImage{
			Names:     []string{fmt.Sprintf("registry.example/shop/app-%03d@sha256:%064d", i, i), fmt.Sprintf("registry.example/shop/app-%03d:1.4.2", i)},
			SizeBytes: int64(50+i) << 20,
		})
	}
	_, err = cs.CoreV1().Nodes().UpdateStatus(ctx, created, metav1.UpdateOptions{})
	return err
}

// footprintPod is a Deployment's pod as it is commonly written: an app
// container and a sidecar, probes, env, a ConfigMap and the projected
// service account token volume, the default tolerations; bound to node.
func footprintPod(ns, name, node string, i int) *corev1.Pod {
	app := fmt.Sprintf("app-%03d", i%25)
	rq := func(cpu, mem string) corev1.ResourceList {
		return corev1.ResourceList{corev1.ResourceCPU: resource.MustParse(cpu), corev1.ResourceMemory: resource.MustParse(mem)}
	}
	probe := func(path string) *corev1.Probe {
		return &corev1.Probe{ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: path, Port: intstr.FromString("http")}},
			PeriodSeconds: 10, TimeoutSeconds: 1, SuccessThreshold: 1, FailureThreshold: 3}
	}
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns,
			Labels: map[string]string{"app.kubernetes.io/name": app, "app.kubernetes.io/part-of": "shop", "pod-template-hash": "5fffb58574", "tier": "backend"},
			Annotations: map[string]string{"kubectl.kubernetes.io/restartedAt": "2026-01-01T00:00:00Z", "prometheus.io/scrape": "true",
				"prometheus.io/port": "9090"},
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "ReplicaSet", Name: app + "-5fffb58574",
				UID: types.UID(fmt.Sprintf("0b9e1c2a-7c1d-4f5e-9a6b-%012d", i%25)), Controller: ptr.To(true), BlockOwnerDeletion: ptr.To(true)}},
		},
		Spec: corev1.PodSpec{
			NodeName:                     node,
			ServiceAccountName:           "default",
			AutomountServiceAccountToken: ptr.To(false), // the token volume is spelled out below
			Containers: []corev1.Container{{
				Name: "app", Image: "registry.example/shop/" + app + ":1.4.2", ImagePullPolicy: corev1.PullIfNotPresent,
				Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: 8080, Protocol: corev1.ProtocolTCP}, {Name: "metrics", ContainerPort: 9090, Protocol: corev1.ProtocolTCP}},
				Env: []corev1.EnvVar{{Name: "LOG_LEVEL", Value: "info"}, {Name: "HTTP_PORT", Value: "8080"}, {Name: "DB_HOST", Value: "postgres.shop.svc.cluster.local"},
					{Name: "POD_NAME", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{APIVersion: "v1", FieldPath: "metadata.name"}}},
					{Name: "POD_IP", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{APIVersion: "v1", FieldPath: "status.podIP"}}}},
				Resources:      corev1.ResourceRequirements{Requests: rq("100m", "128Mi"), Limits: rq("500m", "256Mi")},
				VolumeMounts:   []corev1.VolumeMount{{Name: "config", MountPath: "/etc/app", ReadOnly: true}, {Name: "kube-api-access", MountPath: "/var/run/secrets/kubernetes.io/serviceaccount", ReadOnly: true}},
				ReadinessProbe: probe("/ready"), LivenessProbe: probe("/healthz"),
				TerminationMessagePath: "/dev/termination-log", TerminationMessagePolicy: corev1.TerminationMessageReadFile,
			}, {
				Name: "proxy", Image: "registry.example/mesh/proxy:2.1.0", ImagePullPolicy: corev1.PullIfNotPresent,
				Args:                   []string{"proxy", "--upstream=127.0.0.1:8080", "--listen=:15001"},
				Resources:              corev1.ResourceRequirements{Requests: rq("10m", "16Mi"), Limits: rq("100m", "64Mi")},
				TerminationMessagePath: "/dev/termination-log", TerminationMessagePolicy: corev1.TerminationMessageReadFile,
			}},
			Volumes: []corev1.Volume{
				{Name: "config", VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{LocalObjectReference: corev1.LocalObjectReference{Name: app + "-config"}}}},
				{Name: "kube-api-access", VolumeSource: corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{Sources: []corev1.VolumeProjection{
					{ServiceAccountToken: &corev1.ServiceAccountTokenProjection{Path: "token", ExpirationSeconds: ptr.To[int64](3607)}},
					{ConfigMap: &corev1.ConfigMapProjection{LocalObjectReference: corev1.LocalObjectReference{Name: "kube-root-ca.crt"}, Items: []corev1.KeyToPath{{Key: "ca.crt", Path: "ca.crt"}}}},
					{DownwardAPI: &corev1.DownwardAPIProjection{Items: []corev1.DownwardAPIVolumeFile{{Path: "namespace", FieldRef: &corev1.ObjectFieldSelector{APIVersion: "v1", FieldPath: "metadata.namespace"}}}}},
				}}}},
			},
			Tolerations: []corev1.Toleration{
				{Key: corev1.TaintNodeNotReady, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoExecute, TolerationSeconds: ptr.To[int64](300)},
				{Key: corev1.TaintNodeUnreachable, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoExecute, TolerationSeconds: ptr.To[int64](300)},
			},
		},
	}
}

// markRunning sets the status a kubelet reports for a started pod.
func markRunning(p *corev1.Pod, i int) {
	now := metav1.Now()
	p.Status.Phase = corev1.PodRunning
	p.Status.QOSClass = corev1.PodQOSBurstable
	p.Status.StartTime = &now
	p.Status.HostIP = "10.0.1.17"
	p.Status.HostIPs = []corev1.HostIP{{IP: p.Status.HostIP}}
	p.Status.PodIP = fmt.Sprintf("10.%d.%d.%d", 100+i>>16, (i>>8)&255, i&255)
	p.Status.PodIPs = []corev1.PodIP{{IP: p.Status.PodIP}}
	p.Status.Conditions = []corev1.PodCondition{
		{Type: corev1.PodReadyToStartContainers, Status: corev1.ConditionTrue, LastTransitionTime: now},
		{Type: corev1.PodInitialized, Status: corev1.ConditionTrue, LastTransitionTime: now},
		{Type: corev1.PodReady, Status: corev1.ConditionTrue, LastTransitionTime: now},
		{Type: corev1.ContainersReady, Status: corev1.ConditionTrue, LastTransitionTime: now},
		{Type: corev1.PodScheduled, Status: corev1.ConditionTrue, LastTransitionTime: now},
	}
	p.Status.ContainerStatuses = nil
	for _, c := range p.Spec.Containers {
		p.Status.ContainerStatuses = append(p.Status.ContainerStatuses, corev1.ContainerStatus{
			Name: c.Name, Image: c.Image, ImageID: c.Image + "@sha256:" + strings.Repeat("ab", 32),
			ContainerID: fmt.Sprintf("containerd://%064x", i), Ready: true, Started: ptr.To(true),
			State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: now}},
		})
	}
}

// waitAdvertised waits until the agent's Advertisement, published after
// the agent started and acknowledged by the broker, carries the allocatable
// of nodes nodes and the requests of pods pods.
func (fx *footprintFixture) waitAdvertised(ctx context.Context, p *process, since time.Time, nodes, pods int) error {
	wantAllocatable := resource.MustParse(nodeCPU)
	wantAllocatable.SetMilli(wantAllocatable.MilliValue() * int64(nodes))
	deadline := time.Now().Add(5 * time.Minute)
	for time.Now().Before(deadline) {
		if p.exited() {
			return fmt.Errorf("rb-agent exited:\n%s", p.tail())
		}
		var adv rbv1.Advertisement
		if err := fx.client.Get(ctx, types.NamespacedName{Name: footprintClusterID}, &adv); err == nil {
			published := meta.FindStatusCondition(adv.Status.Conditions, rbv1.ConditionPublished)
			cpuAllocated, cpuAllocatable := adv.Spec.Allocated[corev1.ResourceCPU], adv.Spec.Allocatable[corev1.ResourceCPU]
			memAllocated := adv.Spec.Allocated[corev1.ResourceMemory]
			if adv.Status.LastPublished != nil && !adv.Status.LastPublished.Time.Before(since.Truncate(time.Second)) /* seconds in the API */ &&
				published != nil && published.Status == metav1.ConditionTrue && published.ObservedGeneration == adv.Generation &&
				cpuAllocatable.MilliValue() == wantAllocatable.MilliValue() &&
				cpuAllocated.MilliValue() == int64(pods)*podCPUMilli && memAllocated.Value() == int64(pods)*podMemory {
				return nil
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	return fmt.Errorf("rb-agent did not advertise %d nodes and %d pods within 5m:\n%s", nodes, pods, p.tail())
}

// churn patches an annotation of random pods at rate per second until the
// returned function is called, which returns how many patches were made.
func (fx *footprintFixture) churn(b *testing.B, rate int) func() int {
	ctx := context.Background()
	stop := make(chan struct{})
	work := make(chan types.NamespacedName, rate)
	var made atomic.Int64
	var wg sync.WaitGroup
	for range 16 { // patches in flight: enough for the rate even when the API server is slow
		wg.Go(func() {
			for key := range work {
				patch := fmt.Appendf(nil, `{"metadata":{"annotations":{"bench.fluidos.eu/churn":"%d"}}}`, time.Now().UnixNano())
				if _, err := fx.cs.CoreV1().Pods(key.Namespace).Patch(ctx, key.Name, types.MergePatchType, patch, metav1.PatchOptions{}); err == nil {
					made.Add(1)
				} else {
					b.Logf("churn: %v", err)
				}
			}
		})
	}
	wg.Go(func() {
		defer close(work)
		t := time.NewTicker(time.Second / time.Duration(rate))
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-t.C:
				select {
				case work <- fx.pods[rand.IntN(len(fx.pods))]:
				default: // the API server is behind: skip rather than burst
				}
			}
		}
	})
	return func() int {
		close(stop)
		wg.Wait()
		return int(made.Load())
	}
}
