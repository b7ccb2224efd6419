package virtualkubelet

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/utils/ptr"

	rbv1 "github.com/fluidos-project/resource-broker/api/v1alpha1"
	"github.com/fluidos-project/resource-broker/broker/api"
)

func TestRemoteName(t *testing.T) {
	assert.Equal(t, "default.web-0", RemoteName("default", "web-0"))
	// Pairs that would collide under a naive "<namespace>-<name>" scheme do not.
	assert.NotEqual(t, RemoteName("a-b", "c"), RemoteName("a", "b-c"))
	// Namespaces have no dots, so the first dot splits the pair back.
	assert.NotEqual(t, RemoteName("a", "b.c"), RemoteName("ab", "c"))

	long := strings.Repeat("x", 250)
	n1, n2 := RemoteName("team-a", long), RemoteName("team-b", long)
	assert.NotEqual(t, n1, n2)
	for _, n := range []string{n1, n2} {
		assert.LessOrEqual(t, len(n), validation.DNS1123SubdomainMaxLength)
		assert.Empty(t, validation.IsDNS1123Subdomain(n), n)
	}
	assert.Equal(t, n1, RemoteName("team-a", long), "stable")
}

func testPod() *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name: "web-0", Namespace: "shop", UID: "uid-1",
			Labels:          map[string]string{"app": "web"},
			Annotations:     map[string]string{"note": "x"},
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "StatefulSet", Name: "web", UID: "owner"}},
			Finalizers:      []string{"example.com/keep"},
		},
		Spec: corev1.PodSpec{
			NodeName: "rb-paris", SchedulerName: "resource-broker", ServiceAccountName: "web-sa",
			PriorityClassName: "high", Priority: ptr.To(int32(1000)),
			NodeSelector: map[string]string{rbv1.ProviderLabel: "paris", "disktype": "ssd", corev1.LabelArchStable: "amd64"},
			Tolerations: []corev1.Toleration{
				{Key: rbv1.VirtualNodeTaint, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule},
				{Key: "node.kubernetes.io/not-ready", Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoExecute, TolerationSeconds: ptr.To(int64(300))},
			},
			ImagePullSecrets: []corev1.LocalObjectReference{{Name: "regcred"}},
			Volumes: []corev1.Volume{
				{Name: "config", VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{LocalObjectReference: corev1.LocalObjectReference{Name: "web-config"}}}},
				{Name: "creds", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: "web-creds"}}},
				{Name: "kube-api-access-abcde", VolumeSource: corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{Sources: []corev1.VolumeProjection{
					{ServiceAccountToken: &corev1.ServiceAccountTokenProjection{Path: "token"}},
					{ConfigMap: &corev1.ConfigMapProjection{LocalObjectReference: corev1.LocalObjectReference{Name: "kube-root-ca.crt"}}},
				}}}},
			},
			Containers: []corev1.Container{{
				Name: "web", Image: "nginx",
				Env: []corev1.EnvVar{
					{Name: "POD_NAME", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.name"}}},
					{Name: "POD_IP", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "status.podIP"}}},
					{Name: "LEVEL", ValueFrom: &corev1.EnvVarSource{ConfigMapKeyRef: &corev1.ConfigMapKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: "env-config"}, Key: "level"}}},
				},
				EnvFrom: []corev1.EnvFromSource{{SecretRef: &corev1.SecretEnvSource{LocalObjectReference: corev1.LocalObjectReference{Name: "env-secret"}}}},
				VolumeMounts: []corev1.VolumeMount{
					{Name: "config", MountPath: "/etc/web"},
					{Name: "kube-api-access-abcde", MountPath: "/var/run/secrets/kubernetes.io/serviceaccount"},
				},
			}},
		},
	}
}

func TestRefsOf(t *testing.T) {
	refs := refsOf(testPod())
	assert.Equal(t, []string{"env-config", "web-config"}, refs.ConfigMaps, "the token volume's kube-root-ca.crt is not copied")
	assert.Equal(t, []string{"env-secret", "regcred", "web-creds"}, refs.Secrets)
}

func TestRemotePod(t *testing.T) {
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "rb-paris", Labels: map[string]string{rbv1.ProviderLabel: "paris", TypeLabel: TypeValue}},
		Spec: corev1.NodeSpec{Taints: []corev1.Taint{{Key: rbv1.VirtualNodeTaint, Value: "true", Effect: corev1.TaintEffectNoSchedule}}}}
	local := testPod()
	local.Spec.TopologySpreadConstraints = []corev1.TopologySpreadConstraint{{MaxSkew: 1, TopologyKey: corev1.LabelTopologyZone,
		WhenUnsatisfiable: corev1.DoNotSchedule, LabelSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "web"}}}}
	remote, err := remotePod(local, mirrorParams{clusterID: "rome", namespace: "rb-rome", node: node})
	require.NoError(t, err)

	assert.Equal(t, "shop.web-0", remote.Name)
	assert.Equal(t, "rb-rome", remote.Namespace)
	assert.Equal(t, map[string]string{"app": "web", rbv1.RequesterLabel: "rome"}, remote.Labels)
	assert.Equal(t, "shop", remote.Annotations[OriginNamespaceAnnotation])
	assert.Equal(t, "web-0", remote.Annotations[OriginNameAnnotation])
	assert.Equal(t, "uid-1", remote.Annotations[OriginUIDAnnotation])
	assert.Equal(t, "x", remote.Annotations["note"])
	assert.Empty(t, remote.OwnerReferences)
	assert.Empty(t, remote.Finalizers)

	s := remote.Spec
	assert.Empty(t, s.NodeName)
	assert.Empty(t, s.SchedulerName)
	assert.Empty(t, s.ServiceAccountName)
	assert.Empty(t, s.PriorityClassName)
	assert.Nil(t, s.Priority)
	assert.Equal(t, ptr.To(false), s.AutomountServiceAccountToken)
	assert.Equal(t, "web-0", s.Hostname)
	assert.Equal(t, map[string]string{corev1.LabelArchStable: "amd64"}, s.NodeSelector,
		"only labels every provider's nodes carry: disktype means a node of this cluster")
	require.Len(t, s.Tolerations, 1)
	assert.Equal(t, "node.kubernetes.io/not-ready", s.Tolerations[0].Key)
	assert.Equal(t, []corev1.LocalObjectReference{{Name: "shop.regcred"}}, s.ImagePullSecrets)
	assert.Empty(t, s.TopologySpreadConstraints, "a spread over this cluster's nodes: the providers, done here")

	require.Len(t, s.Volumes, 2, "the service account token volume is dropped")
	assert.Equal(t, "shop.web-config", s.Volumes[0].ConfigMap.Name)
	assert.Equal(t, "shop.web-creds", s.Volumes[1].Secret.SecretName)
	c := s.Containers[0]
	assert.Equal(t, []corev1.VolumeMount{{Name: "config", MountPath: "/etc/web"}}, c.VolumeMounts)
	assert.Equal(t, corev1.EnvVar{Name: "POD_NAME", Value: "web-0"}, c.Env[0], "resolved to the local pod's name")
	assert.Equal(t, "status.podIP", c.Env[1].ValueFrom.FieldRef.FieldPath, "resolved at the provider")
	assert.Equal(t, "shop.env-config", c.Env[2].ValueFrom.ConfigMapKeyRef.Name)
	assert.Equal(t, "shop.env-secret", c.EnvFrom[0].SecretRef.Name)

	assert.Equal(t, "rb-paris", local.Spec.NodeName, "the local pod is not touched")
	assert.Len(t, local.Spec.Volumes, 3)

	key, uid, ok := originOf(remote)
	require.True(t, ok)
	assert.Equal(t, types.NamespacedName{Namespace: "shop", Name: "web-0"}, key)
	assert.Equal(t, types.UID("uid-1"), uid)
	view := providerView(remote, key, uid)
	assert.Equal(t, local.Labels, view.Labels)
	assert.Equal(t, local.Annotations, view.Annotations)

	local.Spec.Volumes = append(local.Spec.Volumes, corev1.Volume{Name: "data",
		VolumeSource: corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: "data"}}})
	_, err = remotePod(local, mirrorParams{clusterID: "rome", namespace: "rb-rome", node: node})
	assert.True(t, permanent(err), "PVCs are refused for good: %v", err)
}

func TestNodeAffinityOnVirtualNode(t *testing.T) {
	spec := &corev1.PodSpec{Affinity: &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{
		RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{
			{MatchExpressions: []corev1.NodeSelectorRequirement{{Key: rbv1.ProviderLabel, Operator: corev1.NodeSelectorOpExists}}},
		}},
	}}}
	dropNodeSelection(spec, nil)
	assert.Nil(t, spec.Affinity, "a term that only selected the virtual node is gone, not left empty (empty matches nothing)")

	spec = &corev1.PodSpec{Affinity: &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{
		RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{
			{MatchExpressions: []corev1.NodeSelectorRequirement{
				{Key: rbv1.ProviderLabel, Operator: corev1.NodeSelectorOpExists},
				{Key: corev1.LabelTopologyZone, Operator: corev1.NodeSelectorOpIn, Values: []string{"a"}},
				{Key: "rack", Operator: corev1.NodeSelectorOpIn, Values: []string{"r1"}},
			}, MatchFields: []corev1.NodeSelectorRequirement{{Key: "metadata.name", Operator: corev1.NodeSelectorOpIn, Values: []string{"rb-paris"}}}},
		}},
		PreferredDuringSchedulingIgnoredDuringExecution: []corev1.PreferredSchedulingTerm{
			{Weight: 10, Preference: corev1.NodeSelectorTerm{MatchExpressions: []corev1.NodeSelectorRequirement{
				{Key: "disktype", Operator: corev1.NodeSelectorOpIn, Values: []string{"ssd"}}}}},
			{Weight: 5, Preference: corev1.NodeSelectorTerm{MatchExpressions: []corev1.NodeSelectorRequirement{
				{Key: corev1.LabelArchStable, Operator: corev1.NodeSelectorOpIn, Values: []string{"amd64"}}}}},
		},
	}}}
	dropNodeSelection(spec, nil)
	terms := spec.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms
	require.Len(t, terms, 1)
	require.Len(t, terms[0].MatchExpressions, 1, "the zone stays; the virtual node's label and a rack of this cluster go")
	assert.Equal(t, corev1.LabelTopologyZone, terms[0].MatchExpressions[0].Key)
	assert.Empty(t, terms[0].MatchFields, "node names are this cluster's")
	preferred := spec.Affinity.NodeAffinity.PreferredDuringSchedulingIgnoredDuringExecution
	require.Len(t, preferred, 1)
	assert.Equal(t, int32(5), preferred[0].Weight)

	spec = &corev1.PodSpec{Affinity: &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{
		PreferredDuringSchedulingIgnoredDuringExecution: []corev1.PreferredSchedulingTerm{
			{Weight: 10, Preference: corev1.NodeSelectorTerm{MatchExpressions: []corev1.NodeSelectorRequirement{
				{Key: "disktype", Operator: corev1.NodeSelectorOpIn, Values: []string{"ssd"}}}}},
		}}}}
	dropNodeSelection(spec, nil)
	assert.Nil(t, spec.Affinity, "nothing of the affinity is left")
}

func TestCopyCarriesItsReservation(t *testing.T) {
	remote, err := remotePod(testPod(), mirrorParams{clusterID: "rome", namespace: "rb-rome", reservation: "uid-r1"})
	require.NoError(t, err)
	assert.Equal(t, "uid-r1", remote.Labels[rbv1.ReservationLabel])
	assert.Equal(t, "rome", remote.Labels[rbv1.RequesterLabel])
	remote, err = remotePod(testPod(), mirrorParams{clusterID: "rome", namespace: "rb-rome"})
	require.NoError(t, err)
	assert.NotContains(t, remote.Labels, rbv1.ReservationLabel, "no reservation known: no label")
}

func TestLocalStatus(t *testing.T) {
	local := testPod()
	local.Status = corev1.PodStatus{Phase: corev1.PodPending, QOSClass: corev1.PodQOSBurstable,
		Conditions: []corev1.PodCondition{{Type: corev1.PodScheduled, Status: corev1.ConditionTrue}}}
	now := metav1.Now()
	remote := &corev1.Pod{Status: corev1.PodStatus{
		Phase: corev1.PodRunning, PodIP: "10.0.0.7", PodIPs: []corev1.PodIP{{IP: "10.0.0.7"}}, HostIP: "192.168.1.2", StartTime: &now,
		QOSClass: corev1.PodQOSGuaranteed,
		Conditions: []corev1.PodCondition{
			{Type: corev1.PodScheduled, Status: corev1.ConditionTrue},
			{Type: corev1.PodReady, Status: corev1.ConditionTrue},
		},
		ContainerStatuses: []corev1.ContainerStatus{{Name: "web", Ready: true, State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: now}}}},
	}}
	got := localStatus(local, remote, "paris")
	assert.Equal(t, corev1.PodRunning, got.Status.Phase)
	assert.Equal(t, "10.0.0.7", got.Status.PodIP)
	assert.Equal(t, remote.Status.ContainerStatuses, got.Status.ContainerStatuses)
	assert.Equal(t, corev1.PodQOSBurstable, got.Status.QOSClass, "immutable: stays")
	require.Len(t, got.Status.Conditions, 2)
	assert.Equal(t, corev1.PodScheduled, got.Status.Conditions[0].Type)
	assert.Equal(t, corev1.PodReady, got.Status.Conditions[1].Type)

	// Not placed at the provider yet: the reason shows, the local pod stays scheduled.
	remote.Status = corev1.PodStatus{Phase: corev1.PodPending, Conditions: []corev1.PodCondition{
		{Type: corev1.PodScheduled, Status: corev1.ConditionFalse, Reason: "Unschedulable", Message: "0/3 nodes are available"}}}
	got = localStatus(local, remote, "paris")
	assert.Equal(t, "ProviderPending", got.Status.Reason)
	assert.Contains(t, got.Status.Message, "on paris: Unschedulable: 0/3 nodes are available")
	assert.Equal(t, corev1.ConditionTrue, got.Status.Conditions[0].Status)

	// The provider's names of the copy and its objects read as the local ones;
	// the local conditions a kubelet does not write stay.
	local.UID = "uid-local"
	local.Status.Conditions = append(local.Status.Conditions,
		corev1.PodCondition{Type: PodConditionReserved, Status: corev1.ConditionTrue, Reason: ReasonReserved},
		corev1.PodCondition{Type: corev1.PodReady, Status: corev1.ConditionTrue})
	remote = &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "rb-rome", Name: "shop.web-0", UID: "uid-copy"}, Status: corev1.PodStatus{
		Phase:      corev1.PodPending,
		Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionFalse, Reason: "ContainersNotReady"}},
		ContainerStatuses: []corev1.ContainerStatus{{Name: "web", State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{
			Reason: "CreateContainerConfigError", Message: `configmap "shop.env-config" not found`}}}},
	}}
	got = localStatus(local, remote, "paris")
	assert.Equal(t, `configmap "env-config" not found`, got.Status.ContainerStatuses[0].State.Waiting.Message)
	assert.Equal(t, `configmap "shop.env-config" not found`, remote.Status.ContainerStatuses[0].State.Waiting.Message, "the copy's status is not touched")
	types := func(cs []corev1.PodCondition) (out []string) {
		for _, c := range cs {
			out = append(out, string(c.Type)+"="+string(c.Status))
		}
		return out
	}
	assert.Equal(t, []string{"PodScheduled=True", "Ready=False", string(PodConditionReserved) + "=True"}, types(got.Status.Conditions),
		"the copy's Ready stands for the pod's; the admission stays")

	failed := failedStatus(localStatus(local, &corev1.Pod{Status: corev1.PodStatus{Phase: corev1.PodRunning,
		ContainerStatuses: []corev1.ContainerStatus{{Name: "web", Ready: true, State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: now}}}}}}, "paris"),
		ReasonDeletedAtProvider, "the copy of this pod was deleted on paris")
	assert.Equal(t, corev1.PodFailed, failed.Status.Phase)
	assert.Equal(t, ReasonDeletedAtProvider, failed.Status.Reason)
	require.NotNil(t, failed.Status.ContainerStatuses[0].State.Terminated)
	assert.Equal(t, int32(137), failed.Status.ContainerStatuses[0].State.Terminated.ExitCode)
	assert.False(t, failed.Status.ContainerStatuses[0].Ready)
}

func TestLocalizer(t *testing.T) {
	local := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "web-0", UID: "uid-local"}}
	remote := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "rb-rome", Name: "shop.web-0", UID: "uid-copy"}}
	loc := localizer(local, remote)
	for in, want := range map[string]string{
		"Back-off restarting failed container app in pod shop.web-0_rb-rome(uid-copy)":        "Back-off restarting failed container app in pod web-0_shop(uid-local)",
		"Successfully assigned rb-rome/shop.web-0 to paris-node-1":                            "Successfully assigned shop/web-0 to paris-node-1",
		`Error: configmap "shop.settings" not found`:                                          `Error: configmap "settings" not found`,
		`secret "shop.shop.x" not found`:                                                      `secret "shop.x" not found`,
		`pod: "shop.web-0_rb-rome(uid-copy)". kubelet does not have ClusterDNS IP configured`: `pod: "web-0_shop(uid-local)". kubelet does not have ClusterDNS IP configured`,
		`pod "shop.web-0" deleted; uid uid-copy`:                                              `pod "web-0" deleted; uid uid-local`,
		`Pulling image "rb.test/testapp:v1"`:                                                  `Pulling image "rb.test/testapp:v1"`,
		"":                                                                                    "",
	} {
		assert.Equal(t, want, loc.Replace(in), in)
	}
	// Nothing known of the copy: nothing replaced but the quoted copies' names.
	assert.Equal(t, "a b", localizer(local, &corev1.Pod{}).Replace("a b"))
}

func TestRefreshIn(t *testing.T) {
	assert.InDelta(t, float64(30*time.Minute), float64(refreshIn(time.Now().Add(time.Hour), time.Second)), float64(time.Second))
	assert.InDelta(t, float64(5*time.Minute), float64(refreshIn(time.Now().Add(10*time.Minute), time.Second)), float64(time.Second))
	assert.Equal(t, 5*time.Second, refreshIn(time.Now().Add(time.Second), 5*time.Second), "never sooner than the floor")
	assert.Equal(t, 30*time.Minute, refreshIn(time.Now().Add(10*time.Hour), time.Second), "never later than 30m")
}

// grants answers reservations with grants of given expiries.
type grants map[string]time.Time

func (g grants) Reservation(_ context.Context, id string) (api.Reservation, error) {
	exp, ok := g[id]
	if !ok {
		return api.Reservation{}, errors.New("unknown")
	}
	return api.Reservation{ID: id, Grant: &api.Grant{Endpoint: "https://paris:6443", Token: "token-" + id, Namespace: "rb-rome", ExpiresAt: exp}}, nil
}

func TestFetchGrantTakesTheLongestLived(t *testing.T) {
	now := time.Now()
	b := &Bridge{cfg: Config{Grants: grants{"a": now.Add(time.Minute), "b": now.Add(time.Hour), "c": now.Add(10 * time.Minute)}}}
	n := &providerNode{b: b, active: []string{"a", "missing", "b", "c"}}
	g, err := n.fetchGrant(context.Background())
	require.NoError(t, err)
	assert.Equal(t, "token-b", g.Token)

	n.active = []string{"missing"}
	_, err = n.fetchGrant(context.Background())
	assert.Error(t, err)
}

func TestObjectMirrorCountsUsers(t *testing.T) {
	m := newObjectMirror(nil)
	pod := func(name string, cms ...string) *corev1.Pod {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: name}, Status: corev1.PodStatus{
			Conditions: []corev1.PodCondition{{Type: PodConditionReserved, Status: corev1.ConditionTrue}}}}
		for _, cm := range cms {
			p.Spec.Volumes = append(p.Spec.Volumes, corev1.Volume{Name: cm, VolumeSource: corev1.VolumeSource{
				ConfigMap: &corev1.ConfigMapVolumeSource{LocalObjectReference: corev1.LocalObjectReference{Name: cm}}}})
		}
		return p
	}
	m.track(pod("a", "shared", "only-a"))
	m.track(pod("b", "shared"))
	m.track(pod("a", "shared", "only-a")) // an update of the same pod counts once
	assert.True(t, m.usedLocked("ConfigMap", "shop", "shared"))
	assert.False(t, m.usedLocked("ConfigMap", "other", "shared"))
	assert.False(t, m.usedLocked("Secret", "shop", "shared"))
	refused := pod("c", "only-c")
	refused.Status.Conditions[0].Status = corev1.ConditionFalse
	m.track(refused)
	assert.False(t, m.usedLocked("ConfigMap", "shop", "only-c"), "a pod not admitted: nothing of it is copied")

	unused := m.setLocked("shop", "a", objectRefs{})
	assert.Equal(t, []string{"only-a"}, unused.ConfigMaps, "shared is still used by b")
	unused = m.setLocked("shop", "b", objectRefs{})
	assert.Equal(t, []string{"shared"}, unused.ConfigMaps)
	assert.Empty(t, m.users)
	assert.Empty(t, m.byPod)
}

// TestCopyAppliesPlacement: a reservation the provider holds pins the copy to
// the placeholder's node at rb-tenant; every required term gains the pin.
func TestCopyAppliesPlacement(t *testing.T) {
	placement := &rbv1.ReservationPlacement{Node: "paris-2", PriorityClassName: rbv1.TenantPriorityClass}
	pin := corev1.NodeSelectorRequirement{Key: corev1.LabelHostname, Operator: corev1.NodeSelectorOpIn, Values: []string{"paris-2"}}

	local := testPod()
	local.Spec.PriorityClassName, local.Spec.Priority = "business-critical", ptr.To(int32(5000))
	remote, err := remotePod(local, mirrorParams{clusterID: "rome", namespace: "rb-rome", reservation: "uid-r1", placement: placement})
	require.NoError(t, err)
	assert.Equal(t, rbv1.TenantPriorityClass, remote.Spec.PriorityClassName)
	assert.Nil(t, remote.Spec.Priority, "the provider's admission sets it from the class")
	assert.Nil(t, remote.Spec.PreemptionPolicy)
	req := remote.Spec.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution
	require.NotNil(t, req)
	assert.Equal(t, []corev1.NodeSelectorTerm{{MatchExpressions: []corev1.NodeSelectorRequirement{pin}}}, req.NodeSelectorTerms)
	// Its own placeholder, and only that one, must leave the node for it:
	// the scheduler's preemption takes it whatever the order it tries
	// the node's placeholders in.
	assert.Equal(t, &corev1.PodAntiAffinity{RequiredDuringSchedulingIgnoredDuringExecution: []corev1.PodAffinityTerm{{
		LabelSelector: &metav1.LabelSelector{MatchLabels: map[string]string{rbv1.ReservationLabel: "uid-r1", rbv1.RoleLabel: rbv1.RolePlaceholder}},
		TopologyKey:   corev1.LabelHostname,
	}}}, remote.Spec.Affinity.PodAntiAffinity)
	assert.Nil(t, local.Spec.Affinity, "the local pod is not touched")

	// Two ORed terms of carried labels: both gain the pin.
	local = testPod()
	local.Spec.Affinity = &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{
		RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{
			{MatchExpressions: []corev1.NodeSelectorRequirement{{Key: corev1.LabelTopologyZone, Operator: corev1.NodeSelectorOpIn, Values: []string{"a"}}}},
			{MatchExpressions: []corev1.NodeSelectorRequirement{{Key: corev1.LabelArchStable, Operator: corev1.NodeSelectorOpIn, Values: []string{"arm64"}}}},
		}},
		PreferredDuringSchedulingIgnoredDuringExecution: []corev1.PreferredSchedulingTerm{{Weight: 5, Preference: corev1.NodeSelectorTerm{
			MatchExpressions: []corev1.NodeSelectorRequirement{{Key: corev1.LabelArchStable, Operator: corev1.NodeSelectorOpIn, Values: []string{"amd64"}}}}}},
	}}
	remote, err = remotePod(local, mirrorParams{clusterID: "rome", namespace: "rb-rome", placement: placement})
	require.NoError(t, err)
	terms := remote.Spec.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms
	require.Len(t, terms, 2)
	for _, term := range terms {
		require.Len(t, term.MatchExpressions, 2)
		assert.Equal(t, pin, term.MatchExpressions[1])
	}
	assert.Len(t, remote.Spec.Affinity.NodeAffinity.PreferredDuringSchedulingIgnoredDuringExecution, 1, "preferences stay as they were")
	assert.Equal(t, corev1.LabelTopologyZone, terms[0].MatchExpressions[0].Key, "the pod's own terms are not changed otherwise")
	assert.Len(t, local.Spec.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms[0].MatchExpressions, 1,
		"the local pod is not touched")
	assert.Nil(t, remote.Spec.Affinity.PodAntiAffinity, "no reservation id: no placeholder to repel")

	// No placement: the copy is as before.
	remote, err = remotePod(testPod(), mirrorParams{clusterID: "rome", namespace: "rb-rome"})
	require.NoError(t, err)
	assert.Empty(t, remote.Spec.PriorityClassName)
	assert.Nil(t, remote.Spec.Affinity)
}
