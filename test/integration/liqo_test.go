package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	authv1beta1 "github.com/liqotech/liqo/apis/authentication/v1beta1"
	liqov1beta1 "github.com/liqotech/liqo/apis/core/v1beta1"
	offloadingv1beta1 "github.com/liqotech/liqo/apis/offloading/v1beta1"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/fluidos-project/resource-broker/agent/bridge/liqo"
	rbv1 "github.com/fluidos-project/resource-broker/api/v1alpha1"
	"github.com/fluidos-project/resource-broker/internal/liqobed"
	"github.com/fluidos-project/resource-broker/internal/testbed"
)

// TestRealLiqo: the agent's Liqo mode against Liqo v1.2.0 itself. A
// real-node bed with rome (requester, its agent in --bridge=liqo mode) and
// paris (provider); Liqo's chart, controller-manager, crd-replicator,
// webhook and virtual kubelets run in both (internal/liqobed), rome is
// peered with paris by liqoctl (networking disabled) and the app's
// namespace offloaded by liqoctl (same name at paris). A Deployment whose pod fits no rome node:
// the scheduler plugin opens a Reservation, the broker picks paris, rome's
// agent creates a ResourceSlice in liqo-tenant-paris (what a Liqo user
// would), Liqo replicates it to paris, paris's Liqo accepts it, rome's Liqo
// creates the VirtualNode and its virtual kubelet the Node, the agent
// labels that Node, the pod is bound to it, the virtual kubelet offloads it
// (a ShadowPod in paris, whose Liqo makes the pod), it runs in a real
// container on a paris node and answers at its pod IP. Liqo reflects the
// namespace's Service backend (its pod on rome's node) into paris, where
// the offloaded pod reaches it by name through paris's DNS and kube-proxy
// (checkServiceReflection); deleting the Service deletes the reflection.
// Deleting the Deployment cleans up both sides: no ShadowPod or pod left in paris, the
// slice deleted (and its replica in paris), the VirtualNode, its Node and
// its virtual kubelet gone, the broker's numbers back to where they were.
func TestRealLiqo(t *testing.T) {
	ctx := context.Background()
	began := time.Now()
	bed := testbed.Start(t, testbed.Options{RealNodes: true,
		Clusters: []testbed.ClusterSpec{testbed.RealRome, testbed.RealParis},
		// Every publish in full (no heartbeat band): "counted once" below
		// compares paris's used figures at the broker exactly.
		AgentArgs: func(string) []string { return []string{"--bridge=liqo", "--advertise-band=-1"} }})
	t.Logf("real-node bed up in %s (%s)", bed.Timings["total"].Round(time.Millisecond), timingsAll(bed))
	lq := liqobed.Start(t, bed, liqobed.Options{Verbosity: 2})
	rome, paris := lq.Cluster("rome"), lq.Cluster("paris")
	figure(t, "Liqo %s installed in rome and paris in %s (%s)", lq.Version, lq.Timings["total"].Round(time.Millisecond), strings.Join(sortedTimings(lq.Timings), ", "))

	// Peering, as a user: liqoctl peer, networking disabled, no slice.
	peered := time.Now()
	out, err := lq.Peer(ctx, rome, paris)
	require.NoError(t, err)
	t.Logf("liqoctl peer:\n%s", out)
	figure(t, "liqoctl peer (networking disabled): %s", time.Since(peered).Round(time.Millisecond))
	var fc liqov1beta1.ForeignCluster
	eventually(t, 60*time.Second, "rome's ForeignCluster paris authenticated", func() (bool, string) {
		var list liqov1beta1.ForeignClusterList
		require.NoError(t, rome.Client.List(ctx, &list))
		for _, f := range list.Items {
			if f.Spec.ClusterID == "paris" {
				fc = f
				return f.Status.TenantNamespace.Local == "liqo-tenant-paris" && moduleEnabled(f.Status.Modules.Authentication), fmt.Sprintf("%+v", f.Status)
			}
		}
		return false, fmt.Sprintf("%d ForeignClusters", len(list.Items))
	})
	assert.False(t, fc.Status.Modules.Networking.Enabled, "networking disabled")
	var tenant authv1beta1.Tenant
	require.NoError(t, paris.Client.List(ctx, &authv1beta1.TenantList{})) // the CRD is served
	eventually(t, 30*time.Second, "paris's Tenant for rome", func() (bool, string) {
		var list authv1beta1.TenantList
		require.NoError(t, paris.Client.List(ctx, &list, client.InNamespace("liqo-tenant-rome")))
		if len(list.Items) != 1 {
			return false, fmt.Sprintf("%d Tenants", len(list.Items))
		}
		tenant = list.Items[0]
		return tenant.Spec.ClusterID == "rome", fmt.Sprintf("%+v", tenant.Spec.ClusterID)
	})

	base := baseline(t, bed)
	const ns = "shop"
	newNamespace(t, rome.Cluster, ns)
	// EnforceSameName: shop is shop at paris too, so that an offloaded pod
	// reaches backend.shop and its FQDN through paris's DNS (Liqo's own
	// advice for Services consumed by name; DefaultName would make it
	// shop-rome there, where only the bare name resolves).
	out, err = lq.OffloadNamespace(ctx, rome, ns, string(offloadingv1beta1.LocalAndRemotePodOffloadingStrategyType),
		string(offloadingv1beta1.EnforceSameNameMappingStrategyType))
	require.NoError(t, err)
	t.Logf("liqoctl offload namespace:\n%s", out)
	eventually(t, 30*time.Second, "namespace "+ns+" enabled for Liqo scheduling", func() (bool, string) {
		var n corev1.Namespace
		require.NoError(t, rome.Client.Get(ctx, client.ObjectKey{Name: ns}, &n))
		return n.Labels["liqo.io/scheduling-enabled"] == "true", fmt.Sprint(n.Labels)
	})

	// The workload: one 1.5-CPU pod; rome's only node has 1 CPU. Next to
	// it, a Service backend in front of one small pod on rome's node (pinned
	// there: the namespace lets pods go to the virtual node too), which the
	// offloaded pod calls through Liqo's reflection of the Service.
	romeNode := rome.Nodes()[0]
	backend := appDeployment(ns, "backend", 1, "100m", "32Mi")
	backend.Spec.Template.Spec.NodeSelector = map[string]string{corev1.LabelHostname: romeNode}
	backendSvc := appService(ns, "backend")
	require.NoError(t, rome.Client.Create(ctx, backendSvc))
	require.NoError(t, rome.Client.Create(ctx, backend))
	dep := appDeployment(ns, "web", 1, "1500m", "256Mi")
	created := time.Now()
	require.NoError(t, rome.Client.Create(ctx, dep))
	step := func(what string) { figure(t, "  +%-8s %s", time.Since(created).Round(10*time.Millisecond), what) }

	var rsv rbv1.Reservation
	eventually(t, 60*time.Second, "a Reservation Active with paris", func() (bool, string) {
		items := reservations(t, rome.Cluster, ns)
		if len(items) != 1 {
			return false, fmt.Sprintf("%d reservations", len(items))
		}
		rsv = items[0]
		return rsv.Status.Phase == rbv1.ReservationActive && rsv.Status.Provider == "paris", fmt.Sprintf("%s %s %s", rsv.Status.Phase, rsv.Status.Provider, rsv.Status.Reason)
	})
	step("Reservation " + rsv.Name + " Active, provider paris")

	sliceKey := client.ObjectKey{Namespace: "liqo-tenant-paris", Name: liqo.SliceName(&rsv)}
	var slice authv1beta1.ResourceSlice
	eventually(t, 30*time.Second, "the agent's ResourceSlice "+sliceKey.String(), func() (bool, string) {
		err := rome.Client.Get(ctx, sliceKey, &slice)
		return err == nil, fmt.Sprint(err)
	})
	step("ResourceSlice " + sliceKey.String() + " created by rome's agent")
	assert.Equal(t, "true", slice.Annotations[liqo.CreateVirtualNodeAnnotation])
	eventually(t, 120*time.Second, "the slice accepted by paris (status replicated back)", func() (bool, string) {
		require.NoError(t, rome.Client.Get(ctx, sliceKey, &slice))
		return sliceAccepted(&slice), fmt.Sprintf("%+v", slice.Status.Conditions)
	})
	step("ResourceSlice Authentication and Resources Accepted by paris's Liqo")
	assert.Equal(t, "1500m", ptrQ(slice.Status.Resources, corev1.ResourceCPU), "paris granted what the reservation asked")
	var replica authv1beta1.ResourceSlice
	require.NoError(t, paris.Client.Get(ctx, client.ObjectKey{Namespace: "liqo-tenant-rome", Name: slice.Name}, &replica),
		"crd-replicator put the slice in paris's tenant namespace for rome")

	var vn offloadingv1beta1.VirtualNode
	eventually(t, 60*time.Second, "Liqo's VirtualNode for the slice", func() (bool, string) {
		var list offloadingv1beta1.VirtualNodeList
		require.NoError(t, rome.Client.List(ctx, &list, client.InNamespace("liqo-tenant-paris")))
		for _, v := range list.Items {
			if v.Name == slice.Name || v.Labels[liqo.ResourceSliceNameLabel] == slice.Name {
				vn = v
				return true, ""
			}
		}
		return false, fmt.Sprintf("%d VirtualNodes", len(list.Items))
	})
	step("VirtualNode " + vn.Name + " created by rome's Liqo")
	var node corev1.Node
	eventually(t, 120*time.Second, "Liqo's Node "+vn.Name+" Ready and labelled for the broker", func() (bool, string) {
		if err := rome.Client.Get(ctx, client.ObjectKey{Name: vn.Name}, &node); err != nil {
			return false, fmt.Sprintf("%v; virtual kubelets: %v", err, rome.VirtualKubelets())
		}
		return nodeReady(&node) && node.Labels[rbv1.ProviderLabel] == "paris", fmt.Sprintf("ready=%v labels=%v", nodeReady(&node), node.Labels)
	})
	step("Node " + node.Name + " Ready (Liqo's virtual kubelet), labelled provider=paris by the agent")
	assert.Equal(t, "virtual-node", node.Labels["liqo.io/type"])
	assert.Equal(t, "paris", node.Labels["liqo.io/remote-cluster-id"])
	assert.Equal(t, "1500m", ptrQ(node.Status.Allocatable, corev1.ResourceCPU), "the virtual node is the reservation's size")
	require.Len(t, rome.VirtualKubelets(), 1, "one virtual kubelet, run from Liqo's Deployment")

	var pod corev1.Pod
	eventually(t, 120*time.Second, "the pod bound to "+node.Name+", Running and Ready", func() (bool, string) {
		var pods corev1.PodList
		require.NoError(t, rome.Client.List(ctx, &pods, client.InNamespace(ns), client.MatchingLabels{"app": "web"}))
		if len(pods.Items) != 1 {
			return false, fmt.Sprintf("%d pods", len(pods.Items))
		}
		pod = pods.Items[0]
		return pod.Spec.NodeName == node.Name && pod.Status.Phase == corev1.PodRunning && podReady(&pod) && pod.Status.PodIP != "",
			fmt.Sprintf("on %q: %s", pod.Spec.NodeName, podCondition(&pod))
	})
	step("pod " + pod.Name + " Running and Ready on " + node.Name)
	running := time.Since(created)
	assert.True(t, tolerates(&pod, "virtual-node.liqo.io/not-allowed"), "Liqo's webhook added its toleration: %v", pod.Spec.Tolerations)

	var nsoff offloadingv1beta1.NamespaceOffloading
	require.NoError(t, rome.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "offloading"}, &nsoff))
	remoteNS := nsoff.Status.RemoteNamespaceName
	require.NotEmpty(t, remoteNS)
	var shadows offloadingv1beta1.ShadowPodList
	require.Equal(t, ns, remoteNS, "EnforceSameName")
	require.NoError(t, paris.Client.List(ctx, &shadows, client.InNamespace(remoteNS)))
	require.Len(t, shadows.Items, 1, "one ShadowPod in paris's %s", remoteNS)
	var remote corev1.Pod
	require.NoError(t, paris.Client.Get(ctx, client.ObjectKey{Namespace: remoteNS, Name: pod.Name}, &remote))
	assert.Contains(t, paris.Nodes(), remote.Spec.NodeName, "the pod runs on a real paris node")
	require.NotEmpty(t, remote.Status.ContainerStatuses)
	assert.True(t, strings.HasPrefix(remote.Status.ContainerStatuses[0].ContainerID, "containerd://"), "a real container: %s", remote.Status.ContainerStatuses[0].ContainerID)
	assert.Equal(t, remote.Status.PodIP, pod.Status.PodIP, "rome's pod has the container's IP")
	a, err := getApp("http://" + pod.Status.PodIP + ":8080/")
	require.NoError(t, err, "the container answers at the pod IP")
	assert.Equal(t, pod.Name, a["pod"], "the pod sees its own name")
	parisNodes := nodeIPs(t, paris.Cluster)
	assert.Contains(t, parisNodes, a["hostIP"], "answered from a paris node: %v", a)
	step(fmt.Sprintf("GET http://%s:8080/ answered by %s on paris node %s (ShadowPod %s/%s)", pod.Status.PodIP, a["pod"], parisNodes[a["hostIP"]], remoteNS, shadows.Items[0].Name))
	figure(t, "Deployment created -> pod Running on paris via Liqo: %s", running.Round(time.Millisecond))
	// rome offloads with Liqo (it advertises broker.fluidos.eu/bridge=liqo):
	// paris holds nothing for it, or the capacity would be taken twice.
	var held corev1.PodList
	require.NoError(t, paris.Client.List(ctx, &held, client.MatchingLabels{rbv1.RoleLabel: rbv1.RolePlaceholder}))
	assert.Empty(t, held.Items, "no placeholder for a requester that offloads with Liqo")

	// Liqo's virtual kubelet serves the pod's log and exec (its serving
	// certificate approved by Liqo, signed by rome's kube-controller-manager).
	kctx, kcancel := context.WithTimeout(ctx, 60*time.Second)
	defer kcancel()
	logs, err := kubectl(kctx, t, rome.Cluster, "logs", "-n", ns, pod.Name).CombinedOutput()
	require.NoError(t, err, "kubectl logs through Liqo's virtual kubelet: %s", logs)
	assert.Contains(t, string(logs), "testapp listening on :8080", "the container's log, read from paris")
	execOut, err := kubectl(kctx, t, rome.Cluster, "exec", "-n", ns, pod.Name, "--", "/testapp", "get", "http://"+pod.Status.PodIP+":8080/").CombinedOutput()
	require.NoError(t, err, "kubectl exec through Liqo's virtual kubelet: %s", execOut)
	assert.Contains(t, string(execOut), pod.Name, "exec ran in the container")

	reflectedSvc := checkServiceReflection(t, rome, paris, ns, &pod, romeNode)

	// What the broker sees while the pod runs: rome's agent does not count
	// Liqo's node; paris's counts the pods its nodes run.
	var during testbed.Capacity
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(250 * time.Millisecond) {
		during, err = bed.Capacity(ctx)
		require.NoError(t, err)
		if during["paris"]["used_cpu"] != base["paris"]["used_cpu"] || time.Now().After(deadline) {
			break
		}
	}
	assert.Equal(t, base["rome"]["alloc_cpu"], during["rome"]["alloc_cpu"], "Liqo's virtual node is not rome's capacity")
	figure(t, "paris at the broker while the pod runs: used_cpu %s (before %s), resv_cpu %s (before %s), alloc_cpu %s",
		during["paris"]["used_cpu"], base["paris"]["used_cpu"], during["paris"]["resv_cpu"], base["paris"]["resv_cpu"], during["paris"]["alloc_cpu"])
	// Counted once: the pod Liqo runs for rome (namespace remoteNS, which
	// Liqo annotates as another cluster's) is the reservation's use, not
	// paris's own.
	assert.Equal(t, base["paris"]["used_cpu"], during["paris"]["used_cpu"],
		"paris's agent does not count the pod in %s as its own use: the broker holds rome's reservation for it", remoteNS)
	rss := lq.RSS()
	var total int64
	var parts []string
	for name, b := range rss {
		total += b
		parts = append(parts, fmt.Sprintf("%s %dMB", strings.TrimPrefix(name, "liqo-"), b>>20))
	}
	sort.Strings(parts)
	figure(t, "Liqo processes RSS %d MB in all: %s", total>>20, strings.Join(parts, ", "))
	figure(t, "RSS of the test and every process it started, while the pod runs: %d MB", treeRSS(os.Getpid())>>20)

	// Deleting the Service while the virtual kubelet runs: Liqo deletes its
	// reflection at paris.
	require.NoError(t, rome.Client.Delete(ctx, backendSvc))
	unreflected := time.Now()
	eventually(t, 30*time.Second, "the reflected Service, ShadowEndpointSlice and EndpointSlice gone at paris", func() (bool, string) {
		var state []string
		if err := paris.Client.Get(ctx, client.ObjectKeyFromObject(reflectedSvc), &corev1.Service{}); !apierrors.IsNotFound(err) {
			state = append(state, "Service")
		}
		var shadows offloadingv1beta1.ShadowEndpointSliceList
		require.NoError(t, paris.Client.List(ctx, &shadows, client.InNamespace(remoteNS)))
		if len(shadows.Items) > 0 {
			state = append(state, fmt.Sprintf("%d ShadowEndpointSlices", len(shadows.Items)))
		}
		if n := len(liqoEndpointSlices(t, paris, remoteNS, "backend")); n > 0 {
			state = append(state, fmt.Sprintf("%d EndpointSlices", n))
		}
		return len(state) == 0, strings.Join(state, ", ")
	})
	figure(t, "Service backend deleted at rome -> its reflection gone at paris: %s", time.Since(unreflected).Round(time.Millisecond))

	// Deleting the workload cleans up both sides.
	deleted := time.Now()
	require.NoError(t, rome.Client.Delete(ctx, backend, client.PropagationPolicy(metav1.DeletePropagationBackground)))
	require.NoError(t, rome.Client.Delete(ctx, dep, client.PropagationPolicy(metav1.DeletePropagationBackground)))
	eventually(t, 120*time.Second, "no pod and no Reservation left in rome's "+ns, func() (bool, string) {
		var left corev1.PodList
		require.NoError(t, rome.Client.List(ctx, &left, client.InNamespace(ns)))
		n := len(reservations(t, rome.Cluster, ns))
		return len(left.Items) == 0 && n == 0, fmt.Sprintf("%d pods, %d reservations", len(left.Items), n)
	})
	figure(t, "Deployment deleted -> pod and Reservation gone in rome: %s", time.Since(deleted).Round(time.Millisecond))
	eventually(t, 120*time.Second, "no ShadowPod and no pod left in paris's "+remoteNS, func() (bool, string) {
		var sp offloadingv1beta1.ShadowPodList
		var pods corev1.PodList
		require.NoError(t, paris.Client.List(ctx, &sp, client.InNamespace(remoteNS)))
		require.NoError(t, paris.Client.List(ctx, &pods, client.InNamespace(remoteNS)))
		return len(sp.Items) == 0 && len(pods.Items) == 0, fmt.Sprintf("%d ShadowPods, %d pods", len(sp.Items), len(pods.Items))
	})
	figure(t, "Deployment deleted -> ShadowPod and pod gone in paris: %s", time.Since(deleted).Round(time.Millisecond))
	eventually(t, 120*time.Second, "no container left on paris's nodes", func() (bool, string) {
		left := 0
		var state []string
		for _, n := range paris.RealNodes() {
			tasks, err := n.RunningTasks(ctx)
			require.NoError(t, err)
			left += len(tasks)
			state = append(state, fmt.Sprintf("%s: %d tasks", n.Name, len(tasks)))
		}
		return left == 0, strings.Join(state, ", ")
	})
	eventually(t, 120*time.Second, "the slice, its replica, the VirtualNode, its Node and virtual kubelet gone", func() (bool, string) {
		var state []string
		if err := rome.Client.Get(ctx, sliceKey, &authv1beta1.ResourceSlice{}); !apierrors.IsNotFound(err) {
			state = append(state, "slice in rome")
		}
		if err := paris.Client.Get(ctx, client.ObjectKey{Namespace: "liqo-tenant-rome", Name: slice.Name}, &authv1beta1.ResourceSlice{}); !apierrors.IsNotFound(err) {
			state = append(state, "slice in paris")
		}
		if err := rome.Client.Get(ctx, client.ObjectKeyFromObject(&vn), &offloadingv1beta1.VirtualNode{}); !apierrors.IsNotFound(err) {
			state = append(state, "VirtualNode")
		}
		if err := rome.Client.Get(ctx, client.ObjectKey{Name: node.Name}, &corev1.Node{}); !apierrors.IsNotFound(err) {
			state = append(state, "Node")
		}
		var deps appsv1.DeploymentList
		require.NoError(t, rome.Client.List(ctx, &deps, client.InNamespace("liqo-tenant-paris")))
		if len(deps.Items) > 0 {
			state = append(state, fmt.Sprintf("%d virtual-kubelet Deployments", len(deps.Items)))
		}
		if vks := rome.VirtualKubelets(); len(vks) > 0 {
			state = append(state, fmt.Sprintf("virtual kubelets running %v", vks))
		}
		return len(state) == 0, strings.Join(state, ", ")
	})
	figure(t, "Deployment deleted -> slice, VirtualNode, Node, virtual kubelet gone: %s", time.Since(deleted).Round(time.Millisecond))
	backToBaseline(t, bed, base, 60*time.Second)
	figure(t, "Deployment deleted -> broker back to baseline: %s", time.Since(deleted).Round(time.Millisecond))
	assert.Empty(t, lq.Restarts(), "no Liqo process restarted")
	figure(t, "whole test (bed, Liqo, peering, workload, clean-up): %s", time.Since(began).Round(time.Millisecond))
	if keep := os.Getenv(testbed.KeepDirEnv); keep != "" {
		t.Logf("logs in %s", bed.LogDir)
	}
}

// treeRSS sums the resident memory of pid and all its descendants (API
// servers, etcd, brokers, Redis, agents, schedulers, kube-controller-managers,
// node scripts, containerd, kubelets, Liqo's processes; not the container
// shims, which are reparented to pid 1). Shared pages count once per process.
func treeRSS(pid int) int64 {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return 0
	}
	children := map[int][]int{}
	for _, e := range entries {
		p, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		raw, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		// pid (comm) state ppid ...: comm may hold spaces, ppid follows the last ')'.
		f := strings.Fields(string(raw[strings.LastIndexByte(string(raw), ')')+1:]))
		if len(f) < 2 {
			continue
		}
		ppid, _ := strconv.Atoi(f[1])
		children[ppid] = append(children[ppid], p)
	}
	var total int64
	for queue := []int{pid}; len(queue) > 0; queue = queue[1:] {
		p := queue[0]
		total += procRSS(p)
		queue = append(queue, children[p]...)
	}
	return total
}

func procRSS(pid int) int64 {
	raw, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(raw), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "VmRSS:" {
			kb, _ := strconv.ParseInt(f[1], 10, 64)
			return kb << 10
		}
	}
	return 0
}

func moduleEnabled(m liqov1beta1.Module) bool { return m.Enabled }

func sliceAccepted(s *authv1beta1.ResourceSlice) bool {
	ok := 0
	for _, c := range s.Status.Conditions {
		if (c.Type == authv1beta1.ResourceSliceConditionTypeAuthentication || c.Type == authv1beta1.ResourceSliceConditionTypeResources) &&
			c.Status == authv1beta1.ResourceSliceConditionAccepted {
			ok++
		}
	}
	return ok == 2
}

func ptrQ(l corev1.ResourceList, name corev1.ResourceName) string {
	q, ok := l[name]
	if !ok {
		return ""
	}
	return q.String()
}

func tolerates(p *corev1.Pod, key string) bool {
	for _, t := range p.Spec.Tolerations {
		if t.Key == key {
			return true
		}
	}
	return false
}

func sortedTimings(m map[string]time.Duration) []string {
	var out []string
	for k, v := range m {
		if k != "total" {
			out = append(out, fmt.Sprintf("%s %s", k, v.Round(time.Millisecond)))
		}
	}
	sort.Strings(out)
	return out
}

// reflectionManagedBy is the managed-by label of the EndpointSlices Liqo
// makes in a provider from the consumer's (the value of Liqo's
// forge.EndpointSliceManagedBy).
const reflectionManagedBy = "endpointslice.reflection.liqo.io"

// checkServiceReflection: Liqo's Service reflection over the bed's flat
// network. rome's Service backend (namespace ns, its pod on romeNode) is
// reflected by rome's virtual kubelet into paris's ns: a Service (paris
// gives it a ClusterIP of its own) and a ShadowEndpointSlice, from which
// paris's Liqo makes an EndpointSlice holding the rome pod's IP. caller,
// offloaded to paris, resolves backend, backend.<ns> and the FQDN through
// paris's DNS to that ClusterIP, and paris's kube-proxy takes its GETs to
// the pod at rome. Returns the reflected Service.
func checkServiceReflection(t *testing.T, rome, paris *liqobed.Cluster, ns string, caller *corev1.Pod, romeNode string) *corev1.Service {
	t.Helper()
	ctx := context.Background()
	began := time.Now()
	var backend corev1.Pod
	eventually(t, 60*time.Second, "the backend pod Ready on "+romeNode, func() (bool, string) {
		var pods corev1.PodList
		require.NoError(t, rome.Client.List(ctx, &pods, client.InNamespace(ns), client.MatchingLabels{"app": "backend"}))
		if len(pods.Items) != 1 {
			return false, fmt.Sprintf("%d pods", len(pods.Items))
		}
		backend = pods.Items[0]
		return backend.Spec.NodeName == romeNode && podReady(&backend) && backend.Status.PodIP != "",
			fmt.Sprintf("on %q: %s", backend.Spec.NodeName, podCondition(&backend))
	})
	var home corev1.Service
	require.NoError(t, rome.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "backend"}, &home))

	var reflected corev1.Service
	var slice discoveryv1.EndpointSlice
	eventually(t, 30*time.Second, "Service backend and its endpoints reflected to paris", func() (bool, string) {
		if err := paris.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "backend"}, &reflected); err != nil {
			return false, err.Error()
		}
		var shadows offloadingv1beta1.ShadowEndpointSliceList
		require.NoError(t, paris.Client.List(ctx, &shadows, client.InNamespace(ns)))
		for _, s := range liqoEndpointSlices(t, paris, ns, "backend") {
			for _, ep := range s.Endpoints {
				if slices.Contains(ep.Addresses, backend.Status.PodIP) && (ep.Conditions.Ready == nil || *ep.Conditions.Ready) {
					slice = s
					return len(shadows.Items) == 1, fmt.Sprintf("%d ShadowEndpointSlices", len(shadows.Items))
				}
			}
		}
		return false, fmt.Sprintf("no ready endpoint %s in Liqo's EndpointSlices; ready endpoints %v", backend.Status.PodIP, readyEndpoints(t, paris.Cluster, ns, "backend"))
	})
	assert.Equal(t, "rome", reflected.Labels["offloading.liqo.io/origin"], "reflected by rome's Liqo: %v", reflected.Labels)
	assert.Equal(t, "paris", reflected.Labels["offloading.liqo.io/destination"])
	assert.NotEqual(t, home.Spec.ClusterIP, reflected.Spec.ClusterIP, "paris gives the reflected Service a ClusterIP of its own")
	assert.Equal(t, "backend", slice.Labels[discoveryv1.LabelServiceName])
	reflectedIn := time.Since(began)

	romeNodes := nodeIPs(t, rome.Cluster)
	for _, name := range []string{"backend", "backend." + ns, "backend." + ns + ".svc." + testbed.ClusterDomain} {
		var got []string
		var id appAnswer
		eventually(t, 30*time.Second, caller.Name+" at paris reaches "+name, func() (bool, string) {
			out, err := execOut(t, rome.Cluster, caller, "lookup", name)
			if err != nil {
				return false, out
			}
			require.NoError(t, json.Unmarshal([]byte(out), &got), "lookup %s: %s", name, out)
			if out, err = execOut(t, rome.Cluster, caller, "get", "http://"+name+"/"); err != nil {
				return false, out
			}
			require.NoError(t, json.Unmarshal([]byte(out), &id), "answer of %s: %s", name, out)
			return true, ""
		})
		assert.Equal(t, []string{reflected.Spec.ClusterIP}, got, "%s resolved by paris's DNS to the reflected Service", name)
		assert.Equal(t, backend.Name, id["pod"], "%s answered by rome's backend pod", name)
		assert.Equal(t, romeNode, romeNodes[id["hostIP"]], "answered from rome's node: %v", id)
	}
	figure(t, "Service backend (pod on %s): reflected to paris with its EndpointSlice in %s; backend, backend.%s and its FQDN answer the offloaded pod through paris's DNS (%s) and kube-proxy after %s",
		romeNode, reflectedIn.Round(time.Millisecond), ns, reflected.Spec.ClusterIP, time.Since(began).Round(time.Millisecond))
	return &reflected
}

// liqoEndpointSlices are the EndpointSlices of Service svc in c's ns that
// Liqo made from a consumer's (reflection).
func liqoEndpointSlices(t *testing.T, c *liqobed.Cluster, ns, svc string) []discoveryv1.EndpointSlice {
	t.Helper()
	var list discoveryv1.EndpointSliceList
	require.NoError(t, c.Client.List(context.Background(), &list, client.InNamespace(ns),
		client.MatchingLabels{discoveryv1.LabelServiceName: svc, discoveryv1.LabelManagedBy: reflectionManagedBy}))
	return list.Items
}

// execOut runs `testapp args...` in pod through c's API server; its stdout,
// or its combined output and the error.
func execOut(t *testing.T, c *testbed.Cluster, pod *corev1.Pod, args ...string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cmd := kubectl(ctx, t, c, append([]string{"exec", "-n", pod.Namespace, pod.Name, "--", "/testapp"}, args...)...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return string(out) + stderr.String(), fmt.Errorf("testapp %s in %s: %w", strings.Join(args, " "), pod.Name, err)
	}
	return string(out), nil
}
