package liqo_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	authv1beta1 "github.com/liqotech/liqo/apis/authentication/v1beta1"
	liqov1beta1 "github.com/liqotech/liqo/apis/core/v1beta1"
	offloadingv1beta1 "github.com/liqotech/liqo/apis/offloading/v1beta1"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/fluidos-project/resource-broker/agent/bridge"
	"github.com/fluidos-project/resource-broker/agent/bridge/internal/bridgetest"
	"github.com/fluidos-project/resource-broker/agent/bridge/internal/rsvstatus"
	"github.com/fluidos-project/resource-broker/agent/bridge/liqo"
	rbv1 "github.com/fluidos-project/resource-broker/api/v1alpha1"
	"github.com/fluidos-project/resource-broker/internal/testenv"
)

// liqoCRDs is the directory of Liqo's CRDs in the module cache (the version
// go.mod pins), so that the test runs against Liqo's real API.
func liqoCRDs(t *testing.T) string {
	t.Helper()
	out, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", "github.com/liqotech/liqo").Output()
	if err != nil {
		t.Fatalf("locating the Liqo module (go list -m github.com/liqotech/liqo): %v; is the module downloaded (go mod download)?", err)
	}
	dir := filepath.Join(strings.TrimSpace(string(out)), "deployments", "liqo", "charts", "liqo-crds", "crds")
	if fi, err := os.Stat(dir); err != nil || !fi.IsDir() {
		t.Fatalf("Liqo's CRDs are not at %s: %v", dir, err)
	}
	return dir
}

func newScheme() *runtime.Scheme {
	s := runtime.NewScheme()
	_ = clientgoscheme.AddToScheme(s)
	_ = rbv1.AddToScheme(s)
	return s
}

// TestLiqo: the Liqo bridge against Liqo's real CRDs; the test plays the
// reservation reconciler (Reservation status) and the provider's Liqo (the
// slice's conditions, the VirtualNode and its Node).
func TestLiqo(t *testing.T) {
	ctx := context.Background()
	testScheme := newScheme()
	require.NoError(t, authv1beta1.AddToScheme(testScheme))
	require.NoError(t, offloadingv1beta1.AddToScheme(testScheme))
	rome := bridgetest.Start(t, "rome", bridgetest.Options{
		CRDDirs: []string{testenv.ModulePath(t, "manifests", "crds"), liqoCRDs(t)}, Scheme: testScheme})
	c := rome.Client
	require.NoError(t, c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "liqo-tenant-paris"}}))

	mgr, err := ctrl.NewManager(rome.Config, ctrl.Options{
		Scheme: newScheme(), Metrics: metricsserver.Options{BindAddress: "0"}, HealthProbeBindAddress: "0",
		Controller: config.Controller{SkipNameValidation: ptr.To(true)},
		Logger:     bridgetest.Logger(t, 0),
	})
	require.NoError(t, err)
	br, err := bridge.New(bridge.ModeLiqo, bridge.Options{ClusterID: "rome", Log: bridgetest.Logger(t, 1)})
	require.NoError(t, err)
	require.NoError(t, br.SetupWithManager(mgr))
	mctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- mgr.Start(mctx) }()
	t.Cleanup(func() {
		cancel()
		assert.NoError(t, <-done)
	})

	// reserve plays the reservation reconciler: the broker reserved on provider.
	reserve := func(t *testing.T, name, provider string, resources corev1.ResourceList) *rbv1.Reservation {
		rsv := &rbv1.Reservation{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"}, Spec: rbv1.ReservationSpec{Resources: resources}}
		require.NoError(t, c.Create(ctx, rsv))
		rsv.Status = rbv1.ReservationStatus{Phase: rbv1.ReservationReserved, Provider: provider, ReservationID: string(rsv.UID)}
		require.NoError(t, c.Status().Update(ctx, rsv))
		return rsv
	}
	sliceOf := func(t *testing.T, rsv *rbv1.Reservation) *authv1beta1.ResourceSlice {
		var slice authv1beta1.ResourceSlice
		require.EventuallyWithT(t, func(ct *assert.CollectT) {
			require.NoError(ct, c.Get(ctx, types.NamespacedName{Namespace: "liqo-tenant-" + rsv.Status.Provider, Name: liqo.SliceName(rsv)}, &slice))
		}, 10*time.Second, 10*time.Millisecond)
		return &slice
	}
	waitCondition := func(t *testing.T, rsv *rbv1.Reservation, status metav1.ConditionStatus, reason string) *rbv1.Reservation {
		var got rbv1.Reservation
		require.EventuallyWithT(t, func(ct *assert.CollectT) {
			require.NoError(ct, c.Get(ctx, client.ObjectKeyFromObject(rsv), &got))
			cond := meta.FindStatusCondition(got.Status.Conditions, rsvstatus.ConditionVirtualNode)
			require.NotNil(ct, cond, "%+v", got.Status)
			assert.Equal(ct, status, cond.Status, "%+v", cond)
			assert.Equal(ct, reason, cond.Reason, "%+v", cond)
		}, 10*time.Second, 10*time.Millisecond)
		return &got
	}
	setSliceConditions := func(t *testing.T, slice *authv1beta1.ResourceSlice, resources authv1beta1.ResourceSliceConditionStatus, msg string) {
		now := metav1.Now()
		slice.Status.Conditions = []authv1beta1.ResourceSliceCondition{
			{Type: authv1beta1.ResourceSliceConditionTypeAuthentication, Status: authv1beta1.ResourceSliceConditionAccepted, LastTransitionTime: now},
			{Type: authv1beta1.ResourceSliceConditionTypeResources, Status: resources, LastTransitionTime: now, Message: msg},
		}
		if resources == authv1beta1.ResourceSliceConditionAccepted {
			slice.Status.Resources = slice.Spec.Resources.DeepCopy()
			slice.Status.Resources[corev1.ResourcePods] = resource.MustParse("110")
		}
		require.NoError(t, c.Status().Update(ctx, slice))
	}
	var web *rbv1.Reservation
	var webSlice *authv1beta1.ResourceSlice

	t.Run("reserved: a ResourceSlice sized to the reservation, asking for a virtual node", func(t *testing.T) {
		web = reserve(t, "web", "paris", corev1.ResourceList{
			corev1.ResourceCPU: resource.MustParse("2"), corev1.ResourceMemory: resource.MustParse("4Gi"), "nvidia.com/gpu": resource.MustParse("1")})
		webSlice = sliceOf(t, web)
		assert.Equal(t, "paris", string(ptr.Deref(webSlice.Spec.ProviderClusterID, "")))
		assert.Equal(t, authv1beta1.ResourceSliceClassDefault, webSlice.Spec.Class)
		assert.True(t, webSlice.Spec.Resources.Cpu().Equal(resource.MustParse("2")))
		assert.True(t, webSlice.Spec.Resources.Memory().Equal(resource.MustParse("4Gi")))
		assert.True(t, ptr.To(webSlice.Spec.Resources["nvidia.com/gpu"]).Equal(resource.MustParse("1")))
		assert.Equal(t, "paris", webSlice.Labels["liqo.io/remote-cluster-id"])
		assert.Equal(t, "true", webSlice.Labels["liqo.io/replication"])
		assert.Equal(t, "true", webSlice.Annotations["liqo.io/create-virtual-node"])
		waitCondition(t, web, metav1.ConditionFalse, liqo.ReasonWaitingSlice)
	})

	t.Run("accepted: Liqo's virtual node is labelled for the scheduler and named in status", func(t *testing.T) {
		setSliceConditions(t, webSlice, authv1beta1.ResourceSliceConditionAccepted, "")
		waitCondition(t, web, metav1.ConditionFalse, liqo.ReasonWaitingNode)
		// Liqo creates a VirtualNode named after the slice, and its Node.
		vn := &offloadingv1beta1.VirtualNode{
			ObjectMeta: metav1.ObjectMeta{Name: webSlice.Name, Namespace: webSlice.Namespace, Labels: map[string]string{"liqo.io/resourceslice-name": webSlice.Name}},
			Spec:       offloadingv1beta1.VirtualNodeSpec{ClusterID: "paris", CreateNode: ptr.To(true)},
		}
		require.NoError(t, c.Create(ctx, vn))
		require.NoError(t, c.Create(ctx, &corev1.Node{
			ObjectMeta: metav1.ObjectMeta{Name: webSlice.Name, Labels: map[string]string{"liqo.io/remote-cluster-id": "paris", "liqo.io/type": "virtual-node"}},
			Spec:       corev1.NodeSpec{Taints: []corev1.Taint{{Key: "virtual-node.liqo.io/not-allowed", Value: "true", Effect: corev1.TaintEffectNoExecute}}},
		}))
		got := waitCondition(t, web, metav1.ConditionTrue, liqo.ReasonVirtualNodeUp)
		assert.Equal(t, webSlice.Name, got.Status.VirtualNode)
		var node corev1.Node
		require.NoError(t, c.Get(ctx, types.NamespacedName{Name: webSlice.Name}, &node))
		assert.Equal(t, "paris", node.Labels[rbv1.ProviderLabel], "the scheduler plugin finds it by this label")
		assert.Equal(t, "virtual-node", node.Labels["liqo.io/type"], "Liqo's labels stay")

		// The reservation reconciler's full status updates keep what the bridge wrote.
		got.Status.Phase = rbv1.ReservationActive
		got.Status.Message = "reserved on paris"
		require.NoError(t, c.Status().Update(ctx, got))
		require.NoError(t, c.Get(ctx, client.ObjectKeyFromObject(got), got))
		assert.Equal(t, webSlice.Name, got.Status.VirtualNode)
		assert.NotNil(t, meta.FindStatusCondition(got.Status.Conditions, rsvstatus.ConditionVirtualNode))
	})

	t.Run("denied: the provider's refusal is the reservation's reason", func(t *testing.T) {
		big := reserve(t, "big", "paris", corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("64"), corev1.ResourceMemory: resource.MustParse("256Gi")})
		slice := sliceOf(t, big)
		setSliceConditions(t, slice, authv1beta1.ResourceSliceConditionDenied, "not enough resources: cpu")
		got := waitCondition(t, big, metav1.ConditionFalse, liqo.ReasonDenied)
		assert.Equal(t, liqo.ReasonDenied, got.Status.Reason)
		assert.Contains(t, got.Status.Message, "paris denied ResourceSlice liqo-tenant-paris/"+slice.Name+": not enough resources: cpu")
		assert.Empty(t, got.Status.VirtualNode)

		require.NoError(t, c.Delete(ctx, got))
		require.Eventually(t, func() bool {
			return apierrors.IsNotFound(c.Get(ctx, client.ObjectKeyFromObject(slice), &authv1beta1.ResourceSlice{}))
		}, 10*time.Second, 10*time.Millisecond, "a deleted reservation's slice is deleted")
	})

	t.Run("a replica of another cluster's slice is left alone", func(t *testing.T) {
		// What Liqo's crd-replicator puts in a provider (this cluster as
		// paris's provider): the consumer's slice with its labels and
		// annotations, naming a reservation that exists only there.
		replica := &authv1beta1.ResourceSlice{
			ObjectMeta: metav1.ObjectMeta{Name: "rb-rome-0a1b2c3d", Namespace: "liqo-tenant-paris",
				Labels: map[string]string{rbv1.ManagedByLabel: rbv1.ManagedByValue, rbv1.ReservationLabel: "0a1b2c3d-uid",
					"liqo.io/replicated": "true", "liqo.io/originID": "paris", "liqo.io/remote-cluster-id": "paris"},
				Annotations: map[string]string{liqo.ReservationNamespaceAnnotation: "default", liqo.ReservationNameAnnotation: "ghost",
					liqo.CreateVirtualNodeAnnotation: "true"}},
			Spec: authv1beta1.ResourceSliceSpec{ProviderClusterID: ptr.To(liqov1beta1.ClusterID("rome")), Class: authv1beta1.ResourceSliceClassDefault},
		}
		require.NoError(t, c.Create(ctx, replica))
		// A reservation of this cluster with the same name comes and goes.
		ghost := reserve(t, "ghost", "berlin", corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("1"), corev1.ResourceMemory: resource.MustParse("1Gi")})
		waitCondition(t, ghost, metav1.ConditionFalse, liqo.ReasonNotPeered)
		require.NoError(t, c.Delete(ctx, ghost))
		require.Never(t, func() bool {
			return apierrors.IsNotFound(c.Get(ctx, client.ObjectKeyFromObject(replica), &authv1beta1.ResourceSlice{}))
		}, 2*time.Second, 50*time.Millisecond, "the replica is Liqo's, not the agent's")
		require.NoError(t, c.Delete(ctx, replica))
	})

	t.Run("not peered: the reservation says so", func(t *testing.T) {
		rsv := reserve(t, "far", "berlin", corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("1"), corev1.ResourceMemory: resource.MustParse("1Gi")})
		got := waitCondition(t, rsv, metav1.ConditionFalse, liqo.ReasonNotPeered)
		assert.Contains(t, got.Status.Message, "no Liqo tenant namespace liqo-tenant-berlin")
	})

	t.Run("reservation ended: its slice is deleted", func(t *testing.T) {
		var got rbv1.Reservation
		require.NoError(t, c.Get(ctx, client.ObjectKeyFromObject(web), &got))
		got.Status.Phase = rbv1.ReservationReleased
		require.NoError(t, c.Status().Update(ctx, &got))
		require.Eventually(t, func() bool {
			return apierrors.IsNotFound(c.Get(ctx, client.ObjectKeyFromObject(webSlice), &authv1beta1.ResourceSlice{}))
		}, 10*time.Second, 10*time.Millisecond)
	})
}
