package integration

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/fluidos-project/resource-broker/internal/testbed"
	"github.com/fluidos-project/resource-broker/internal/testimages"
)

// TestBatch: the batch Jobs users run borrow like any pod. On one real-node
// bed (rome's one node holds 1 CPU; kube-controller-manager's Job
// controller; Kueue in rome): a Job of parallel pods and an indexed Job
// complete with some of their pods borrowed, a failing pod's retry is
// borrowed again and both attempts read Failed, and a Kueue-admitted Job
// completes with its pods borrowed. Each leaves no reservation behind.
func TestBatch(t *testing.T) {
	bed := testbed.Start(t, testbed.Options{RealNodes: true, Kueue: true, Clusters: []testbed.ClusterSpec{testbed.RealRome, testbed.RealParis}})
	t.Logf("batch bed up in %s", bed.Timings["total"].Round(time.Millisecond))
	runScenarios(t, bed, []scenario{
		{"job", testBatchJob},
		{"indexed", testBatchIndexed},
		{"retry", testBatchRetry},
		{"kueue", testBatchKueue},
	})
}

// batchJob is a Job of parallel pods of 400m (rome's node holds two) that
// work for secs seconds each, scheduled by rb-scheduler.
func batchJob(ns, name string, pods int32, cpu string, args ...string) *batchv1.Job {
	return &batchv1.Job{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: batchv1.JobSpec{
			Completions: ptr.To(pods), Parallelism: ptr.To(pods), BackoffLimit: ptr.To[int32](0),
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"job": name}},
				Spec: corev1.PodSpec{
					SchedulerName: "resource-broker", RestartPolicy: corev1.RestartPolicyNever,
					TerminationGracePeriodSeconds: ptr.To[int64](5),
					Containers: []corev1.Container{{
						Name: "work", Image: testimages.TestApp, ImagePullPolicy: corev1.PullIfNotPresent,
						Command:   append([]string{"/testapp"}, args...),
						Resources: corev1.ResourceRequirements{Requests: requests(cpu, "64Mi"), Limits: requests(cpu, "64Mi")},
					}},
				},
			},
		},
	}
}

// jobDone waits for the Job's condition (Complete or Failed) and returns
// its pods.
func jobDone(t *testing.T, c *testbed.Cluster, job *batchv1.Job, cond batchv1.JobConditionType, timeout time.Duration) []corev1.Pod {
	t.Helper()
	ctx := context.Background()
	eventually(t, timeout, fmt.Sprintf("Job %s %s", job.Name, cond), func() (bool, string) {
		var j batchv1.Job
		require.NoError(t, c.Client.Get(ctx, client.ObjectKeyFromObject(job), &j))
		for _, jc := range j.Status.Conditions {
			if jc.Type == cond && jc.Status == corev1.ConditionTrue {
				return true, ""
			}
		}
		return false, fmt.Sprintf("active %d, succeeded %d, failed %d, conditions %v", j.Status.Active, j.Status.Succeeded, j.Status.Failed, j.Status.Conditions)
	})
	var pods corev1.PodList
	require.NoError(t, c.Client.List(ctx, &pods, client.InNamespace(job.Namespace), client.MatchingLabels{"job": job.Name}))
	return pods.Items
}

// borrowedCount counts the pods that ran on a virtual node (rb-<provider>):
// each was bound there on a reservation won at the broker.
func borrowedCount(pods []corev1.Pod) (borrowed int, where []string) {
	for _, p := range pods {
		where = append(where, fmt.Sprintf("%s@%s:%s", p.Name, p.Spec.NodeName, p.Status.Phase))
		if strings.HasPrefix(p.Spec.NodeName, "rb-") {
			borrowed++
		}
	}
	return borrowed, where
}

// exitCode is the exit code of the pod's container (-1: not terminated).
func exitCode(p *corev1.Pod) int32 {
	for _, cs := range p.Status.ContainerStatuses {
		if cs.State.Terminated != nil {
			return cs.State.Terminated.ExitCode
		}
	}
	return -1
}

// testBatchJob: 4 parallel pods of 400m working 6 s: two run at home, two
// are borrowed; the Job completes and every pod Succeeded, from its
// container's exit at home or at paris.
func testBatchJob(t *testing.T, bed *testbed.Bed) {
	rome := bed.Cluster("rome")
	base := baseline(t, bed)
	const ns = "batch-job"
	newNamespace(t, rome, ns)
	job := batchJob(ns, "crunch", 4, "400m", "sleep", "6")
	require.NoError(t, rome.Client.Create(context.Background(), job))
	pods := jobDone(t, rome, job, batchv1.JobComplete, 120*time.Second)
	borrowed, where := borrowedCount(pods)
	assert.GreaterOrEqual(t, borrowed, 2, "pods that did not fit at home were borrowed: %v", where)
	for i := range pods {
		assert.Equal(t, corev1.PodSucceeded, pods[i].Status.Phase, where)
		assert.Equal(t, int32(0), exitCode(&pods[i]), "%s: its container's exit", pods[i].Name)
	}
	figure(t, "4 pods: %d borrowed, %v", borrowed, where)
	cleanJob(t, bed, rome, job, base)
}

// testBatchIndexed: an indexed Job of 3 pods of 600m (rome's node holds
// one): each index completes once, two of them at a provider.
func testBatchIndexed(t *testing.T, bed *testbed.Bed) {
	rome := bed.Cluster("rome")
	base := baseline(t, bed)
	const ns = "batch-indexed"
	newNamespace(t, rome, ns)
	job := batchJob(ns, "shards", 3, "600m", "sleep", "6")
	job.Spec.CompletionMode = ptr.To(batchv1.IndexedCompletion)
	require.NoError(t, rome.Client.Create(context.Background(), job))
	pods := jobDone(t, rome, job, batchv1.JobComplete, 120*time.Second)
	borrowed, where := borrowedCount(pods)
	assert.GreaterOrEqual(t, borrowed, 2, where)
	indexes := map[string]int{}
	for _, p := range pods {
		if p.Status.Phase == corev1.PodSucceeded {
			indexes[p.Annotations[batchv1.JobCompletionIndexAnnotation]]++
		}
	}
	assert.Equal(t, map[string]int{"0": 1, "1": 1, "2": 1}, indexes, "each index completed once: %v", where)
	cleanJob(t, bed, rome, job, base)
}

// testBatchRetry: a Job whose one pod (1500m: never at home) fails, with one
// retry: the retry is a new pod, borrowed through the broker again, and
// both attempts read Failed with their container's exit code 3, never
// Succeeded; the Job Failed; nothing stays reserved.
func testBatchRetry(t *testing.T, bed *testbed.Bed) {
	rome := bed.Cluster("rome")
	base := baseline(t, bed)
	const ns = "batch-retry"
	newNamespace(t, rome, ns)
	job := batchJob(ns, "flaky", 1, "1500m", "exit", "3")
	job.Spec.BackoffLimit = ptr.To[int32](1)
	require.NoError(t, rome.Client.Create(context.Background(), job))
	pods := jobDone(t, rome, job, batchv1.JobFailed, 180*time.Second)
	borrowed, where := borrowedCount(pods)
	require.Len(t, pods, 2, "the pod and its retry: %v", where)
	assert.Equal(t, 2, borrowed, "each attempt borrowed: %v", where)
	for i := range pods {
		assert.Equal(t, corev1.PodFailed, pods[i].Status.Phase, where)
		assert.Equal(t, int32(3), exitCode(&pods[i]), "%s: its container's exit at the provider", pods[i].Name)
	}
	cleanJob(t, bed, rome, job, base)
}

var kueueGV = schema.GroupVersion{Group: "kueue.x-k8s.io", Version: "v1beta2"}

func kueueObject(kind, ns, name string, spec map[string]any) *unstructured.Unstructured {
	u := &unstructured.Unstructured{Object: map[string]any{"spec": spec}}
	u.SetGroupVersionKind(kueueGV.WithKind(kind))
	u.SetNamespace(ns)
	u.SetName(name)
	return u
}

// testBatchKueue: a Job in a Kueue LocalQueue whose ClusterQueue's quota (4
// CPU) is more than rome holds (Kueue's quota is a budget, not capacity):
// Kueue's webhook suspends it, Kueue admits it, and its 3 pods of 400m
// complete, at least one borrowed.
func testBatchKueue(t *testing.T, bed *testbed.Bed) {
	ctx := context.Background()
	rome := bed.Cluster("rome")
	base := baseline(t, bed)
	const ns = "batch-kueue"
	newNamespace(t, rome, ns)
	require.NoError(t, rome.Client.Create(ctx, kueueObject("ResourceFlavor", "", "borrowable", map[string]any{})))
	require.NoError(t, rome.Client.Create(ctx, kueueObject("ClusterQueue", "", "burst", map[string]any{
		"namespaceSelector": map[string]any{},
		"resourceGroups": []any{map[string]any{
			"coveredResources": []any{"cpu", "memory"},
			"flavors": []any{map[string]any{"name": "borrowable", "resources": []any{
				map[string]any{"name": "cpu", "nominalQuota": "4"},
				map[string]any{"name": "memory", "nominalQuota": "4Gi"},
			}}},
		}},
	})))
	require.NoError(t, rome.Client.Create(ctx, kueueObject("LocalQueue", ns, "team", map[string]any{"clusterQueue": "burst"})))

	job := batchJob(ns, "queued", 3, "400m", "sleep", "6")
	job.Labels = map[string]string{testbed.KueueQueueLabel: "team"}
	eventually(t, 30*time.Second, "the Job created (the LocalQueue known to Kueue's webhook)", func() (bool, string) {
		err := rome.Client.Create(ctx, job)
		return err == nil, fmt.Sprint(err)
	})
	assert.True(t, ptr.Deref(job.Spec.Suspend, false), "Kueue's webhook suspends a Job that names a queue")
	pods := jobDone(t, rome, job, batchv1.JobComplete, 120*time.Second)
	borrowed, where := borrowedCount(pods)
	assert.GreaterOrEqual(t, borrowed, 1, where)
	for i := range pods {
		assert.Equal(t, corev1.PodSucceeded, pods[i].Status.Phase, where)
	}
	wls := &unstructured.UnstructuredList{}
	wls.SetGroupVersionKind(kueueGV.WithKind("WorkloadList"))
	require.NoError(t, rome.Client.List(ctx, wls, client.InNamespace(ns)))
	require.Len(t, wls.Items, 1)
	admitted := false
	conds, _, _ := unstructured.NestedSlice(wls.Items[0].Object, "status", "conditions")
	for _, c := range conds {
		if m, ok := c.(map[string]any); ok && m["type"] == "Admitted" {
			admitted = true
		}
	}
	assert.True(t, admitted, "the Job ran on Kueue's admission: %v", conds)
	figure(t, "Kueue-admitted Job of 3: %d borrowed, %v", borrowed, where)
	cleanJob(t, bed, rome, job, base)
}

// cleanJob deletes the Job and its pods, then checks that nothing is
// reserved and the broker's numbers are back where they were.
func cleanJob(t *testing.T, bed *testbed.Bed, c *testbed.Cluster, job *batchv1.Job, base testbed.Capacity) {
	t.Helper()
	waitNoLive(t, bed, 60*time.Second)
	require.NoError(t, c.Client.Delete(context.Background(), job, client.PropagationPolicy(metav1.DeletePropagationForeground)))
	waitNoPodOrReservation(t, c, job.Namespace, 60*time.Second)
	backToBaseline(t, bed, base, 60*time.Second)
}
