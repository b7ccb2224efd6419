// Package rsvstatus holds what both bridges need of Reservations: which ones
// count, and how to write the few status fields the bridge owns without
// fighting the reservation reconciler (which updates status as a whole).
package rsvstatus

import (
	"context"
	"encoding/json"

	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	corev1 "k8s.io/api/core/v1"

	rbv1 "github.com/fluidos-project/resource-broker/api/v1alpha1"
)

// FieldOwner is the field manager of the bridge's status writes.
const FieldOwner = "rb-bridge"

// ConditionVirtualNode is True when the reservation's virtual node is in place.
const ConditionVirtualNode = "VirtualNode"

// ProviderIndex indexes Reservations by status.provider.
const ProviderIndex = "bridge.status.provider"

// IndexProvider is the extractor of ProviderIndex.
func IndexProvider(o client.Object) []string {
	if p := o.(*rbv1.Reservation).Status.Provider; p != "" {
		return []string{p}
	}
	return nil
}

// Live tells that the broker holds capacity for r (and r is not being deleted).
func Live(r *rbv1.Reservation) bool {
	return r.DeletionTimestamp.IsZero() &&
		(r.Status.Phase == rbv1.ReservationReserved || r.Status.Phase == rbv1.ReservationActive)
}

// Active tells that r is live and its provider has granted access.
func Active(r *rbv1.Reservation) bool {
	return r.DeletionTimestamp.IsZero() && r.Status.Phase == rbv1.ReservationActive
}

// Sum adds up the resources of reservations.
func Sum(rsvs []*rbv1.Reservation) corev1.ResourceList {
	out := corev1.ResourceList{}
	for _, r := range rsvs {
		for name, q := range r.Spec.Resources {
			sum, ok := out[name]
			if !ok {
				sum = resource.Quantity{Format: q.Format}
			}
			sum.Add(q)
			out[name] = sum
		}
	}
	return out
}

// SetVirtualNode writes status.virtualNode alone with a JSON merge patch: it
// carries no resourceVersion, so it neither conflicts with the reconciler's
// updates nor drops what they wrote; their updates, made from a copy that
// includes it (or refused as conflicts), keep it.
func SetVirtualNode(ctx context.Context, c client.Client, r *rbv1.Reservation, node string) error {
	if r.Status.VirtualNode == node {
		return nil
	}
	data, err := json.Marshal(map[string]any{"status": map[string]any{"virtualNode": node}})
	if err != nil {
		return err
	}
	err = c.Status().Patch(ctx, r, client.RawPatch(types.MergePatchType, data), client.FieldOwner(FieldOwner))
	return client.IgnoreNotFound(err)
}

// Report writes the VirtualNode condition (and, when reason is given for a
// refusal, status.reason and status.message) with server-side apply: the
// conditions list is merged by type, so the reconciler's conditions stay.
func Report(ctx context.Context, c client.Client, r *rbv1.Reservation, cond metav1.Condition, setReason bool) error {
	cur := findCondition(r.Status.Conditions, cond.Type)
	if cur != nil && cur.Status == cond.Status && cur.Reason == cond.Reason && cur.Message == cond.Message &&
		(!setReason || (r.Status.Reason == cond.Reason && r.Status.Message == cond.Message)) {
		return nil
	}
	now := metav1.Now()
	if cur != nil && cur.Status == cond.Status {
		now = cur.LastTransitionTime
	}
	condition := map[string]any{
		"type": cond.Type, "status": string(cond.Status), "reason": cond.Reason, "message": cond.Message,
		"lastTransitionTime": now.UTC().Format("2006-01-02T15:04:05Z"), "observedGeneration": r.Generation,
	}
	status := map[string]any{"conditions": []any{condition}}
	if setReason {
		status["reason"], status["message"] = cond.Reason, cond.Message
	}
	obj := map[string]any{
		"apiVersion": rbv1.GroupVersion.String(), "kind": "Reservation",
		"metadata": map[string]any{"name": r.Name, "namespace": r.Namespace},
		"status":   status,
	}
	data, err := json.Marshal(obj)
	if err != nil {
		return err
	}
	err = c.Status().Patch(ctx, r, client.RawPatch(types.ApplyPatchType, data), client.FieldOwner(FieldOwner), client.ForceOwnership)
	return client.IgnoreNotFound(err)
}

func findCondition(conds []metav1.Condition, typ string) *metav1.Condition {
	for i := range conds {
		if conds[i].Type == typ {
			return &conds[i]
		}
	}
	return nil
}
