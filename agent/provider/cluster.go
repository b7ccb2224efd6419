package provider

import (
	"context"
	"fmt"
	"time"

	admissionv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	schedulingv1 "k8s.io/api/scheduling/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/log"

	rbv1 "github.com/fluidos-project/resource-broker/api/v1alpha1"
)

// DefaultHoldPriority is the default value of the rb-placeholder
// PriorityClass (rb-tenant is one more): above ordinary workloads (0 unless
// they name a class), below the system classes (2000000000 and up).
const DefaultHoldPriority = 1000000

// TenantPodPolicy names the ValidatingAdmissionPolicy (and its binding) that
// keeps the hold's PriorityClasses to their use.
const TenantPodPolicy = "rb-tenant-pods"

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

// NewTenantPodPolicy is the admission policy (and binding) that closes the
// hold's abuse hole: a tenant's ServiceAccount may create pods of no
// PriorityClass or of rb-tenant only (not rb-placeholder, not any class
// above), and no one may create pods of rb-tenant or rb-placeholder outside
// the tenant namespaces (label broker.fluidos.eu/tenant), where the tenant's
// ResourceQuota caps them.
func NewTenantPodPolicy() (*admissionv1.ValidatingAdmissionPolicy, *admissionv1.ValidatingAdmissionPolicyBinding) {
	labels := map[string]string{rbv1.ManagedByLabel: rbv1.ManagedByValue}
	policy := &admissionv1.ValidatingAdmissionPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: TenantPodPolicy, Labels: labels},
		Spec: admissionv1.ValidatingAdmissionPolicySpec{
			FailurePolicy: ptr.To(admissionv1.Fail),
			MatchConstraints: &admissionv1.MatchResources{ResourceRules: []admissionv1.NamedRuleWithOperations{{
				RuleWithOperations: admissionv1.RuleWithOperations{
					// spec.priorityClassName is immutable: creation is enough.
					Operations: []admissionv1.OperationType{admissionv1.Create},
					Rule:       admissionv1.Rule{APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{"pods"}},
				},
			}}},
			Variables: []admissionv1.Variable{
				{Name: "class", Expression: "has(object.spec.priorityClassName) ? object.spec.priorityClassName : ''"},
				{Name: "tenantNamespace", Expression: fmt.Sprintf(
					"namespaceObject != null && has(namespaceObject.metadata.labels) && '%s' in namespaceObject.metadata.labels", rbv1.TenantLabel)},
				{Name: "tenant", Expression: fmt.Sprintf(
					"request.userInfo.username == 'system:serviceaccount:' + request.namespace + ':%s'", TenantServiceAccount)},
			},
			Validations: []admissionv1.Validation{{
				Expression: fmt.Sprintf("!variables.tenant || variables.class == '' || variables.class == '%s'", rbv1.TenantPriorityClass),
				Message:    fmt.Sprintf("a tenant may create pods of PriorityClass %s or none only", rbv1.TenantPriorityClass),
				Reason:     ptr.To(metav1.StatusReasonForbidden),
			}, {
				Expression: fmt.Sprintf("!(variables.class in ['%s', '%s']) || variables.tenantNamespace",
					rbv1.TenantPriorityClass, rbv1.PlaceholderPriorityClass),
				Message: fmt.Sprintf("PriorityClasses %s and %s are for tenant namespaces (label %s) only",
					rbv1.TenantPriorityClass, rbv1.PlaceholderPriorityClass, rbv1.TenantLabel),
				Reason: ptr.To(metav1.StatusReasonForbidden),
			}},
		},
	}
	binding := &admissionv1.ValidatingAdmissionPolicyBinding{
		ObjectMeta: metav1.ObjectMeta{Name: TenantPodPolicy, Labels: labels},
		Spec: admissionv1.ValidatingAdmissionPolicyBindingSpec{
			PolicyName:        TenantPodPolicy,
			ValidationActions: []admissionv1.ValidationAction{admissionv1.Deny},
		},
	}
	return policy, binding
}

// ClusterObjects ensures, at start-up, the cluster-wide objects of the
// provider-side hold: its PriorityClasses and the tenant pod policy. It is a
// manager.Runnable; it retries until it succeeds (placeholders fail to be
// created, and say so, until then).
type ClusterObjects struct {
	Client       client.Client
	HoldPriority int32
	// Retry is the wait between attempts (default 10s).
	Retry time.Duration
}

// NeedLeaderElection: the leader's tenant reconciler is the one that needs them.
func (c *ClusterObjects) NeedLeaderElection() bool { return true }

// Start ensures the objects, retrying until it succeeds or ctx ends.
func (c *ClusterObjects) Start(ctx context.Context) error {
	logger := log.FromContext(ctx).WithName("provider-hold")
	if c.Retry == 0 {
		c.Retry = 10 * time.Second
	}
	for {
		err := c.Ensure(ctx)
		if err == nil {
			logger.Info("hold PriorityClasses and tenant pod policy in place", "placeholderPriority", c.HoldPriority)
			return nil
		}
		logger.Error(err, "ensuring the hold's PriorityClasses and tenant pod policy, retrying", "in", c.Retry)
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(c.Retry):
		}
	}
}

// Ensure creates or updates the objects once.
func (c *ClusterObjects) Ensure(ctx context.Context) error {
	for _, want := range NewPriorityClasses(c.HoldPriority) {
		if err := c.ensurePriorityClass(ctx, want); err != nil {
			return err
		}
	}
	policy, binding := NewTenantPodPolicy()
	p := &admissionv1.ValidatingAdmissionPolicy{ObjectMeta: metav1.ObjectMeta{Name: policy.Name}}
	if _, err := controllerutil.CreateOrUpdate(ctx, c.Client, p, func() error {
		p.Labels, p.Spec = policy.Labels, policy.Spec
		return nil
	}); err != nil {
		return fmt.Errorf("ValidatingAdmissionPolicy %s: %w", policy.Name, err)
	}
	b := &admissionv1.ValidatingAdmissionPolicyBinding{ObjectMeta: metav1.ObjectMeta{Name: binding.Name}}
	if _, err := controllerutil.CreateOrUpdate(ctx, c.Client, b, func() error {
		b.Labels, b.Spec = binding.Labels, binding.Spec
		return nil
	}); err != nil {
		return fmt.Errorf("ValidatingAdmissionPolicyBinding %s: %w", binding.Name, err)
	}
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
