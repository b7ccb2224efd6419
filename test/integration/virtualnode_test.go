package integration

import (
	"testing"
	"time"

	"github.com/fluidos-project/resource-broker/internal/testbed"
)

// TestVirtualNode starts one real-node bed (rome requests, paris provides;
// metrics-server in both) and runs the virtual node's scenarios on it in
// turn: what cluster tools read from a node (metrics for kubectl top and the
// HPA, /stats/summary through the API server's node proxy), truthful pod
// status, and pods that reach a virtual node without a reservation. Each
// scenario leaves the bed as it found it.
func TestVirtualNode(t *testing.T) {
	bed := testbed.Start(t, testbed.Options{RealNodes: true, MetricsServer: true,
		Clusters: []testbed.ClusterSpec{testbed.RealRome, testbed.RealParis}})
	t.Logf("real-node bed with metrics-server up in %s (%s)", bed.Timings["total"].Round(time.Millisecond), timingsAll(bed))
	runScenarios(t, bed, []scenario{
		// virtualnode_metrics_test.go
		{"metrics", testVirtualNodeMetrics},
		{"hpa", testVirtualNodeHPA},
		// virtualnode_status_test.go
		{"status", testVirtualNodeStatus},
		{"unreserved", testVirtualNodeUnreserved},
		{"daemonset", testVirtualNodeDaemonSet},
		{"tenant-quota", testVirtualNodeTenantQuota},
	})
}
