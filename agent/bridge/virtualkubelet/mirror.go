package virtualkubelet

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"maps"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/utils/ptr"

	rbv1 "github.com/fluidos-project/resource-broker/api/v1alpha1"
)

// Marks of origin on mirrored objects (pods, ConfigMaps, Secrets) in the
// provider's tenant namespace. The label rbv1.RequesterLabel=<this cluster>
// selects them; the annotations say which local object each one mirrors.
const (
	OriginNamespaceAnnotation = "broker.fluidos.eu/origin-namespace"
	OriginNameAnnotation      = "broker.fluidos.eu/origin-name"
	OriginUIDAnnotation       = "broker.fluidos.eu/origin-uid"
	OriginNodeAnnotation      = "broker.fluidos.eu/origin-node"
)

// RemoteName is the name in the tenant namespace of the local object
// namespace/name. A namespace has no dots, so "<namespace>.<name>" cannot be
// the image of any other pair; only a pair longer than an object name allows
// (253) is shortened with a hash, and an existing object is adopted only when
// its origin annotations match.
func RemoteName(namespace, name string) string {
	full := namespace + "." + name
	if len(full) <= validation.DNS1123SubdomainMaxLength {
		return full
	}
	sum := sha256.Sum256([]byte(namespace + "/" + name))
	suffix := hex.EncodeToString(sum[:])[:16]
	prefix := strings.TrimRight(full[:validation.DNS1123SubdomainMaxLength-len(suffix)-1], "-.")
	return prefix + "-" + suffix
}

// mirrorParams is what the pod translation needs to know of the node and tenant.
type mirrorParams struct {
	clusterID string // this cluster, the requester
	namespace string // tenant namespace at the provider
	node      *corev1.Node
	// reservation is the broker id of the pod's reservation ("" unknown):
	// the copy carries it (rbv1.ReservationLabel), so the provider can tell
	// which reservation each of its tenant pods consumes.
	reservation string
	// placement is how the provider holds the reservation (its grant,
	// mirrored into the Reservation's status.placement; nil: it holds
	// nothing): the copy runs at its PriorityClass, pinned to its node.
	placement *rbv1.ReservationPlacement
	// network is the home network the copy keeps (nil: the provider's;
	// homenetwork.go).
	network *homeView
	// home, when set, gives the copy a token of its ServiceAccount here
	// and this cluster's API server in place of the provider's (homeapi.go).
	home *homeAPI
}

// objectRefs are the ConfigMaps and Secrets (local names) a pod uses.
type objectRefs struct {
	ConfigMaps, Secrets []string
}

func (r objectRefs) empty() bool { return len(r.ConfigMaps) == 0 && len(r.Secrets) == 0 }

// refsOf lists the ConfigMaps and Secrets a pod mounts, reads into its
// environment, or pulls images with.
func refsOf(pod *corev1.Pod) objectRefs {
	cms, secrets := map[string]bool{}, map[string]bool{}
	for _, v := range pod.Spec.Volumes {
		switch {
		case v.ConfigMap != nil:
			cms[v.ConfigMap.Name] = true
		case v.Secret != nil:
			secrets[v.Secret.SecretName] = true
		case v.Projected != nil:
			if isServiceAccountVolume(v) {
				continue // dropped by the mirror
			}
			for _, s := range v.Projected.Sources {
				if s.ConfigMap != nil {
					cms[s.ConfigMap.Name] = true
				}
				if s.Secret != nil {
					secrets[s.Secret.Name] = true
				}
			}
		}
	}
	eachContainer(&pod.Spec, func(env []corev1.EnvVar, from []corev1.EnvFromSource) {
		for _, e := range env {
			if e.ValueFrom == nil {
				continue
			}
			if r := e.ValueFrom.ConfigMapKeyRef; r != nil {
				cms[r.Name] = true
			}
			if r := e.ValueFrom.SecretKeyRef; r != nil {
				secrets[r.Name] = true
			}
		}
		for _, f := range from {
			if f.ConfigMapRef != nil {
				cms[f.ConfigMapRef.Name] = true
			}
			if f.SecretRef != nil {
				secrets[f.SecretRef.Name] = true
			}
		}
	})
	for _, s := range pod.Spec.ImagePullSecrets {
		secrets[s.Name] = true
	}
	delete(cms, "")
	delete(secrets, "")
	return objectRefs{ConfigMaps: slices.Sorted(maps.Keys(cms)), Secrets: slices.Sorted(maps.Keys(secrets))}
}

func eachContainer(spec *corev1.PodSpec, fn func([]corev1.EnvVar, []corev1.EnvFromSource)) {
	for i := range spec.InitContainers {
		fn(spec.InitContainers[i].Env, spec.InitContainers[i].EnvFrom)
	}
	for i := range spec.Containers {
		fn(spec.Containers[i].Env, spec.Containers[i].EnvFrom)
	}
	for i := range spec.EphemeralContainers {
		fn(spec.EphemeralContainers[i].Env, spec.EphemeralContainers[i].EnvFrom)
	}
}

// isServiceAccountVolume: the projected volume the ServiceAccount admission
// plugin adds (kube-api-access-*), or any projection of a token.
func isServiceAccountVolume(v corev1.Volume) bool {
	if v.Projected == nil {
		return false
	}
	for _, s := range v.Projected.Sources {
		if s.ServiceAccountToken != nil {
			return true
		}
	}
	return false
}

// errUnsupported marks a pod the bridge cannot run on a provider.
type errUnsupported struct{ msg string }

func (e errUnsupported) Error() string { return e.msg }

// remotePod is the pod to create in the tenant namespace for local:
//   - name mapped by RemoteName, labels and annotations carried with the marks of origin;
//   - the service account token and its mounts dropped, no token automounted;
//     with p.home, the volume at ServiceAccountMountPath carries instead a
//     token of the pod's ServiceAccount here, and the containers' environment
//     points at this cluster's API server (applyHomeAPI);
//   - node-specific fields dropped: node name, scheduler, priority class,
//     overhead, the virtual node's selectors, affinity terms and tolerations,
//     topology spread constraints (a spread over this cluster's nodes, which
//     the scheduler and the broker honoured among the providers; the copy
//     goes to the provider node that holds its reservation);
//   - ConfigMaps, Secrets and image pull secrets renamed to their copies;
//   - downward API fields that would read the provider's copy (name,
//     namespace, uid, node, service account) resolved to the local pod's values.
func remotePod(local *corev1.Pod, p mirrorParams) (*corev1.Pod, error) {
	for _, v := range local.Spec.Volumes {
		if v.PersistentVolumeClaim != nil {
			return nil, errUnsupported{fmt.Sprintf("volume %q: PersistentVolumeClaims cannot follow a pod to another cluster", v.Name)}
		}
	}
	ns := local.Namespace
	spec := local.Spec.DeepCopy()

	// Identity and placement belong to this cluster.
	spec.NodeName = ""
	spec.SchedulerName = ""
	spec.Priority, spec.PriorityClassName, spec.PreemptionPolicy = nil, "", nil
	spec.Overhead = nil
	spec.SchedulingGates = nil
	spec.TopologySpreadConstraints = nil
	spec.ServiceAccountName, spec.DeprecatedServiceAccount = "", ""
	spec.AutomountServiceAccountToken = ptr.To(false)
	if spec.Hostname == "" && len(validation.IsDNS1123Label(local.Name)) == 0 {
		spec.Hostname = local.Name // what the pod would see as its host name here
	}
	dropNodeSelection(spec, p.node)
	applyPlacement(spec, p.placement, p.reservation)
	if p.network != nil {
		applyHomeNetwork(spec, ns, p.network)
	}

	// Drop the token volumes and their mounts (but the home token's).
	var home map[string]bool
	if p.home != nil {
		home = homeAPIVolumes(local)
	}
	dropped := map[string]bool{}
	spec.Volumes = slices.DeleteFunc(spec.Volumes, func(v corev1.Volume) bool {
		if isServiceAccountVolume(v) && !home[v.Name] {
			dropped[v.Name] = true
			return true
		}
		return false
	})
	unmount := func(ms []corev1.VolumeMount) []corev1.VolumeMount {
		return slices.DeleteFunc(ms, func(m corev1.VolumeMount) bool { return dropped[m.Name] })
	}
	for i := range spec.InitContainers {
		spec.InitContainers[i].VolumeMounts = unmount(spec.InitContainers[i].VolumeMounts)
	}
	for i := range spec.Containers {
		spec.Containers[i].VolumeMounts = unmount(spec.Containers[i].VolumeMounts)
	}
	for i := range spec.EphemeralContainers {
		spec.EphemeralContainers[i].VolumeMounts = unmount(spec.EphemeralContainers[i].VolumeMounts)
	}

	// Point at the copies.
	rename := func(name string) string { return RemoteName(ns, name) }
	for i := range spec.Volumes {
		v := &spec.Volumes[i]
		switch {
		case v.ConfigMap != nil:
			v.ConfigMap.Name = rename(v.ConfigMap.Name)
		case v.Secret != nil:
			v.Secret.SecretName = rename(v.Secret.SecretName)
		case v.Projected != nil:
			for j := range v.Projected.Sources {
				s := &v.Projected.Sources[j]
				if s.ConfigMap != nil {
					s.ConfigMap.Name = rename(s.ConfigMap.Name)
				}
				if s.Secret != nil {
					s.Secret.Name = rename(s.Secret.Name)
				}
			}
		}
	}
	for i := range spec.ImagePullSecrets {
		spec.ImagePullSecrets[i].Name = rename(spec.ImagePullSecrets[i].Name)
	}
	fixEnv := func(env []corev1.EnvVar, from []corev1.EnvFromSource) {
		for i := range env {
			vf := env[i].ValueFrom
			if vf == nil {
				continue
			}
			if vf.ConfigMapKeyRef != nil {
				vf.ConfigMapKeyRef.Name = rename(vf.ConfigMapKeyRef.Name)
			}
			if vf.SecretKeyRef != nil {
				vf.SecretKeyRef.Name = rename(vf.SecretKeyRef.Name)
			}
			if vf.FieldRef != nil {
				if v, ok := localField(local, vf.FieldRef.FieldPath); ok {
					env[i].Value, env[i].ValueFrom = v, nil
				}
			}
		}
		for i := range from {
			if from[i].ConfigMapRef != nil {
				from[i].ConfigMapRef.Name = rename(from[i].ConfigMapRef.Name)
			}
			if from[i].SecretRef != nil {
				from[i].SecretRef.Name = rename(from[i].SecretRef.Name)
			}
		}
	}
	eachContainer(spec, fixEnv)
	if p.network != nil {
		readServiceEnv(spec, p.network)
	}
	if p.home != nil {
		// With the home network the KUBERNETES_* variables are already the
		// home ClusterIP's, as a local pod's.
		applyHomeAPI(spec, home, p.home, p.network == nil)
	}

	return &corev1.Pod{
		ObjectMeta: mirrorMeta(local.ObjectMeta, p, map[string]string{OriginNodeAnnotation: local.Spec.NodeName}),
		Spec:       *spec,
	}, nil
}

// localField resolves the downward API fields whose value differs on the
// provider's copy; the others (IPs, labels, annotations) resolve there.
func localField(pod *corev1.Pod, path string) (string, bool) {
	switch path {
	case "metadata.name":
		return pod.Name, true
	case "metadata.namespace":
		return pod.Namespace, true
	case "metadata.uid":
		return string(pod.UID), true
	case "spec.nodeName":
		return pod.Spec.NodeName, true
	case "spec.serviceAccountName":
		return pod.Spec.ServiceAccountName, true
	}
	return "", false
}

// CarriedNodeLabels are the node labels a copy keeps in its node selector
// and node affinity: labels every provider's nodes carry with the same
// meaning (architecture, OS, region, zone, GPU model), which the scheduler
// plugin also turns into the reservation's provider selector. Any other
// node label means a node of this cluster: the copy drops it, and the
// provider's scheduler chooses the node.
var CarriedNodeLabels = map[string]bool{
	corev1.LabelArchStable: true, corev1.LabelOSStable: true,
	corev1.LabelTopologyRegion: true, corev1.LabelTopologyZone: true,
	"nvidia.com/gpu.product": true,
}

// dropNodeSelection keeps, of the pod's node selection, only what a
// provider's nodes can satisfy (CarriedNodeLabels): node selector entries,
// required and preferred node affinity expressions on other labels and
// every match on node names go; so do tolerations of the virtual node's
// taints.
func dropNodeSelection(spec *corev1.PodSpec, node *corev1.Node) {
	dropped := func(key string) bool { return !CarriedNodeLabels[key] }
	for k := range spec.NodeSelector {
		if dropped(k) {
			delete(spec.NodeSelector, k)
		}
	}
	if len(spec.NodeSelector) == 0 {
		spec.NodeSelector = nil
	}
	keep := func(t corev1.NodeSelectorTerm) (corev1.NodeSelectorTerm, bool) {
		before := len(t.MatchExpressions) + len(t.MatchFields)
		t.MatchExpressions = slices.DeleteFunc(t.MatchExpressions, func(e corev1.NodeSelectorRequirement) bool { return dropped(e.Key) })
		t.MatchFields = nil // metadata.name: a node of this cluster
		return t, len(t.MatchExpressions) > 0 || before == 0
	}
	if a := spec.Affinity; a != nil && a.NodeAffinity != nil {
		if req := a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution; req != nil {
			var terms []corev1.NodeSelectorTerm
			for _, t := range req.NodeSelectorTerms {
				if t, ok := keep(t); ok {
					terms = append(terms, t)
				}
			}
			if len(terms) == 0 {
				a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution = nil
			} else {
				req.NodeSelectorTerms = terms
			}
		}
		var preferred []corev1.PreferredSchedulingTerm
		for _, p := range a.NodeAffinity.PreferredDuringSchedulingIgnoredDuringExecution {
			if t, ok := keep(p.Preference); ok {
				p.Preference = t
				preferred = append(preferred, p)
			}
		}
		a.NodeAffinity.PreferredDuringSchedulingIgnoredDuringExecution = preferred
		if a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution == nil && len(a.NodeAffinity.PreferredDuringSchedulingIgnoredDuringExecution) == 0 {
			a.NodeAffinity = nil
		}
		if a.NodeAffinity == nil && a.PodAffinity == nil && a.PodAntiAffinity == nil {
			spec.Affinity = nil
		}
	}
	taints := map[string]bool{rbv1.VirtualNodeTaint: true}
	if node != nil {
		for _, t := range node.Spec.Taints {
			taints[t.Key] = true
		}
	}
	spec.Tolerations = slices.DeleteFunc(spec.Tolerations, func(t corev1.Toleration) bool { return t.Key != "" && taints[t.Key] })
	if len(spec.Tolerations) == 0 {
		spec.Tolerations = nil
	}
}

// applyPlacement pins the copy to the node where the provider holds its
// capacity (a placeholder pod) at the PriorityClass one above the
// placeholder's: there the scheduler preempts the placeholder for it.
// Priority is cleared so that the provider's admission sets it from the
// class. Every required nodeSelectorTerm (they are ORed) gains the hostname
// expression, so none of them lets the copy elsewhere.
//
// The copy also repels its own placeholder (required pod anti-affinity on
// the node). Without it the scheduler, which knows nothing of which
// placeholder holds which reservation, takes as victim whichever of the
// node's equally important placeholders it reprieves last: when the copies
// of several reservations held on one node (a gang) arrive together, each
// takes another reservation's room, their preemptions pick victims already
// deleted ("Victim Pod is already deleted") and the copies race for what is
// left. With it, the own placeholder is a victim whatever the order, and
// its room leaves the others (placeholders, the provider's pods) reprieved.
func applyPlacement(spec *corev1.PodSpec, p *rbv1.ReservationPlacement, reservation string) {
	if p == nil || p.Node == "" {
		return
	}
	spec.PriorityClassName, spec.Priority, spec.PreemptionPolicy = p.PriorityClassName, nil, nil
	pin := corev1.NodeSelectorRequirement{Key: corev1.LabelHostname, Operator: corev1.NodeSelectorOpIn, Values: []string{p.Node}}
	if spec.Affinity == nil {
		spec.Affinity = &corev1.Affinity{}
	}
	if spec.Affinity.NodeAffinity == nil {
		spec.Affinity.NodeAffinity = &corev1.NodeAffinity{}
	}
	na := spec.Affinity.NodeAffinity
	if na.RequiredDuringSchedulingIgnoredDuringExecution == nil || len(na.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms) == 0 {
		na.RequiredDuringSchedulingIgnoredDuringExecution = &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{}}}
	}
	terms := na.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms
	for i := range terms {
		terms[i].MatchExpressions = append(terms[i].MatchExpressions, pin)
	}
	if reservation == "" || len(validation.IsValidLabelValue(reservation)) > 0 {
		return // the placeholder carries no label to select it by
	}
	if spec.Affinity.PodAntiAffinity == nil {
		spec.Affinity.PodAntiAffinity = &corev1.PodAntiAffinity{}
	}
	pa := spec.Affinity.PodAntiAffinity
	pa.RequiredDuringSchedulingIgnoredDuringExecution = append(pa.RequiredDuringSchedulingIgnoredDuringExecution, corev1.PodAffinityTerm{
		LabelSelector: &metav1.LabelSelector{MatchLabels: map[string]string{rbv1.ReservationLabel: reservation, rbv1.RoleLabel: rbv1.RolePlaceholder}},
		TopologyKey:   corev1.LabelHostname,
	})
}

// mirrorMeta is the metadata of a copy: mapped name, the tenant namespace,
// the local labels and annotations plus the marks of origin; no owners,
// finalizers or generated names.
func mirrorMeta(local metav1.ObjectMeta, p mirrorParams, extra map[string]string) metav1.ObjectMeta {
	labels := maps.Clone(local.Labels)
	if labels == nil {
		labels = map[string]string{}
	}
	labels[rbv1.RequesterLabel] = p.clusterID
	if p.reservation != "" {
		labels[rbv1.ReservationLabel] = p.reservation
	}
	annotations := maps.Clone(local.Annotations)
	if annotations == nil {
		annotations = map[string]string{}
	}
	annotations[OriginNamespaceAnnotation] = local.Namespace
	annotations[OriginNameAnnotation] = local.Name
	annotations[OriginUIDAnnotation] = string(local.UID)
	for k, v := range extra {
		if v != "" {
			annotations[k] = v
		}
	}
	return metav1.ObjectMeta{Name: RemoteName(local.Namespace, local.Name), Namespace: p.namespace, Labels: labels, Annotations: annotations}
}

// originOf reads the marks of origin of a copy.
func originOf(o metav1.Object) (key types.NamespacedName, uid types.UID, ok bool) {
	a := o.GetAnnotations()
	key = types.NamespacedName{Namespace: a[OriginNamespaceAnnotation], Name: a[OriginNameAnnotation]}
	if key.Namespace == "" || key.Name == "" || RemoteName(key.Namespace, key.Name) != o.GetName() {
		return key, "", false
	}
	return key, types.UID(a[OriginUIDAnnotation]), true
}

// unmirrorMeta strips the marks of origin: the labels and annotations as the
// local object carries them.
func unmirrorMeta(remote metav1.ObjectMeta) (labels, annotations map[string]string) {
	labels, annotations = maps.Clone(remote.Labels), maps.Clone(remote.Annotations)
	delete(labels, rbv1.RequesterLabel)
	for _, k := range []string{OriginNamespaceAnnotation, OriginNameAnnotation, OriginUIDAnnotation, OriginNodeAnnotation} {
		delete(annotations, k)
	}
	if len(labels) == 0 {
		labels = nil
	}
	if len(annotations) == 0 {
		annotations = nil
	}
	return labels, annotations
}

// providerView is the remote pod as the pod controller sees it: in local
// coordinates, with the remote spec and status.
func providerView(remote *corev1.Pod, key types.NamespacedName, uid types.UID) *corev1.Pod {
	out := remote.DeepCopy()
	out.Name, out.Namespace, out.UID = key.Name, key.Namespace, uid
	out.Labels, out.Annotations = unmirrorMeta(remote.ObjectMeta)
	out.ResourceVersion, out.OwnerReferences, out.ManagedFields = "", nil, nil
	return out
}

// localStatus is local with the remote pod's status reflected: phase,
// conditions, container statuses, IPs, start time, with the provider's names
// of the copy and its objects in messages replaced by the local ones
// (localizer). The local PodScheduled condition stays (the pod is bound
// here); the provider's scheduling verdict, while it has not placed the copy,
// goes in the message. So do the local conditions a kubelet does not write
// (the bridge's PodConditionReserved, readiness gates', DisruptionTarget):
// the copy has none of them.
func localStatus(local, remote *corev1.Pod, provider string) *corev1.Pod {
	out := local.DeepCopy()
	rs := remote.Status.DeepCopy()
	loc := localizer(local, remote)
	s := &out.Status
	s.Phase, s.Reason, s.Message = rs.Phase, rs.Reason, loc.Replace(rs.Message)
	s.HostIP, s.HostIPs, s.PodIP, s.PodIPs = rs.HostIP, rs.HostIPs, rs.PodIP, rs.PodIPs
	s.StartTime = rs.StartTime
	s.ContainerStatuses, s.InitContainerStatuses, s.EphemeralContainerStatuses =
		localizeStates(rs.ContainerStatuses, loc), localizeStates(rs.InitContainerStatuses, loc), localizeStates(rs.EphemeralContainerStatuses, loc)
	conds := make([]corev1.PodCondition, 0, len(rs.Conditions)+len(local.Status.Conditions))
	if scheduled := podCondition(local, corev1.PodScheduled); scheduled != nil {
		conds = append(conds, *scheduled.DeepCopy())
	}
	for _, c := range rs.Conditions {
		if c.Type == corev1.PodScheduled {
			if c.Status != corev1.ConditionTrue && s.Message == "" {
				s.Reason, s.Message = "ProviderPending", fmt.Sprintf("on %s: %s: %s", provider, c.Reason, c.Message)
			}
			continue
		}
		c.ObservedGeneration = 0
		c.Message = loc.Replace(c.Message)
		conds = append(conds, c)
	}
	for _, c := range local.Status.Conditions {
		if !kubeletConditions[c.Type] && !slices.ContainsFunc(conds, func(have corev1.PodCondition) bool { return have.Type == c.Type }) {
			conds = append(conds, *c.DeepCopy())
		}
	}
	s.Conditions = conds
	s.ObservedGeneration = 0
	return out
}

// kubeletConditions are the pod conditions a kubelet writes: the copy's
// stand for the pod's.
var kubeletConditions = map[corev1.PodConditionType]bool{
	corev1.PodReady: true, corev1.ContainersReady: true, corev1.PodInitialized: true, corev1.PodReadyToStartContainers: true,
	corev1.PodResizePending: true, corev1.PodResizeInProgress: true,
}

func localizeStates(cs []corev1.ContainerStatus, loc *strings.Replacer) []corev1.ContainerStatus {
	for i := range cs {
		for _, st := range []*corev1.ContainerState{&cs[i].State, &cs[i].LastTerminationState} {
			if st.Waiting != nil {
				st.Waiting.Message = loc.Replace(st.Waiting.Message)
			}
			if st.Terminated != nil {
				st.Terminated.Message = loc.Replace(st.Terminated.Message)
			}
		}
	}
	return cs
}

// localizer replaces, in the provider's messages about the copy remote of
// local, the provider's names by the local ones: the copy's
// "<tenant namespace>/<namespace>.<name>" and the kubelet's
// "<namespace>.<name>_<tenant namespace>(<uid>)" by the pod's, the copy's UID
// by the pod's, and a quoted "<namespace>.<object>" (the copy of a ConfigMap
// or Secret, the copy itself) by the quoted local name, e.g.
// `configmap "shop.settings" not found` becomes `configmap "settings" not found`.
func localizer(local, remote *corev1.Pod) *strings.Replacer {
	var pairs []string
	if remote.Name != "" && remote.Namespace != "" {
		if remote.UID != "" {
			// Quoted too: the quoted copy's name below would match first.
			theirs := fmt.Sprintf("%s_%s(%s)", remote.Name, remote.Namespace, remote.UID)
			ours := fmt.Sprintf("%s_%s(%s)", local.Name, local.Namespace, local.UID)
			pairs = append(pairs, `"`+theirs, `"`+ours, theirs, ours)
		}
		pairs = append(pairs, remote.Namespace+"/"+remote.Name, local.Namespace+"/"+local.Name)
	}
	if remote.UID != "" {
		pairs = append(pairs, string(remote.UID), string(local.UID))
	}
	if local.Namespace != "" {
		pairs = append(pairs, `"`+local.Namespace+".", `"`)
	}
	return strings.NewReplacer(pairs...)
}

// remoteConfigMap is the copy of a local ConfigMap.
func remoteConfigMap(local *corev1.ConfigMap, p mirrorParams) *corev1.ConfigMap {
	return &corev1.ConfigMap{
		ObjectMeta: mirrorMeta(local.ObjectMeta, p, nil),
		Immutable:  local.Immutable,
		Data:       maps.Clone(local.Data),
		BinaryData: maps.Clone(local.BinaryData),
	}
}

// remoteSecret is the copy of a local Secret.
func remoteSecret(local *corev1.Secret, p mirrorParams) *corev1.Secret {
	return &corev1.Secret{
		ObjectMeta: mirrorMeta(local.ObjectMeta, p, nil),
		Immutable:  local.Immutable,
		Type:       local.Type,
		Data:       maps.Clone(local.Data),
	}
}
