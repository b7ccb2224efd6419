package resourcebroker

import (
	"context"
	"fmt"
	"testing"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/sets"
	fwk "k8s.io/kube-scheduler/framework"
	"k8s.io/kubernetes/pkg/scheduler/framework"
	plfeature "k8s.io/kubernetes/pkg/scheduler/framework/plugins/feature"
	"k8s.io/kubernetes/pkg/scheduler/framework/plugins/tainttoleration"
)

// BenchmarkFilterPerPod isolates what the plugin adds to one scheduling
// attempt of a pod without a reservation (the locally-fitting case): one op
// is PreFilter plus Filter on 100 worker nodes, with TaintToleration's
// Filter (what the plugin replaces in its profile) as the reference. No API
// server: this is the plugin's own CPU cost.
//
//	go test -run '^$' -bench FilterPerPod ./plugins/resourcebroker/
func BenchmarkFilterPerPod(b *testing.B) {
	ctx := context.Background()
	// As in the throughput benchmark: 100m / 128Mi pods, 32-CPU / 128Gi workers.
	pod := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "p", UID: "p1", Labels: map[string]string{"app": "web"}},
		Spec: v1.PodSpec{Containers: []v1.Container{{Name: "c", Resources: v1.ResourceRequirements{Requests: v1.ResourceList{
			v1.ResourceCPU: resource.MustParse("100m"), v1.ResourceMemory: resource.MustParse("128Mi")}}}}}}
	size := v1.ResourceList{v1.ResourceCPU: resource.MustParse("32"), v1.ResourceMemory: resource.MustParse("128Gi"), v1.ResourcePods: resource.MustParse("110")}
	nodes := func(tainted bool) []fwk.NodeInfo {
		var out []fwk.NodeInfo
		for i := 0; i < 100; i++ {
			n := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("worker-%03d", i)}, Status: v1.NodeStatus{Capacity: size, Allocatable: size}}
			if tainted && i == 0 {
				n.Spec.Taints = []v1.Taint{{Key: "node-role.kubernetes.io/control-plane", Effect: v1.TaintEffectNoSchedule}}
			}
			ni := framework.NewNodeInfo()
			ni.SetNode(n)
			out = append(out, ni)
		}
		return out
	}
	tt, err := tainttoleration.New(ctx, nil, nil, plfeature.Features{EnableSchedulingQueueHint: true})
	if err != nil {
		b.Fatal(err)
	}
	taintFilter := tt.(fwk.FilterPlugin)

	for _, tainted := range []bool{false, true} {
		ns := nodes(tainted)
		b.Run(fmt.Sprintf("TaintToleration/tainted-node=%v", tainted), func(b *testing.B) {
			b.ReportAllocs()
			for i := 0; i < b.N; i++ {
				state := framework.NewCycleState()
				for _, ni := range ns {
					if s := taintFilter.Filter(ctx, state, pod, ni); !s.IsSuccess() && !tainted {
						b.Fatal(s)
					}
				}
			}
		})
		b.Run(fmt.Sprintf("ResourceBroker/tainted-node=%v", tainted), func(b *testing.B) {
			pl := benchPlugin(b, ns)
			b.ReportAllocs()
			for i := 0; i < b.N; i++ {
				state := framework.NewCycleState()
				_, s := pl.PreFilter(ctx, state, pod, ns)
				if s.IsSkip() {
					continue
				}
				for _, ni := range ns {
					pl.Filter(ctx, state, pod, ni)
				}
			}
		})
	}
}

func benchPlugin(b *testing.B, nodes []fwk.NodeInfo) *ResourceBroker {
	b.Helper()
	pl := testPlugin(b)
	args, err := DecodeArgs(nil)
	if err != nil {
		b.Fatal(err)
	}
	pl.args = args
	pl.selector = labels.Everything()
	pl.excluded = sets.New[string]()
	for _, ni := range nodes {
		pl.nodes.set(ni.Node())
	}
	return pl
}
