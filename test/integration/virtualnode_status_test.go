package integration

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/fluidos-project/resource-broker/agent/bridge/virtualkubelet"
	rbv1 "github.com/fluidos-project/resource-broker/api/v1alpha1"
	"github.com/fluidos-project/resource-broker/internal/testbed"
	"github.com/fluidos-project/resource-broker/internal/testimages"
)

// testVirtualNodeStatus: pods borrowed from paris that fail, wait or end
// in every way a kubelet reports, each shown in rome as paris's kubelet
// shows its copy, and paris's Events about the copies recorded on the pods:
//   - cm-missing: a mandatory ConfigMap that does not exist: never Running,
//     CreateContainerConfigError naming rome's ConfigMap; created in rome,
//     it reaches paris and the pod runs;
//   - cm-optional: an optional ConfigMap and Secret that do not exist: Running and Ready;
//   - image-missing: an image no registry has: ErrImagePull, then ImagePullBackOff;
//   - crash: exits 3 (restart policy Always): CrashLoopBackOff, restarts counted;
//   - done: exits 0 (Never): Succeeded, Completed;
//   - oom: allocates past its memory limit (Never): Failed, OOMKilled;
//   - unready: a readiness probe that fails: Running, not Ready.
//
// The Events are paris's kubelet's, "(on paris)", never its scheduler's,
// one local Event per provider Event, and rome's agent restarted adds none.
func testVirtualNodeStatus(t *testing.T, bed *testbed.Bed) {
	ctx := context.Background()
	rome, paris := bed.Cluster("rome"), bed.Cluster("paris")
	base := baseline(t, bed)
	const ns = "truth"
	newPodNamespace(t, rome, ns)
	filler := fillRome(t, rome, ns)
	history := watchPodHistory(t, rome, ns)

	server := corev1.Container{Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: 8080}}}
	cmMissing := server
	cmMissing.Env = []corev1.EnvVar{{Name: "LEVEL", ValueFrom: &corev1.EnvVarSource{ConfigMapKeyRef: &corev1.ConfigMapKeySelector{
		LocalObjectReference: corev1.LocalObjectReference{Name: "settings"}, Key: "level"}}}}
	cmOptional := server
	cmOptional.EnvFrom = []corev1.EnvFromSource{{ConfigMapRef: &corev1.ConfigMapEnvSource{
		LocalObjectReference: corev1.LocalObjectReference{Name: "settings-optional"}, Optional: ptr.To(true)}}}
	cmOptional.VolumeMounts = []corev1.VolumeMount{{Name: "creds", MountPath: "/etc/creds"}}
	cmOptional.ReadinessProbe = &corev1.Probe{ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/healthz", Port: intstrHTTP}}, PeriodSeconds: 1}
	unready := server
	unready.ReadinessProbe = &corev1.Probe{ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/not-here", Port: intstrHTTP}}, PeriodSeconds: 1}
	oom := corev1.Container{Command: []string{"/testapp", "alloc", "512"},
		Resources: corev1.ResourceRequirements{Requests: requests("100m", "48Mi"), Limits: requests("100m", "48Mi")}}

	optional := truthPod(ns, "cm-optional", cmOptional, corev1.RestartPolicyAlways)
	optional.Spec.Volumes = []corev1.Volume{{Name: "creds", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{
		SecretName: "creds-optional", Optional: ptr.To(true)}}}}
	pods := []*corev1.Pod{
		truthPod(ns, "cm-missing", cmMissing, corev1.RestartPolicyAlways),
		optional,
		truthPod(ns, "image-missing", corev1.Container{Image: "rb.test/missing:v1"}, corev1.RestartPolicyAlways),
		truthPod(ns, "crash", corev1.Container{Command: []string{"/testapp", "exit", "3"}}, corev1.RestartPolicyAlways),
		truthPod(ns, "done", corev1.Container{Command: []string{"/testapp", "exit", "0"}}, corev1.RestartPolicyNever),
		truthPod(ns, "oom", oom, corev1.RestartPolicyNever),
		truthPod(ns, "unready", unready, corev1.RestartPolicyAlways),
	}
	for _, p := range pods {
		require.NoError(t, rome.Client.Create(ctx, p))
	}

	get := func(name string) *corev1.Pod {
		var p corev1.Pod
		require.NoError(t, rome.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &p))
		return &p
	}
	waitPod := func(name, what string, timeout time.Duration, ok func(p *corev1.Pod, c *corev1.ContainerStatus) bool) *corev1.Pod {
		t.Helper()
		var p *corev1.Pod
		eventually(t, timeout, name+" "+what, func() (bool, string) {
			p = get(name)
			if p.Spec.NodeName != "" && p.Spec.NodeName != "rb-paris" {
				t.Fatalf("%s bound to %s, not borrowed", name, p.Spec.NodeName)
			}
			if len(p.Status.ContainerStatuses) == 0 {
				return false, fmt.Sprintf("%s on %q, no container status: %s", p.Status.Phase, p.Spec.NodeName, p.Status.Message)
			}
			c := &p.Status.ContainerStatuses[0]
			return ok(p, c), fmt.Sprintf("%s, container %s", p.Status.Phase, containerState(c))
		})
		return p
	}

	p := waitPod("cm-missing", "CreateContainerConfigError", 120*time.Second, func(p *corev1.Pod, c *corev1.ContainerStatus) bool {
		return c.State.Waiting != nil && c.State.Waiting.Reason == "CreateContainerConfigError"
	})
	assert.Equal(t, corev1.PodPending, p.Status.Phase)
	assert.Equal(t, `configmap "settings" not found`, p.Status.ContainerStatuses[0].State.Waiting.Message, "rome's name of the ConfigMap, not its copy's")
	assert.Empty(t, p.Status.ContainerStatuses[0].ContainerID, "no container, no id")
	p = waitPod("cm-optional", "Running and Ready", 120*time.Second, func(p *corev1.Pod, c *corev1.ContainerStatus) bool {
		return p.Status.Phase == corev1.PodRunning && podReady(p)
	})
	assert.True(t, strings.HasPrefix(p.Status.ContainerStatuses[0].ContainerID, "containerd://"), "a real container: %s", p.Status.ContainerStatuses[0].ContainerID)
	waitPod("image-missing", "ImagePullBackOff", 120*time.Second, func(p *corev1.Pod, c *corev1.ContainerStatus) bool {
		return p.Status.Phase == corev1.PodPending && c.State.Waiting != nil && c.State.Waiting.Reason == "ImagePullBackOff"
	})
	p = waitPod("done", "Succeeded, Completed", 120*time.Second, func(p *corev1.Pod, c *corev1.ContainerStatus) bool {
		return p.Status.Phase == corev1.PodSucceeded && c.State.Terminated != nil
	})
	assert.Equal(t, "Completed", p.Status.ContainerStatuses[0].State.Terminated.Reason)
	assert.Equal(t, int32(0), p.Status.ContainerStatuses[0].State.Terminated.ExitCode)
	p = waitPod("oom", "Failed, OOMKilled", 120*time.Second, func(p *corev1.Pod, c *corev1.ContainerStatus) bool {
		return p.Status.Phase == corev1.PodFailed && c.State.Terminated != nil
	})
	assert.Equal(t, "OOMKilled", p.Status.ContainerStatuses[0].State.Terminated.Reason)
	assert.Equal(t, int32(137), p.Status.ContainerStatuses[0].State.Terminated.ExitCode)
	p = waitPod("unready", "Running, not Ready", 120*time.Second, func(p *corev1.Pod, c *corev1.ContainerStatus) bool {
		return p.Status.Phase == corev1.PodRunning && c.State.Running != nil
	})
	time.Sleep(3 * time.Second) // probes every second: failed by now
	p = get("unready")
	assert.False(t, podReady(p), "the probe fails at paris: not Ready in rome")
	assert.False(t, p.Status.ContainerStatuses[0].Ready)
	p = waitPod("crash", "CrashLoopBackOff after 2 restarts", 120*time.Second, func(p *corev1.Pod, c *corev1.ContainerStatus) bool {
		return c.RestartCount >= 2 && c.State.Waiting != nil && c.State.Waiting.Reason == "CrashLoopBackOff"
	})
	last := p.Status.ContainerStatuses[0].LastTerminationState.Terminated
	require.NotNil(t, last, "the last run")
	assert.Equal(t, int32(3), last.ExitCode)
	assert.Equal(t, "Error", last.Reason)
	assert.Equal(t, corev1.PodRunning, p.Status.Phase, "a crash-looping pod is Running, as a kubelet says")
	figure(t, "crash: %d restarts, %s", p.Status.ContainerStatuses[0].RestartCount, containerState(&p.Status.ContainerStatuses[0]))

	// Every status above is the copy's, translated.
	var copies corev1.PodList
	require.NoError(t, paris.Client.List(ctx, &copies, client.InNamespace("rb-rome")))
	byName := map[string]corev1.Pod{}
	for _, cp := range copies.Items {
		byName[cp.Name] = cp
	}
	for _, name := range []string{"cm-missing", "crash", "done", "oom"} {
		cp, ok := byName[ns+"."+name]
		require.True(t, ok, "copy of %s at paris", name)
		local := get(name)
		assert.Equal(t, cp.Status.Phase, local.Status.Phase, name)
		require.Len(t, local.Status.ContainerStatuses, 1)
		assert.Equal(t, stateReason(&cp.Status.ContainerStatuses[0]), stateReason(&local.Status.ContainerStatuses[0]), name)
		assert.Equal(t, cp.Status.ContainerStatuses[0].RestartCount, local.Status.ContainerStatuses[0].RestartCount, name)
	}

	// paris's Events, on rome's pods.
	var events map[string][]corev1.Event
	eventually(t, 30*time.Second, "paris's Events on rome's pods", func() (bool, string) {
		events = mirroredEvents(t, rome, ns)
		want := map[string]string{"crash": "BackOff", "image-missing": "BackOff", "cm-missing": "Failed", "unready": "Unhealthy",
			"cm-optional": "Started", "done": "Started", "oom": "Started"}
		var missing []string
		for pod, reason := range want {
			if !slices.ContainsFunc(events[pod], func(e corev1.Event) bool { return e.Reason == reason }) {
				missing = append(missing, pod+" "+reason)
			}
		}
		slices.Sort(missing)
		return len(missing) == 0, "missing: " + strings.Join(missing, ", ")
	})
	for pod, evs := range events {
		for _, e := range evs {
			assert.NotEqual(t, "Scheduled", e.Reason, "%s: paris's scheduler's Events are not recorded: %s", pod, e.Message)
			assert.Equal(t, corev1.EventSource{Component: "kubelet", Host: "rb-paris"}, e.Source, "%s: %s", pod, e.Message)
			assert.NotContains(t, e.Message, "rb-rome", "%s: paris's names read as rome's: %s", pod, e.Message)
		}
	}
	backOff := eventWith(events["crash"], "BackOff")
	assert.Equal(t, corev1.EventTypeWarning, backOff.Type)
	assert.Equal(t, fmt.Sprintf("(on paris) Back-off restarting failed container app in pod crash_%s(%s)", ns, get("crash").UID), backOff.Message)
	assert.Contains(t, eventWith(events["cm-missing"], "Failed").Message, `(on paris) Error: configmap "settings" not found`)
	assert.Contains(t, eventWith(events["unready"], "Unhealthy").Message, "(on paris) Readiness probe failed: HTTP probe failed with statuscode: 404")
	assert.Contains(t, eventWith(events["image-missing"], "BackOff").Message, `(on paris) Back-off pulling image "rb.test/missing:v1"`)
	describe, err := kubectl(ctx, t, rome, "describe", "pod", "-n", ns, "crash").CombinedOutput()
	require.NoError(t, err, "%s", describe)
	if _, evs, ok := strings.Cut(string(describe), "\nEvents:"); assert.True(t, ok) {
		assert.Regexp(t, `Warning\s+BackOff\s+.*\s+kubelet\s+spec\.containers\{app\}: \(on paris\) Back-off restarting failed container app`, evs)
		t.Logf("kubectl describe pod crash, Events:%s", evs)
	}

	// rome's agent restarted: it lists paris's Events again and records none twice.
	before := eventNames(events)
	require.NoError(t, rome.StopAgent())
	require.NoError(t, rome.StartAgent(ctx))
	time.Sleep(10 * time.Second)
	after := mirroredEvents(t, rome, ns)
	for name, uid := range before {
		assert.Equal(t, uid, eventNames(after)[name], "Event %s kept, not made again", name)
	}
	for pod, evs := range after {
		seen := map[string]bool{}
		for _, e := range evs {
			key := e.Reason + " " + e.Message
			assert.False(t, seen[key], "%s: %q recorded twice", pod, key)
			seen[key] = true
		}
	}
	if e := eventWith(after["crash"], "BackOff"); assert.NotNil(t, e) {
		figure(t, "crash: BackOff recorded once, count %d (paris's count followed)", e.Count)
	}

	// The missing ConfigMap created in rome: its copy reaches paris, the pod runs.
	created := time.Now()
	require.NoError(t, rome.Client.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "settings"},
		Data: map[string]string{"level": "debug"}}))
	waitPod("cm-missing", "Running once its ConfigMap exists", 120*time.Second, func(p *corev1.Pod, c *corev1.ContainerStatus) bool {
		return p.Status.Phase == corev1.PodRunning && c.State.Running != nil
	})
	figure(t, "cm-missing: ConfigMap created in rome -> Running %s", time.Since(created).Round(100*time.Millisecond))
	assert.False(t, history.ever("cm-missing", func(s podState) bool { return s.at.Before(created) && (s.phase == corev1.PodRunning || s.running) }),
		"cm-missing was never shown Running before its ConfigMap existed: %v", history.of("cm-missing"))

	for _, p := range append(pods, filler) {
		require.NoError(t, client.IgnoreNotFound(rome.Client.Delete(ctx, p)))
	}
	waitGone(t, rome, ns)
	backToBaseline(t, bed, base, 60*time.Second)
}

// testVirtualNodeUnreserved: a pod bound by hand to rome's virtual node
// (spec.nodeName), with requests and without a reservation, is not copied
// to paris: Pending NotReserved, with one Warning Event, its restart policy
// Never notwithstanding, and the broker's numbers untouched; a pod without
// requests is refused too. A Reservation made for it (the broker places it
// on paris, the only provider) admits it, and it runs there.
func testVirtualNodeUnreserved(t *testing.T, bed *testbed.Bed) {
	ctx := context.Background()
	rome, paris := bed.Cluster("rome"), bed.Cluster("paris")
	base := baseline(t, bed)
	const ns = "unreserved"
	newPodNamespace(t, rome, ns)
	room := openVirtualNode(t, rome, ns)
	vnode := virtualNode(t, rome)
	capacity := bed.Capacity

	before, err := capacity(ctx)
	require.NoError(t, err)
	pinned := pinnedPod(ns, "pinned", requests("200m", "64Mi"))
	bare := pinnedPod(ns, "bare", nil)
	require.NoError(t, rome.Client.Create(ctx, pinned))
	require.NoError(t, rome.Client.Create(ctx, bare))
	refused := waitNotReserved(t, rome, ns, "pinned", "no live broker reservation at paris names this pod", "schedulerName: resource-broker")
	assert.Equal(t, virtualkubelet.ReasonNotReserved, refused.Status.ContainerStatuses[0].State.Waiting.Reason)
	waitNotReserved(t, rome, ns, "bare", "container main requests no cpu and no memory")
	t.Logf("kubectl get pod: %s", kubectlOut(ctx, t, rome, "get", "pod", "-n", ns, "-o", "wide"))

	eventually(t, 10*time.Second, "rb-paris's capacity counts the refused pods' requests", func() (bool, string) {
		n := virtualNode(t, rome)
		cpu, pods := n.Status.Allocatable.Cpu().MilliValue(), n.Status.Allocatable.Pods().Value()
		return cpu == vnode.Status.Allocatable.Cpu().MilliValue()+200 && pods == vnode.Status.Allocatable.Pods().Value()+2,
			fmt.Sprintf("cpu %dm, %d pods", cpu, pods)
	})
	time.Sleep(10 * time.Second) // resyncs, the agent's reconciles: still one Event, no copy
	for _, name := range []string{"pinned", "bare"} {
		warnings := podEvents(t, rome, ns, name, virtualkubelet.ReasonNotReserved)
		if assert.Len(t, warnings, 1, "%s: one Warning Event", name) {
			assert.Equal(t, corev1.EventTypeWarning, warnings[0].Type)
			assert.Nil(t, warnings[0].Series, "%s: not one per decision (events.k8s.io: a repeat makes a series)", name)
		}
		err := paris.Client.Get(ctx, client.ObjectKey{Namespace: "rb-rome", Name: ns + "." + name}, &corev1.Pod{})
		assert.True(t, apierrors.IsNotFound(err), "no copy of %s at paris: %v", name, err)
		p := &corev1.Pod{}
		require.NoError(t, rome.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, p))
		assert.Equal(t, corev1.PodPending, p.Status.Phase, "%s: Pending (its restart policy is %s)", name, p.Spec.RestartPolicy)
	}
	after, err := capacity(ctx)
	require.NoError(t, err)
	assert.Empty(t, after.Diff(before), "the broker's numbers are untouched")

	// A reservation for it: the broker places it on paris, the pod runs there.
	rsv := reservation(ns, "pinned", "200m", "64Mi")
	rsv.Spec.PodName = "pinned"
	admittedAt := time.Now()
	require.NoError(t, rome.Client.Create(ctx, rsv))
	waitReservation(t, rome, ns, "pinned", 60*time.Second, "Active on paris", func(r *rbv1.Reservation) bool {
		return r.Status.Phase == rbv1.ReservationActive && r.Status.Provider == "paris"
	})
	eventually(t, 60*time.Second, "pinned admitted and Running", func() (bool, string) {
		p := &corev1.Pod{}
		require.NoError(t, rome.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "pinned"}, p))
		return p.Status.Phase == corev1.PodRunning, fmt.Sprintf("%s %s: %s", p.Status.Phase, p.Status.Reason, p.Status.Message)
	})
	figure(t, "pinned: Reservation naming it created -> Running at paris %s", time.Since(admittedAt).Round(100*time.Millisecond))
	var cp corev1.Pod
	require.NoError(t, paris.Client.Get(ctx, client.ObjectKey{Namespace: "rb-rome", Name: ns + ".pinned"}, &cp))
	assert.Contains(t, paris.Nodes(), cp.Spec.NodeName, "the copy runs on a real paris node")
	assert.Len(t, podEvents(t, rome, ns, "pinned", virtualkubelet.ReasonReserved), 1, "a Normal Event says it is admitted")
	assert.Len(t, podEvents(t, rome, ns, "bare", virtualkubelet.ReasonNotReserved), 1, "bare: still the one Warning")

	for _, o := range []client.Object{pinned, bare, rsv, room} {
		require.NoError(t, client.IgnoreNotFound(rome.Client.Delete(ctx, o)))
	}
	waitGone(t, rome, ns)
	backToBaseline(t, bed, base, 60*time.Second)
}

// testVirtualNodeDaemonSet: a DaemonSet that tolerates every taint, in rome
// while rome has a virtual node. Its pod on rome's real node runs; its pod
// on rb-paris is not admitted and stays Pending NotReserved, the same pod
// (not failed, deleted and made again) for 30 s, with no copy at paris; the
// DaemonSet counts it scheduled but unavailable. A DaemonSet with node
// affinity on type NotIn [virtual-kubelet] has no pod there.
func testVirtualNodeDaemonSet(t *testing.T, bed *testbed.Bed) {
	ctx := context.Background()
	rome, paris := bed.Cluster("rome"), bed.Cluster("paris")
	base := baseline(t, bed)
	const ns = "daemons"
	newPodNamespace(t, rome, ns)
	room := openVirtualNode(t, rome, ns)

	everywhere := daemonSet(ns, "everywhere")
	everywhere.Spec.Template.Spec.Tolerations = []corev1.Toleration{{Operator: corev1.TolerationOpExists}}
	realOnly := daemonSet(ns, "real-only")
	realOnly.Spec.Template.Spec.Tolerations = []corev1.Toleration{{Operator: corev1.TolerationOpExists}}
	realOnly.Spec.Template.Spec.Affinity = &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{
		RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
			MatchExpressions: []corev1.NodeSelectorRequirement{{Key: "type", Operator: corev1.NodeSelectorOpNotIn, Values: []string{"virtual-kubelet"}}}}}}}}
	require.NoError(t, rome.Client.Create(ctx, everywhere))
	require.NoError(t, rome.Client.Create(ctx, realOnly))

	romeNode := rome.Nodes()[0]
	var onVirtual *corev1.Pod
	eventually(t, 90*time.Second, "everywhere: Running on "+romeNode+", NotReserved on rb-paris", func() (bool, string) {
		pods := dsPods(t, rome, ns, "everywhere")
		var state []string
		running := false
		onVirtual = nil
		for i, p := range pods {
			state = append(state, fmt.Sprintf("%s on %q: %s %s", p.Name, p.Spec.NodeName, p.Status.Phase, p.Status.Reason))
			switch p.Spec.NodeName {
			case romeNode:
				running = p.Status.Phase == corev1.PodRunning
			case "rb-paris":
				if p.Status.Reason == virtualkubelet.ReasonNotReserved {
					onVirtual = &pods[i]
				}
			}
		}
		return running && onVirtual != nil, strings.Join(state, "; ")
	})
	uid := onVirtual.UID

	// 30 s: no churn (a watch would see a deletion or a new pod), no copy.
	w, err := rome.Clientset.CoreV1().Pods(ns).Watch(ctx, metav1.ListOptions{LabelSelector: "app=everywhere"})
	require.NoError(t, err)
	changes := map[watch.EventType]int{}
	timeout := time.After(30 * time.Second)
observe:
	for {
		select {
		case ev, ok := <-w.ResultChan():
			require.True(t, ok, "the watch ended early")
			changes[ev.Type]++
		case <-timeout:
			break observe
		}
	}
	w.Stop()
	assert.Zero(t, changes[watch.Deleted], "no pod deleted: %v", changes)
	assert.Equal(t, 2, changes[watch.Added], "the two pods, listed when the watch began; none since: %v", changes)
	var p corev1.Pod
	require.NoError(t, rome.Client.Get(ctx, client.ObjectKeyFromObject(onVirtual), &p))
	assert.Equal(t, uid, p.UID, "the same pod on rb-paris")
	assert.Equal(t, corev1.PodPending, p.Status.Phase)
	assert.Len(t, podEvents(t, rome, ns, p.Name, virtualkubelet.ReasonNotReserved), 1, "one Warning Event")
	var copies corev1.PodList
	require.NoError(t, paris.Client.List(ctx, &copies, client.InNamespace("rb-rome")))
	for _, cp := range copies.Items {
		assert.False(t, strings.HasPrefix(cp.Name, ns+"."), "no copy of a DaemonSet pod at paris: %s", cp.Name)
	}

	var ds appsv1.DaemonSet
	require.NoError(t, rome.Client.Get(ctx, client.ObjectKeyFromObject(everywhere), &ds))
	s := ds.Status
	assert.Equal(t, int32(2), s.DesiredNumberScheduled)
	assert.Equal(t, int32(2), s.CurrentNumberScheduled)
	assert.Equal(t, int32(1), s.NumberReady)
	assert.Equal(t, int32(1), s.NumberUnavailable)
	figure(t, "DaemonSet tolerating every taint: desired %d, current %d, ready %d, available %d, unavailable %d; its rb-paris pod the same for 30 s (%v)",
		s.DesiredNumberScheduled, s.CurrentNumberScheduled, s.NumberReady, s.NumberAvailable, s.NumberUnavailable, changes)
	t.Logf("kubectl get ds,pod: %s", kubectlOut(ctx, t, rome, "get", "ds,pod", "-n", ns, "-o", "wide"))
	eventually(t, 30*time.Second, "real-only: one pod, on "+romeNode, func() (bool, string) {
		require.NoError(t, rome.Client.Get(ctx, client.ObjectKeyFromObject(realOnly), &ds))
		pods := dsPods(t, rome, ns, "real-only")
		return ds.Status.DesiredNumberScheduled == 1 && ds.Status.NumberReady == 1 && len(pods) == 1 && pods[0].Spec.NodeName == romeNode,
			fmt.Sprintf("desired %d ready %d, %d pods", ds.Status.DesiredNumberScheduled, ds.Status.NumberReady, len(pods))
	})

	for _, o := range []client.Object{everywhere, realOnly, room} {
		require.NoError(t, rome.Client.Delete(ctx, o))
	}
	waitGone(t, rome, ns)
	backToBaseline(t, bed, base, 60*time.Second)
}

// testVirtualNodeTenantQuota: paris enforces rome's tenant ResourceQuota
// (its kube-controller-manager computes the usage): once a borrowed pod
// runs, the quota shows it used; with the tenant's own credentials (the
// token paris granted through the broker), a pod without requests gets the
// tenant LimitRange's defaults (100m, 200Mi: manifests/agent/
// tenant-namespace.yaml) and is counted with them, so with the reservation
// used up it is refused as exceeding the quota, as is one that requests.
func testVirtualNodeTenantQuota(t *testing.T, bed *testbed.Bed) {
	ctx := context.Background()
	rome, paris := bed.Cluster("rome"), bed.Cluster("paris")
	base := baseline(t, bed)
	const ns = "quota"
	newPodNamespace(t, rome, ns)
	dep := appDeployment(ns, "web", 1, "1500m", "256Mi")
	require.NoError(t, rome.Client.Create(ctx, dep))
	eventually(t, 120*time.Second, "the borrowed pod Running and Ready", func() (bool, string) {
		var pods corev1.PodList
		require.NoError(t, rome.Client.List(ctx, &pods, client.InNamespace(ns)))
		if len(pods.Items) != 1 {
			return false, fmt.Sprintf("%d pods", len(pods.Items))
		}
		p := pods.Items[0]
		return p.Spec.NodeName == "rb-paris" && podReady(&p), fmt.Sprintf("%s on %q: %s", p.Status.Phase, p.Spec.NodeName, podCondition(&p))
	})

	var quota corev1.ResourceQuota
	eventually(t, 30*time.Second, "paris's quota for rome shows the pod used", func() (bool, string) {
		require.NoError(t, paris.Client.Get(ctx, client.ObjectKey{Namespace: "rb-rome", Name: "rb-reservations"}, &quota))
		used, hard := quota.Status.Used, quota.Status.Hard
		return quantity(used, "requests.cpu").Cmp(resource.MustParse("1500m")) == 0 && quantity(hard, "requests.cpu").Cmp(resource.MustParse("1500m")) == 0 &&
				quantity(used, "requests.memory").Cmp(resource.MustParse("256Mi")) == 0,
			fmt.Sprintf("used %v, hard %v", used, hard)
	})
	figure(t, "tenant quota at paris: hard %s, used %s", resourceString(quota.Status.Hard), resourceString(quota.Status.Used))

	rsvs := reservations(t, rome, ns)
	require.Len(t, rsvs, 1)
	bc, err := rome.BrokerClient()
	require.NoError(t, err)
	at, err := bc.Reservation(ctx, rsvs[0].Status.ReservationID)
	require.NoError(t, err)
	require.NotNil(t, at.Grant, "paris's grant")
	tenant, err := kubernetes.NewForConfig(&rest.Config{Host: at.Grant.Endpoint, BearerToken: at.Grant.Token,
		TLSClientConfig: rest.TLSClientConfig{CAData: at.Grant.CABundle}})
	require.NoError(t, err)
	// No token of paris's ServiceAccounts: the tenant policy refuses one first.
	pod := func(name string, r corev1.ResourceList) *corev1.Pod {
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: corev1.PodSpec{AutomountServiceAccountToken: ptr.To(false),
			Containers: []corev1.Container{{
				Name: "main", Image: testimages.Pause, ImagePullPolicy: corev1.PullIfNotPresent, Resources: corev1.ResourceRequirements{Requests: r}}}}}
	}
	_, err = tenant.CoreV1().Pods(at.Grant.Namespace).Create(ctx, pod("no-requests", nil), metav1.CreateOptions{})
	require.Error(t, err, "a tenant pod without requests")
	assert.True(t, apierrors.IsForbidden(err), "%v", err)
	assert.Contains(t, err.Error(), "exceeded quota: rb-reservations", "counted with the LimitRange's defaults")
	assert.Contains(t, err.Error(), "requests.cpu=100m", "the LimitRange's default request")
	figure(t, "tenant pod without requests: %v", err)
	_, err = tenant.CoreV1().Pods(at.Grant.Namespace).Create(ctx, pod("more", requests("100m", "64Mi")), metav1.CreateOptions{})
	require.Error(t, err, "a tenant pod past the reservations")
	assert.True(t, apierrors.IsForbidden(err), "%v", err)
	assert.Contains(t, err.Error(), "exceeded quota: rb-reservations")
	figure(t, "tenant pod past its reservations: %v", err)

	require.NoError(t, rome.Client.Delete(ctx, dep))
	waitGone(t, rome, ns)
	backToBaseline(t, bed, base, 60*time.Second)
}

// newPodNamespace makes a namespace and waits for its default
// ServiceAccount (kube-controller-manager's), without which the API server
// refuses pods there.
func newPodNamespace(t *testing.T, c *testbed.Cluster, ns string) {
	t.Helper()
	newNamespace(t, c, ns)
	eventually(t, 30*time.Second, "ServiceAccount "+ns+"/default", func() (bool, string) {
		err := c.Client.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: "default"}, &corev1.ServiceAccount{})
		return err == nil, fmt.Sprint(err)
	})
}

// truthPod is a borrowed pod of the status scenario: rb-scheduler's,
// requesting 100m CPU (more than fillRome leaves in rome), the test app
// unless the container says otherwise.
func truthPod(ns, name string, c corev1.Container, policy corev1.RestartPolicy) *corev1.Pod {
	c.Name = "app"
	if c.Image == "" {
		c.Image = testimages.TestApp
	}
	c.ImagePullPolicy = corev1.PullIfNotPresent
	if c.Resources.Requests == nil {
		c.Resources = corev1.ResourceRequirements{Requests: requests("100m", "64Mi"), Limits: requests("100m", "64Mi")}
	}
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: map[string]string{"app": name}},
		Spec: corev1.PodSpec{SchedulerName: "resource-broker", RestartPolicy: policy,
			TerminationGracePeriodSeconds: ptr.To[int64](2), Containers: []corev1.Container{c}},
	}
}

// fillRome takes, with a pod of the default scheduler in ns, all but 50m of
// the CPU that rome's real node has left: any pod requesting 100m or more is
// then borrowed. It returns that pod.
func fillRome(t *testing.T, rome *testbed.Cluster, ns string) *corev1.Pod {
	t.Helper()
	ctx := context.Background()
	node := rome.Nodes()[0]
	var n corev1.Node
	require.NoError(t, rome.Client.Get(ctx, client.ObjectKey{Name: node}, &n))
	var pods corev1.PodList
	require.NoError(t, rome.Client.List(ctx, &pods, client.MatchingFields{"spec.nodeName": node}))
	free := n.Status.Allocatable.Cpu().MilliValue()
	for _, p := range pods.Items {
		if p.Status.Phase != corev1.PodSucceeded && p.Status.Phase != corev1.PodFailed {
			for _, c := range p.Spec.Containers {
				free -= c.Resources.Requests.Cpu().MilliValue()
			}
		}
	}
	require.Greater(t, free, int64(100), "rome's node has room for the filler")
	filler := pinnedPod(ns, "filler", corev1.ResourceList{corev1.ResourceCPU: *resource.NewMilliQuantity(free-50, resource.DecimalSI),
		corev1.ResourceMemory: resource.MustParse("16Mi")})
	filler.Spec.NodeName = ""
	require.NoError(t, rome.Client.Create(ctx, filler))
	eventually(t, 60*time.Second, "the filler Running on "+node, func() (bool, string) {
		require.NoError(t, rome.Client.Get(ctx, client.ObjectKeyFromObject(filler), filler))
		return filler.Spec.NodeName == node && filler.Status.Phase == corev1.PodRunning, string(filler.Status.Phase)
	})
	return filler
}

// pinnedPod is a pause pod bound to rb-paris by hand (spec.nodeName), restart
// policy Never, with requests r (none when nil).
func pinnedPod(ns, name string, r corev1.ResourceList) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: map[string]string{"app": name}},
		Spec: corev1.PodSpec{NodeName: "rb-paris", RestartPolicy: corev1.RestartPolicyNever, TerminationGracePeriodSeconds: ptr.To[int64](2),
			Containers: []corev1.Container{{Name: "main", Image: testimages.Pause, ImagePullPolicy: corev1.PullIfNotPresent,
				Resources: corev1.ResourceRequirements{Requests: r}}}},
	}
}

// openVirtualNode makes rome's virtual node of paris with a Reservation of
// its own (1 CPU, 512Mi, naming no pod) and waits until rb-paris is Ready;
// it returns the Reservation.
func openVirtualNode(t *testing.T, rome *testbed.Cluster, ns string) *rbv1.Reservation {
	t.Helper()
	room := reservation(ns, "room", "1", "512Mi")
	require.NoError(t, rome.Client.Create(context.Background(), room))
	waitReservation(t, rome, ns, "room", 60*time.Second, "named rb-paris", func(r *rbv1.Reservation) bool {
		return r.Status.Phase == rbv1.ReservationActive && r.Status.VirtualNode == "rb-paris"
	})
	eventually(t, 30*time.Second, "rb-paris Ready", func() (bool, string) {
		n := virtualNode(t, rome)
		return nodeReady(n), fmt.Sprint(n.Status.Conditions)
	})
	return room
}

func virtualNode(t *testing.T, rome *testbed.Cluster) *corev1.Node {
	t.Helper()
	var n corev1.Node
	require.NoError(t, rome.Client.Get(context.Background(), client.ObjectKey{Name: "rb-paris"}, &n))
	return &n
}

// waitNotReserved waits until a pod is refused by the bridge with a message
// that has every part.
func waitNotReserved(t *testing.T, c *testbed.Cluster, ns, name string, parts ...string) *corev1.Pod {
	t.Helper()
	var p corev1.Pod
	eventually(t, 30*time.Second, name+" Pending NotReserved", func() (bool, string) {
		require.NoError(t, c.Client.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: name}, &p))
		cond := podConditionOf(&p, virtualkubelet.PodConditionReserved)
		ok := p.Status.Phase == corev1.PodPending && p.Status.Reason == virtualkubelet.ReasonNotReserved &&
			cond != nil && cond.Status == corev1.ConditionFalse && len(p.Status.ContainerStatuses) == 1
		for _, part := range parts {
			ok = ok && strings.Contains(p.Status.Message, part)
		}
		return ok, fmt.Sprintf("%s %s: %s", p.Status.Phase, p.Status.Reason, p.Status.Message)
	})
	return &p
}

func podConditionOf(p *corev1.Pod, typ corev1.PodConditionType) *corev1.PodCondition {
	for i := range p.Status.Conditions {
		if p.Status.Conditions[i].Type == typ {
			return &p.Status.Conditions[i]
		}
	}
	return nil
}

// podEvents lists the Events on pod ns/name with reason.
func podEvents(t *testing.T, c *testbed.Cluster, ns, name, reason string) []corev1.Event {
	t.Helper()
	var list corev1.EventList
	require.NoError(t, c.Client.List(context.Background(), &list, client.InNamespace(ns),
		client.MatchingFields{"involvedObject.kind": "Pod", "involvedObject.name": name, "reason": reason}))
	return list.Items
}

// mirroredEvents are the Events recorded on the pods of ns from their
// copies' at paris, by pod name.
func mirroredEvents(t *testing.T, c *testbed.Cluster, ns string) map[string][]corev1.Event {
	t.Helper()
	var list corev1.EventList
	require.NoError(t, c.Client.List(context.Background(), &list, client.InNamespace(ns)))
	out := map[string][]corev1.Event{}
	for _, e := range list.Items {
		if e.InvolvedObject.Kind == "Pod" && strings.HasPrefix(e.Message, "(on paris) ") {
			out[e.InvolvedObject.Name] = append(out[e.InvolvedObject.Name], e)
		}
	}
	return out
}

func eventWith(events []corev1.Event, reason string) *corev1.Event {
	for i := range events {
		if events[i].Reason == reason {
			return &events[i]
		}
	}
	return nil
}

func eventNames(events map[string][]corev1.Event) map[string]types.UID {
	out := map[string]types.UID{}
	for _, evs := range events {
		for _, e := range evs {
			out[e.Name] = e.UID
		}
	}
	return out
}

func containerState(c *corev1.ContainerStatus) string {
	s := c.State
	switch {
	case s.Waiting != nil:
		return "Waiting " + s.Waiting.Reason + ": " + s.Waiting.Message
	case s.Running != nil:
		return fmt.Sprintf("Running (ready %v, restarts %d)", c.Ready, c.RestartCount)
	case s.Terminated != nil:
		return fmt.Sprintf("Terminated %s, exit code %d", s.Terminated.Reason, s.Terminated.ExitCode)
	}
	return "unknown"
}

// stateReason is a container's state and reason, without the message.
func stateReason(c *corev1.ContainerStatus) string {
	s, _, _ := strings.Cut(containerState(c), ":")
	return s
}

func daemonSet(ns, name string) *appsv1.DaemonSet {
	labels := map[string]string{"app": name}
	return &appsv1.DaemonSet{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: appsv1.DaemonSetSpec{
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{TerminationGracePeriodSeconds: ptr.To[int64](2), Containers: []corev1.Container{{
					Name: "agent", Image: testimages.Pause, ImagePullPolicy: corev1.PullIfNotPresent,
					Resources: corev1.ResourceRequirements{Requests: requests("10m", "16Mi")}}}},
			},
		},
	}
}

func dsPods(t *testing.T, c *testbed.Cluster, ns, app string) []corev1.Pod {
	t.Helper()
	var pods corev1.PodList
	require.NoError(t, c.Client.List(context.Background(), &pods, client.InNamespace(ns), client.MatchingLabels{"app": app}))
	return pods.Items
}

// waitGone waits until ns has no pod and no Reservation left.
func waitGone(t *testing.T, c *testbed.Cluster, ns string) {
	t.Helper()
	eventually(t, 90*time.Second, "no pod and no Reservation left in "+ns, func() (bool, string) {
		var left corev1.PodList
		require.NoError(t, c.Client.List(context.Background(), &left, client.InNamespace(ns)))
		n := len(reservations(t, c, ns))
		return len(left.Items) == 0 && n == 0, fmt.Sprintf("%d pods, %d reservations", len(left.Items), n)
	})
}

func kubectlOut(ctx context.Context, t *testing.T, c *testbed.Cluster, args ...string) string {
	out, err := kubectl(ctx, t, c, args...).CombinedOutput()
	if err != nil {
		return fmt.Sprintf("%v: %s", err, out)
	}
	return "\n" + string(out)
}

func resourceString(l corev1.ResourceList) string {
	var parts []string
	for _, name := range slices.Sorted(maps.Keys(l)) {
		q := l[name]
		parts = append(parts, string(name)+"="+q.String())
	}
	return strings.Join(parts, ",")
}

func quantity(l corev1.ResourceList, name corev1.ResourceName) *resource.Quantity {
	q := l[name]
	return &q
}

// podState is one state of a pod a watch saw.
type podState struct {
	at      time.Time
	phase   corev1.PodPhase
	running bool // a container Running
}

// podHistory records the states of the pods of a namespace, from a watch.
type podHistory struct {
	mu     sync.Mutex
	states map[string][]podState
}

func watchPodHistory(t *testing.T, c *testbed.Cluster, ns string) *podHistory {
	t.Helper()
	w, err := c.Clientset.CoreV1().Pods(ns).Watch(context.Background(), metav1.ListOptions{})
	require.NoError(t, err)
	h := &podHistory{states: map[string][]podState{}}
	go func() {
		for ev := range w.ResultChan() {
			p, ok := ev.Object.(*corev1.Pod)
			if !ok {
				continue
			}
			s := podState{at: time.Now(), phase: p.Status.Phase}
			for _, cs := range p.Status.ContainerStatuses {
				s.running = s.running || cs.State.Running != nil
			}
			h.mu.Lock()
			h.states[p.Name] = append(h.states[p.Name], s)
			h.mu.Unlock()
		}
	}()
	t.Cleanup(w.Stop)
	return h
}

func (h *podHistory) ever(pod string, match func(podState) bool) bool {
	return slices.ContainsFunc(h.of(pod), match)
}

func (h *podHistory) of(pod string) []podState {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.states[pod])
}
