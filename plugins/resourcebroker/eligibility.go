package resourcebroker

import (
	"fmt"
	"reflect"
	"slices"
	"strconv"
	"strings"

	brokerv1alpha1 "github.com/fluidos-project/resource-broker/api/v1alpha1"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/component-helpers/scheduling/corev1/nodeaffinity"
	"k8s.io/klog/v2"
	fwk "k8s.io/kube-scheduler/framework"
	"k8s.io/kubernetes/pkg/scheduler/framework/plugins/names"
)

// Which pods are offloaded (sent to another cluster through a broker
// reservation), and why not: see "Which pods are offloaded" in README.md.
// A pod is offloaded only when
//
//  1. the args and the pod allow it (policyReason): its namespace is not in
//     excludedNamespaces, is in namespaces when that is set, its labels
//     match the selector, and it is not annotated OffloadAnnotation: "false";
//  2. the bridge can carry it to a provider (carriageReason): no
//     PersistentVolumeClaim (nor generic ephemeral volume, which is one),
//     hostPath or other volume bound to this cluster, no host namespaces,
//     host ports or privileged containers, no resource a reservation cannot
//     hold, no DRA resource claims;
//  3. what it requires of its node can be asked of the broker
//     (providerSelector): required node labels only among
//     ProviderSelectorLabels, each with one value; they become the
//     reservation's providerSelector, so that only providers advertising
//     them are candidates;
//  4. and no local node takes it for lack of resources only: some local
//     node would take it but for cpu, memory, ephemeral storage, GPUs or its
//     pod count (shortOfResources). A pod every node rejects for something
//     else (taints, node affinity, cordoned nodes, ports, volumes, ...)
//     would not be placed by more capacity either.

// OffloadAnnotation on a pod, set to "false", keeps it in this cluster.
const OffloadAnnotation = "broker.fluidos.eu/offload"

// GPUProductLabel is the node label of the GPU model (NVIDIA GPU feature
// discovery), e.g. NVIDIA-A100-SXM4-40GB.
const GPUProductLabel = "nvidia.com/gpu.product"

// ProviderSelectorLabels are the node labels a pod may require (node
// selector, required node affinity) and still be offloaded: they become the
// reservation's spec.providerSelector, which the broker matches against the
// labels a provider cluster advertises, so providers must advertise them
// under these keys. The bridge's virtual node carries the provider's values
// of the same labels, so that the pod also matches it.
var ProviderSelectorLabels = []string{
	v1.LabelArchStable,     // kubernetes.io/arch
	v1.LabelOSStable,       // kubernetes.io/os
	v1.LabelTopologyRegion, // topology.kubernetes.io/region
	v1.LabelTopologyZone,   // topology.kubernetes.io/zone
	GPUProductLabel,        // nvidia.com/gpu.product
}

var providerSelectorLabels = sets.New(ProviderSelectorLabels...)

// ReservableResources are what a reservation holds (and a virtual node offers).
var ReservableResources = []v1.ResourceName{v1.ResourceCPU, v1.ResourceMemory, v1.ResourceEphemeralStorage, brokerv1alpha1.ResourceGPU}

var reservable = sets.New(ReservableResources...)

// ResourceShortageReasons are the NodeResourcesFit filter reasons that
// borrowing capacity fixes: too little cpu, memory, ephemeral storage or
// GPUs, or too many pods (the virtual node has its own pod capacity).
var ResourceShortageReasons = []string{
	"Insufficient " + string(v1.ResourceCPU),
	"Insufficient " + string(v1.ResourceMemory),
	"Insufficient " + string(v1.ResourceEphemeralStorage),
	"Insufficient " + string(brokerv1alpha1.ResourceGPU),
	"Too many pods",
}

var shortageReasons = sets.New(ResourceShortageReasons...)

// Reason and prefix of what the plugin tells about a pod it keeps here.
const (
	// EventNotOffloaded is the reason of the Warning Event on a pod that
	// fits no local node and is not offloaded.
	EventNotOffloaded = "NotOffloaded"
	// NotOffloadedPrefix starts the PostFilter message (and so the pod's
	// PodScheduled condition) of such a pod, followed by why.
	NotOffloadedPrefix = "not offloaded: "
	// reasonNoShortage: every local node rejects the pod for something other than resources.
	reasonNoShortage = "no local node is short only of resources (cpu, memory, ephemeral-storage, nvidia.com/gpu, pods); " +
		"the nodes reject the pod for other reasons, which more capacity would not fix"
)

// verdict is whether a pod may be offloaded, and to which providers.
type verdict struct {
	reason   string            // why not, "" when it may
	selector map[string]string // the reservation's provider selector
}

// eligible: the args and the pod's annotation let it be offloaded.
func (pl *ResourceBroker) eligible(pod *v1.Pod) bool { return pl.policyReason(pod) == "" }

// policyReason says why the args or the pod's annotation keep it here ("" when they do not).
func (pl *ResourceBroker) policyReason(pod *v1.Pod) string {
	switch {
	case pl.excluded.Has(pod.Namespace):
		return fmt.Sprintf("namespace %s is excluded (ResourceBroker args excludedNamespaces)", pod.Namespace)
	case pl.allowed != nil && !pl.allowed.Has(pod.Namespace):
		return fmt.Sprintf("namespace %s is not one of the namespaces offloaded (ResourceBroker args namespaces)", pod.Namespace)
	case !pl.selector.Matches(labels.Set(pod.Labels)):
		return fmt.Sprintf("the pod's labels do not match the ResourceBroker selector %q", pl.selector.String())
	}
	if v, ok := pod.Annotations[OffloadAnnotation]; ok {
		b, err := strconv.ParseBool(v)
		switch {
		case err != nil:
			return fmt.Sprintf("annotation %s is %q, neither \"true\" nor \"false\"", OffloadAnnotation, v)
		case !b:
			return fmt.Sprintf("annotation %s is %q", OffloadAnnotation, v)
		}
	}
	return ""
}

// offloadVerdict: whether the pod may be offloaded (rules 1 to 3), and the
// provider selector its reservation carries.
func (pl *ResourceBroker) offloadVerdict(pod *v1.Pod) verdict {
	if r := pl.policyReason(pod); r != "" {
		return verdict{reason: r}
	}
	if r := carriageReason(pod); r != "" {
		return verdict{reason: r}
	}
	sel, r := providerSelector(pod)
	return verdict{reason: r, selector: sel}
}

// carriageReason says why the bridge cannot carry the pod to another
// cluster ("" when it can): the first thing found, in the order below.
func carriageReason(pod *v1.Pod) string {
	for i := range pod.Spec.Volumes {
		if r := volumeReason(&pod.Spec.Volumes[i]); r != "" {
			return r
		}
	}
	switch {
	case pod.Spec.HostNetwork:
		return "uses the host's network namespace (hostNetwork)"
	case pod.Spec.HostPID:
		return "uses the host's PID namespace (hostPID)"
	case pod.Spec.HostIPC:
		return "uses the host's IPC namespace (hostIPC)"
	}
	containers := slices.Concat(pod.Spec.InitContainers, pod.Spec.Containers)
	for i := range containers {
		c := &containers[i]
		for _, p := range c.Ports {
			if p.HostPort != 0 {
				return fmt.Sprintf("uses host port %d (container %s)", p.HostPort, c.Name)
			}
		}
	}
	for i := range containers {
		if sc := containers[i].SecurityContext; sc != nil && sc.Privileged != nil && *sc.Privileged {
			return fmt.Sprintf("runs privileged container %s", containers[i].Name)
		}
	}
	for i := range pod.Spec.EphemeralContainers {
		if sc := pod.Spec.EphemeralContainers[i].SecurityContext; sc != nil && sc.Privileged != nil && *sc.Privileged {
			return fmt.Sprintf("runs privileged container %s", pod.Spec.EphemeralContainers[i].Name)
		}
	}
	if len(pod.Spec.ResourceClaims) > 0 {
		return fmt.Sprintf("uses resource claim %s (dynamic resource allocation), which is bound to this cluster", pod.Spec.ResourceClaims[0].Name)
	}
	var other []string
	for name, q := range PodRequests(pod) {
		if !reservable.Has(name) && q.Sign() > 0 {
			other = append(other, string(name))
		}
	}
	if len(other) > 0 {
		slices.Sort(other)
		return fmt.Sprintf("requests %s, which a broker reservation cannot hold (only cpu, memory, ephemeral-storage, nvidia.com/gpu)", strings.Join(other, ", "))
	}
	return ""
}

// volumeReason says why a volume keeps the pod here: its data or device
// belongs to this cluster or this node. emptyDir, configMap, secret,
// downwardAPI and projected volumes travel (the bridge copies the
// ConfigMaps and Secrets).
func volumeReason(vol *v1.Volume) string {
	src := &vol.VolumeSource
	switch {
	case src.EmptyDir != nil, src.ConfigMap != nil, src.Secret != nil, src.DownwardAPI != nil, src.Projected != nil:
		return ""
	case src.PersistentVolumeClaim != nil:
		return fmt.Sprintf("uses PersistentVolumeClaim data (claim %s, volume %s)", src.PersistentVolumeClaim.ClaimName, vol.Name)
	case src.Ephemeral != nil:
		return fmt.Sprintf("uses PersistentVolumeClaim data (generic ephemeral volume %s)", vol.Name)
	case src.HostPath != nil:
		return fmt.Sprintf("uses hostPath %s (volume %s)", src.HostPath.Path, vol.Name)
	}
	return fmt.Sprintf("uses a %s volume (%s), which the bridge does not carry", volumeType(src), vol.Name)
}

// volumeType is the JSON name of the source a volume sets, e.g. "nfs".
func volumeType(src *v1.VolumeSource) string {
	v := reflect.ValueOf(src).Elem()
	for i := 0; i < v.NumField(); i++ {
		if f := v.Field(i); f.Kind() == reflect.Pointer && !f.IsNil() {
			if name, _, _ := strings.Cut(v.Type().Field(i).Tag.Get("json"), ","); name != "" {
				return name
			}
			return v.Type().Field(i).Name
		}
	}
	return "unknown"
}

// providerSelector turns what the pod requires of its node (nodeSelector,
// required node affinity) into the reservation's provider selector, or says
// why it cannot: a label outside ProviderSelectorLabels (it names something
// of this cluster's nodes), anything but one value per label (the broker
// matches labels by equality), alternatives (several nodeSelectorTerms), or
// a match on node names.
func providerSelector(pod *v1.Pod) (map[string]string, string) {
	sel := map[string]string{}
	add := func(key, value, where string) string {
		if !providerSelectorLabels.Has(key) {
			return fmt.Sprintf("requires node label %s (%s), which providers do not advertise; only %s become broker selectors",
				key, where, strings.Join(ProviderSelectorLabels, ", "))
		}
		if prev, ok := sel[key]; ok && prev != value {
			return fmt.Sprintf("requires node label %s to be both %q and %q", key, prev, value)
		}
		sel[key] = value
		return ""
	}
	for _, key := range sortedKeys(pod.Spec.NodeSelector) {
		if r := add(key, pod.Spec.NodeSelector[key], "nodeSelector"); r != "" {
			return nil, r
		}
	}
	if a := pod.Spec.Affinity; a != nil && a.NodeAffinity != nil && a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution != nil {
		terms := a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms
		if len(terms) > 1 {
			return nil, fmt.Sprintf("has %d alternative required nodeSelectorTerms; a broker selector is one set of labels", len(terms))
		}
		for _, t := range terms {
			if len(t.MatchFields) > 0 {
				return nil, fmt.Sprintf("requires nodes by %s (required node affinity matchFields)", t.MatchFields[0].Key)
			}
			for _, e := range t.MatchExpressions {
				if e.Operator != v1.NodeSelectorOpIn || len(e.Values) != 1 {
					if !providerSelectorLabels.Has(e.Key) {
						return nil, add(e.Key, "", "required node affinity")
					}
					return nil, fmt.Sprintf("requires node label %s %s %v (required node affinity); a broker selector takes one value (operator In, one value)",
						e.Key, e.Operator, e.Values)
				}
				if r := add(e.Key, e.Values[0], "required node affinity"); r != "" {
					return nil, r
				}
			}
		}
	}
	if len(sel) == 0 {
		return nil, ""
	}
	return sel, ""
}

func sortedKeys(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// requiredAffinity is the pod's node selector and required node affinity,
// nil when it has neither.
func requiredAffinity(pod *v1.Pod) *nodeaffinity.RequiredNodeAffinity {
	a := pod.Spec.Affinity
	if len(pod.Spec.NodeSelector) == 0 && (a == nil || a.NodeAffinity == nil || a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution == nil) {
		return nil
	}
	r := nodeaffinity.GetRequiredNodeAffinity(pod)
	return &r
}

// admits: local node n takes the pod as far as everything but resources
// goes that PreFilter can tell from the node alone (the filters of
// NodeUnschedulable, NodeAffinity and TaintToleration); aff is the pod's
// requiredAffinity.
func (pl *ResourceBroker) admits(logger klog.Logger, pod *v1.Pod, aff *nodeaffinity.RequiredNodeAffinity, n *v1.Node) bool {
	if n.Spec.Unschedulable && !tolerates(logger, pod, &v1.Taint{Key: v1.TaintNodeUnschedulable, Effect: v1.TaintEffectNoSchedule}, pl.comparisonOperators) {
		return false
	}
	if _, untolerated := untoleratedTaint(logger, n, pod, pl.comparisonOperators); untolerated {
		return false
	}
	if aff != nil {
		if ok, _ := aff.Match(n); !ok {
			return false
		}
	}
	return true
}

// shortOfResources tells, from the filters' statuses, whether some local
// node rejected the pod for lack of resources only: NodeResourcesFit's
// status, every reason one of ResourceShortageReasons, and the node
// admitting the pod otherwise (the filters that run after NodeResourcesFit
// never saw that node; this plugin's, which runs last, is checked here).
func (pl *ResourceBroker) shortOfResources(logger klog.Logger, pod *v1.Pod, statuses fwk.NodeToStatusReader) bool {
	if statuses == nil {
		return false
	}
	nodes, err := pl.handle.SnapshotSharedLister().NodeInfos().List()
	if err != nil {
		return false
	}
	aff := requiredAffinity(pod)
	for _, ni := range nodes {
		n := ni.Node()
		if n == nil {
			continue
		}
		if _, virtual := virtualNodeProvider(n); virtual || !shortageStatus(statuses.Get(n.Name)) {
			continue
		}
		if pl.admits(logger, pod, aff, n) {
			return true
		}
	}
	return false
}

// shortageStatus: st is NodeResourcesFit's, for resources borrowing gives.
func shortageStatus(st *fwk.Status) bool {
	if st == nil || st.IsSuccess() || st.Plugin() != names.NodeResourcesFit || len(st.Reasons()) == 0 {
		return false
	}
	for _, r := range st.Reasons() {
		if !shortageReasons.Has(r) {
			return false
		}
	}
	return true
}

// notOffloaded is PostFilter's answer for a pod kept here: the message
// (which ends up in its PodScheduled condition) says why, and so does a
// Warning Event, once per pod and reason.
func (pl *ResourceBroker) notOffloaded(pod *v1.Pod, reason string) *fwk.Status {
	pl.mu.Lock()
	told := pl.told[pod.UID] == reason
	if !told {
		pl.told[pod.UID] = reason
	}
	pl.mu.Unlock()
	if !told {
		pl.handle.EventRecorder().Eventf(pod, nil, v1.EventTypeWarning, EventNotOffloaded, "Scheduling", "Not offloaded: %s", reason)
	}
	return fwk.NewStatus(fwk.Unschedulable, NotOffloadedPrefix+reason)
}
