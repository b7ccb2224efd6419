package provider

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	schedulingv1 "k8s.io/api/scheduling/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	rbv1 "github.com/fluidos-project/resource-broker/api/v1alpha1"
)

// DefaultHoldPriority is the default value of the rb-placeholder
// PriorityClass (rb-tenant is one more): above ordinary workloads (0 unless
// they name a class), below the system classes (2000000000 and up).
const DefaultHoldPriority = 1000000

// NewPriorityClasses are the PriorityClasses of the provider-side hold
// (shipped in manifests/agent with the default value). The placeholder's
// class takes free capacity only (preemptionPolicy Never); the tenant's,
// one above, preempts: pinned to its placeholder's node, the scheduler's
// victim search there gives up the placeholder and reprieves the rest.
func NewPriorityClasses(holdPriority int32) []*schedulingv1.PriorityClass {
	labels := map[string]string{rbv1.ManagedByLabel: rbv1.ManagedByValue}
	return []*schedulingv1.PriorityClass{{
		ObjectMeta:       metav1.ObjectMeta{Name: rbv1.PlaceholderPriorityClass, Labels: labels},
		Value:            holdPriority,
		PreemptionPolicy: ptr.To(corev1.PreemptNever),
		Description:      "rb-agent: placeholder pods that hold a reservation's capacity for its tenant pod; they take free capacity only",
	}, {
		ObjectMeta:       metav1.ObjectMeta{Name: rbv1.TenantPriorityClass, Labels: labels},
		Value:            holdPriority + 1,
		PreemptionPolicy: ptr.To(corev1.PreemptLowerPriority),
		Description:      "rb-agent: tenant pods pinned to their placeholder's node, which they preempt; tenant namespaces only",
	}}
}

// ClusterObjects ensures, at start-up, the cluster-wide objects of the
// provider side: the tenant policy's admission policies and bindings
// (manifests/agent/tenant-policy.yaml, built in), and with the hold its
// PriorityClasses. It is a manager.Runnable; it retries until it succeeds
// (placeholders fail to be created, and say so, until then), and Ready
// tells the tenant reconciler when tenants may be granted access.
//
// The agent may update the tenant policy, by name, but not create it (an
// admission policy's creation can be limited neither by RBAC names nor by
// another policy): manifests/agent creates it, and an agent that finds it
// missing says so and grants nothing.
type ClusterObjects struct {
	Client client.Client
	// HoldPriority is the value of the rb-placeholder PriorityClass
	// (rb-tenant is one more); 0: no hold, no PriorityClasses.
	HoldPriority int32
	// Retry is the wait between attempts (default 10s).
	Retry time.Duration

	ready atomic.Bool
}

// NeedLeaderElection: the leader's tenant reconciler is the one that needs them.
func (c *ClusterObjects) NeedLeaderElection() bool { return true }

// Ready tells whether the objects are in place (Ensure succeeded once).
func (c *ClusterObjects) Ready() bool { return c.ready.Load() }

// Start ensures the objects, retrying until it succeeds or ctx ends.
func (c *ClusterObjects) Start(ctx context.Context) error {
	logger := log.FromContext(ctx).WithName("provider-policy")
	if c.Retry == 0 {
		c.Retry = 10 * time.Second
	}
	for {
		err := c.Ensure(ctx)
		if err == nil {
			logger.Info("tenant policy in place", "placeholderPriority", c.HoldPriority)
			return nil
		}
		logger.Error(err, "ensuring the tenant policy and the hold's PriorityClasses; no tenant is granted access until then", "retryIn", c.Retry)
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(c.Retry):
		}
	}
}

// FieldOwner is the agent's field manager in server-side applies.
const FieldOwner = "rb-agent"

// Ensure creates or updates the objects once.
func (c *ClusterObjects) Ensure(ctx context.Context) error {
	if c.HoldPriority > 0 {
		for _, want := range NewPriorityClasses(c.HoldPriority) {
			if err := c.ensurePriorityClass(ctx, want); err != nil {
				return err
			}
		}
	}
	for _, obj := range TenantAdmissionPolicy() {
		u, err := runtime.DefaultUnstructuredConverter.ToUnstructured(obj)
		if err != nil {
			return err
		}
		apply := &unstructured.Unstructured{Object: u}
		unstructured.RemoveNestedField(apply.Object, "metadata", "creationTimestamp")
		unstructured.RemoveNestedField(apply.Object, "status")
		err = c.Client.Apply(ctx, client.ApplyConfigurationFromUnstructured(apply), client.FieldOwner(FieldOwner), client.ForceOwnership)
		if apierrors.IsForbidden(err) {
			return fmt.Errorf("%s %s: %w (the agent may only update it: apply manifests/agent, whose tenant-policy.yaml creates it)",
				apply.GetKind(), apply.GetName(), err)
		}
		if err != nil {
			return fmt.Errorf("%s %s: %w", apply.GetKind(), apply.GetName(), err)
		}
	}
	c.ready.Store(true)
	return nil
}

// ensurePriorityClass creates want, or replaces a class of that name whose
// value or preemption policy differ (both are immutable): pods that run
// keep the priority they were admitted with.
func (c *ClusterObjects) ensurePriorityClass(ctx context.Context, want *schedulingv1.PriorityClass) error {
	var have schedulingv1.PriorityClass
	err := c.Client.Get(ctx, client.ObjectKeyFromObject(want), &have)
	switch {
	case apierrors.IsNotFound(err):
	case err != nil:
		return err
	case have.Value == want.Value && ptr.Deref(have.PreemptionPolicy, corev1.PreemptLowerPriority) == *want.PreemptionPolicy:
		return nil
	default:
		log.FromContext(ctx).Info("replacing PriorityClass", "name", want.Name, "value", have.Value, "newValue", want.Value)
		if err := c.Client.Delete(ctx, &have); client.IgnoreNotFound(err) != nil {
			return err
		}
	}
	if err := c.Client.Create(ctx, want.DeepCopy()); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("PriorityClass %s: %w", want.Name, err)
	}
	return nil
}
