package home

import (
	"context"
	"encoding/json"
	"math"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	appsv1 "k8s.io/api/apps/v1"
	autoscalingv1 "k8s.io/api/autoscaling/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/fluidos-project/resource-broker/agent/collector"
	"github.com/fluidos-project/resource-broker/agent/reservation"
	rbv1 "github.com/fluidos-project/resource-broker/api/v1alpha1"
)

// A move home, replacement first. Kubernetes has no "move": the pod's
// Deployment is scaled out by one, so that a replacement is created, which
// rb-scheduler binds to the local node that now holds it; once the
// replacement is Ready at home the moved pod gets the lowest deletion cost
// there is and the Deployment is scaled back: the ReplicaSet controller
// deletes that pod. Availability never drops (a PodDisruptionBudget of
// maxUnavailable 0 holds), nothing is evicted, and the reservation ends with
// the borrowed pod. The move's state is an annotation on the Deployment, so
// that a restarted agent finishes or undoes it; one Deployment has one move
// at a time, and Cooldown between two. Only Deployments are moved: a
// StatefulSet's pod cannot run twice, a Job's would restart its work.
//
// The phases, each a write of the annotation, then of the scale:
//
//	up:   annotation {phase: up, replicas: N}, then scale to N+1;
//	down: once a new pod is Ready on a local node, {phase: down}, then
//	      scale to N; the annotation goes and returned-at is written.
//
// The move is undone (scaled to N, with the cool-down) when the
// replacement lands on a virtual node (home could not hold it after all) or
// is not Ready at home within ReplacementTimeout. Anyone else changing the
// Deployment's replicas meanwhile (a user, an autoscaler) ends it as it is.

// Deployment annotations of a move.
const (
	// MoveAnnotation holds a move in progress (JSON, moveState).
	MoveAnnotation = "broker.fluidos.eu/return-home-move"
	// ReturnedAtAnnotation is when the last move of the Deployment ended (RFC 3339).
	ReturnedAtAnnotation = "broker.fluidos.eu/return-home-last"
)

// Events about moves (on the borrowed pod).
const (
	EventMoving   = "ReturningHome"
	EventMoved    = "ReturnedHome"
	EventUndone   = "ReturnHomeUndone"
	EventNotMoved = "NotReturnedHome"
)

type moveState struct {
	Pod      string      `json:"pod"`
	UID      types.UID   `json:"uid"`
	Phase    string      `json:"phase"`            // up, down
	Replicas int32       `json:"replicas"`         // before the move
	Result   string      `json:"result,omitempty"` // once down: moved or undone
	Started  metav1.Time `json:"started"`
}

var moves = prometheus.NewCounterVec(prometheus.CounterOpts{
	Name: "rb_agent_return_home_moves_total",
	Help: "Moves of borrowed pods home, by result: moved (the replacement Ready at home, the borrowed pod scaled in), undone (the replacement not Ready at home in time, or placed at a provider), abandoned (the Deployment's replicas changed by someone else).",
}, []string{"result"})

func init() { ctrlmetrics.Registry.MustRegister(moves) }

// policyOf is the pod's return-home policy and minimum stay.
func (r *Reconciler) policyOf(ctx context.Context, namespace string, pod reservation.PodState) (string, time.Duration) {
	policy, stay := pod.Annotations[PolicyAnnotation], pod.Annotations[MinStayAnnotation]
	if policy == "" || stay == "" {
		var ns corev1.Namespace
		if err := r.Client.Get(ctx, client.ObjectKey{Name: namespace}, &ns); err == nil {
			if policy == "" {
				policy = ns.Annotations[PolicyAnnotation]
			}
			if stay == "" {
				stay = ns.Annotations[MinStayAnnotation]
			}
		}
	}
	if policy == "" {
		policy = r.DefaultPolicy
	}
	minStay := r.MinStay
	if d, err := time.ParseDuration(stay); err == nil && d >= 0 {
		minStay = d
	}
	return policy, minStay
}

// returnHome starts, goes on with or undoes the move of rsv's pod.
func (r *Reconciler) returnHome(ctx context.Context, rsv *rbv1.Reservation, pod reservation.PodState) (ctrl.Result, error) {
	policy, minStay := r.policyOf(ctx, rsv.Namespace, pod)
	if policy != PolicyWhenLocalFits || !pod.Ready {
		return ctrl.Result{}, nil
	}
	dep, err := r.deploymentOf(ctx, rsv.Namespace, rsv.Spec.PodName)
	if dep == nil || err != nil {
		return ctrl.Result{}, err
	}
	if raw := dep.Annotations[MoveAnnotation]; raw != "" {
		// The move is the Deployment's: whichever of its pods is looked at
		// takes it further (the moved pod's reservation ends with the move).
		var m moveState
		if err := json.Unmarshal([]byte(raw), &m); err != nil {
			return ctrl.Result{}, ignoreConflict(r.end(ctx, dep, m, resultAbandoned))
		}
		if m.UID == pod.UID {
			r.track(client.ObjectKeyFromObject(rsv), client.ObjectKeyFromObject(dep))
		}
		return r.goOn(ctx, dep, m)
	}
	now := r.Now()
	if rsv.Status.ReservedAt != nil {
		if left := rsv.Status.ReservedAt.Add(minStay).Sub(now); left > 0 {
			return ctrl.Result{RequeueAfter: left}, nil
		}
	}
	if last, err := time.Parse(time.RFC3339, dep.Annotations[ReturnedAtAnnotation]); err == nil {
		if left := last.Add(r.cooldown()).Sub(now); left > 0 {
			return ctrl.Result{RequeueAfter: left}, nil
		}
	}
	if !settled(dep) {
		return waitForWorkload, nil // Deployments are not watched: looked at again
	}
	if !r.localFits(rsv.Spec.Resources) {
		// Looked at again when the local capacity changes, and now and
		// then all the same: a level, not an edge.
		return ctrl.Result{RequeueAfter: recheck}, nil
	}
	m := moveState{Pod: rsv.Spec.PodName, UID: pod.UID, Phase: phaseUp, Replicas: *dep.Spec.Replicas, Started: metav1.NewTime(now.Truncate(time.Second))}
	if err := r.annotate(ctx, dep, &m); err != nil {
		return ctrl.Result{}, ignoreConflict(err)
	}
	r.track(client.ObjectKeyFromObject(rsv), client.ObjectKeyFromObject(dep))
	log.FromContext(ctx).Info("moving a borrowed pod home: scaling its Deployment out by one first", "pod", m.Pod, "deployment", dep.Name, "provider", rsv.Status.Provider)
	r.event(dep, m, corev1.EventTypeNormal, EventMoving, "a local node can hold the pod: Deployment %s scaled to %d so that a replacement starts at home first", dep.Name, m.Replicas+1)
	return r.goOn(ctx, dep, m)
}

// track remembers that the pod of Reservation rsv is being moved, with dep.
func (r *Reconciler) track(rsv, dep types.NamespacedName) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.moving == nil {
		r.moving = map[types.NamespacedName]types.NamespacedName{}
	}
	r.moving[rsv] = dep
}

// orphanedMove takes further the move of a pod that went, or ended, before
// its move did (it was deleted, or its provider lost it): the Deployment
// is scaled back all the same. A move whose pod and agent both went (a
// restart) is taken further by the next look at another pod of the
// Deployment.
func (r *Reconciler) orphanedMove(ctx context.Context, rsv types.NamespacedName) (ctrl.Result, error) {
	r.mu.Lock()
	key, ok := r.moving[rsv]
	r.mu.Unlock()
	if !ok {
		return ctrl.Result{}, nil
	}
	var dep appsv1.Deployment
	err := r.APIReader.Get(ctx, key, &dep)
	raw := dep.Annotations[MoveAnnotation]
	var m moveState
	if apierrors.IsNotFound(err) || (err == nil && (raw == "" || json.Unmarshal([]byte(raw), &m) != nil || dep.Spec.Replicas == nil)) {
		r.mu.Lock()
		delete(r.moving, rsv)
		r.mu.Unlock()
		return ctrl.Result{}, nil
	}
	if err != nil {
		return ctrl.Result{}, err
	}
	return r.goOn(ctx, &dep, m)
}

// goOn takes the move m one step further; each step is one write, and the
// next reads the Deployment again.
func (r *Reconciler) goOn(ctx context.Context, dep *appsv1.Deployment, m moveState) (ctrl.Result, error) {
	replicas := *dep.Spec.Replicas
	switch {
	case m.Phase == phaseUp && replicas == m.Replicas:
		return requeueSoon, ignoreConflict(r.scale(ctx, dep, m.Replicas+1))
	case m.Phase == phaseUp && replicas == m.Replicas+1:
		placed, err := r.replacement(ctx, dep, m)
		if err != nil {
			return ctrl.Result{}, err
		}
		timedOut := r.Now().Sub(m.Started.Time) > r.replacementTimeout()
		if placed == placedNot && !timedOut {
			return requeueSoon, nil
		}
		m.Phase, m.Result = phaseDown, resultMoved
		if placed != placedHome {
			m.Result = resultUndone
		}
		if err := r.annotate(ctx, dep, &m); err != nil {
			return ctrl.Result{}, ignoreConflict(err)
		}
		switch {
		case placed == placedHome:
			r.event(dep, m, corev1.EventTypeNormal, EventMoved, "a replacement is Ready at home: Deployment %s scaled back to %d, which scales in this pod (given the lowest deletion cost)", dep.Name, m.Replicas)
		case placed == placedAway:
			r.event(dep, m, corev1.EventTypeWarning, EventUndone, "the replacement was placed at a provider (home could not hold it after all): Deployment %s scaled back to %d", dep.Name, m.Replicas)
		default:
			r.event(dep, m, corev1.EventTypeWarning, EventUndone, "the replacement was not Ready at home within %s: Deployment %s scaled back to %d", r.replacementTimeout(), dep.Name, m.Replicas)
		}
		return r.goOn(ctx, dep, m)
	case m.Phase == phaseDown && replicas == m.Replicas+1:
		// The moved pod is the one the ReplicaSet scales in: the lowest
		// cost there is (another borrowed pod would go otherwise; undone,
		// the replacement, not Ready or borrowed, goes before it anyway).
		if m.Result == resultMoved {
			if err := r.setCost(ctx, dep.Namespace, m.Pod, m.UID, strconv.Itoa(math.MinInt32), movingMarker); err != nil {
				return ctrl.Result{}, err
			}
		}
		// Scaled back, then ended at once: the moved pod goes with the
		// scale, and its reservation with it, so no later look is due.
		if err := r.scale(ctx, dep, m.Replicas); err != nil {
			return ctrl.Result{}, ignoreConflict(err)
		}
		// Another pod of the Deployment is looked at after the cool-down.
		return r.afterCooldown(), client.IgnoreNotFound(r.end(ctx, dep, m, m.Result))
	case m.Phase == phaseDown && replicas == m.Replicas:
		return r.afterCooldown(), ignoreConflict(r.end(ctx, dep, m, m.Result))
	default: // someone else scaled the Deployment: theirs to decide
		r.event(dep, m, corev1.EventTypeWarning, EventNotMoved, "Deployment %s was scaled to %d by someone else during the move: left as it is", dep.Name, replicas)
		return r.afterCooldown(), ignoreConflict(r.end(ctx, dep, m, resultAbandoned))
	}
}

// Phases and results of a move.
const (
	phaseUp, phaseDown                         = "up", "down"
	resultMoved, resultUndone, resultAbandoned = "moved", "undone", "abandoned"
)

// requeueSoon looks at a move again after one step; waitForWorkload at a
// pod whose Deployment is busy (another pod's move, a rollout).
var requeueSoon, waitForWorkload = ctrl.Result{RequeueAfter: time.Second}, ctrl.Result{RequeueAfter: 3 * time.Second}

// recheck is how often a borrowed pod that may move home is looked at
// while no local node can hold it, besides the collector's changes.
const recheck = 30 * time.Second

// end removes the move's annotation and starts the cool-down. Without a
// precondition: the Deployment controller writes the status of a
// Deployment just scaled many times a second, and nobody else writes a
// move (one leader, one worker).
func (r *Reconciler) end(ctx context.Context, dep *appsv1.Deployment, m moveState, result string) error {
	patch := map[string]any{"metadata": map[string]any{"annotations": map[string]any{
		MoveAnnotation: nil, ReturnedAtAnnotation: r.Now().UTC().Format(time.RFC3339)}}}
	if err := r.patchDeployment(ctx, dep, patch); err != nil {
		return err
	}
	moves.WithLabelValues(result).Inc()
	log.FromContext(ctx).Info("move home ended", "pod", m.Pod, "deployment", dep.Name, "result", result)
	return nil
}

// placement of a move's replacement.
type placement int

const (
	placedNot  placement = iota // none yet, or not Ready
	placedHome                  // a new pod Ready on a local node
	placedAway                  // a new pod bound to a virtual node
)

// replacement finds the pods of dep created since the move started.
func (r *Reconciler) replacement(ctx context.Context, dep *appsv1.Deployment, m moveState) (placement, error) {
	sel, err := metav1.LabelSelectorAsSelector(dep.Spec.Selector)
	if err != nil {
		return placedNot, err
	}
	var pods corev1.PodList
	if err := r.APIReader.List(ctx, &pods, client.InNamespace(dep.Namespace), client.MatchingLabelsSelector{Selector: sel}); err != nil {
		return placedNot, err
	}
	out := placedNot
	for i := range pods.Items {
		p := &pods.Items[i]
		if p.UID == m.UID || !p.DeletionTimestamp.IsZero() || p.CreationTimestamp.Before(&m.Started) || p.Spec.NodeName == "" {
			continue
		}
		var node corev1.Node // from the manager's cache
		switch {
		case r.Client.Get(ctx, client.ObjectKey{Name: p.Spec.NodeName}, &node) == nil && collector.IsVirtualNode(&node):
			return placedAway, nil
		case reservation.PodReady(p):
			out = placedHome
		}
	}
	return out, nil
}

// deploymentOf is the Deployment whose ReplicaSet controls the pod (nil: none).
func (r *Reconciler) deploymentOf(ctx context.Context, namespace, name string) (*appsv1.Deployment, error) {
	var pod corev1.Pod
	if err := r.APIReader.Get(ctx, client.ObjectKey{Namespace: namespace, Name: name}, &pod); err != nil {
		return nil, client.IgnoreNotFound(err)
	}
	ref := metav1.GetControllerOf(&pod)
	if ref == nil || ref.Kind != "ReplicaSet" {
		return nil, nil
	}
	var rs appsv1.ReplicaSet
	if err := r.APIReader.Get(ctx, client.ObjectKey{Namespace: namespace, Name: ref.Name}, &rs); err != nil {
		return nil, client.IgnoreNotFound(err)
	}
	ref = metav1.GetControllerOf(&rs)
	if ref == nil || ref.Kind != "Deployment" {
		return nil, nil
	}
	var dep appsv1.Deployment
	if err := r.APIReader.Get(ctx, client.ObjectKey{Namespace: namespace, Name: ref.Name}, &dep); err != nil {
		return nil, client.IgnoreNotFound(err)
	}
	if dep.Spec.Replicas == nil {
		return nil, nil
	}
	return &dep, nil
}

// settled: the Deployment is not rolling out, and every replica is available.
func settled(dep *appsv1.Deployment) bool {
	n := *dep.Spec.Replicas
	s := dep.Status
	return s.ObservedGeneration >= dep.Generation && s.Replicas == n && s.UpdatedReplicas == n && s.AvailableReplicas == n
}

// localFits: one local node has room for the requests (the scheduler still
// decides; a replacement it sends away undoes the move).
func (r *Reconciler) localFits(req corev1.ResourceList) bool {
	if r.Local == nil {
		return false
	}
	r.mu.Lock()
	if r.Now().Sub(r.measAt) > remeasure {
		r.measured, r.measAt = r.Local.Measure(), r.Now()
	}
	nodes := r.measured.NodeSummary
	r.mu.Unlock()
	for _, n := range nodes {
		fits := true
		for res, want := range req {
			free := n.Allocatable[res].DeepCopy()
			free.Sub(n.Allocated[res])
			if free.Cmp(want) < 0 {
				fits = false
				break
			}
		}
		if fits {
			return true
		}
	}
	return false
}

// annotate writes the move's state on the Deployment (conflict: it changed).
func (r *Reconciler) annotate(ctx context.Context, dep *appsv1.Deployment, m *moveState) error {
	raw, err := json.Marshal(m)
	if err != nil {
		return err
	}
	return r.patchDeployment(ctx, dep, map[string]any{"metadata": map[string]any{
		"resourceVersion": dep.ResourceVersion, "annotations": map[string]any{MoveAnnotation: string(raw)}}})
}

func (r *Reconciler) patchDeployment(ctx context.Context, dep *appsv1.Deployment, patch map[string]any) error {
	raw, err := json.Marshal(patch)
	if err != nil {
		return err
	}
	return r.Client.Patch(ctx, dep, client.RawPatch(types.MergePatchType, raw))
}

// scale sets the Deployment's replicas through its scale subresource.
func (r *Reconciler) scale(ctx context.Context, dep *appsv1.Deployment, replicas int32) error {
	sc := &autoscalingv1.Scale{Spec: autoscalingv1.ScaleSpec{Replicas: replicas}}
	err := r.Client.SubResource("scale").Update(ctx, dep, client.WithSubResourceBody(sc))
	if err != nil {
		return err
	}
	dep.Spec.Replicas = &replicas
	return nil
}

// event tells about a move on its pod.
func (r *Reconciler) event(dep *appsv1.Deployment, m moveState, typ, reason, note string, args ...any) {
	if r.Recorder == nil {
		return
	}
	pod := &corev1.Pod{}
	pod.Namespace, pod.Name, pod.UID = dep.Namespace, m.Pod, m.UID
	r.Recorder.Eventf(pod, nil, typ, reason, "ReturnHome", note, args...)
}

// afterCooldown looks at a pod again once the Deployment's cool-down passed.
func (r *Reconciler) afterCooldown() ctrl.Result {
	return ctrl.Result{RequeueAfter: r.cooldown() + time.Second}
}

func (r *Reconciler) cooldown() time.Duration {
	if r.Cooldown > 0 {
		return r.Cooldown
	}
	return DefaultCooldown
}

func (r *Reconciler) replacementTimeout() time.Duration {
	if r.ReplacementTimeout > 0 {
		return r.ReplacementTimeout
	}
	return DefaultReplacementTimeout
}

func ignoreConflict(err error) error {
	if apierrors.IsConflict(err) || apierrors.IsNotFound(err) {
		return nil
	}
	return err
}
