package resourcebroker_test

import (
	"context"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/utils/ptr"

	brokerv1alpha1 "github.com/fluidos-project/resource-broker/api/v1alpha1"
	"github.com/fluidos-project/resource-broker/plugins/resourcebroker"
)

// Which pods are offloaded, in a real scheduler: see eligibility.go.

// TestPodsNotOffloaded: pods that fit no local node (3 CPUs, local-1 has
// 2) but that the bridge cannot carry, whose node requirements cannot be
// asked of the broker, or that opt out, stay Pending without a
// reservation; the condition and a NotOffloaded Event say why.
func TestPodsNotOffloaded(t *testing.T) {
	localNodes(t)
	ns := newNamespace(t)
	volume := func(name string, src v1.VolumeSource) podOpt {
		return func(p *v1.Pod) { p.Spec.Volumes = append(p.Spec.Volumes, v1.Volume{Name: name, VolumeSource: src}) }
	}
	privileged := true
	cases := []struct {
		name string
		opt  podOpt
		want string
	}{
		{"pvc", volume("data", v1.VolumeSource{PersistentVolumeClaim: &v1.PersistentVolumeClaimVolumeSource{ClaimName: "data-0"}}),
			"uses PersistentVolumeClaim data (claim data-0, volume data)"},
		{"ephemeral", volume("scratch", v1.VolumeSource{Ephemeral: &v1.EphemeralVolumeSource{VolumeClaimTemplate: &v1.PersistentVolumeClaimTemplate{
			Spec: v1.PersistentVolumeClaimSpec{AccessModes: []v1.PersistentVolumeAccessMode{v1.ReadWriteOnce},
				Resources: v1.VolumeResourceRequirements{Requests: v1.ResourceList{v1.ResourceStorage: resource.MustParse("1Gi")}}}}}}),
			"uses PersistentVolumeClaim data (generic ephemeral volume scratch)"},
		{"hostpath", volume("logs", v1.VolumeSource{HostPath: &v1.HostPathVolumeSource{Path: "/var/log"}}), "uses hostPath /var/log (volume logs)"},
		{"hostnetwork", func(p *v1.Pod) { p.Spec.HostNetwork = true }, "uses the host's network namespace (hostNetwork)"},
		{"hostpid", func(p *v1.Pod) { p.Spec.HostPID = true }, "uses the host's PID namespace (hostPID)"},
		{"hostipc", func(p *v1.Pod) { p.Spec.HostIPC = true }, "uses the host's IPC namespace (hostIPC)"},
		{"hostport", func(p *v1.Pod) {
			p.Spec.Containers[0].Ports = []v1.ContainerPort{{ContainerPort: 8080, HostPort: 8080}}
		},
			"uses host port 8080 (container main)"},
		{"privileged", func(p *v1.Pod) { p.Spec.Containers[0].SecurityContext = &v1.SecurityContext{Privileged: &privileged} },
			"runs privileged container main"},
		{"hugepages", func(p *v1.Pod) {
			q := resource.MustParse("2Mi")
			p.Spec.Containers[0].Resources.Requests["hugepages-2Mi"] = q
			p.Spec.Containers[0].Resources.Limits = v1.ResourceList{"hugepages-2Mi": q}
		}, "requests hugepages-2Mi, which a broker reservation cannot hold"},
		{"node-label", func(p *v1.Pod) { p.Spec.NodeSelector = map[string]string{"disktype": "ssd"} },
			"requires node label disktype (nodeSelector), which providers do not advertise"},
		{"two-zones", func(p *v1.Pod) {
			p.Spec.Affinity = &v1.Affinity{NodeAffinity: &v1.NodeAffinity{RequiredDuringSchedulingIgnoredDuringExecution: &v1.NodeSelector{
				NodeSelectorTerms: []v1.NodeSelectorTerm{{MatchExpressions: []v1.NodeSelectorRequirement{
					{Key: v1.LabelTopologyZone, Operator: v1.NodeSelectorOpIn, Values: []string{"a", "b"}}}}}}}}
		}, "requires node label topology.kubernetes.io/zone In [a b] (required node affinity); a broker selector takes one value"},
		{"opt-out", func(p *v1.Pod) { p.Annotations = map[string]string{resourcebroker.OffloadAnnotation: "false"} },
			`annotation broker.fluidos.eu/offload is "false"`},
	}
	for _, tc := range cases {
		p := createPod(t, newPod(ns, tc.name, "3", "1Gi", tc.opt))
		// Bound claims, so that VolumeBinding passes and the pods fail for
		// resources (a missing claim fails the cycle before PostFilter).
		switch tc.name {
		case "pvc":
			boundClaim(t, ns, "data-0", nil)
		case "ephemeral":
			boundClaim(t, ns, p.Name+"-scratch", p)
		}
	}
	for _, tc := range cases {
		c := waitCondition(t, ns, tc.name, resourcebroker.NotOffloadedPrefix+tc.want, bindTimeout)
		t.Logf("%s: %s", tc.name, c.Message)
		waitEvent(t, ns, tc.name, resourcebroker.EventNotOffloaded, "Not offloaded: "+tc.want)
	}
	time.Sleep(300 * time.Millisecond)
	if rs := reservations(t, ns); len(rs) != 0 {
		t.Errorf("reservations made for pods that are not offloaded: %v", names(rs))
	}
	for _, tc := range cases {
		if p := getPod(t, ns, tc.name); p.Spec.NodeName != "" {
			t.Errorf("%s bound to %s", tc.name, p.Spec.NodeName)
		}
	}
}

// TestRejectedForOtherReasonsThanResources: a pod that every local node
// rejects for its taint or its node affinity, not for resources, gets no
// reservation (borrowing capacity would not place it), even when its
// requirements could be asked of the broker; a pod that one node rejects
// for resources only and the others for other reasons gets one.
func TestRejectedForOtherReasonsThanResources(t *testing.T) {
	dedicated := v1.Taint{Key: "dedicated", Value: "db", Effect: v1.TaintEffectNoSchedule}
	setNodes(t,
		nodeSpec{name: "db-1", cpu: "8", memory: "16Gi", taints: []v1.Taint{dedicated}},
		nodeSpec{name: "zone-b", cpu: "8", memory: "16Gi", labels: map[string]string{v1.LabelTopologyZone: "eu-west-1b"}},
	)
	ns := newNamespace(t)
	// Fits zone-b by resources, but requires zone a: zone-b for affinity, db-1 for its taint.
	inZoneA := createPod(t, newPod(ns, "zone-a", "1", "1Gi", func(p *v1.Pod) {
		p.Spec.NodeSelector = map[string]string{v1.LabelTopologyZone: "eu-west-1a"}
	}))
	// Tolerates nothing, and 12 CPUs fit no node anyway; db-1's taint and
	// zone-b's size: zone-b lacks resources only, so this one is offloaded.
	big := createPod(t, newPod(ns, "big", "12", "1Gi"))
	c := waitCondition(t, ns, inZoneA.Name, resourcebroker.NotOffloadedPrefix+"no local node is short only of resources", bindTimeout)
	t.Logf("%s: %s", inZoneA.Name, c.Message)
	waitEvent(t, ns, inZoneA.Name, resourcebroker.EventNotOffloaded, "Not offloaded: no local node is short only of resources")
	rsv := waitReservation(t, big, bindTimeout)
	time.Sleep(300 * time.Millisecond)
	for _, r := range reservations(t, ns) {
		if r.Name != rsv.Name {
			t.Errorf("reservation %s for %s: only %s is short of resources only", r.Name, r.Spec.PodName, big.Name)
		}
	}
	if len(rsv.Spec.ProviderSelector) != 0 {
		t.Errorf("provider selector %v for a pod that requires no node label", rsv.Spec.ProviderSelector)
	}
}

// TestTaintedNodesOnly: every node rejects the pod for its taint alone.
func TestTaintedNodesOnly(t *testing.T) {
	dedicated := v1.Taint{Key: "dedicated", Value: "db", Effect: v1.TaintEffectNoSchedule}
	setNodes(t,
		nodeSpec{name: "db-1", cpu: "8", memory: "16Gi", taints: []v1.Taint{dedicated}},
		nodeSpec{name: "db-2", cpu: "1", memory: "1Gi", taints: []v1.Taint{dedicated}},
	)
	ns := newNamespace(t)
	for _, name := range []string{"fits-db-1", "fits-none"} {
		cpu := "2"
		if name == "fits-none" {
			cpu = "12" // short of cpu everywhere, but db-1 and db-2 would reject it for their taint anyway
		}
		createPod(t, newPod(ns, name, cpu, "1Gi"))
	}
	for _, name := range []string{"fits-db-1", "fits-none"} {
		c := waitCondition(t, ns, name, resourcebroker.NotOffloadedPrefix+"no local node is short only of resources", bindTimeout)
		t.Logf("%s: %s", name, c.Message)
		waitEvent(t, ns, name, resourcebroker.EventNotOffloaded, "Not offloaded: no local node is short only of resources")
	}
	time.Sleep(300 * time.Millisecond)
	if rs := reservations(t, ns); len(rs) != 0 {
		t.Errorf("reservations made for pods that only taints keep off the nodes: %v", names(rs))
	}
}

// TestWellKnownLabelsBecomeProviderSelector: a pod that requires the
// architecture, OS, region, zone and GPU model of its node gets a
// reservation whose providerSelector asks the broker for providers
// advertising them; the provider's virtual node, carrying the provider's
// values of those labels (as the bridge labels it), takes the pod.
func TestWellKnownLabelsBecomeProviderSelector(t *testing.T) {
	want := map[string]string{
		v1.LabelArchStable:             "amd64",
		v1.LabelOSStable:               "linux",
		v1.LabelTopologyRegion:         "eu-west",
		v1.LabelTopologyZone:           "eu-west-1a",
		resourcebroker.GPUProductLabel: "NVIDIA-A100-SXM4-40GB",
	}
	local := map[string]string{}
	for k, v := range want {
		local[k] = v
	}
	otherZone := map[string]string{v1.LabelTopologyZone: "eu-west-1b"}
	setNodes(t,
		nodeSpec{name: "local-a", cpu: "2", memory: "4Gi", labels: local},       // the pod's kind of node, too small
		nodeSpec{name: "local-b", cpu: "16", memory: "32Gi", labels: otherZone}, // big enough, wrong zone
	)
	ns := newNamespace(t)
	pod := createPod(t, newPod(ns, "trainer", "3", "1Gi", func(p *v1.Pod) {
		p.Spec.NodeSelector = map[string]string{v1.LabelArchStable: "amd64", v1.LabelOSStable: "linux"}
		p.Spec.Affinity = &v1.Affinity{NodeAffinity: &v1.NodeAffinity{RequiredDuringSchedulingIgnoredDuringExecution: &v1.NodeSelector{
			NodeSelectorTerms: []v1.NodeSelectorTerm{{MatchExpressions: []v1.NodeSelectorRequirement{
				{Key: v1.LabelTopologyRegion, Operator: v1.NodeSelectorOpIn, Values: []string{"eu-west"}},
				{Key: v1.LabelTopologyZone, Operator: v1.NodeSelectorOpIn, Values: []string{"eu-west-1a"}},
				{Key: resourcebroker.GPUProductLabel, Operator: v1.NodeSelectorOpIn, Values: []string{"NVIDIA-A100-SXM4-40GB"}},
			}}}}}}
	}))
	rsv := waitReservation(t, pod, bindTimeout)
	if len(rsv.Spec.ProviderSelector) != len(want) {
		t.Errorf("provider selector %v, want %v", rsv.Spec.ProviderSelector, want)
	}
	for k, v := range want {
		if rsv.Spec.ProviderSelector[k] != v {
			t.Errorf("provider selector %s=%q, want %q (all: %v)", k, rsv.Spec.ProviderSelector[k], v, rsv.Spec.ProviderSelector)
		}
	}
	waitCondition(t, ns, pod.Name, "waiting for broker reservation "+rsv.Name, bindTimeout)

	// The agent's part: the broker chose a provider advertising those labels.
	setStatus(t, rsv, brokerv1alpha1.ReservationStatus{Phase: brokerv1alpha1.ReservationReserved, Provider: "dublin", VirtualNode: "rb-dublin"})
	vnLabels := map[string]string{brokerv1alpha1.ProviderLabel: "dublin"}
	for k, v := range want {
		vnLabels[k] = v
	}
	createNode(t, nodeSpec{name: "rb-dublin", cpu: "8", memory: "16Gi", labels: vnLabels,
		taints: []v1.Taint{{Key: brokerv1alpha1.VirtualNodeTaint, Effect: v1.TaintEffectNoSchedule}}})
	if node := waitBound(t, ns, pod.Name, bindTimeout); node != "rb-dublin" {
		t.Fatalf("bound to %s, want rb-dublin", node)
	}
}

// TestNamespacesArg: a profile whose args list namespaces offloads the
// pods of those namespaces only.
func TestNamespacesArg(t *testing.T) {
	localNodes(t)
	allowed := createNamespace(t, allowedNamespace)
	other := newNamespace(t)
	restricted := func(p *v1.Pod) { p.Spec.SchedulerName = restrictedProfile }
	in := createPod(t, newPod(allowed, "in", "3", "1Gi", restricted))
	out := createPod(t, newPod(other, "out", "3", "1Gi", restricted))
	rsv := waitReservation(t, in, bindTimeout)
	waitCondition(t, allowed, in.Name, "waiting for broker reservation "+rsv.Name, bindTimeout)
	want := "namespace " + other + " is not one of the namespaces offloaded (ResourceBroker args namespaces)"
	waitCondition(t, other, out.Name, resourcebroker.NotOffloadedPrefix+want, bindTimeout)
	waitEvent(t, other, out.Name, resourcebroker.EventNotOffloaded, "Not offloaded: "+want)
	if rs := reservations(t, other); len(rs) != 0 {
		t.Errorf("reservations in %s, which the profile does not offload: %v", other, names(rs))
	}
}

// boundClaim creates the PersistentVolumeClaim ns/name bound to a
// PersistentVolume of its own (there is no PV controller to bind it), owned
// by owner when that is a pod (a generic ephemeral volume's claim).
func boundClaim(t testing.TB, ns, name string, owner *v1.Pod) {
	t.Helper()
	ctx := context.Background()
	size := v1.ResourceList{v1.ResourceStorage: resource.MustParse("1Gi")}
	pv := &v1.PersistentVolume{ObjectMeta: metav1.ObjectMeta{Name: ns + "-" + name},
		Spec: v1.PersistentVolumeSpec{Capacity: size, AccessModes: []v1.PersistentVolumeAccessMode{v1.ReadWriteOnce},
			PersistentVolumeSource: v1.PersistentVolumeSource{HostPath: &v1.HostPathVolumeSource{Path: "/tmp/" + name}},
			ClaimRef:               &v1.ObjectReference{Kind: "PersistentVolumeClaim", Namespace: ns, Name: name}}}
	pv, err := cs.CoreV1().PersistentVolumes().Create(ctx, pv, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cs.CoreV1().PersistentVolumes().Delete(context.Background(), pv.Name, metav1.DeleteOptions{})
	})
	pvc := &v1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name,
		Annotations: map[string]string{"pv.kubernetes.io/bind-completed": "yes"}},
		Spec: v1.PersistentVolumeClaimSpec{AccessModes: pv.Spec.AccessModes, VolumeName: pv.Name,
			Resources: v1.VolumeResourceRequirements{Requests: size}}}
	if owner != nil {
		pvc.OwnerReferences = []metav1.OwnerReference{{APIVersion: "v1", Kind: "Pod", Name: owner.Name, UID: owner.UID, Controller: ptr.To(true)}}
	}
	if pvc, err = cs.CoreV1().PersistentVolumeClaims(ns).Create(ctx, pvc, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	pvc.Status = v1.PersistentVolumeClaimStatus{Phase: v1.ClaimBound, AccessModes: pv.Spec.AccessModes, Capacity: size}
	if _, err := cs.CoreV1().PersistentVolumeClaims(ns).UpdateStatus(ctx, pvc, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	pv.Status.Phase = v1.VolumeBound
	if _, err := cs.CoreV1().PersistentVolumes().UpdateStatus(ctx, pv, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// waitEvent waits for an Event of reason on the pod whose message starts with prefix.
func waitEvent(t testing.TB, ns, pod, reason, prefix string) v1.Event {
	t.Helper()
	var found v1.Event
	waitFor(t, bindTimeout, "event "+reason+" on "+ns+"/"+pod, func() (bool, error) {
		l, err := cs.CoreV1().Events(ns).List(context.Background(), metav1.ListOptions{
			FieldSelector: fields.OneTermEqualSelector("involvedObject.name", pod).String()})
		if err != nil {
			return false, err
		}
		for _, e := range l.Items {
			if e.Reason == reason && strings.HasPrefix(e.Message, prefix) {
				found = e
				return true, nil
			}
		}
		return false, nil
	})
	return found
}
