package testbed

import (
	"context"
	"fmt"
	"path/filepath"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/fluidos-project/resource-broker/internal/kustomize"
)

// The bed runs every rb-agent and rb-scheduler as its ServiceAccount, with
// the roles, bindings and admission policies of manifests/agent and
// manifests/scheduler (kustomize build, applied to each cluster as `kubectl
// apply -k` would) and a token of it, as a pod of it would mount: every test
// on a bed is a proof that those permissions suffice.

// identityKinds are what the bed applies of each base: the agent's and the
// scheduler's namespace, identity and permissions, and the hold's
// PriorityClasses (the Deployments, configuration and certificates are the
// bed's own).
var identityKinds = map[string][]string{
	"agent":     append([]string{"Namespace", "PriorityClass"}, kustomize.RBAC...),
	"scheduler": append([]string{"Namespace"}, kustomize.RBAC...),
}

// Names of the components' ServiceAccounts (in AgentNamespace).
const (
	AgentServiceAccount     = "rb-agent"
	SchedulerServiceAccount = "rb-scheduler"
)

// Identities are the objects of manifests/agent and manifests/scheduler
// (under moduleRoot) that give rb-agent and rb-scheduler their identities
// and permissions, to apply with kustomize.Apply.
func Identities(moduleRoot string) ([]*unstructured.Unstructured, error) {
	var out []*unstructured.Unstructured
	for _, base := range []string{"agent", "scheduler"} {
		objs, err := kustomize.Build(filepath.Join(moduleRoot, "manifests", base))
		if err != nil {
			return nil, err
		}
		out = append(out, kustomize.Kinds(objs, identityKinds[base]...)...)
	}
	return out, nil
}

// identities are the bed's Identities, built once.
func (b *Bed) identities() ([]*unstructured.Unstructured, error) {
	b.identitiesOnce.Do(func() { b.identityObjs, b.identitiesErr = Identities(b.moduleRoot) })
	return b.identityObjs, b.identitiesErr
}

// installIdentities applies the manifests' identities and permissions to
// the cluster and writes the kubeconfigs its agent and scheduler run with.
func (c *Cluster) installIdentities(ctx context.Context) error {
	objs, err := c.bed.identities()
	if err != nil {
		return err
	}
	if err := kustomize.Apply(ctx, c.Config, "rb-testbed", objs); err != nil {
		return fmt.Errorf("%s: the manifests' RBAC and policies: %w", c.Name, err)
	}
	if c.AgentKubeconfig, err = c.serviceAccountKubeconfig(ctx, AgentNamespace, AgentServiceAccount); err != nil {
		return fmt.Errorf("%s: rb-agent's token: %w", c.Name, err)
	}
	if c.SchedulerKubeconfig, err = c.serviceAccountKubeconfig(ctx, AgentNamespace, SchedulerServiceAccount); err != nil {
		return fmt.Errorf("%s: rb-scheduler's token: %w", c.Name, err)
	}
	return nil
}
