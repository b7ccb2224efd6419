package virtualkubelet_test

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/httpstream"
	"k8s.io/apimachinery/pkg/util/version"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/portforward"
	"k8s.io/client-go/tools/remotecommand"
	"k8s.io/client-go/transport/spdy"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/fluidos-project/resource-broker/agent"
	"github.com/fluidos-project/resource-broker/agent/bridge"
	"github.com/fluidos-project/resource-broker/agent/bridge/internal/bridgetest"
	"github.com/fluidos-project/resource-broker/agent/bridge/virtualkubelet"
	"github.com/fluidos-project/resource-broker/agent/provider"
	rbv1 "github.com/fluidos-project/resource-broker/api/v1alpha1"
	brokerclient "github.com/fluidos-project/resource-broker/broker/client"
	"github.com/fluidos-project/resource-broker/internal/brokertest"
	"github.com/fluidos-project/resource-broker/internal/testenv"
)

const (
	agentNamespace = "resource-broker"
	leaseDuration  = 10 * time.Second
	lostGrace      = 3 * time.Second
)

// member is a cluster with its agent.
type member struct {
	*bridgetest.Cluster
	t      *testing.T
	id     string
	broker *brokertest.Broker
	labels map[string]string // the agent advertises
	stop   context.CancelFunc
	done   chan error
}

func newMember(t *testing.T, b *brokertest.Broker, id string, o bridgetest.Options) *member {
	t.Helper()
	o.CRDDirs = append(o.CRDDirs, testenv.ModulePath(t, "manifests", "crds"))
	c := bridgetest.Start(t, id, o)
	ctx := context.Background()
	require.NoError(t, c.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: agentNamespace}}))
	require.NoError(t, c.Client.Create(ctx, provider.NewTenantClusterRole()), "installed by manifests/agent")
	return &member{Cluster: c, t: t, id: id, broker: b}
}

func (m *member) brokerClient(opts ...brokerclient.Option) *brokerclient.Client {
	bc, err := brokerclient.New(m.broker.URL, m.broker.ClusterCertDir(m.id), opts...)
	require.NoError(m.t, err)
	return bc
}

// startAgent runs the agent in-process, with the virtual-kubelet bridge when
// o is not nil.
func (m *member) startAgent(o *bridge.Options) {
	m.t.Helper()
	mgr, err := ctrl.NewManager(m.Config, ctrl.Options{
		Scheme:                 bridgetest.Scheme,
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
		Controller:             config.Controller{SkipNameValidation: ptr.To(true)},
		Logger:                 bridgetest.Logger(m.t, 0).WithName(m.id),
	})
	require.NoError(m.t, err)
	bc := m.brokerClient(brokerclient.WithRetries(1, 50*time.Millisecond))
	ao := agent.Options{ClusterID: m.id, Broker: bc, Namespace: agentNamespace, Labels: m.labels,
		TokenTTL: 10 * time.Minute, MinBackoff: 100 * time.Millisecond, MaxBackoff: time.Second,
		HoldTimeout: 200 * time.Millisecond} // nothing schedules placeholders here
	ao.EndpointFrom(m.Config)
	if o != nil {
		ao.Bridge, ao.BridgeOptions = bridge.ModeVirtualKubelet, *o
	}
	require.NoError(m.t, agent.Setup(mgr, ao))
	ctx, cancel := context.WithCancel(context.Background())
	m.stop, m.done = cancel, make(chan error, 1)
	go func() { m.done <- mgr.Start(ctx) }()
	m.t.Cleanup(func() {
		cancel()
		select {
		case err := <-m.done:
			assert.NoError(m.t, err)
		case <-time.After(30 * time.Second):
			m.t.Error("agent did not stop")
		}
	})
}

func reservation(name, cpu, memory string) *rbv1.Reservation {
	return &rbv1.Reservation{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
		Spec: rbv1.ReservationSpec{Resources: corev1.ResourceList{
			corev1.ResourceCPU: resource.MustParse(cpu), corev1.ResourceMemory: resource.MustParse(memory)}},
	}
}

// podReservation is a Reservation in ns naming pod (spec.podName), as
// rb-scheduler opens one for a pod it places on a virtual node.
func podReservation(ns, pod, cpu, memory string) *rbv1.Reservation {
	r := reservation(pod, cpu, memory)
	r.Namespace, r.Spec.PodName = ns, pod
	return r
}

// reserve opens a reservation naming pod in shop (the requests of
// boundPod) and waits until it is Active.
func (m *member) reserve(t testing.TB, pod string) {
	t.Helper()
	require.NoError(t, m.Client.Create(context.Background(), podReservation("shop", pod, "100m", "64Mi")))
	m.waitReservationIn(t, "shop", pod, func(r *rbv1.Reservation) bool { return r.Status.Phase == rbv1.ReservationActive }, 15*time.Second)
}

func (m *member) waitReservation(t testing.TB, name string, cond func(*rbv1.Reservation) bool, within time.Duration) *rbv1.Reservation {
	t.Helper()
	return m.waitReservationIn(t, "default", name, cond, within)
}

func (m *member) waitReservationIn(t testing.TB, ns, name string, cond func(*rbv1.Reservation) bool, within time.Duration) *rbv1.Reservation {
	t.Helper()
	var rsv rbv1.Reservation
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		require.NoError(c, m.Client.Get(context.Background(), types.NamespacedName{Namespace: ns, Name: name}, &rsv))
		assert.True(c, cond(&rsv), "status: %+v", rsv.Status)
	}, within, 20*time.Millisecond)
	return &rsv
}

func (m *member) node(name string) (*corev1.Node, error) {
	var n corev1.Node
	err := m.Client.Get(context.Background(), types.NamespacedName{Name: name}, &n)
	return &n, err
}

func readyCondition(n *corev1.Node) corev1.NodeCondition {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c
		}
	}
	return corev1.NodeCondition{}
}

// waitReady waits for the node's Ready condition and returns how long it took.
func (m *member) waitReady(t testing.TB, name string, want corev1.ConditionStatus, reason string, within time.Duration) time.Duration {
	t.Helper()
	start := time.Now()
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		n, err := m.node(name)
		require.NoError(c, err)
		rc := readyCondition(n)
		assert.Equal(c, want, rc.Status, "%+v", rc)
		if reason != "" {
			assert.Equal(c, reason, rc.Reason, "%+v", rc)
		}
	}, within, 20*time.Millisecond)
	return time.Since(start)
}

func (m *member) pod(ns, name string) (*corev1.Pod, error) {
	var p corev1.Pod
	err := m.Client.Get(context.Background(), types.NamespacedName{Namespace: ns, Name: name}, &p)
	return &p, err
}

// boundPod is a pod the scheduler bound to the virtual node, with what a
// pod of this cluster carries: a service account token volume (as the
// ServiceAccount admission plugin adds it), the virtual node's selector and
// toleration, our scheduler's name.
func boundPod(ns, name string, policy corev1.RestartPolicy) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: map[string]string{"app": name}, Annotations: map[string]string{"team": "blue"}},
		Spec: corev1.PodSpec{
			NodeName: "rb-paris", SchedulerName: "resource-broker", ServiceAccountName: "web-sa", RestartPolicy: policy,
			NodeSelector: map[string]string{rbv1.ProviderLabel: "paris"},
			Tolerations:  []corev1.Toleration{{Key: rbv1.VirtualNodeTaint, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule}},
			Volumes: []corev1.Volume{
				{Name: "kube-api-access-x7k2p", VolumeSource: corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{Sources: []corev1.VolumeProjection{
					{ServiceAccountToken: &corev1.ServiceAccountTokenProjection{Path: "token", ExpirationSeconds: ptr.To(int64(3607))}},
					{ConfigMap: &corev1.ConfigMapProjection{LocalObjectReference: corev1.LocalObjectReference{Name: "kube-root-ca.crt"},
						Items: []corev1.KeyToPath{{Key: "ca.crt", Path: "ca.crt"}}}},
				}}}},
			},
			Containers: []corev1.Container{{
				Name: "main", Image: "nginx:1.27",
				Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{
					corev1.ResourceCPU: resource.MustParse("100m"), corev1.ResourceMemory: resource.MustParse("64Mi")}},
				VolumeMounts: []corev1.VolumeMount{{Name: "kube-api-access-x7k2p", MountPath: "/var/run/secrets/kubernetes.io/serviceaccount", ReadOnly: true}},
			}},
		},
	}
}

// TestVirtualKubelet runs the virtual-kubelet bridge between two real API
// servers (rome, the requester; paris, the provider, whose pods a fake
// kubelet runs), a real broker and both agents, through a virtual node's life.
func TestVirtualKubelet(t *testing.T) {
	ctx := context.Background()
	b := brokertest.Start(t, brokertest.Options{})
	// rome's API server verifies kubelet serving certificates, and its
	// kube-controller-manager's kubelet-serving signer issues them: the
	// agent's kubelet endpoint must serve the one its CSR got.
	signingCA := bridgetest.NewSigningCA(t)
	rome := newMember(t, b, "rome", bridgetest.Options{KubeletCA: signingCA})
	rome.RunKubeletServingSigner(signingCA, time.Hour)
	paris := newMember(t, b, "paris", bridgetest.Options{AuditNamespaces: []string{"rb-rome"}})
	kubelet := paris.RunKubelet("paris-node-1", "rb-rome", corev1.ResourceList{
		corev1.ResourceCPU: resource.MustParse("16"), corev1.ResourceMemory: resource.MustParse("64Gi"), corev1.ResourcePods: resource.MustParse("110")})
	b.Advertise("paris", "8", "32Gi", "", "0.03", nil)
	paris.startAgent(nil)
	rome.startAgent(&bridge.Options{Log: bridgetest.Logger(t, 1), VirtualKubelet: virtualkubelet.Config{
		LeaseDuration: leaseDuration, ProbePeriod: time.Second, StatusSyncPeriod: 5 * time.Second,
		KubeletAddress: "127.0.0.1:0", NodeIP: "127.0.0.1",
		// Lost after a short grace; never replaced here (test/integration's
		// TestFaultsProviderLost covers that on real nodes).
		ProviderLostGrace: lostGrace, ProviderLostReplaceAfter: time.Hour,
	}})
	require.NoError(t, rome.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "shop"}}))
	var rsv *rbv1.Reservation

	t.Run("reserved: virtual node rb-paris with the reservation's capacity and our taint", func(t *testing.T) {
		start := time.Now()
		require.NoError(t, rome.Client.Create(ctx, reservation("web", "2", "4Gi")))
		rsv = rome.waitReservation(t, "web", func(r *rbv1.Reservation) bool { return r.Status.Phase == rbv1.ReservationActive }, 15*time.Second)
		rome.waitReady(t, "rb-paris", corev1.ConditionTrue, virtualkubelet.ReasonReachable, 15*time.Second)
		t.Logf("reservation created -> rb-paris Ready: %s", time.Since(start).Round(time.Millisecond))
		// Named once the node is schedulable (Ready, and the API server's
		// node.kubernetes.io/not-ready taint lifted by the node lifecycle
		// controller, which bridgetest plays) and its capacity counts the
		// reservation: read right after, the node has it.
		rome.waitReservation(t, "web", func(r *rbv1.Reservation) bool { return r.Status.VirtualNode == "rb-paris" }, 5*time.Second)
		n, err := rome.node("rb-paris")
		require.NoError(t, err)
		assert.Equal(t, "paris", n.Labels[rbv1.ProviderLabel])
		assert.Equal(t, "virtual-kubelet", n.Labels["type"])
		kv, err := version.ParseSemantic(n.Status.NodeInfo.KubeletVersion)
		require.NoError(t, err, "kubeletVersion is semver: %q", n.Status.NodeInfo.KubeletVersion)
		assert.Equal(t, uint(1), kv.Major())
		assert.Equal(t, []corev1.Taint{{Key: rbv1.VirtualNodeTaint, Value: "true", Effect: corev1.TaintEffectNoSchedule}}, n.Spec.Taints)
		for _, list := range []corev1.ResourceList{n.Status.Capacity, n.Status.Allocatable} {
			assert.Equal(t, "2", ptr.To(list[corev1.ResourceCPU]).String())
			assert.Equal(t, "4Gi", ptr.To(list[corev1.ResourceMemory]).String())
			assert.Equal(t, "110", ptr.To(list[corev1.ResourcePods]).String())
		}
		var lease coordinationv1.Lease
		require.NoError(t, rome.Client.Get(ctx, types.NamespacedName{Namespace: corev1.NamespaceNodeLease, Name: "rb-paris"}, &lease))
		assert.Equal(t, int32(leaseDuration/time.Second), ptr.Deref(lease.Spec.LeaseDurationSeconds, 0))

		require.NoError(t, rome.Client.Create(ctx, reservation("web-1", "1", "1Gi")))
		rome.waitReservation(t, "web-1", func(r *rbv1.Reservation) bool { return r.Status.VirtualNode == "rb-paris" }, 15*time.Second)
		n, err = rome.node("rb-paris")
		require.NoError(t, err)
		assert.Equal(t, "3", ptr.To(n.Status.Capacity[corev1.ResourceCPU]).String(), "the sum of the active reservations, written before web-1 names the node")
		assert.Equal(t, "5Gi", ptr.To(n.Status.Capacity[corev1.ResourceMemory]).String())
		assert.Equal(t, "220", ptr.To(n.Status.Allocatable[corev1.ResourcePods]).String())
		rsv = rome.waitReservation(t, "web", func(r *rbv1.Reservation) bool { return r.Status.Phase == rbv1.ReservationActive }, time.Second)
		assert.Equal(t, "rb-paris", rsv.Status.VirtualNode, "the reconciler's updates keep the bridge's field")
	})

	t.Run("a pod bound to rb-paris runs in paris's tenant namespace, its status reflected", func(t *testing.T) {
		require.NoError(t, rome.Client.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "web-config", Namespace: "shop"},
			Data: map[string]string{"index.html": "hello"}}))
		require.NoError(t, rome.Client.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "web-creds", Namespace: "shop"},
			StringData: map[string]string{"password": "s3cret"}}))
		pod := boundPod("shop", "web-0", corev1.RestartPolicyAlways)
		pod.Spec.Volumes = append(pod.Spec.Volumes,
			corev1.Volume{Name: "config", VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{LocalObjectReference: corev1.LocalObjectReference{Name: "web-config"}}}},
			corev1.Volume{Name: "creds", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: "web-creds"}}})
		pod.Spec.Containers[0].VolumeMounts = append(pod.Spec.Containers[0].VolumeMounts,
			corev1.VolumeMount{Name: "config", MountPath: "/usr/share/nginx/html"}, corev1.VolumeMount{Name: "creds", MountPath: "/etc/creds"})
		rome.reserve(t, "web-0")
		t0 := time.Now()
		require.NoError(t, rome.Client.Create(ctx, pod))

		var remote corev1.Pod
		require.EventuallyWithT(t, func(c *assert.CollectT) {
			require.NoError(c, paris.Client.Get(ctx, types.NamespacedName{Namespace: "rb-rome", Name: "shop.web-0"}, &remote))
		}, 15*time.Second, 5*time.Millisecond)
		var local *corev1.Pod
		require.EventuallyWithT(t, func(c *assert.CollectT) {
			var err error
			local, err = rome.pod("shop", "web-0")
			require.NoError(c, err)
			assert.Equal(c, corev1.PodRunning, local.Status.Phase)
			assert.NotEmpty(c, local.Status.ContainerStatuses)
		}, 15*time.Second, 5*time.Millisecond)
		t3 := time.Now()
		ev := kubelet.Event("shop.web-0")
		t.Logf("latency: pod bound in rome -> copy seen by paris's kubelet %s -> copy Running %s -> rome's pod Running %s (total %s)",
			ev.Seen.Sub(t0).Round(time.Millisecond), ev.Running.Sub(ev.Seen).Round(time.Millisecond), t3.Sub(ev.Running).Round(time.Millisecond), t3.Sub(t0).Round(time.Millisecond))

		require.NoError(t, paris.Client.Get(ctx, types.NamespacedName{Namespace: "rb-rome", Name: "shop.web-0"}, &remote))
		// The copy: no token, none of rome's placement, marked with its origin.
		for _, v := range remote.Spec.Volumes {
			assert.Nil(t, v.Projected, "no service account token volume: %s", v.Name)
		}
		for _, m := range remote.Spec.Containers[0].VolumeMounts {
			assert.NotEqual(t, "/var/run/secrets/kubernetes.io/serviceaccount", m.MountPath)
		}
		assert.Equal(t, ptr.To(false), remote.Spec.AutomountServiceAccountToken)
		assert.NotEqual(t, "web-sa", remote.Spec.ServiceAccountName)
		assert.Equal(t, "paris-node-1", remote.Spec.NodeName, "placed by paris, not bound to rome's node")
		assert.Equal(t, corev1.DefaultSchedulerName, remote.Spec.SchedulerName)
		assert.NotContains(t, remote.Spec.NodeSelector, rbv1.ProviderLabel)
		for _, tol := range remote.Spec.Tolerations {
			assert.NotEqual(t, rbv1.VirtualNodeTaint, tol.Key)
		}
		assert.Empty(t, remote.OwnerReferences)
		assert.Equal(t, "web-0", remote.Labels["app"])
		assert.Equal(t, "rome", remote.Labels[rbv1.RequesterLabel])
		assert.Equal(t, "blue", remote.Annotations["team"])
		assert.Equal(t, string(local.UID), remote.Annotations[virtualkubelet.OriginUIDAnnotation])
		// Its ConfigMap and Secret came along.
		var cm corev1.ConfigMap
		require.NoError(t, paris.Client.Get(ctx, types.NamespacedName{Namespace: "rb-rome", Name: "shop.web-config"}, &cm))
		assert.Equal(t, "hello", cm.Data["index.html"])
		var secret corev1.Secret
		require.NoError(t, paris.Client.Get(ctx, types.NamespacedName{Namespace: "rb-rome", Name: "shop.web-creds"}, &secret))
		assert.Equal(t, "s3cret", string(secret.Data["password"]))
		assert.True(t, slices.ContainsFunc(remote.Spec.Volumes, func(v corev1.Volume) bool { return v.ConfigMap != nil && v.ConfigMap.Name == "shop.web-config" }))
		// Rome's pod shows paris's status.
		assert.Equal(t, "rb-paris", local.Spec.NodeName)
		assert.Equal(t, remote.Status.PodIP, local.Status.PodIP)
		assert.Equal(t, remote.Status.ContainerStatuses, local.Status.ContainerStatuses)
		assert.True(t, slices.ContainsFunc(local.Status.Conditions, func(c corev1.PodCondition) bool {
			return c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue
		}))
		assert.True(t, slices.ContainsFunc(local.Status.Conditions, func(c corev1.PodCondition) bool {
			return c.Type == virtualkubelet.PodConditionReserved && c.Status == corev1.ConditionTrue &&
				strings.Contains(c.Message, "reservation web-0 (broker id ") && strings.Contains(c.Message, "at paris")
		}), "admitted on its reservation: %+v", local.Status.Conditions)

		// The copies follow their originals.
		cmLocal := &corev1.ConfigMap{}
		require.NoError(t, rome.Client.Get(ctx, types.NamespacedName{Namespace: "shop", Name: "web-config"}, cmLocal))
		cmLocal.Data["index.html"] = "hello again"
		require.NoError(t, rome.Client.Update(ctx, cmLocal))
		require.EventuallyWithT(t, func(c *assert.CollectT) {
			require.NoError(c, paris.Client.Get(ctx, types.NamespacedName{Namespace: "rb-rome", Name: "shop.web-config"}, &cm))
			assert.Equal(c, "hello again", cm.Data["index.html"])
		}, 10*time.Second, 20*time.Millisecond)
	})

	t.Run("the kubelet endpoint serves the certificate rome's kubelet-serving signer issued", func(t *testing.T) {
		n, err := rome.node("rb-paris")
		require.NoError(t, err)
		addr := fmt.Sprintf("127.0.0.1:%d", n.Status.DaemonEndpoints.KubeletEndpoint.Port)
		require.EventuallyWithT(t, func(c *assert.CollectT) {
			// As the API server dials it: the node's address, no SNI, verified with the signer's CA.
			conn, err := tls.Dial("tcp", addr, &tls.Config{RootCAs: signingCA.Pool, MinVersion: tls.VersionTLS12})
			require.NoError(c, err)
			defer conn.Close()
			assert.Equal(c, "system:node:rb-rome-vk", conn.ConnectionState().PeerCertificates[0].Subject.CommonName)
		}, 15*time.Second, 50*time.Millisecond)
	})

	t.Run("kubectl logs on rome's pod reads paris's pods/log", func(t *testing.T) {
		data, err := rome.Clientset.CoreV1().Pods("shop").GetLogs("web-0", &corev1.PodLogOptions{Container: "main"}).DoRaw(ctx)
		require.NoError(t, err, "%s", data)
		assert.Equal(t, "log of rb-rome/shop.web-0 container main on paris-node-1\n", string(data))

		// The kubelet endpoint authenticates and authorizes as a kubelet does:
		// nodes/proxy of the pod's node.
		_, err = virtualkubeletLogs(ctx, t, &rest.Config{}, rome, "shop", "web-0")
		assert.ErrorContains(t, err, "401", "no credentials")
		mallory := rest.CopyConfig(rome.Config)
		mallory.CertData, mallory.KeyData, err = rome.Authn.Issue("mallory")
		require.NoError(t, err)
		_, err = virtualkubeletLogs(ctx, t, mallory, rome, "shop", "web-0")
		assert.ErrorContains(t, err, "403", "a user without nodes/proxy is refused")

		require.NoError(t, rome.Client.Create(ctx, &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "rb-paris-proxy"},
			Rules: []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"nodes/proxy"}, ResourceNames: []string{"rb-paris"}, Verbs: []string{"get"}}}}))
		require.NoError(t, rome.Client.Create(ctx, &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "alice-rb-paris-proxy"},
			RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "rb-paris-proxy"},
			Subjects: []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: "alice"}}}))
		alice := rest.CopyConfig(rome.Config)
		alice.CertData, alice.KeyData, err = rome.Authn.Issue("alice")
		require.NoError(t, err)
		require.EventuallyWithT(t, func(c *assert.CollectT) { // RBAC caches
			data, err := virtualkubeletLogs(ctx, t, alice, rome, "shop", "web-0")
			require.NoError(c, err)
			assert.Equal(c, "log of rb-rome/shop.web-0 container main on paris-node-1\n", string(data))
		}, 5*time.Second, 50*time.Millisecond, "nodes/proxy of rb-paris is enough")

		_, err = virtualkubeletLogs(ctx, t, rome.Config, rome, "shop", "not-here")
		assert.ErrorContains(t, err, "404", "a pod that is not on a virtual node of this agent")
		_, err = virtualkubeletLogs(ctx, t, rome.Config, rome, "shop", "web-0", "sidecar")
		assert.ErrorContains(t, err, "400", "paris's answer: no such container")
		t.Logf("logs of a container the pod does not have: %v", err)
	})

	t.Run("exec, attach and port-forward reach the copy through paris's API with the tenant token", func(t *testing.T) {
		// paris's API server takes the requests to its kubelet, which (a
		// fake) serves no streams: its 404 comes back to rome's caller.
		_, err := remoteCommand(ctx, rome.Config, "exec", "shop", "web-0", "cat", "/etc/hostname")
		require.Error(t, err)
		assert.Contains(t, err.Error(), "exec in the copy shop.web-0 at paris")
		assert.Contains(t, err.Error(), "404", "paris's kubelet has no /exec")
		t.Logf("exec, through paris to its kubelet: %v", err)
		_, err = remoteCommand(ctx, rome.Config, "attach", "shop", "web-0")
		require.Error(t, err)
		assert.Contains(t, err.Error(), "404", "paris's kubelet has no /attach")
		t.Logf("attach, through paris to its kubelet: %v", err)
		msg := portForwardError(ctx, t, rome.Config, "shop", "web-0", 8080)
		assert.Contains(t, msg, "port-forward to the copy shop.web-0 at paris")
		assert.Contains(t, msg, "404", "paris's kubelet has no /portForward")
		t.Logf("port-forward, through paris to its kubelet: %s", msg)
		// With the tenant token: paris's audit log has the tenant asking for
		// the copy's streams.
		streams := map[string]bool{}
		for _, e := range paris.AuditEvents() {
			if r := e.ObjectRef; r.Namespace == "rb-rome" && r.Name == "shop.web-0" && e.User.Username == "system:serviceaccount:rb-rome:rb-tenant" {
				streams[r.Subresource] = true
			}
		}
		assert.True(t, streams["exec"] && streams["attach"] && streams["portforward"], "subresources the tenant asked paris for: %v", streams)

		// A provider that refuses: its answer is what rome's caller sees.
		var binding rbacv1.RoleBinding
		require.NoError(t, paris.Client.Get(ctx, types.NamespacedName{Namespace: "rb-rome", Name: provider.TenantRoleBinding}, &binding))
		require.NoError(t, paris.Client.Delete(ctx, &binding))
		require.EventuallyWithT(t, func(c *assert.CollectT) {
			_, err := remoteCommand(ctx, rome.Config, "exec", "shop", "web-0", "cat", "/etc/hostname")
			require.Error(c, err)
			assert.Contains(c, err.Error(), `User "system:serviceaccount:rb-rome:rb-tenant" cannot create resource "pods/exec"`)
		}, 5*time.Second, 50*time.Millisecond)
		binding.ResourceVersion, binding.UID = "", ""
		require.NoError(t, paris.Client.Create(ctx, &binding))
		rome.waitReady(t, "rb-paris", corev1.ConditionTrue, virtualkubelet.ReasonReachable, 10*time.Second)
	})

	t.Run("mirrored objects are written with the tenant token, which works nowhere else", func(t *testing.T) {
		at, err := rome.brokerClient().Reservation(ctx, rsv.Status.ReservationID)
		require.NoError(t, err)
		require.NotNil(t, at.Grant)
		tenant, err := client.New(&rest.Config{Host: at.Grant.Endpoint, BearerToken: at.Grant.Token,
			TLSClientConfig: rest.TLSClientConfig{CAData: at.Grant.CABundle}}, client.Options{Scheme: bridgetest.Scheme})
		require.NoError(t, err)
		require.NoError(t, tenant.List(ctx, &corev1.PodList{}, client.InNamespace("rb-rome")))
		err = tenant.List(ctx, &corev1.PodList{}, client.InNamespace("default"))
		assert.True(t, apierrors.IsForbidden(err), "%v", err)
		err = tenant.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "x", Namespace: "default"}})
		assert.True(t, apierrors.IsForbidden(err), "%v", err)
		err = tenant.Get(ctx, types.NamespacedName{Namespace: "kube-system", Name: "extension-apiserver-authentication"}, &corev1.ConfigMap{})
		assert.True(t, apierrors.IsForbidden(err), "%v", err)

		// paris's audit log: who created the copies.
		creators := map[string][]string{}
		for _, e := range paris.AuditEvents() {
			r := e.ObjectRef
			if r.Resource == "pods" && strings.HasPrefix(r.Name, strings.TrimSuffix(provider.PlaceholderName("x"), "x")) {
				continue // paris's agent's placeholders (provider-side hold), not copies
			}
			if e.Verb == "create" && r.Namespace == "rb-rome" && r.Subresource == "" && slices.Contains([]string{"pods", "configmaps", "secrets"}, r.Resource) {
				creators[e.User.Username] = append(creators[e.User.Username], r.Resource+"/"+r.Name)
			}
		}
		require.NotEmpty(t, creators)
		assert.Equal(t, []string{"system:serviceaccount:rb-rome:rb-tenant"}, mapsKeys(creators), "creations in rb-rome by user: %v", creators)
		assert.Subset(t, creators["system:serviceaccount:rb-rome:rb-tenant"], []string{"pods/shop.web-0", "configmaps/shop.web-config", "secrets/shop.web-creds"})
	})

	t.Run("paris's Events about a copy are recorded on rome's pod, once, with their count", func(t *testing.T) {
		var remote corev1.Pod
		require.NoError(t, paris.Client.Get(ctx, types.NamespacedName{Namespace: "rb-rome", Name: "shop.web-0"}, &remote))
		local, err := rome.pod("shop", "web-0")
		require.NoError(t, err)
		now := metav1.Now()
		// As paris's kubelet and scheduler record them about the copy.
		providerEvent := func(name, reason, typ, component, msg string) *corev1.Event {
			return &corev1.Event{ObjectMeta: metav1.ObjectMeta{Namespace: "rb-rome", Name: name},
				InvolvedObject: corev1.ObjectReference{Kind: "Pod", APIVersion: "v1", Namespace: "rb-rome", Name: remote.Name, UID: remote.UID,
					FieldPath: "spec.containers{main}"},
				Reason: reason, Type: typ, Message: msg, Source: corev1.EventSource{Component: component, Host: "paris-node-1"},
				Count: 1, FirstTimestamp: now, LastTimestamp: now}
		}
		backOff := providerEvent("shop.web-0.backoff", "BackOff", corev1.EventTypeWarning, "kubelet",
			fmt.Sprintf("Back-off restarting failed container main in pod shop.web-0_rb-rome(%s)", remote.UID))
		for _, e := range []*corev1.Event{
			providerEvent("shop.web-0.scheduled", "Scheduled", corev1.EventTypeNormal, "default-scheduler", "Successfully assigned rb-rome/shop.web-0 to paris-node-1"),
			backOff,
			providerEvent("shop.web-0.failed", "Failed", corev1.EventTypeWarning, "kubelet", `Error: configmap "shop.web-config" not found`),
		} {
			require.NoError(t, paris.Client.Create(ctx, e))
		}
		recorded := func(c require.TestingT) map[string]corev1.Event {
			var list corev1.EventList
			require.NoError(c, rome.Client.List(ctx, &list, client.InNamespace("shop")))
			out := map[string]corev1.Event{}
			for _, e := range list.Items {
				if e.InvolvedObject.UID == local.UID && strings.HasPrefix(e.Message, "(on paris) ") {
					_, dup := out[e.Reason]
					assert.False(t, dup, "one local Event per provider Event: %s", e.Reason)
					out[e.Reason] = e
				}
			}
			return out
		}
		require.EventuallyWithT(t, func(c *assert.CollectT) {
			got := recorded(c)
			assert.Len(c, got, 2, "BackOff and Failed, not the provider scheduler's Scheduled: %v", got)
			assert.Equal(c, fmt.Sprintf("(on paris) Back-off restarting failed container main in pod web-0_shop(%s)", local.UID), got["BackOff"].Message)
			assert.Equal(c, `(on paris) Error: configmap "web-config" not found`, got["Failed"].Message)
			assert.Equal(c, corev1.EventTypeWarning, got["Failed"].Type)
			assert.Equal(c, "spec.containers{main}", got["BackOff"].InvolvedObject.FieldPath)
			assert.Equal(c, corev1.EventSource{Component: "kubelet", Host: "rb-paris"}, got["BackOff"].Source)
		}, 10*time.Second, 20*time.Millisecond)

		// The kubelet counts the back-off again: the same local Event counts too.
		require.NoError(t, paris.Client.Get(ctx, client.ObjectKeyFromObject(backOff), backOff))
		backOff.Count, backOff.LastTimestamp = 5, metav1.NewTime(now.Add(time.Minute))
		require.NoError(t, paris.Client.Update(ctx, backOff))
		require.EventuallyWithT(t, func(c *assert.CollectT) {
			got := recorded(c)
			assert.Len(c, got, 2)
			assert.Equal(c, int32(5), got["BackOff"].Count)
			assert.True(c, got["BackOff"].LastTimestamp.After(now.Time))
		}, 10*time.Second, 20*time.Millisecond)
	})

	t.Run("a pod bound to rb-paris that no reservation names is not copied: Pending NotReserved until one does", func(t *testing.T) {
		node, err := rome.node("rb-paris")
		require.NoError(t, err)
		cpu, pods := node.Status.Capacity.Cpu().MilliValue(), node.Status.Capacity.Pods().Value()
		// Restart policy Never: a kubelet's rejection would fail it; the bridge keeps it Pending.
		pinned := boundPod("shop", "pinned", corev1.RestartPolicyNever)
		bare := boundPod("shop", "bare", corev1.RestartPolicyAlways)
		bare.Spec.Containers[0].Resources = corev1.ResourceRequirements{}
		require.NoError(t, rome.Client.Create(ctx, pinned))
		require.NoError(t, rome.Client.Create(ctx, bare))
		notReserved := func(name string, parts ...string) *corev1.Pod {
			var p *corev1.Pod
			require.EventuallyWithT(t, func(c *assert.CollectT) {
				var err error
				p, err = rome.pod("shop", name)
				require.NoError(c, err)
				assert.Equal(c, corev1.PodPending, p.Status.Phase)
				assert.Equal(c, virtualkubelet.ReasonNotReserved, p.Status.Reason)
				for _, part := range parts {
					assert.Contains(c, p.Status.Message, part)
				}
				require.Len(c, p.Status.ContainerStatuses, 1)
				assert.Equal(c, virtualkubelet.ReasonNotReserved, p.Status.ContainerStatuses[0].State.Waiting.Reason)
				cond := podCondition(p, virtualkubelet.PodConditionReserved)
				require.NotNil(c, cond)
				assert.Equal(c, corev1.ConditionFalse, cond.Status)
			}, 10*time.Second, 20*time.Millisecond)
			return p
		}
		notReserved("pinned", "no live broker reservation at paris names this pod", "schedulerName: resource-broker")
		notReserved("bare", "container main requests no cpu and no memory")
		require.EventuallyWithT(t, func(c *assert.CollectT) {
			n, err := rome.node("rb-paris")
			require.NoError(c, err)
			assert.Equal(c, cpu+100, n.Status.Capacity.Cpu().MilliValue(), "the refused pod's requests are added: it takes no reserved room")
			assert.Equal(c, pods+2, n.Status.Capacity.Pods().Value())
		}, 10*time.Second, 20*time.Millisecond)

		// Touched and decided again: still one Event, no copy.
		require.NoError(t, rome.Client.Patch(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "pinned"}},
			client.RawPatch(types.MergePatchType, []byte(`{"metadata":{"labels":{"touched":"yes"}}}`))))
		require.NoError(t, rome.Client.Create(ctx, reservation("elsewhere", "100m", "64Mi"))) // the provider's reservations change
		time.Sleep(2 * time.Second)
		warnings := func(pod string) []corev1.Event {
			var list corev1.EventList
			require.NoError(t, rome.Client.List(ctx, &list, client.InNamespace("shop")))
			var out []corev1.Event
			for _, e := range list.Items {
				if e.InvolvedObject.Name == pod && e.Reason == virtualkubelet.ReasonNotReserved {
					out = append(out, e)
				}
			}
			return out
		}
		if ev := warnings("pinned"); assert.Len(t, ev, 1) {
			// events.k8s.io: a repeated Event would be a series.
			assert.Nil(t, ev[0].Series, "one Warning, not one per decision")
			assert.Equal(t, corev1.EventTypeWarning, ev[0].Type)
		}
		for _, name := range []string{"shop.pinned", "shop.bare"} {
			err := paris.Client.Get(ctx, types.NamespacedName{Namespace: "rb-rome", Name: name}, &corev1.Pod{})
			assert.True(t, apierrors.IsNotFound(err), "no copy of %s at paris: %v", name, err)
		}
		p, err := rome.pod("shop", "pinned")
		require.NoError(t, err)
		assert.Equal(t, corev1.PodPending, p.Status.Phase, "Pending, not Failed, although its restart policy is Never")

		// A reservation naming it, at paris: admitted, copied, running.
		rome.reserve(t, "pinned")
		require.EventuallyWithT(t, func(c *assert.CollectT) {
			p, err := rome.pod("shop", "pinned")
			require.NoError(c, err)
			assert.Equal(c, corev1.PodRunning, p.Status.Phase)
			cond := podCondition(p, virtualkubelet.PodConditionReserved)
			require.NotNil(c, cond)
			assert.Equal(c, corev1.ConditionTrue, cond.Status)
		}, 15*time.Second, 20*time.Millisecond, "admitted once a reservation names it")
		require.NoError(t, paris.Client.Get(ctx, types.NamespacedName{Namespace: "rb-rome", Name: "shop.pinned"}, &corev1.Pod{}))
		var admittedEvents corev1.EventList
		require.NoError(t, rome.Client.List(ctx, &admittedEvents, client.InNamespace("shop"), client.MatchingFields{"involvedObject.kind": "Pod", "involvedObject.name": "pinned", "reason": virtualkubelet.ReasonReserved}))
		assert.Len(t, admittedEvents.Items, 1, "a Normal Event says it is admitted now")

		// A refused pod deleted goes at once: nothing runs for it.
		start := time.Now()
		require.NoError(t, rome.Client.Delete(ctx, bare))
		require.Eventually(t, func() bool {
			_, err := rome.pod("shop", "bare")
			return apierrors.IsNotFound(err)
		}, 10*time.Second, 20*time.Millisecond)
		t.Logf("refused pod deleted -> gone in %s", time.Since(start).Round(time.Millisecond))
		require.NoError(t, rome.Client.Delete(ctx, pinned))
		require.NoError(t, rome.Client.Delete(ctx, reservation("elsewhere", "100m", "64Mi")))
		require.Eventually(t, func() bool {
			_, err := rome.pod("shop", "pinned")
			return apierrors.IsNotFound(err)
		}, 15*time.Second, 20*time.Millisecond)
	})

	t.Run("deleting rome's pod deletes the copy with the same grace period", func(t *testing.T) {
		t0 := time.Now()
		require.NoError(t, rome.Client.Delete(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "web-0"}}, client.GracePeriodSeconds(7)))
		require.Eventually(t, func() bool {
			_, err := rome.pod("shop", "web-0")
			return apierrors.IsNotFound(err)
		}, 15*time.Second, 5*time.Millisecond, "rome's pod goes once the copy is gone, not after the grace period")
		ev := kubelet.Event("shop.web-0")
		assert.Equal(t, ptr.To(int64(7)), ev.DeleteGrace, "paris deleted the copy with rome's grace period")
		t.Logf("latency: delete in rome -> copy deleted at paris %s -> rome's pod gone %s", ev.Deleted.Sub(t0).Round(time.Millisecond), time.Since(ev.Deleted).Round(time.Millisecond))
		require.Eventually(t, func() bool {
			err1 := paris.Client.Get(ctx, types.NamespacedName{Namespace: "rb-rome", Name: "shop.web-config"}, &corev1.ConfigMap{})
			err2 := paris.Client.Get(ctx, types.NamespacedName{Namespace: "rb-rome", Name: "shop.web-creds"}, &corev1.Secret{})
			return apierrors.IsNotFound(err1) && apierrors.IsNotFound(err2)
		}, 10*time.Second, 20*time.Millisecond, "copies no pod uses are deleted")
	})

	t.Run("a copy deleted behind the bridge's back is recreated, or fails the pod, per restart policy", func(t *testing.T) {
		rome.reserve(t, "always")
		rome.reserve(t, "never")
		require.NoError(t, rome.Client.Create(ctx, boundPod("shop", "always", corev1.RestartPolicyAlways)))
		require.NoError(t, rome.Client.Create(ctx, boundPod("shop", "never", corev1.RestartPolicyNever)))
		running := func(name string) {
			require.EventuallyWithT(t, func(c *assert.CollectT) {
				p, err := rome.pod("shop", name)
				require.NoError(c, err)
				assert.Equal(c, corev1.PodRunning, p.Status.Phase)
			}, 15*time.Second, 10*time.Millisecond)
		}
		running("always")
		running("never")
		var before corev1.Pod
		require.NoError(t, paris.Client.Get(ctx, types.NamespacedName{Namespace: "rb-rome", Name: "shop.always"}, &before))
		for _, name := range []string{"shop.always", "shop.never"} {
			require.NoError(t, paris.Client.Delete(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "rb-rome", Name: name}}))
		}
		require.EventuallyWithT(t, func(c *assert.CollectT) {
			var after corev1.Pod
			require.NoError(c, paris.Client.Get(ctx, types.NamespacedName{Namespace: "rb-rome", Name: "shop.always"}, &after))
			assert.NotEqual(c, before.UID, after.UID, "a new copy")
			assert.Equal(c, corev1.PodRunning, after.Status.Phase)
		}, 15*time.Second, 10*time.Millisecond, "restart policy Always: recreated")
		running("always")
		require.EventuallyWithT(t, func(c *assert.CollectT) {
			p, err := rome.pod("shop", "never")
			require.NoError(c, err)
			assert.Equal(c, corev1.PodFailed, p.Status.Phase)
			assert.Equal(c, virtualkubelet.ReasonDeletedAtProvider, p.Status.Reason)
		}, 15*time.Second, 10*time.Millisecond, "restart policy Never: failed")
		time.Sleep(time.Second)
		err := paris.Client.Get(ctx, types.NamespacedName{Namespace: "rb-rome", Name: "shop.never"}, &corev1.Pod{})
		assert.True(t, apierrors.IsNotFound(err), "not recreated: %v", err)
		require.NoError(t, rome.Client.Delete(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "never"}}))
	})

	t.Run("revoked access: rb-paris NotReady with a clear reason, Ready again when restored", func(t *testing.T) {
		var binding rbacv1.RoleBinding
		require.NoError(t, paris.Client.Get(ctx, types.NamespacedName{Namespace: "rb-rome", Name: provider.TenantRoleBinding}, &binding))
		require.NoError(t, paris.Client.Delete(ctx, &binding))
		took := rome.waitReady(t, "rb-paris", corev1.ConditionFalse, virtualkubelet.ReasonAccessRevoked, 10*time.Second)
		t.Logf("access revoked -> rb-paris NotReady (AccessRevoked): %s", took.Round(time.Millisecond))
		n, err := rome.node("rb-paris")
		require.NoError(t, err)
		assert.Contains(t, readyCondition(n).Message, "paris revoked access to namespace rb-rome")
		binding.ResourceVersion, binding.UID = "", ""
		require.NoError(t, paris.Client.Create(ctx, &binding))
		rome.waitReady(t, "rb-paris", corev1.ConditionTrue, virtualkubelet.ReasonReachable, 10*time.Second)
	})

	t.Run("a deleted virtual node is registered again", func(t *testing.T) {
		before, err := rome.node("rb-paris")
		require.NoError(t, err)
		require.NoError(t, rome.Client.Delete(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "rb-paris"}}))
		rome.waitReady(t, "rb-paris", corev1.ConditionTrue, virtualkubelet.ReasonReachable, 10*time.Second)
		n, err := rome.node("rb-paris")
		require.NoError(t, err)
		assert.Contains(t, n.Spec.Taints, corev1.Taint{Key: rbv1.VirtualNodeTaint, Value: "true", Effect: corev1.TaintEffectNoSchedule})
		assert.Equal(t, ptr.To(before.Status.Capacity[corev1.ResourceCPU]).String(), ptr.To(n.Status.Capacity[corev1.ResourceCPU]).String(),
			"registered again with its capacity")
	})

	t.Run("paris's API server stopped: rb-paris Ready for the grace, then Unknown and tainted unreachable; restarted: Ready", func(t *testing.T) {
		var lease coordinationv1.Lease
		require.NoError(t, rome.Client.Get(ctx, types.NamespacedName{Namespace: corev1.NamespaceNodeLease, Name: "rb-paris"}, &lease))
		renewed := lease.Spec.RenewTime.Time
		stopping := time.Now()
		paris.StopAPIServer(t)
		stopped := time.Now()
		rome.waitReady(t, "rb-paris", corev1.ConditionUnknown, virtualkubelet.ReasonUnreachable, lostGrace+leaseDuration)
		n, err := rome.node("rb-paris")
		require.NoError(t, err)
		lost := readyCondition(n).LastTransitionTime.Time
		t.Logf("paris API server stopping (SIGTERM, SIGKILL after 5s) -> port closed %s; rb-paris Unknown %s after the stop began (grace %s, probe 1s; the condition's time has second precision)",
			stopped.Sub(stopping).Round(time.Millisecond), lost.Sub(stopping.Truncate(time.Second)).Round(time.Second), lostGrace)
		assert.GreaterOrEqual(t, lost.Sub(stopping.Truncate(time.Second)), lostGrace-time.Second, "Ready for the grace after the last answer")
		assert.Contains(t, readyCondition(n).Message, "has not answered since")
		require.EventuallyWithT(t, func(c *assert.CollectT) {
			n, err := rome.node("rb-paris")
			require.NoError(c, err)
			for _, effect := range []corev1.TaintEffect{corev1.TaintEffectNoSchedule, corev1.TaintEffectNoExecute} {
				assert.True(c, slices.ContainsFunc(n.Spec.Taints, func(t corev1.Taint) bool {
					return t.Key == corev1.TaintNodeUnreachable && t.Effect == effect
				}), "unreachable:%s in %v", effect, n.Spec.Taints)
			}
			assert.Contains(c, n.Spec.Taints, corev1.Taint{Key: rbv1.VirtualNodeTaint, Value: "true", Effect: corev1.TaintEffectNoSchedule})
		}, 5*time.Second, 20*time.Millisecond, "tainted unreachable, our taint kept")
		require.Eventually(t, func() bool {
			_ = rome.Client.Get(ctx, types.NamespacedName{Namespace: corev1.NamespaceNodeLease, Name: "rb-paris"}, &lease)
			return lease.Spec.RenewTime.After(renewed) && lease.Spec.RenewTime.After(stopped)
		}, leaseDuration, 50*time.Millisecond, "the virtual kubelet renews its lease meanwhile")

		starting := time.Now()
		paris.StartAPIServer(t)
		serving := time.Now()
		rome.waitReady(t, "rb-paris", corev1.ConditionTrue, virtualkubelet.ReasonReachable, 30*time.Second)
		require.EventuallyWithT(t, func(c *assert.CollectT) {
			n, err := rome.node("rb-paris")
			require.NoError(c, err)
			assert.Equal(c, []corev1.Taint{{Key: rbv1.VirtualNodeTaint, Value: "true", Effect: corev1.TaintEffectNoSchedule}}, n.Spec.Taints)
		}, 5*time.Second, 20*time.Millisecond, "untainted")
		t.Logf("paris API server down %s; started again -> serving %s -> rb-paris Ready %s later",
			starting.Sub(stopped).Round(time.Millisecond), serving.Sub(starting).Round(time.Millisecond), time.Since(serving).Round(time.Millisecond))
		running, err := rome.pod("shop", "always")
		require.NoError(t, err)
		assert.Equal(t, corev1.PodRunning, running.Status.Phase)

		// The bridge hears of paris's pods again at once: a fresh watch, not after the old one's
		// back-off (up to 30 s).
		var before corev1.Pod
		require.NoError(t, paris.Client.Get(ctx, types.NamespacedName{Namespace: "rb-rome", Name: "shop.always"}, &before))
		require.NoError(t, paris.Client.Delete(ctx, &before, client.GracePeriodSeconds(0))) // not waiting for the fake kubelet's own watch
		deleted := time.Now()
		require.EventuallyWithT(t, func(c *assert.CollectT) {
			var after corev1.Pod
			require.NoError(c, paris.Client.Get(ctx, types.NamespacedName{Namespace: "rb-rome", Name: "shop.always"}, &after))
			assert.NotEqual(c, before.UID, after.UID)
		}, 10*time.Second, 10*time.Millisecond)
		t.Logf("after the restart, a copy deleted at paris is recreated in %s", time.Since(deleted).Round(time.Millisecond))
	})

	t.Run("the node goes when the last reservation ended and no pod is left", func(t *testing.T) {
		for _, ns := range []string{"default", "shop"} {
			require.NoError(t, rome.Client.DeleteAllOf(ctx, &rbv1.Reservation{}, client.InNamespace(ns)))
		}
		require.Eventually(t, func() bool {
			var list rbv1.ReservationList
			require.NoError(t, rome.Client.List(ctx, &list))
			return len(list.Items) == 0
		}, 15*time.Second, 20*time.Millisecond)
		require.EventuallyWithT(t, func(c *assert.CollectT) {
			n, err := rome.node("rb-paris")
			require.NoError(c, err)
			assert.Equal(c, "0", ptr.To(n.Status.Capacity[corev1.ResourceCPU]).String())
		}, 10*time.Second, 20*time.Millisecond)
		time.Sleep(time.Second)
		_, err := rome.node("rb-paris")
		require.NoError(t, err, "a pod is still on it")

		require.NoError(t, rome.Client.Delete(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "always"}}))
		require.Eventually(t, func() bool {
			_, err := rome.node("rb-paris")
			return apierrors.IsNotFound(err)
		}, 15*time.Second, 20*time.Millisecond)
		err = rome.Client.Get(ctx, types.NamespacedName{Namespace: corev1.NamespaceNodeLease, Name: "rb-paris"}, &coordinationv1.Lease{})
		assert.True(t, apierrors.IsNotFound(err), "the lease goes first: %v", err)
	})
}

// virtualkubeletLogs calls the kubelet endpoint of rb-paris directly with cfg's credentials.
func virtualkubeletLogs(ctx context.Context, t *testing.T, cfg *rest.Config, rome *member, ns, pod string, container ...string) ([]byte, error) {
	t.Helper()
	n, err := rome.node("rb-paris")
	require.NoError(t, err)
	cfg = rest.CopyConfig(cfg)
	cfg.CAData, cfg.Insecure = nil, true
	hc, err := rest.HTTPClientFor(cfg)
	require.NoError(t, err)
	c := "main"
	if len(container) > 0 {
		c = container[0]
	}
	url := fmt.Sprintf("https://127.0.0.1:%d/containerLogs/%s/%s/%s", n.Status.DaemonEndpoints.KubeletEndpoint.Port, ns, pod, c)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	require.NoError(t, err)
	resp, err := hc.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return data, fmt.Errorf("%d: %s", resp.StatusCode, data)
	}
	return data, err
}

// remoteCommand runs pods/exec (command) or pods/attach of a pod through
// the API server of cfg as kubectl does (websockets, SPDY as the fallback),
// with stdout and stderr.
func remoteCommand(ctx context.Context, cfg *rest.Config, subresource, ns, pod string, command ...string) (string, error) {
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return "", err
	}
	var opts runtime.Object = &corev1.PodAttachOptions{Container: "main", Stdout: true, Stderr: true}
	if subresource == "exec" {
		opts = &corev1.PodExecOptions{Container: "main", Command: command, Stdout: true, Stderr: true}
	}
	u := cs.CoreV1().RESTClient().Post().Namespace(ns).Resource("pods").Name(pod).SubResource(subresource).VersionedParams(opts, scheme.ParameterCodec).URL()
	spdyExec, err := remotecommand.NewSPDYExecutor(cfg, http.MethodPost, u)
	if err != nil {
		return "", err
	}
	wsExec, err := remotecommand.NewWebSocketExecutor(cfg, http.MethodGet, u.String())
	if err != nil {
		return "", err
	}
	exe, _ := remotecommand.NewFallbackExecutor(wsExec, spdyExec, func(err error) bool {
		return httpstream.IsUpgradeFailure(err) || httpstream.IsHTTPSProxyError(err)
	})
	var out strings.Builder
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	err = exe.StreamWithContext(ctx, remotecommand.StreamOptions{Stdout: &out, Stderr: &out})
	return out.String(), err
}

// portForwardError forwards one connection to port of a pod through the API
// server of cfg, as kubectl port-forward does for each connection it
// accepts, and returns what the error stream says.
func portForwardError(ctx context.Context, t *testing.T, cfg *rest.Config, ns, pod string, port int) string {
	t.Helper()
	cs, err := kubernetes.NewForConfig(cfg)
	require.NoError(t, err)
	u := cs.CoreV1().RESTClient().Post().Namespace(ns).Resource("pods").Name(pod).SubResource("portforward").URL()
	transport, upgrader, err := spdy.RoundTripperFor(cfg)
	require.NoError(t, err)
	conn, _, err := spdy.NewDialer(upgrader, &http.Client{Transport: transport}, http.MethodPost, u).Dial(portforward.PortForwardProtocolV1Name)
	require.NoError(t, err)
	defer conn.Close()
	headers := http.Header{}
	headers.Set(corev1.StreamType, corev1.StreamTypeError)
	headers.Set(corev1.PortHeader, strconv.Itoa(port))
	headers.Set(corev1.PortForwardRequestIDHeader, "0")
	errorStream, err := conn.CreateStream(headers)
	require.NoError(t, err)
	require.NoError(t, errorStream.Close())
	headers.Set(corev1.StreamType, corev1.StreamTypeData)
	data, err := conn.CreateStream(headers)
	require.NoError(t, err)
	defer data.Close()
	msg := make(chan string, 1)
	go func() {
		b, _ := io.ReadAll(errorStream)
		msg <- string(b)
	}()
	select {
	case m := <-msg:
		return m
	case <-time.After(10 * time.Second):
		t.Fatal("no answer on the error stream")
		return ""
	case <-ctx.Done():
		return ""
	}
}

func podCondition(p *corev1.Pod, t corev1.PodConditionType) *corev1.PodCondition {
	for i := range p.Status.Conditions {
		if p.Status.Conditions[i].Type == t {
			return &p.Status.Conditions[i]
		}
	}
	return nil
}

func mapsKeys(m map[string][]string) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}
