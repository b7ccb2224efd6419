package virtualkubelet

import (
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	applycorev1 "k8s.io/client-go/applyconfigurations/core/v1"
	"k8s.io/utils/ptr"
)

// secretKind reflects the Secrets the pods use (reflection.go), but
// service-account tokens. The home API token Secrets are homeapi.go's.
type secretKind struct{ n *providerNode }

var _ reflectedKind[*corev1.Secret, *applycorev1.SecretApplyConfiguration] = secretKind{}

func (secretKind) kind() string { return "Secret" }

func (secretKind) local(objs *localObjects) objectGetter[*corev1.Secret] { return objs.secrets }

func (secretKind) cached(rc *remoteCluster) objectGetter[*corev1.Secret] { return rc.secrets }

func (secretKind) api(rc *remoteCluster) objectAPI[*corev1.Secret, *applycorev1.SecretApplyConfiguration] {
	return rc.client.CoreV1().Secrets(rc.namespace)
}

func (k secretKind) copyOf(local *corev1.Secret, p mirrorParams) (*corev1.Secret, *applycorev1.SecretApplyConfiguration, bool) {
	if local.Type == corev1.SecretTypeServiceAccountToken {
		k.n.log.Info("not copying a service account token to the provider", "secret", local.Namespace+"/"+local.Name)
		return nil, nil, false
	}
	c := remoteSecret(local, p)
	cfg := applycorev1.Secret(c.Name, c.Namespace).WithLabels(c.Labels).WithAnnotations(c.Annotations).
		WithType(c.Type).WithData(c.Data)
	if c.Immutable != nil {
		cfg.WithImmutable(*c.Immutable)
	}
	return c, cfg, true
}

func (secretKind) sameContent(existing, desired *corev1.Secret) bool {
	return existing.Type == desired.Type && equality.Semantic.DeepEqual(existing.Data, desired.Data) &&
		ptr.Deref(existing.Immutable, false) == ptr.Deref(desired.Immutable, false)
}

// mustReplace: a Secret's type cannot change; an immutable one keeps its
// data, and stays immutable.
func (k secretKind) mustReplace(existing, desired *corev1.Secret) bool {
	return existing.Type != desired.Type || (ptr.Deref(existing.Immutable, false) && !k.sameContent(existing, desired))
}
