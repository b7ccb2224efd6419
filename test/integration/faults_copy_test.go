package integration

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/tools/cache"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/fluidos-project/resource-broker/agent/bridge/virtualkubelet"
	"github.com/fluidos-project/resource-broker/internal/testbed"
	"github.com/fluidos-project/resource-broker/internal/testimages"
)

// TestFaultsEvictedCopy: a borrowed pod's copy evicted at the provider (the
// Eviction API, as a drain or an operator would) never shows its pod
// Succeeded, although the test app exits 0 on SIGTERM and paris's kubelet
// reports the copy so. One real-node bed (rome borrows from paris), short
// leases and eviction grace; every phase of rome's pods is recorded by an
// informer from before they exist.
func TestFaultsEvictedCopy(t *testing.T) {
	bed := testbed.Start(t, testbed.Options{RealNodes: true, Clusters: []testbed.ClusterSpec{testbed.RealRome, testbed.RealParis},
		AgentArgs: func(string) []string {
			return []string{"--lease-length=10s", "--lease-renew-interval=3s", "--hold-time=30s", "--eviction-grace=2s"}
		}})
	runScenarios(t, bed, []scenario{
		{"deployment", testEvictedCopyDeployment},
		{"job", testEvictedCopyJob},
		{"bare-pod", testEvictedCopyBarePod},
	})
}

// copyFaultApp is the test app's pod spec, 1.2 CPU (none fits rome's node),
// borrowed through rb-scheduler; it exits 0 on SIGTERM.
func copyFaultApp(policy corev1.RestartPolicy) corev1.PodSpec {
	return corev1.PodSpec{
		SchedulerName: "resource-broker", RestartPolicy: policy, TerminationGracePeriodSeconds: ptr.To[int64](5),
		Containers: []corev1.Container{{
			Name: "app", Image: testimages.TestApp, ImagePullPolicy: corev1.PullIfNotPresent,
			Ports:     []corev1.ContainerPort{{Name: "http", ContainerPort: 8080}},
			Resources: corev1.ResourceRequirements{Requests: requests("1200m", "64Mi"), Limits: requests("1200m", "64Mi")},
			ReadinessProbe: &corev1.Probe{ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/healthz", Port: intstrHTTP}},
				PeriodSeconds: 1},
		}},
	}
}

// podPhases records every phase and readiness each pod of a namespace was
// seen in (by UID), from an informer started before the pods exist.
type podPhases struct {
	mu    sync.Mutex
	names map[types.UID]string
	seen  map[types.UID][]string // "Running/ready", "Pending/not-ready", ...
}

func recordPodPhases(t *testing.T, c *testbed.Cluster, ns string) *podPhases {
	t.Helper()
	pp := &podPhases{names: map[types.UID]string{}, seen: map[types.UID][]string{}}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	f := informers.NewSharedInformerFactoryWithOptions(c.Clientset, 0, informers.WithNamespace(ns))
	inf := f.Core().V1().Pods().Informer()
	record := func(obj any) {
		p, ok := obj.(*corev1.Pod)
		if !ok {
			return
		}
		state := string(p.Status.Phase) + "/" + map[bool]string{true: "ready", false: "not-ready"}[podReady(p)]
		pp.mu.Lock()
		defer pp.mu.Unlock()
		pp.names[p.UID] = p.Name
		if s := pp.seen[p.UID]; len(s) == 0 || s[len(s)-1] != state {
			pp.seen[p.UID] = append(s, state)
		}
	}
	_, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{AddFunc: record, UpdateFunc: func(_, obj any) { record(obj) }})
	require.NoError(t, err)
	f.Start(ctx.Done())
	require.True(t, cache.WaitForCacheSync(ctx.Done(), inf.HasSynced))
	return pp
}

// of returns the states uid was seen in.
func (pp *podPhases) of(uid types.UID) []string {
	pp.mu.Lock()
	defer pp.mu.Unlock()
	return slices.Clone(pp.seen[uid])
}

// everSucceeded names the pods seen Succeeded.
func (pp *podPhases) everSucceeded() []string {
	pp.mu.Lock()
	defer pp.mu.Unlock()
	var out []string
	for uid, states := range pp.seen {
		for _, s := range states {
			if s == string(corev1.PodSucceeded)+"/not-ready" || s == string(corev1.PodSucceeded)+"/ready" {
				out = append(out, pp.names[uid])
			}
		}
	}
	return out
}

// evictCopy evicts the copy of pod at paris with the Eviction API and
// returns the evicted copy's UID.
func evictCopy(t *testing.T, paris *testbed.Cluster, pod *corev1.Pod) types.UID {
	t.Helper()
	cp := copyOf(t, paris, pod)
	require.Equal(t, corev1.PodRunning, cp.Status.Phase, "the copy runs")
	err := paris.Clientset.PolicyV1().Evictions(cp.Namespace).Evict(context.Background(),
		&policyv1.Eviction{ObjectMeta: metav1.ObjectMeta{Namespace: cp.Namespace, Name: cp.Name}})
	require.NoError(t, err)
	return cp.UID
}

// waitCopyGone waits until the evicted copy (uid) is no more at paris: its
// kubelet has stopped it and reported its last phase.
func waitCopyGone(t *testing.T, paris *testbed.Cluster, pod *corev1.Pod, uid types.UID) {
	t.Helper()
	eventually(t, 60*time.Second, "the evicted copy of "+pod.Name+" gone", func() (bool, string) {
		var cp corev1.Pod
		err := paris.Client.Get(context.Background(), client.ObjectKey{Namespace: "rb-rome", Name: virtualkubelet.RemoteName(pod.Namespace, pod.Name)}, &cp)
		if client.IgnoreNotFound(err) != nil {
			return false, err.Error()
		}
		return err != nil || cp.UID != uid, fmt.Sprintf("copy %s %s", cp.UID, cp.Status.Phase)
	})
}

// testEvictedCopyDeployment: the copy of a Deployment's pod (restart policy
// Always) evicted at paris is made anew for the same pod, which runs again,
// Ready; it is shown not ready meanwhile and never Succeeded or Failed.
func testEvictedCopyDeployment(t *testing.T, bed *testbed.Bed) {
	ctx := context.Background()
	rome, paris := bed.Cluster("rome"), bed.Cluster("paris")
	base := baseline(t, bed)
	const ns = "evict-deploy"
	newNamespace(t, rome, ns)
	phases := recordPodPhases(t, rome, ns)
	labels := map[string]string{"app": "web"}
	dep := &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "web"},
		Spec: appsv1.DeploymentSpec{Replicas: ptr.To[int32](1), Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels}, Spec: copyFaultApp(corev1.RestartPolicyAlways)}}}
	require.NoError(t, rome.Client.Create(ctx, dep))
	pod := copyFaultReadyPod(t, rome, ns, labels, "")
	evicted := evictCopy(t, paris, pod)
	t0 := time.Now()
	waitCopyGone(t, paris, pod, evicted)
	eventually(t, 60*time.Second, "a new copy of "+pod.Name+" Running at paris", func() (bool, string) {
		var cp corev1.Pod
		err := paris.Client.Get(ctx, client.ObjectKey{Namespace: "rb-rome", Name: virtualkubelet.RemoteName(ns, pod.Name)}, &cp)
		if err != nil {
			return false, err.Error()
		}
		return cp.UID != evicted && cp.Status.Phase == corev1.PodRunning && podReady(&cp), fmt.Sprintf("copy %s %s", cp.UID, cp.Status.Phase)
	})
	again := copyFaultReadyPod(t, rome, ns, labels, "")
	t.Logf("copy evicted -> the pod Ready again on a new copy: %s", time.Since(t0).Round(time.Millisecond))
	assert.Equal(t, pod.UID, again.UID, "the same pod, on a new copy")
	assert.NotEqual(t, evicted, copyOf(t, paris, again).UID, "a new copy")
	states := phases.of(pod.UID)
	t.Logf("%s went through %v", pod.Name, states)
	assert.NotContains(t, states, "Succeeded/not-ready")
	assert.NotContains(t, states, "Failed/not-ready")
	if i := slices.Index(states, "Running/ready"); assert.GreaterOrEqual(t, i, 0, "%v", states) {
		assert.True(t, slices.ContainsFunc(states[i+1:], func(s string) bool { return s == "Running/not-ready" || s == "Pending/not-ready" }),
			"not ready while its copy was replaced: %v", states)
	}
	var events corev1.EventList
	require.NoError(t, rome.Client.List(ctx, &events, client.InNamespace(ns)))
	assert.True(t, slices.ContainsFunc(events.Items, func(e corev1.Event) bool {
		return e.Reason == "ProviderPodRecreated" && e.InvolvedObject.UID == pod.UID
	}), "an Event says the copy was made anew")

	assert.Empty(t, phases.everSucceeded(), "no pod of the Deployment ever Succeeded")

	// Deleted here, a pod shows its copy's end as a kubelet shows its own.
	require.NoError(t, rome.Client.Delete(ctx, dep, client.PropagationPolicy(metav1.DeletePropagationBackground)))
	backToBaseline(t, bed, base, 90*time.Second)
}

// copyFaultReadyPod waits for the one pod of ns matching labels (other than
// uid "not") to be Running and Ready, and returns it.
func copyFaultReadyPod(t *testing.T, rome *testbed.Cluster, ns string, labels map[string]string, not types.UID) *corev1.Pod {
	t.Helper()
	var got *corev1.Pod
	eventually(t, 120*time.Second, "a pod of "+ns+" Running and Ready", func() (bool, string) {
		var pods corev1.PodList
		require.NoError(t, rome.Client.List(context.Background(), &pods, client.InNamespace(ns), client.MatchingLabels(labels)))
		msg := fmt.Sprintf("%d pods", len(pods.Items))
		for i := range pods.Items {
			p := &pods.Items[i]
			if p.UID == not {
				continue
			}
			msg += fmt.Sprintf("; %s %s ready=%v %s", p.Name, p.Status.Phase, podReady(p), podCondition(p))
			if p.Status.Phase == corev1.PodRunning && podReady(p) {
				got = p
				return true, ""
			}
		}
		return false, msg
	})
	return got
}

// testEvictedCopyJob: a Job's pod (restart policy Never) whose copy is
// evicted at paris fails (reason Evicted): the Job counts a failure, not a
// completion, and makes a new pod; that one's work completes for real (the
// test app asked to exit 0) and the Job is Complete with one success.
func testEvictedCopyJob(t *testing.T, bed *testbed.Bed) {
	ctx := context.Background()
	rome, paris := bed.Cluster("rome"), bed.Cluster("paris")
	base := baseline(t, bed)
	const ns = "evict-job"
	newNamespace(t, rome, ns)
	phases := recordPodPhases(t, rome, ns)
	job := &batchv1.Job{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "work"},
		Spec: batchv1.JobSpec{BackoffLimit: ptr.To[int32](3),
			Template: corev1.PodTemplateSpec{Spec: copyFaultApp(corev1.RestartPolicyNever)}}}
	require.NoError(t, rome.Client.Create(ctx, job))
	labels := map[string]string{batchv1.JobNameLabel: "work"}
	first := copyFaultReadyPod(t, rome, ns, labels, "")
	evicted := evictCopy(t, paris, first)

	eventually(t, 60*time.Second, "the evicted pod Failed", func() (bool, string) {
		var p corev1.Pod
		require.NoError(t, rome.Client.Get(ctx, client.ObjectKeyFromObject(first), &p))
		return p.Status.Phase == corev1.PodFailed, string(p.Status.Phase) + " " + p.Status.Reason
	})
	require.NoError(t, rome.Client.Get(ctx, client.ObjectKeyFromObject(first), first))
	assert.Equal(t, virtualkubelet.ReasonEvicted, first.Status.Reason)
	assert.Contains(t, first.Status.Message, "evicted on paris")
	waitCopyGone(t, paris, first, evicted)
	eventually(t, 30*time.Second, "the Job counts a failure", func() (bool, string) {
		require.NoError(t, rome.Client.Get(ctx, client.ObjectKeyFromObject(job), job))
		return job.Status.Failed == 1, fmt.Sprintf("succeeded %d failed %d", job.Status.Succeeded, job.Status.Failed)
	})
	assert.Zero(t, job.Status.Succeeded, "killed work is no completion")

	second := copyFaultReadyPod(t, rome, ns, labels, first.UID)
	resp, err := http.Post("http://"+second.Status.PodIP+":8080/exit?code=0", "text/plain", nil)
	require.NoError(t, err)
	_ = resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	eventually(t, 60*time.Second, "the Job Complete", func() (bool, string) {
		require.NoError(t, rome.Client.Get(ctx, client.ObjectKeyFromObject(job), job))
		for _, c := range job.Status.Conditions {
			if c.Type == batchv1.JobComplete && c.Status == corev1.ConditionTrue {
				return true, ""
			}
		}
		return false, fmt.Sprintf("succeeded %d failed %d", job.Status.Succeeded, job.Status.Failed)
	})
	assert.Equal(t, int32(1), job.Status.Succeeded)
	assert.Equal(t, int32(1), job.Status.Failed)
	t.Logf("evicted pod went through %v; the second %v", phases.of(first.UID), phases.of(second.UID))
	assert.NotContains(t, phases.of(first.UID), "Succeeded/not-ready", "the evicted pod was never Succeeded")
	assert.Equal(t, []string{second.Name}, phases.everSucceeded(), "only the pod whose work completed Succeeded")

	require.NoError(t, rome.Client.Delete(ctx, job, client.PropagationPolicy(metav1.DeletePropagationBackground)))
	backToBaseline(t, bed, base, 90*time.Second)
}

// testEvictedCopyBarePod: a pod of its own with restart policy Never whose
// copy is evicted at paris ends Failed, reason Evicted, with a Warning Event;
// it is never Succeeded, and no new copy is made.
func testEvictedCopyBarePod(t *testing.T, bed *testbed.Bed) {
	ctx := context.Background()
	rome, paris := bed.Cluster("rome"), bed.Cluster("paris")
	base := baseline(t, bed)
	const ns = "evict-bare"
	newNamespace(t, rome, ns)
	phases := recordPodPhases(t, rome, ns)
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "once", Labels: map[string]string{"app": "once"}},
		Spec: copyFaultApp(corev1.RestartPolicyNever)}
	require.NoError(t, rome.Client.Create(ctx, pod))
	pod = copyFaultReadyPod(t, rome, ns, pod.Labels, "")
	evicted := evictCopy(t, paris, pod)
	eventually(t, 60*time.Second, "the pod Failed", func() (bool, string) {
		require.NoError(t, rome.Client.Get(ctx, client.ObjectKeyFromObject(pod), pod))
		return pod.Status.Phase == corev1.PodFailed, string(pod.Status.Phase) + " " + pod.Status.Reason
	})
	assert.Equal(t, virtualkubelet.ReasonEvicted, pod.Status.Reason)
	assert.False(t, podReady(pod))
	waitCopyGone(t, paris, pod, evicted)
	var events corev1.EventList
	require.NoError(t, rome.Client.List(ctx, &events, client.InNamespace(ns)))
	assert.True(t, slices.ContainsFunc(events.Items, func(e corev1.Event) bool {
		return e.Reason == virtualkubelet.ReasonEvicted && e.Type == corev1.EventTypeWarning && e.InvolvedObject.UID == pod.UID
	}), "a Warning Event says why")
	states := phases.of(pod.UID)
	t.Logf("%s went through %v", pod.Name, states)
	assert.Equal(t, "Failed/not-ready", states[len(states)-1])
	assert.Empty(t, phases.everSucceeded())

	require.NoError(t, rome.Client.Delete(ctx, pod))
	backToBaseline(t, bed, base, 90*time.Second)
}
