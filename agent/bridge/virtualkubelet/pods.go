package virtualkubelet

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/virtual-kubelet/virtual-kubelet/errdefs"
	"github.com/virtual-kubelet/virtual-kubelet/node"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"

	"github.com/fluidos-project/resource-broker/internal/backoff"
)

var everything = labels.Everything()

// FieldManager names the bridge's writes at the provider.
const FieldManager = "rb-bridge"

// podHandler is virtual-kubelet's PodLifecycleHandler for one virtual node:
// it keeps a copy of each pod bound to the node in the provider's tenant
// namespace and reflects the copy's status back (PodNotifier), driven by the
// informer on the tenant namespace.
type podHandler struct {
	n      *providerNode
	notify func(*corev1.Pod)

	mu       sync.Mutex
	deleting map[string]bool // local pod UIDs whose copy the bridge is deleting
	// unscheduled: copies the provider's scheduler has not placed (by the
	// copy's UID), and whether that has been reported (watchScheduling).
	unscheduled map[types.UID]bool

	admitOnce sync.Once
	admit     *admission // which pods bound to the node are copied (admission.go)
	eventOnce sync.Once
	events    *eventMirror // the provider's Events about the copies (events.go)
}

var (
	_ node.PodLifecycleHandler = (*podHandler)(nil)
	_ node.PodNotifier         = (*podHandler)(nil)
)

// errNoAccess: no grant from the provider yet (transient).
var errNoAccess = errors.New("no access to the provider yet (waiting for its grant)")

// errCollision: a different object holds the name of a copy (permanent).
type errCollision struct{ msg string }

func (e errCollision) Error() string { return e.msg }

// CreatePod copies the pod, and the ConfigMaps and Secrets it uses, into the
// tenant namespace. Transient failures are retried for a while here, since
// virtual-kubelet fails a pod whose restart policy is Never at the first error.
func (h *podHandler) CreatePod(ctx context.Context, pod *corev1.Pod) error {
	start := time.Now()
	err := h.n.retry(ctx, func(ctx context.Context) error { return h.create(ctx, pod) })
	if err == nil {
		h.n.log.V(1).Info("pod mirrored", "pod", pod.Namespace+"/"+pod.Name, "took", time.Since(start))
	}
	return err
}

func (h *podHandler) create(ctx context.Context, pod *corev1.Pod) error {
	rc := h.n.currentRemote()
	if rc == nil {
		return errNoAccess
	}
	params := h.n.mirrorParams(rc)
	if r := h.n.reservationOf(ctx, pod); r != nil {
		params.reservation, params.placement = string(r.UID), r.Status.Placement
	}
	network, err := h.n.b.homeView(ctx, pod)
	if err != nil {
		return err
	}
	if err := h.n.serviceEnv.attach(ctx, rc, pod, network); err != nil {
		return err
	}
	params.network = network
	wantsToken, err := h.n.b.wantsHomeToken(ctx, pod)
	if err != nil {
		return err
	}
	if wantsToken {
		server, err := h.n.b.homeAPIServerFor(ctx)
		if err != nil {
			return err
		}
		params.home = &homeAPI{server: server, secret: homeTokenSecretName(pod.Namespace, pod.Name)}
	}
	desired, err := remotePod(pod, params)
	if err != nil {
		return err
	}
	if err := h.n.objects.ensure(ctx, rc, pod); err != nil {
		return err
	}
	if wantsToken {
		// Before the copy: its kubelet finds the Secret at once.
		if err := h.n.tokens.ensure(ctx, rc, pod, nil); err != nil {
			return err
		}
	}
	pods := rc.client.CoreV1().Pods(rc.namespace)
	made, err := pods.Create(ctx, desired, metav1.CreateOptions{FieldManager: FieldManager})
	if err == nil && wantsToken {
		// The copy owns its token: the provider deletes both together.
		if err := h.n.tokens.ensure(ctx, rc, pod, made); err != nil {
			h.n.log.Info("the home API token's owner is not set yet", "pod", pod.Namespace+"/"+pod.Name, "error", err.Error())
		}
	}
	if err != nil && !apierrors.IsAlreadyExists(err) {
		// A full tenant quota refuses before the name is checked: after
		// an agent restart the copy may be there already.
		if cur, gerr := pods.Get(ctx, desired.Name, metav1.GetOptions{}); gerr == nil {
			if _, uid, ok := originOf(cur); ok && uid == pod.UID {
				return h.UpdatePod(ctx, pod)
			}
		}
	}
	if !apierrors.IsAlreadyExists(err) {
		return err
	}
	existing, err := pods.Get(ctx, desired.Name, metav1.GetOptions{})
	if err != nil {
		return err // NotFound: gone in between, try again
	}
	key, uid, ok := originOf(existing)
	switch {
	case !ok || key != (types.NamespacedName{Namespace: pod.Namespace, Name: pod.Name}):
		return errCollision{fmt.Sprintf("pod %s/%s at %s is not a copy of %s/%s", rc.namespace, desired.Name, h.n.provider, pod.Namespace, pod.Name)}
	case uid == pod.UID:
		// Mirrored already (the provider's informer had not listed it
		// yet, as after an agent restart): what may change on a running
		// pod changed meanwhile perhaps.
		return h.UpdatePod(ctx, pod)
	case existing.DeletionTimestamp == nil:
		// The copy of an earlier pod of the same name: that pod is gone here.
		pre := metav1.NewUIDPreconditions(string(existing.UID))
		if err := pods.Delete(ctx, existing.Name, metav1.DeleteOptions{Preconditions: pre}); client404(err) != nil {
			return err
		}
	}
	return fmt.Errorf("the copy of an earlier pod named %s/%s is still terminating at %s", pod.Namespace, pod.Name, h.n.provider)
}

// UpdatePod carries what may change on a running pod: labels, annotations,
// container images, the active deadline.
func (h *podHandler) UpdatePod(ctx context.Context, pod *corev1.Pod) error {
	rc := h.n.currentRemote()
	if rc == nil {
		return errNoAccess
	}
	params := h.n.mirrorParams(rc)
	if r := h.n.reservationOf(ctx, pod); r != nil {
		params.reservation, params.placement = string(r.UID), r.Status.Placement
	}
	desired, err := remotePod(pod, params)
	if err != nil {
		return err
	}
	pods := rc.client.CoreV1().Pods(rc.namespace)
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		existing, err := pods.Get(ctx, desired.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if _, uid, ok := originOf(existing); !ok || uid != pod.UID {
			return errdefs.NotFound("no copy of this pod at the provider")
		}
		updated := existing.DeepCopy()
		updated.Labels, updated.Annotations = desired.Labels, desired.Annotations
		updated.Spec.ActiveDeadlineSeconds = desired.Spec.ActiveDeadlineSeconds
		setImages(updated.Spec.Containers, desired.Spec.Containers)
		setImages(updated.Spec.InitContainers, desired.Spec.InitContainers)
		if equality.Semantic.DeepEqual(updated, existing) {
			return nil
		}
		_, err = pods.Update(ctx, updated, metav1.UpdateOptions{FieldManager: FieldManager})
		return err
	})
}

func setImages(dst, src []corev1.Container) {
	for i := range dst {
		if j := slices.IndexFunc(src, func(c corev1.Container) bool { return c.Name == dst[i].Name }); j >= 0 {
			dst[i].Image = src[j].Image
		}
	}
}

// DeletePod deletes the copy with the local pod's grace period; the local pod
// goes when the copy is gone (remoteGone), as a kubelet lets it go once its
// containers stopped.
func (h *podHandler) DeletePod(ctx context.Context, pod *corev1.Pod) error {
	rc := h.n.currentRemote()
	if rc == nil {
		// The copy, if any, is deleted as an orphan once the provider is back.
		return h.noCopy(ctx, pod, "no access to the provider")
	}
	pods := rc.client.CoreV1().Pods(rc.namespace)
	name := RemoteName(pod.Namespace, pod.Name)
	existing, err := pods.Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return h.noCopy(ctx, pod, "no copy at the provider")
	}
	if err != nil {
		return err
	}
	if _, uid, ok := originOf(existing); !ok || uid != pod.UID {
		return h.noCopy(ctx, pod, "no copy of this pod at the provider")
	}
	if existing.DeletionTimestamp != nil {
		return nil
	}
	h.mu.Lock()
	h.deleting[string(pod.UID)] = true
	h.mu.Unlock()
	opts := metav1.DeleteOptions{GracePeriodSeconds: pod.DeletionGracePeriodSeconds, Preconditions: metav1.NewUIDPreconditions(string(existing.UID))}
	err = pods.Delete(ctx, name, opts)
	if apierrors.IsNotFound(err) || apierrors.IsConflict(err) {
		return errdefs.NotFound("no copy at the provider")
	}
	if err == nil {
		h.n.log.V(1).Info("deleting the copy", "pod", pod.Namespace+"/"+pod.Name, "gracePeriod", opts.GracePeriodSeconds)
	}
	return err
}

// noCopy: nothing runs at the provider for pod, so a pod being deleted goes
// at once, as a kubelet lets a pod go whose containers have all stopped
// (virtual-kubelet would wait out the grace period).
func (h *podHandler) noCopy(ctx context.Context, pod *corev1.Pod, why string) error {
	if pod.DeletionTimestamp != nil && pod.UID != "" {
		if _, err := h.n.localPods.Pods(pod.Namespace).Get(pod.Name); err == nil {
			pre := metav1.NewUIDPreconditions(string(pod.UID))
			err := h.n.b.local.CoreV1().Pods(pod.Namespace).Delete(ctx, pod.Name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To(int64(0)), Preconditions: pre})
			if client404(err) != nil && !apierrors.IsConflict(err) {
				return err
			}
		}
	}
	return errdefs.NotFound(why)
}

// GetPod returns the copy of namespace/name in local coordinates.
func (h *podHandler) GetPod(_ context.Context, namespace, name string) (*corev1.Pod, error) {
	rc := h.n.currentRemote()
	if rc == nil {
		return nil, errdefs.NotFound("no access to the provider")
	}
	remote, ok := rc.pod(namespace, name)
	if !ok {
		return nil, errdefs.NotFound("no copy at the provider")
	}
	key, uid, ok := originOf(remote)
	if !ok || key != (types.NamespacedName{Namespace: namespace, Name: name}) {
		return nil, errdefs.NotFound("no copy at the provider")
	}
	return providerView(remote, key, uid), nil
}

// GetPodStatus returns the copy's status.
func (h *podHandler) GetPodStatus(ctx context.Context, namespace, name string) (*corev1.PodStatus, error) {
	p, err := h.GetPod(ctx, namespace, name)
	if err != nil {
		return nil, err
	}
	return &p.Status, nil
}

// GetPods lists the copies in local coordinates.
func (h *podHandler) GetPods(context.Context) ([]*corev1.Pod, error) {
	rc := h.n.currentRemote()
	if rc == nil {
		return nil, nil
	}
	remote, err := rc.pods.List(everything)
	if err != nil {
		return nil, err
	}
	out := make([]*corev1.Pod, 0, len(remote))
	for _, p := range remote {
		if key, uid, ok := originOf(p); ok {
			out = append(out, providerView(p, key, uid))
		}
	}
	return out, nil
}

// NotifyPods records the callback that writes a pod's status.
func (h *podHandler) NotifyPods(_ context.Context, cb func(*corev1.Pod)) {
	h.mu.Lock()
	h.notify = cb
	h.mu.Unlock()
}

func (h *podHandler) notifyStatus(p *corev1.Pod) {
	h.mu.Lock()
	cb := h.notify
	h.mu.Unlock()
	if cb != nil {
		cb(p)
	}
}

// remoteEvents handles the provider's informers: of the pods, status
// changes are reflected and a copy that disappears is handled as its pod's
// state implies; the copies of ConfigMaps and Secrets are reconciled when
// they change or go (reflection.go); the Events about the copies are
// recorded on their pods.
func (h *podHandler) remoteEvents() remoteHandlers {
	objs := h.n.objects
	return remoteHandlers{pods: h.remotePodEvents(), events: h.eventMirror().handler(),
		configMaps: objs.configMaps.copyEvents(), secrets: objs.secrets.copyEvents()}
}

func (h *podHandler) remotePodEvents() cache.ResourceEventHandler {
	return cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { h.remoteChanged(obj.(*corev1.Pod)) },
		UpdateFunc: func(_, obj any) { h.remoteChanged(obj.(*corev1.Pod)) },
		DeleteFunc: func(obj any) {
			if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = d.Obj
			}
			if p, ok := obj.(*corev1.Pod); ok {
				h.remoteGone(p)
			}
		},
	}
}

// remoteChanged reflects a copy's status onto its local pod, or deletes a
// copy whose pod is gone (left behind while the agent was down).
func (h *podHandler) remoteChanged(remote *corev1.Pod) {
	key, uid, ok := originOf(remote)
	if !ok {
		return
	}
	local, err := h.n.localPods.Pods(key.Namespace).Get(key.Name)
	if apierrors.IsNotFound(err) {
		if h.n.localSynced() && remote.DeletionTimestamp == nil {
			h.deleteOrphan(remote)
		}
		return
	}
	if err != nil || local.UID != uid {
		return
	}
	if !admitted(local) && local.DeletionTimestamp == nil {
		// Not virtual-kubelet's yet: the admission sees the copy and admits it.
		h.admission().consider(local)
		return
	}
	h.watchScheduling(local, remote)
	if finished(local) {
		return // final: virtual-kubelet writes no status over it
	}
	out, replace := copyStatus(local, remote, h.n.provider, func() bool { return h.replaceable(local) })
	if replace && terminal(remote) && remote.DeletionTimestamp == nil {
		// Ended where it stays (evicted by its kubelet, refused at
		// admission): deleted, the copy is made anew once it is gone.
		h.deleteEnded(remote)
	}
	h.failed(local, out)
	if equality.Semantic.DeepEqual(out.Status, local.Status) {
		// Nothing to reflect: the copy was created, or bound by the
		// provider's scheduler (its PodScheduled is not reflected), and
		// the pod already says Pending. virtual-kubelet would write the
		// same status back (it compares with the last notification, whose
		// resourceVersion our own write has changed since).
		return
	}
	h.notifyStatus(out)
}

func (h *podHandler) deleteOrphan(remote *corev1.Pod) {
	rc := h.n.currentRemote()
	if rc == nil {
		return
	}
	h.n.log.Info("deleting a copy whose pod is gone", "copy", remote.Name)
	pre := metav1.NewUIDPreconditions(string(remote.UID))
	err := rc.client.CoreV1().Pods(remote.Namespace).Delete(h.n.ctx, remote.Name, metav1.DeleteOptions{Preconditions: pre})
	if client404(err) != nil && !apierrors.IsConflict(err) {
		h.n.log.Error(err, "deleting an orphaned copy", "copy", remote.Name)
	}
}

// deleteLeftCopies deletes the copies still at the provider once no pod is
// bound to the node any more, before the node stops: a pod deleted while its
// copy was being made, or whose copy's deletion the node's end cut short,
// would otherwise leave its copy running until the provider evicts it after
// its grace.
func (n *providerNode) deleteLeftCopies(ctx context.Context) error {
	rc := n.currentRemote()
	if rc == nil || !rc.synced() {
		return nil
	}
	copies, err := rc.pods.List(labels.Everything())
	if err != nil {
		return err
	}
	for _, cp := range copies {
		if _, _, ok := originOf(cp); !ok || cp.DeletionTimestamp != nil {
			continue
		}
		n.log.Info("deleting a copy left behind by its pod", "copy", cp.Name)
		err := rc.client.CoreV1().Pods(cp.Namespace).Delete(ctx, cp.Name, metav1.DeleteOptions{Preconditions: metav1.NewUIDPreconditions(string(cp.UID))})
		if client404(err) != nil && !apierrors.IsConflict(err) {
			return fmt.Errorf("delete copy %s/%s: %w", cp.Namespace, cp.Name, err)
		}
	}
	return nil
}

// remoteGone: the copy is deleted at the provider. A local pod being deleted
// is let go; one that was not is given a new copy if it may have one
// (replaceable), else it fails with the reason its copy ended (a kubelet
// does not restart such a pod), unless its copy had completed.
func (h *podHandler) remoteGone(remote *corev1.Pod) {
	key, uid, ok := originOf(remote)
	if !ok {
		return
	}
	h.mu.Lock()
	byUs := h.deleting[string(uid)]
	delete(h.deleting, string(uid))
	h.mu.Unlock()
	local, err := h.n.localPods.Pods(key.Namespace).Get(key.Name)
	if err != nil || local.UID != uid {
		return
	}
	ctx := h.n.ctx
	if local.DeletionTimestamp != nil {
		pre := metav1.NewUIDPreconditions(string(uid))
		err := h.n.b.local.CoreV1().Pods(key.Namespace).Delete(ctx, key.Name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To(int64(0)), Preconditions: pre})
		if client404(err) != nil && !apierrors.IsConflict(err) {
			h.n.log.Error(err, "finishing the deletion of a pod", "pod", key.String())
		}
		return
	}
	if finished(local) || byUs {
		return
	}
	end := endOf(local, remote, h.n.provider)
	if !end.stopped && terminal(remote) {
		// Completed on its own, then deleted before its pod showed it.
		h.notifyStatus(localStatus(local, remote, h.n.provider))
		return
	}
	if !end.stopped {
		end = copyEnd{stopped: true, reason: ReasonDeletedAtProvider, message: fmt.Sprintf("the copy of this pod was deleted on %s", h.n.provider)}
	}
	if !h.replaceable(local) {
		h.n.log.Info("copy ended at the provider; the pod failed", "pod", key.String(), "reason", end.reason, "restartPolicy", local.Spec.RestartPolicy)
		out := failedStatus(localStatus(local, remote, h.n.provider), end.reason, end.message)
		h.failed(local, out)
		h.notifyStatus(out)
		return
	}
	h.n.log.Info("copy deleted at the provider; recreating it", "pod", key.String(), "reason", end.reason, "restartPolicy", local.Spec.RestartPolicy)
	h.n.b.recorder.Eventf(local, nil, corev1.EventTypeNormal, "ProviderPodRecreated", "Sync",
		"%s; restart policy %s: recreating it", end.message, local.Spec.RestartPolicy)
	if out := replacingStatus(local, local, end); !equality.Semantic.DeepEqual(out.Status, local.Status) {
		h.notifyStatus(out)
	}
	go func() {
		err := h.n.retry(ctx, func(ctx context.Context) error {
			cur, err := h.n.localPods.Pods(key.Namespace).Get(key.Name)
			if err != nil || cur.UID != uid || cur.DeletionTimestamp != nil || finished(cur) {
				return nil
			}
			return h.create(ctx, cur)
		})
		if err != nil && ctx.Err() == nil {
			h.n.log.Error(err, "recreating the copy", "pod", key.String())
		}
	}()
}

// replaceable: local may be given a new copy: its restart policy restarts
// it, and its reservation at this provider is live (the capacity is still
// held for it).
func (h *podHandler) replaceable(local *corev1.Pod) bool {
	return local.Spec.RestartPolicy != corev1.RestartPolicyNever && h.n.reservationOf(h.n.ctx, local) != nil
}

// deleteEnded deletes a terminal copy that is to be replaced.
func (h *podHandler) deleteEnded(remote *corev1.Pod) {
	rc := h.n.currentRemote()
	if rc == nil {
		return
	}
	h.n.log.Info("deleting a copy that ended without completing, to make it anew", "copy", remote.Name, "phase", remote.Status.Phase, "reason", remote.Status.Reason)
	pre := metav1.NewUIDPreconditions(string(remote.UID))
	err := rc.client.CoreV1().Pods(remote.Namespace).Delete(h.n.ctx, remote.Name, metav1.DeleteOptions{Preconditions: pre})
	if client404(err) != nil && !apierrors.IsConflict(err) {
		h.n.log.Error(err, "deleting an ended copy", "copy", remote.Name)
	}
}

// failed records a Warning Event on local when out (its status to be
// written) fails it because its copy was stopped (a copy that failed on its
// own fails its pod as a kubelet's pod fails, without one).
func (h *podHandler) failed(local, out *corev1.Pod) {
	if local.Status.Phase == corev1.PodFailed || out.Status.Phase != corev1.PodFailed || !stoppedReasons[out.Status.Reason] {
		return
	}
	h.n.b.recorder.Eventf(local, nil, corev1.EventTypeWarning, out.Status.Reason, "Sync", "%s", out.Status.Message)
}

// retry runs fn until it succeeds, fails for good, or CreateTimeout passes.
func (n *providerNode) retry(ctx context.Context, fn func(context.Context) error) error {
	deadline := time.Now().Add(n.b.cfg.CreateTimeout)
	pace := backoff.Exponential(100*time.Millisecond, 5*time.Second)
	for {
		err := fn(ctx)
		if err == nil || permanent(err) || time.Now().After(deadline) {
			return err
		}
		delay := pace.Step()
		n.log.V(1).Info("retrying", "error", err.Error(), "in", delay)
		select {
		case <-ctx.Done():
			return err
		case <-time.After(delay):
		}
	}
}

func permanent(err error) bool {
	var unsupported errUnsupported
	var collision errCollision
	return errors.As(err, &unsupported) || errors.As(err, &collision) ||
		apierrors.IsInvalid(err) || apierrors.IsBadRequest(err) || errdefs.IsNotFound(err)
}

func client404(err error) error {
	if apierrors.IsNotFound(err) {
		return nil
	}
	return err
}
