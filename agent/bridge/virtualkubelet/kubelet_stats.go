package virtualkubelet

import (
	"time"

	dto "github.com/prometheus/client_model/go"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	statsv1alpha1 "k8s.io/kubelet/pkg/apis/stats/v1alpha1"
	"k8s.io/utils/ptr"
)

// The node's usage (metrics.go) in the kubelet's two formats: the Summary
// API (/stats/summary) and the resource metrics (/metrics/resource, what
// metrics-server reads). Only CPU and memory: metrics.k8s.io measures
// nothing else, so network, filesystem, swap and process figures are left
// out (nil), as a kubelet leaves out what its runtime does not report.

// statsSummary answers GET /stats/summary.
func (n *providerNode) statsSummary() *statsv1alpha1.Summary {
	n.mu.Lock()
	allocatable := n.capacityLocked()[corev1.ResourceMemory]
	n.mu.Unlock()
	return n.usageSnapshot().summary(n.name, n.started, uint64(max(allocatable.Value(), 0)))
}

// resourceMetrics answers GET /metrics/resource.
func (n *providerNode) resourceMetrics() []*dto.MetricFamily {
	return n.usageSnapshot().resourceMetrics()
}

// summary is the Summary of node (started at start, with allocatable bytes
// of memory): the node's figures, then one PodStats per pod, named as the
// local pod. Memory usage is the working set (metrics.k8s.io has no other
// figure); the node's available memory is allocatable minus it.
func (s *usageSnapshot) summary(node string, start time.Time, allocatable uint64) *statsv1alpha1.Summary {
	at := metav1.NewTime(s.time)
	out := &statsv1alpha1.Summary{
		Node: statsv1alpha1.NodeStats{
			NodeName:  node,
			StartTime: metav1.NewTime(start),
			CPU:       cpuStats(at, s.nanoCores, s.coreNanoSeconds),
			Memory:    memoryStats(at, s.workingSet),
		},
		Pods: make([]statsv1alpha1.PodStats, 0, len(s.pods)),
	}
	out.Node.Memory.AvailableBytes = ptr.To(allocatable - min(allocatable, s.workingSet))
	for _, p := range s.pods {
		pt := metav1.NewTime(p.time)
		ps := statsv1alpha1.PodStats{
			PodRef:     statsv1alpha1.PodReference{Name: p.name, Namespace: p.namespace, UID: string(p.uid)},
			StartTime:  metav1.NewTime(p.start),
			Containers: make([]statsv1alpha1.ContainerStats, 0, len(p.containers)),
			CPU:        cpuStats(pt, p.nanoCores, p.coreNanoSeconds),
			Memory:     memoryStats(pt, p.workingSet),
		}
		for _, c := range p.containers {
			ct := metav1.NewTime(c.time)
			ps.Containers = append(ps.Containers, statsv1alpha1.ContainerStats{
				Name: c.name, StartTime: metav1.NewTime(c.start),
				CPU: cpuStats(ct, c.nanoCores, c.coreNanoSeconds), Memory: memoryStats(ct, c.workingSet),
			})
		}
		out.Pods = append(out.Pods, ps)
	}
	return out
}

func cpuStats(at metav1.Time, nanoCores, coreNanoSeconds uint64) *statsv1alpha1.CPUStats {
	return &statsv1alpha1.CPUStats{Time: at, UsageNanoCores: ptr.To(nanoCores), UsageCoreNanoSeconds: ptr.To(coreNanoSeconds)}
}

func memoryStats(at metav1.Time, workingSet uint64) *statsv1alpha1.MemoryStats {
	return &statsv1alpha1.MemoryStats{Time: at, WorkingSetBytes: ptr.To(workingSet), UsageBytes: ptr.To(workingSet)}
}

// The kubelet's resource metrics (k8s.io/kubernetes
// pkg/kubelet/metrics/collectors/resource_metrics.go, v1.35): names, help
// (with the stability level component-base puts first), types, labels.
// scrape_error is not served: deprecated in 1.29, a 1.35 kubelet hides it.
// Swap families are left out (no figure for them).
var (
	containerCPUFamily = family("container_cpu_usage_seconds_total",
		"[STABLE] Cumulative cpu time consumed by the container in core-seconds", dto.MetricType_COUNTER)
	containerMemoryFamily = family("container_memory_working_set_bytes",
		"[STABLE] Current working set of the container in bytes", dto.MetricType_GAUGE)
	containerStartFamily = family("container_start_time_seconds",
		"[STABLE] Start time of the container since unix epoch in seconds", dto.MetricType_GAUGE)
	nodeCPUFamily = family("node_cpu_usage_seconds_total",
		"[STABLE] Cumulative cpu time consumed by the node in core-seconds", dto.MetricType_COUNTER)
	nodeMemoryFamily = family("node_memory_working_set_bytes",
		"[STABLE] Current working set of the node in bytes", dto.MetricType_GAUGE)
	podCPUFamily = family("pod_cpu_usage_seconds_total",
		"[STABLE] Cumulative cpu time consumed by the pod in core-seconds", dto.MetricType_COUNTER)
	podMemoryFamily = family("pod_memory_working_set_bytes",
		"[STABLE] Current working set of the pod in bytes", dto.MetricType_GAUGE)
	scrapeErrorFamily = family("resource_scrape_error",
		"[STABLE] 1 if there was an error while getting container metrics, 0 otherwise", dto.MetricType_GAUGE)
)

func family(name, help string, typ dto.MetricType) *dto.MetricFamily {
	return &dto.MetricFamily{Name: ptr.To(name), Help: ptr.To(help), Type: typ.Enum()}
}

// resourceMetrics is the snapshot as the kubelet's /metrics/resource: the
// families by name (as the kubelet's registry sorts them), their series by
// pod; samples carry their measurement time (milliseconds), the start times
// and the error gauge none, as the kubelet's.
func (s *usageSnapshot) resourceMetrics() []*dto.MetricFamily {
	containers := 0
	for _, p := range s.pods {
		containers += len(p.containers)
	}
	fams := map[*dto.MetricFamily][]*dto.Metric{}
	for _, f := range []*dto.MetricFamily{containerCPUFamily, containerMemoryFamily, containerStartFamily} {
		fams[f] = make([]*dto.Metric, 0, containers)
	}
	for _, f := range []*dto.MetricFamily{podCPUFamily, podMemoryFamily} {
		fams[f] = make([]*dto.Metric, 0, len(s.pods))
	}
	// One allocation for all the label pairs and one for the metrics.
	pairs := make([]dto.LabelPair, 0, 3*containers+2*len(s.pods))
	metrics := make([]dto.Metric, 0, 3*containers+2*len(s.pods)+3)
	values := make([]float64, 0, cap(metrics))
	metric := func(f *dto.MetricFamily, labels []*dto.LabelPair, v float64, at time.Time, counter bool) {
		values = append(values, v)
		metrics = append(metrics, dto.Metric{Label: labels})
		m := &metrics[len(metrics)-1]
		if counter {
			m.Counter = &dto.Counter{Value: &values[len(values)-1]}
		} else {
			m.Gauge = &dto.Gauge{Value: &values[len(values)-1]}
		}
		if !at.IsZero() {
			m.TimestampMs = ptr.To(at.UnixMilli())
		}
		fams[f] = append(fams[f], m)
	}
	label := func(name, value string) *dto.LabelPair {
		pairs = append(pairs, dto.LabelPair{Name: ptr.To(name), Value: ptr.To(value)})
		return &pairs[len(pairs)-1]
	}
	for _, p := range s.pods {
		ns, pod := label("namespace", p.namespace), label("pod", p.name)
		for _, c := range p.containers {
			l := []*dto.LabelPair{label("container", c.name), ns, pod}
			metric(containerCPUFamily, l, seconds(c.coreNanoSeconds), c.time, true)
			metric(containerMemoryFamily, l, float64(c.workingSet), c.time, false)
			if c.start.Unix() > 0 {
				metric(containerStartFamily, l, float64(c.start.UnixNano())/1e9, time.Time{}, false)
			}
		}
		l := []*dto.LabelPair{ns, pod}
		metric(podCPUFamily, l, seconds(p.coreNanoSeconds), p.time, true)
		metric(podMemoryFamily, l, float64(p.workingSet), p.time, false)
	}
	metric(nodeCPUFamily, nil, seconds(s.coreNanoSeconds), s.time, true)
	metric(nodeMemoryFamily, nil, float64(s.workingSet), s.time, false)
	scrapeError := 0.0
	if s.failed {
		scrapeError = 1
	}
	metric(scrapeErrorFamily, nil, scrapeError, time.Time{}, false)

	out := make([]*dto.MetricFamily, 0, 8)
	for _, f := range []*dto.MetricFamily{containerCPUFamily, containerMemoryFamily, containerStartFamily,
		nodeCPUFamily, nodeMemoryFamily, podCPUFamily, podMemoryFamily, scrapeErrorFamily} {
		if len(fams[f]) > 0 {
			out = append(out, &dto.MetricFamily{Name: f.Name, Help: f.Help, Type: f.Type, Metric: fams[f]})
		}
	}
	return out
}

// seconds of core time, from nanoseconds.
func seconds(coreNanoSeconds uint64) float64 { return float64(coreNanoSeconds) / float64(time.Second) }
