package testbed

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// kueueGV is the version Kueue stores its objects at; kueueOldGV the one
// its conversion webhook converts them to and from.
var (
	kueueGV    = schema.GroupVersion{Group: "kueue.x-k8s.io", Version: "v1beta2"}
	kueueOldGV = schema.GroupVersion{Group: "kueue.x-k8s.io", Version: "v1beta1"}
)

func kueueObject(gv schema.GroupVersion, kind, ns, name string, spec map[string]any) *unstructured.Unstructured {
	u := &unstructured.Unstructured{Object: map[string]any{"spec": spec}}
	u.SetGroupVersionKind(gv.WithKind(kind))
	u.SetNamespace(ns)
	u.SetName(name)
	return u
}

// TestKueueAdmitsJobs: a bed of one requester cluster (stand-in nodes) with
// Kueue; a ClusterQueue of 1 CPU and 1Gi, a LocalQueue on it, and two Jobs
// that name it: the first (500m, 256Mi) is admitted and unsuspended, the
// second (800m) does not fit beside it and stays suspended, pending.
func TestKueueAdmitsJobs(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a test bed")
	}
	bed := Start(t, Options{Kueue: true, Clusters: []ClusterSpec{Rome}})
	rome := bed.Cluster("rome")
	require.NotNil(t, rome.Kueue)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	c := rome.Client

	require.NoError(t, c.Create(ctx, kueueObject(kueueGV, "ResourceFlavor", "", "default-flavor", map[string]any{})))
	require.NoError(t, c.Create(ctx, kueueObject(kueueGV, "ClusterQueue", "", "batch", map[string]any{
		"namespaceSelector": map[string]any{},
		"resourceGroups": []any{map[string]any{
			"coveredResources": []any{"cpu", "memory"},
			"flavors": []any{map[string]any{"name": "default-flavor", "resources": []any{
				map[string]any{"name": "cpu", "nominalQuota": "1"},
				map[string]any{"name": "memory", "nominalQuota": "1Gi"},
			}}},
		}},
	})))
	require.NoError(t, c.Create(ctx, kueueObject(kueueGV, "LocalQueue", metav1.NamespaceDefault, "team",
		map[string]any{"clusterQueue": "batch"})))

	// The conversion webhook answers: the ClusterQueue reads at v1beta1.
	old := &unstructured.Unstructured{}
	old.SetGroupVersionKind(kueueOldGV.WithKind("ClusterQueue"))
	require.NoError(t, c.Get(ctx, client.ObjectKey{Name: "batch"}, old))
	require.Equal(t, kueueOldGV.String(), old.GetAPIVersion())

	first := queuedJob("first", "500m")
	require.NoError(t, c.Create(ctx, first))
	require.True(t, ptr.Deref(first.Spec.Suspend, false), "Kueue's webhook suspends a Job that names a queue")
	wl := waitForWorkload(ctx, t, c, first, "Admitted", metav1.ConditionTrue)
	require.Equal(t, "batch", fmt.Sprint(wl.Object["status"].(map[string]any)["admission"].(map[string]any)["clusterQueue"]))
	require.Eventually(t, func() bool {
		var j batchv1.Job
		return c.Get(ctx, client.ObjectKeyFromObject(first), &j) == nil && !ptr.Deref(j.Spec.Suspend, true)
	}, time.Minute, 100*time.Millisecond, "Kueue unsuspends the admitted Job")

	second := queuedJob("second", "800m")
	require.NoError(t, c.Create(ctx, second))
	waitForWorkload(ctx, t, c, second, "QuotaReserved", metav1.ConditionFalse)
	var j batchv1.Job
	require.NoError(t, c.Get(ctx, client.ObjectKeyFromObject(second), &j))
	require.True(t, ptr.Deref(j.Spec.Suspend, false), "a Job beyond the ClusterQueue's quota stays suspended")
}

// queuedJob is a Job of one pod requesting cpu and 256Mi, in LocalQueue
// team, left for Kueue to suspend.
func queuedJob(name, cpu string) *batchv1.Job {
	return &batchv1.Job{
		ObjectMeta: metav1.ObjectMeta{Namespace: metav1.NamespaceDefault, Name: name,
			Labels: map[string]string{KueueQueueLabel: "team"}},
		Spec: batchv1.JobSpec{Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{
			RestartPolicy: corev1.RestartPolicyNever,
			Containers: []corev1.Container{{Name: "work", Image: "busybox", Command: []string{"true"},
				Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{
					corev1.ResourceCPU: resource.MustParse(cpu), corev1.ResourceMemory: resource.MustParse("256Mi")}}}},
		}}},
	}
}

// waitForWorkload waits for the Workload Kueue made for job to have
// condition cond at status, and returns it.
func waitForWorkload(ctx context.Context, t *testing.T, c client.Client, job *batchv1.Job, cond string, status metav1.ConditionStatus) *unstructured.Unstructured {
	t.Helper()
	var found *unstructured.Unstructured
	require.Eventually(t, func() bool {
		wls := &unstructured.UnstructuredList{}
		wls.SetGroupVersionKind(kueueGV.WithKind("WorkloadList"))
		if err := c.List(ctx, wls, client.InNamespace(job.Namespace)); err != nil {
			return false
		}
		for i := range wls.Items {
			wl := &wls.Items[i]
			owners := wl.GetOwnerReferences()
			if len(owners) != 1 || owners[0].UID != job.UID {
				continue
			}
			raw, _, _ := unstructured.NestedSlice(wl.Object, "status", "conditions")
			var conds []metav1.Condition
			for _, r := range raw {
				m, _ := r.(map[string]any)
				conds = append(conds, metav1.Condition{Type: fmt.Sprint(m["type"]), Status: metav1.ConditionStatus(fmt.Sprint(m["status"]))})
			}
			if meta.IsStatusConditionPresentAndEqual(conds, cond, status) {
				found = wl
				return true
			}
		}
		return false
	}, time.Minute, 100*time.Millisecond, "Workload of Job %s with %s=%s", job.Name, cond, status)
	return found
}

func TestKueueOptionRefusedWithoutRequester(t *testing.T) {
	b, err := New(context.Background(), Options{Dir: t.TempDir(), Kueue: true, Clusters: []ClusterSpec{Paris}})
	require.Nil(t, b)
	require.ErrorContains(t, err, "Options.Kueue runs Kueue in the requester clusters, and none is")
}

func TestCheckKueueSaysHowToBuildIt(t *testing.T) {
	t.Setenv(KueueBinEnv, t.TempDir())
	require.ErrorContains(t, CheckKueue("/nowhere"), `run "make kueue-bin"`)
}

func TestPointAtURL(t *testing.T) {
	wh := &unstructured.Unstructured{Object: map[string]any{"webhooks": []any{map[string]any{
		"name":         "mjob.kb.io",
		"clientConfig": map[string]any{"service": map[string]any{"name": "kueue-webhook-service", "namespace": "kueue-system", "path": "/mutate-batch-v1-job"}},
	}}}}
	wh.SetKind("MutatingWebhookConfiguration")
	require.NoError(t, pointAtURL(wh, "https://127.0.0.1:9443", []byte("CA")))
	cc := wh.Object["webhooks"].([]any)[0].(map[string]any)["clientConfig"]
	require.Equal(t, map[string]any{"url": "https://127.0.0.1:9443/mutate-batch-v1-job", "caBundle": "Q0E="}, cc)

	crd := &unstructured.Unstructured{Object: map[string]any{"spec": map[string]any{"conversion": map[string]any{
		"strategy": "Webhook", "webhook": map[string]any{"clientConfig": map[string]any{
			"service": map[string]any{"name": "kueue-webhook-service", "namespace": "kueue-system", "path": "/convert"}}}}}}}
	crd.SetKind("CustomResourceDefinition")
	require.NoError(t, pointAtURL(crd, "https://127.0.0.1:9443", []byte("CA")))
	cc, _, _ = unstructured.NestedMap(crd.Object, "spec", "conversion", "webhook", "clientConfig")
	require.Equal(t, map[string]any{"url": "https://127.0.0.1:9443/convert", "caBundle": "Q0E="}, cc)
}
