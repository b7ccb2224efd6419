package virtualkubelet

import (
	"context"
	"fmt"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apiserver/pkg/authentication/serviceaccount"

	rbv1 "github.com/fluidos-project/resource-broker/api/v1alpha1"
)

// The agent reads a namespace's ConfigMaps and Secrets (to copy those its
// mirrored pods use), and requests tokens of its pods' ServiceAccounts (for
// their copies to call this cluster's API, homeapi.go), only in the
// namespaces whose pods go to a provider: it holds no cluster-wide right to
// read them (manifests/agent/rbac.yaml). The first
// time it mirrors a pod of a namespace it cannot read, it binds the
// ClusterRole MirrorRole to its own ServiceAccount there (RoleBinding
// MirrorRole), which the admission policy rb-agent allows except in
// kube-system, kube-public, kube-node-lease, its own namespace, tenant
// namespaces and namespaces labelled broker.fluidos.eu/offload=false.

// MirrorRole names the ClusterRole, and the RoleBindings of it the agent
// makes, that let it read one namespace's ConfigMaps and Secrets and request
// tokens of its ServiceAccounts.
const MirrorRole = "rb-agent-mirror"

// mirrorAccessWait bounds how long a new RoleBinding may take to reach the
// API server's authorizer (its cache of RBAC objects).
const mirrorAccessWait = 10 * time.Second

// ensureMirrorAccess makes sure the agent may list and watch the ConfigMaps
// and Secrets of namespace, and request tokens there, binding MirrorRole to
// itself there if needed.
func (b *Bridge) ensureMirrorAccess(ctx context.Context, namespace string) error {
	if ok, err := b.canMirror(ctx, namespace); err != nil || ok {
		return err
	}
	user, err := b.whoAmI(ctx)
	if err != nil {
		return err
	}
	saNamespace, saName, err := serviceaccount.SplitUsername(user)
	if err != nil {
		return fmt.Errorf("the agent (%s) may not read the ConfigMaps and Secrets of namespace %s, which its pods use, and is no ServiceAccount to bind ClusterRole %s to: bind it there", user, namespace, MirrorRole)
	}
	binding := &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: MirrorRole, Namespace: namespace,
			Labels: map[string]string{rbv1.ManagedByLabel: rbv1.ManagedByValue}},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: MirrorRole},
		Subjects: []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: saNamespace, Name: saName}},
	}
	_, err = b.local.RbacV1().RoleBindings(namespace).Create(ctx, binding, metav1.CreateOptions{FieldManager: FieldManager})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("reading the ConfigMaps and Secrets of namespace %s, which its pods use: %w", namespace, err)
	}
	b.log.Info("bound ClusterRole "+MirrorRole+" to the agent to read the ConfigMaps and Secrets its pods use", "namespace", namespace)
	// The authorizer sees the binding a moment later.
	var last error
	if err := wait.PollUntilContextTimeout(ctx, 20*time.Millisecond, mirrorAccessWait, true, func(ctx context.Context) (bool, error) {
		ok, err := b.canMirror(ctx, namespace)
		last = err
		return ok, nil
	}); err != nil {
		return fmt.Errorf("RoleBinding %s/%s made, but the agent may still not read the namespace's ConfigMaps and Secrets (%v): %w", namespace, MirrorRole, last, err)
	}
	return nil
}

// mirrorRights are what MirrorRole grants in a namespace that the bridge
// needs: with HomeNetwork, the namespace's Services too.
func (b *Bridge) mirrorRights() []authorizationv1.ResourceAttributes {
	rights := []authorizationv1.ResourceAttributes{
		{Verb: "list", Resource: "configmaps"}, {Verb: "watch", Resource: "configmaps"},
		{Verb: "list", Resource: "secrets"}, {Verb: "watch", Resource: "secrets"},
		{Verb: "create", Resource: "serviceaccounts", Subresource: "token"},
	}
	if b.cfg.HomeNetwork != nil {
		rights = append(rights, authorizationv1.ResourceAttributes{Verb: "list", Resource: "services"},
			authorizationv1.ResourceAttributes{Verb: "watch", Resource: "services"})
	}
	return rights
}

// canMirror asks the API server whether the agent holds mirrorRights in
// namespace.
func (b *Bridge) canMirror(ctx context.Context, namespace string) (bool, error) {
	for _, ra := range b.mirrorRights() {
		ra.Namespace = namespace
		r, err := b.local.AuthorizationV1().SelfSubjectAccessReviews().Create(ctx, &authorizationv1.SelfSubjectAccessReview{
			Spec: authorizationv1.SelfSubjectAccessReviewSpec{ResourceAttributes: &ra},
		}, metav1.CreateOptions{})
		if err != nil {
			return false, err
		}
		if !r.Status.Allowed {
			return false, nil
		}
	}
	return true, nil
}

// whoAmI is the agent's user name, as the API server authenticates it.
func (b *Bridge) whoAmI(ctx context.Context) (string, error) {
	b.objectsMu.Lock()
	user := b.whoami
	b.objectsMu.Unlock()
	if user != "" {
		return user, nil
	}
	r, err := b.local.AuthenticationV1().SelfSubjectReviews().Create(ctx, &authenticationv1.SelfSubjectReview{}, metav1.CreateOptions{})
	if err != nil {
		return "", fmt.Errorf("who the agent is (SelfSubjectReview): %w", err)
	}
	b.objectsMu.Lock()
	b.whoami = r.Status.UserInfo.Username
	b.objectsMu.Unlock()
	return r.Status.UserInfo.Username, nil
}
