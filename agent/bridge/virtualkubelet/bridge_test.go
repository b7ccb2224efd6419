package virtualkubelet_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
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
		HomeTokenRefresh: homeTokenRefresh,
	}})
	homeNamespace(t, rome, "shop")
	vk := &vkLifecycle{ctx: ctx, rome: rome, paris: paris, kubelet: kubelet, signingCA: signingCA}

	// Each step starts from what the steps before it left.
	for _, step := range []struct {
		name string
		run  func(*vkLifecycle, *testing.T)
	}{
		{"reserved: virtual node rb-paris with the reservation's capacity and our taint", (*vkLifecycle).virtualNodeForReservations},
		{"a pod bound to rb-paris runs in paris's tenant namespace, its status reflected", (*vkLifecycle).podRunsAtProvider},
		{"its copy calls rome's API with a token of its ServiceAccount in rome, bound to it, renewed before it expires", (*vkLifecycle).homeAPIToken},
		{"the kubelet endpoint serves the certificate rome's kubelet-serving signer issued", (*vkLifecycle).kubeletServingCertificate},
		{"kubectl logs on rome's pod reads paris's pods/log", (*vkLifecycle).logs},
		{"exec, attach and port-forward reach the copy through paris's API with the tenant token", (*vkLifecycle).streams},
		{"mirrored objects are written with the tenant token, which works nowhere else", (*vkLifecycle).tenantToken},
		{"paris's Events about a copy are recorded on rome's pod, once, with their count", (*vkLifecycle).providerEvents},
		{"the copies of ConfigMaps and Secrets are repaired at paris, replaced where apply cannot, deleted once unused", (*vkLifecycle).reflection},
		{"a pod bound to rb-paris that no reservation names is not copied: Pending NotReserved until one does", (*vkLifecycle).unreservedPod},
		{"deleting rome's pod deletes the copy with the same grace period", (*vkLifecycle).podDeleted},
		{"a copy deleted behind the bridge's back is recreated, or fails the pod, per restart policy", (*vkLifecycle).copyDeletedAtProvider},
		{"revoked access: rb-paris NotReady with a clear reason, Ready again when restored", (*vkLifecycle).accessRevoked},
		{"a deleted virtual node is registered again", (*vkLifecycle).nodeDeleted},
		{"paris's API server stopped: rb-paris Ready for the grace, then Unknown and tainted unreachable; restarted: Ready", (*vkLifecycle).providerAPIServerStopped},
		{"the node goes when the last reservation ended and no pod is left", (*vkLifecycle).nodeRemoved},
	} {
		t.Run(step.name, func(t *testing.T) { step.run(vk, t) })
	}
}

// vkLifecycle is what the steps of TestVirtualKubelet share: the two
// members, paris's fake kubelet, rome's kubelet-serving signer, and the
// reservation the first step opens.
type vkLifecycle struct {
	ctx         context.Context
	rome, paris *member
	kubelet     *bridgetest.Kubelet
	signingCA   *bridgetest.SigningCA
	rsv         *rbv1.Reservation
}
