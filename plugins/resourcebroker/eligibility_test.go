package resourcebroker

import (
	"context"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/client-go/tools/events"
	fwk "k8s.io/kube-scheduler/framework"
	"k8s.io/kubernetes/pkg/scheduler/backend/cache"
	"k8s.io/kubernetes/pkg/scheduler/framework"
	"k8s.io/kubernetes/pkg/scheduler/framework/plugins/names"
	"k8s.io/utils/ptr"

	brokerv1alpha1 "github.com/fluidos-project/resource-broker/api/v1alpha1"
	"github.com/fluidos-project/resource-broker/plugins/apis/config"
)

// carriable is a pod the bridge can carry: cpu and memory, a ConfigMap, a
// Secret, an emptyDir and a projected service account token.
func carriable() *v1.Pod {
	p := podRequesting("p", "3", "1Gi")
	p.Spec.Volumes = []v1.Volume{
		{Name: "cm", VolumeSource: v1.VolumeSource{ConfigMap: &v1.ConfigMapVolumeSource{LocalObjectReference: v1.LocalObjectReference{Name: "c"}}}},
		{Name: "s", VolumeSource: v1.VolumeSource{Secret: &v1.SecretVolumeSource{SecretName: "s"}}},
		{Name: "tmp", VolumeSource: v1.VolumeSource{EmptyDir: &v1.EmptyDirVolumeSource{}}},
		{Name: "token", VolumeSource: v1.VolumeSource{Projected: &v1.ProjectedVolumeSource{}}},
		{Name: "info", VolumeSource: v1.VolumeSource{DownwardAPI: &v1.DownwardAPIVolumeSource{}}},
	}
	p.Spec.Containers[0].Ports = []v1.ContainerPort{{ContainerPort: 8080}}
	return p
}

// notCarriable lists, for each rule of carriageReason, a pod it keeps here
// and the start of the reason given.
var notCarriable = []struct {
	name   string
	modify func(*v1.Pod)
	want   string
}{
	{"PersistentVolumeClaim", func(p *v1.Pod) {
		p.Spec.Volumes = append(p.Spec.Volumes, v1.Volume{Name: "data", VolumeSource: v1.VolumeSource{
			PersistentVolumeClaim: &v1.PersistentVolumeClaimVolumeSource{ClaimName: "data-0"}}})
	}, "uses PersistentVolumeClaim data (claim data-0, volume data)"},
	{"generic ephemeral volume", func(p *v1.Pod) {
		p.Spec.Volumes = append(p.Spec.Volumes, v1.Volume{Name: "scratch", VolumeSource: v1.VolumeSource{Ephemeral: &v1.EphemeralVolumeSource{}}})
	}, "uses PersistentVolumeClaim data (generic ephemeral volume scratch)"},
	{"hostPath", func(p *v1.Pod) {
		p.Spec.Volumes = append(p.Spec.Volumes, v1.Volume{Name: "logs", VolumeSource: v1.VolumeSource{HostPath: &v1.HostPathVolumeSource{Path: "/var/log"}}})
	}, "uses hostPath /var/log (volume logs)"},
	{"other volume", func(p *v1.Pod) {
		p.Spec.Volumes = append(p.Spec.Volumes, v1.Volume{Name: "share", VolumeSource: v1.VolumeSource{NFS: &v1.NFSVolumeSource{Server: "nfs", Path: "/"}}})
	}, "uses a nfs volume (share), which the bridge does not carry"},
	{"hostNetwork", func(p *v1.Pod) { p.Spec.HostNetwork = true }, "uses the host's network namespace (hostNetwork)"},
	{"hostPID", func(p *v1.Pod) { p.Spec.HostPID = true }, "uses the host's PID namespace (hostPID)"},
	{"hostIPC", func(p *v1.Pod) { p.Spec.HostIPC = true }, "uses the host's IPC namespace (hostIPC)"},
	{"hostPort", func(p *v1.Pod) { p.Spec.Containers[0].Ports[0].HostPort = 8080 }, "uses host port 8080 (container c)"},
	{"hostPort of an init container", func(p *v1.Pod) {
		p.Spec.InitContainers = []v1.Container{{Name: "init", Ports: []v1.ContainerPort{{ContainerPort: 53, HostPort: 53}}}}
	}, "uses host port 53 (container init)"},
	{"privileged", func(p *v1.Pod) {
		p.Spec.Containers[0].SecurityContext = &v1.SecurityContext{Privileged: ptr.To(true)}
	}, "runs privileged container c"},
	{"resource claim", func(p *v1.Pod) {
		p.Spec.ResourceClaims = []v1.PodResourceClaim{{Name: "gpu", ResourceClaimTemplateName: ptr.To("a100")}}
	}, "uses resource claim gpu (dynamic resource allocation)"},
	{"unreservable resource", func(p *v1.Pod) {
		p.Spec.Containers[0].Resources.Requests["hugepages-2Mi"] = resource.MustParse("4Mi")
		p.Spec.Containers[0].Resources.Requests["example.com/fpga"] = resource.MustParse("1")
	}, "requests example.com/fpga, hugepages-2Mi, which a broker reservation cannot hold"},
}

func TestCarriageReason(t *testing.T) {
	assert.Empty(t, carriageReason(carriable()))
	gpu := carriable()
	gpu.Spec.Containers[0].Resources.Requests[brokerv1alpha1.ResourceGPU] = resource.MustParse("1")
	gpu.Spec.Containers[0].Resources.Requests[v1.ResourceEphemeralStorage] = resource.MustParse("1Gi")
	gpu.Spec.Containers[0].SecurityContext = &v1.SecurityContext{Privileged: ptr.To(false)}
	assert.Empty(t, carriageReason(gpu), "GPUs and ephemeral storage are reserved; privileged: false is not privileged")
	for _, tc := range notCarriable {
		t.Run(tc.name, func(t *testing.T) {
			p := carriable()
			tc.modify(p)
			assert.True(t, strings.HasPrefix(carriageReason(p), tc.want), "got %q, want %q...", carriageReason(p), tc.want)
		})
	}
}

func TestProviderSelector(t *testing.T) {
	required := func(terms ...v1.NodeSelectorTerm) *v1.Affinity {
		return &v1.Affinity{NodeAffinity: &v1.NodeAffinity{RequiredDuringSchedulingIgnoredDuringExecution: &v1.NodeSelector{NodeSelectorTerms: terms}}}
	}
	in := func(key string, values ...string) v1.NodeSelectorRequirement {
		return v1.NodeSelectorRequirement{Key: key, Operator: v1.NodeSelectorOpIn, Values: values}
	}
	for _, tc := range []struct {
		name         string
		nodeSelector map[string]string
		affinity     *v1.Affinity
		want         map[string]string
		reason       string
	}{
		{name: "nothing required"},
		{name: "every well-known label",
			nodeSelector: map[string]string{v1.LabelArchStable: "arm64", v1.LabelOSStable: "linux"},
			affinity: required(v1.NodeSelectorTerm{MatchExpressions: []v1.NodeSelectorRequirement{
				in(v1.LabelTopologyRegion, "eu-west"), in(v1.LabelTopologyZone, "eu-west-1a"), in(GPUProductLabel, "NVIDIA-A100-SXM4-40GB")}}),
			want: map[string]string{v1.LabelArchStable: "arm64", v1.LabelOSStable: "linux", v1.LabelTopologyRegion: "eu-west",
				v1.LabelTopologyZone: "eu-west-1a", GPUProductLabel: "NVIDIA-A100-SXM4-40GB"}},
		{name: "the same value twice", nodeSelector: map[string]string{v1.LabelTopologyZone: "a"},
			affinity: required(v1.NodeSelectorTerm{MatchExpressions: []v1.NodeSelectorRequirement{in(v1.LabelTopologyZone, "a")}}),
			want:     map[string]string{v1.LabelTopologyZone: "a"}},
		{name: "another label", nodeSelector: map[string]string{"disktype": "ssd"},
			reason: "requires node label disktype (nodeSelector), which providers do not advertise; only kubernetes.io/arch, kubernetes.io/os, " +
				"topology.kubernetes.io/region, topology.kubernetes.io/zone, nvidia.com/gpu.product become broker selectors"},
		{name: "the hostname", affinity: required(v1.NodeSelectorTerm{MatchExpressions: []v1.NodeSelectorRequirement{in(v1.LabelHostname, "n1")}}),
			reason: "requires node label kubernetes.io/hostname (required node affinity), which providers do not advertise"},
		{name: "another label, other operator", affinity: required(v1.NodeSelectorTerm{MatchExpressions: []v1.NodeSelectorRequirement{
			{Key: "gpu", Operator: v1.NodeSelectorOpExists}}}),
			reason: "requires node label gpu (required node affinity), which providers do not advertise"},
		{name: "two values", affinity: required(v1.NodeSelectorTerm{MatchExpressions: []v1.NodeSelectorRequirement{in(v1.LabelTopologyZone, "a", "b")}}),
			reason: "requires node label topology.kubernetes.io/zone In [a b] (required node affinity); a broker selector takes one value"},
		{name: "NotIn", affinity: required(v1.NodeSelectorTerm{MatchExpressions: []v1.NodeSelectorRequirement{
			{Key: v1.LabelArchStable, Operator: v1.NodeSelectorOpNotIn, Values: []string{"arm64"}}}}),
			reason: "requires node label kubernetes.io/arch NotIn [arm64]"},
		{name: "conflict", nodeSelector: map[string]string{v1.LabelTopologyZone: "a"},
			affinity: required(v1.NodeSelectorTerm{MatchExpressions: []v1.NodeSelectorRequirement{in(v1.LabelTopologyZone, "b")}}),
			reason:   `requires node label topology.kubernetes.io/zone to be both "a" and "b"`},
		{name: "alternatives", affinity: required(
			v1.NodeSelectorTerm{MatchExpressions: []v1.NodeSelectorRequirement{in(v1.LabelTopologyZone, "a")}},
			v1.NodeSelectorTerm{MatchExpressions: []v1.NodeSelectorRequirement{in(v1.LabelTopologyZone, "b")}}),
			reason: "has 2 alternative required nodeSelectorTerms"},
		{name: "node names", affinity: required(v1.NodeSelectorTerm{MatchFields: []v1.NodeSelectorRequirement{
			{Key: "metadata.name", Operator: v1.NodeSelectorOpIn, Values: []string{"n1"}}}}),
			reason: "requires nodes by metadata.name (required node affinity matchFields)"},
		{name: "preferred affinity is no requirement", affinity: &v1.Affinity{NodeAffinity: &v1.NodeAffinity{
			PreferredDuringSchedulingIgnoredDuringExecution: []v1.PreferredSchedulingTerm{{Weight: 1, Preference: v1.NodeSelectorTerm{
				MatchExpressions: []v1.NodeSelectorRequirement{in("disktype", "ssd")}}}}}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := carriable()
			p.Spec.NodeSelector, p.Spec.Affinity = tc.nodeSelector, tc.affinity
			sel, reason := providerSelector(p)
			assert.Equal(t, tc.want, sel)
			if tc.reason == "" {
				assert.Empty(t, reason)
			} else {
				assert.True(t, strings.HasPrefix(reason, tc.reason), "got %q, want %q...", reason, tc.reason)
				assert.Nil(t, sel)
			}
		})
	}
}

func TestPolicyReason(t *testing.T) {
	pl := testPlugin(t)
	sel, err := metav1.LabelSelectorAsSelector(&metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{
		{Key: "tier", Operator: metav1.LabelSelectorOpNotIn, Values: []string{"db"}}}})
	require.NoError(t, err)
	pl.selector, pl.excluded, pl.allowed = sel, sets.New("kube-system"), nil
	pod := func(ns string, l, a map[string]string) *v1.Pod {
		p := podRequesting("p", "1", "1Gi")
		p.Namespace, p.Labels, p.Annotations = ns, l, a
		return p
	}
	assert.Empty(t, pl.policyReason(pod("apps", nil, nil)))
	assert.Equal(t, "namespace kube-system is excluded (ResourceBroker args excludedNamespaces)", pl.policyReason(pod("kube-system", nil, nil)))
	assert.Equal(t, `the pod's labels do not match the ResourceBroker selector "tier notin (db)"`, pl.policyReason(pod("apps", map[string]string{"tier": "db"}, nil)))
	assert.Equal(t, `annotation broker.fluidos.eu/offload is "false"`, pl.policyReason(pod("apps", nil, map[string]string{OffloadAnnotation: "false"})))
	assert.Equal(t, `annotation broker.fluidos.eu/offload is "nope", neither "true" nor "false"`,
		pl.policyReason(pod("apps", nil, map[string]string{OffloadAnnotation: "nope"})))
	assert.Empty(t, pl.policyReason(pod("apps", nil, map[string]string{OffloadAnnotation: "true"})))
	pl.allowed = sets.New("batch")
	assert.Equal(t, "namespace apps is not one of the namespaces offloaded (ResourceBroker args namespaces)", pl.policyReason(pod("apps", nil, nil)))
	assert.Empty(t, pl.policyReason(pod("batch", nil, nil)))

	v := pl.offloadVerdict(pod("batch", nil, map[string]string{OffloadAnnotation: "false"}))
	assert.Contains(t, v.reason, "annotation")
	p := pod("batch", nil, nil)
	p.Spec.NodeSelector = map[string]string{v1.LabelTopologyRegion: "eu-west"}
	v = pl.offloadVerdict(p)
	assert.Empty(t, v.reason)
	assert.Equal(t, map[string]string{v1.LabelTopologyRegion: "eu-west"}, v.selector)
}

func TestShortageStatus(t *testing.T) {
	fit := func(code fwk.Code, reasons ...string) *fwk.Status {
		return fwk.NewStatus(code, reasons...).WithPlugin(names.NodeResourcesFit)
	}
	assert.True(t, shortageStatus(fit(fwk.Unschedulable, "Insufficient cpu")))
	assert.True(t, shortageStatus(fit(fwk.UnschedulableAndUnresolvable, "Insufficient memory", "Insufficient nvidia.com/gpu", "Too many pods")),
		"a node too small even when empty: a bigger provider fixes it")
	assert.True(t, shortageStatus(fit(fwk.Unschedulable, "Insufficient ephemeral-storage")))
	assert.False(t, shortageStatus(fit(fwk.Unschedulable, "Insufficient cpu", "Insufficient hugepages-2Mi")), "hugepages are not reserved")
	assert.False(t, shortageStatus(fwk.NewStatus(fwk.Unschedulable, "Insufficient cpu").WithPlugin(names.NodeAffinity)))
	assert.False(t, shortageStatus(fwk.NewStatus(fwk.UnschedulableAndUnresolvable, ErrReasonUntoleratedTaint).WithPlugin(Name)))
	assert.False(t, shortageStatus(fwk.NewStatus(fwk.UnschedulableAndUnresolvable, "node(s) didn't satisfy plugin(s) [NodeAffinity]")))
	assert.False(t, shortageStatus(nil))
	assert.False(t, shortageStatus(fwk.NewStatus(fwk.Success)))
}

// fakeHandle is the part of the scheduler's handle PostFilter uses.
type fakeHandle struct {
	fwk.Handle
	snapshot *cache.Snapshot
	recorder *events.FakeRecorder
}

func (h *fakeHandle) SnapshotSharedLister() fwk.SharedLister { return h.snapshot }
func (h *fakeHandle) EventRecorder() events.EventRecorder    { return h.recorder }

// TestPostFilterRules: which pods PostFilter asks a reservation for, and
// what it tells the others, from the filters' statuses.
func TestPostFilterRules(t *testing.T) {
	ctx := context.Background()
	dedicated := v1.Taint{Key: "dedicated", Effect: v1.TaintEffectNoSchedule}
	small := sized("small", "2", "4Gi")
	tainted := sized("tainted", "2", "4Gi", dedicated)
	zoned := sized("zoned", "8", "8Gi")
	zoned.Labels = map[string]string{v1.LabelTopologyZone: "b"}
	virtual := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "rb-paris", Labels: map[string]string{brokerv1alpha1.ProviderLabel: "paris"}}}
	newPlugin := func(nodes ...*v1.Node) (*ResourceBroker, *fakeHandle) {
		pl := testPlugin(t)
		h := &fakeHandle{snapshot: cache.NewSnapshot(nil, nodes), recorder: events.NewFakeRecorder(10)}
		pl.handle, pl.selector, pl.excluded, pl.worker = h, labels.Everything(), sets.New[string](), newWorker(nil)
		pl.args = &config.ResourceBrokerArgs{MaxOutstandingReservationsPerNamespace: 10}
		return pl, h
	}
	status := func(plugin string, reasons ...string) *fwk.Status {
		return fwk.NewStatus(fwk.Unschedulable, reasons...).WithPlugin(plugin)
	}
	postFilter := func(pl *ResourceBroker, pod *v1.Pod, statuses map[string]*fwk.Status) string {
		t.Helper()
		_, st := pl.PostFilter(ctx, framework.NewCycleState(), pod, framework.NewNodeToStatus(statuses, fwk.NewStatus(fwk.UnschedulableAndUnresolvable)))
		require.Equal(t, fwk.Unschedulable, st.Code())
		return st.Message()
	}
	pod := podRequesting("p", "3", "1Gi")

	// Every node rejects the pod for lack of resources: a reservation.
	pl, h := newPlugin(small, virtual)
	assert.Equal(t, "waiting for broker reservation "+ReservationName(pod),
		postFilter(pl, pod, map[string]*fwk.Status{"small": status(names.NodeResourcesFit, "Insufficient cpu"), "rb-paris": status(Name, ErrReasonVirtualNode)}))
	_, creating := pl.worker.creating(pod.UID)
	assert.True(t, creating)
	assert.Empty(t, h.recorder.Events)

	// Only for taints: none, and the pod is told why, once.
	pl, h = newPlugin(tainted)
	msg := postFilter(pl, pod, map[string]*fwk.Status{"tainted": status(Name, ErrReasonUntoleratedTaint)})
	assert.Equal(t, NotOffloadedPrefix+reasonNoShortage, msg)
	_, creating = pl.worker.creating(pod.UID)
	assert.False(t, creating)
	require.Len(t, h.recorder.Events, 1)
	assert.Equal(t, "Warning NotOffloaded Not offloaded: "+reasonNoShortage, <-h.recorder.Events)
	postFilter(pl, pod, map[string]*fwk.Status{"tainted": status(Name, ErrReasonUntoleratedTaint)})
	assert.Empty(t, h.recorder.Events, "told once")

	// Short of cpu on a node whose taint the pod does not tolerate (this
	// plugin's filter, which does the taints, runs after NodeResourcesFit):
	// no lack of resources only.
	pl, _ = newPlugin(tainted)
	assert.Contains(t, postFilter(pl, pod, map[string]*fwk.Status{"tainted": status(names.NodeResourcesFit, "Insufficient cpu")}), reasonNoShortage)

	// Only for node affinity: none.
	inZoneA := pod.DeepCopy()
	inZoneA.Spec.NodeSelector = map[string]string{v1.LabelTopologyZone: "a"}
	pl, _ = newPlugin(zoned)
	assert.Contains(t, postFilter(pl, inZoneA, map[string]*fwk.Status{"zoned": status(names.NodeAffinity, "node(s) didn't match Pod's node affinity/selector")}), reasonNoShortage)

	// Mixed: one node lacks resources only, another the pod may not go to: a reservation.
	pl, _ = newPlugin(small, tainted, zoned)
	inZoneB := pod.DeepCopy()
	inZoneB.Spec.NodeSelector = map[string]string{v1.LabelTopologyZone: "b"}
	assert.Contains(t, postFilter(pl, pod, map[string]*fwk.Status{
		"small":   status(names.NodeResourcesFit, "Insufficient cpu"),
		"tainted": status(Name, ErrReasonUntoleratedTaint),
		"zoned":   status(names.NodeAffinity, "node(s) didn't match Pod's node affinity/selector"),
	}), "waiting for broker reservation")

	// Short of hugepages: not carriable in the first place.
	huge := pod.DeepCopy()
	huge.Spec.Containers[0].Resources.Requests["hugepages-2Mi"] = resource.MustParse("2Mi")
	pl, h = newPlugin(small)
	assert.Contains(t, postFilter(pl, huge, map[string]*fwk.Status{"small": status(names.NodeResourcesFit, "Insufficient hugepages-2Mi")}),
		NotOffloadedPrefix+"requests hugepages-2Mi")
	require.Len(t, h.recorder.Events, 1)

	// Each rule: the reason in the message and in the Event, nothing asked.
	for _, tc := range notCarriable {
		p := carriable()
		tc.modify(p)
		pl, h := newPlugin(small)
		msg := postFilter(pl, p, map[string]*fwk.Status{"small": status(names.NodeResourcesFit, "Insufficient cpu")})
		assert.True(t, strings.HasPrefix(msg, NotOffloadedPrefix+tc.want), "%s: %q", tc.name, msg)
		require.Len(t, h.recorder.Events, 1, tc.name)
		assert.True(t, strings.HasPrefix(<-h.recorder.Events, "Warning NotOffloaded Not offloaded: "+tc.want), tc.name)
		_, creating := pl.worker.creating(p.UID)
		assert.False(t, creating, tc.name)
	}
}
