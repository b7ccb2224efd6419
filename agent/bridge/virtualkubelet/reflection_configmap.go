package virtualkubelet

import (
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	applycorev1 "k8s.io/client-go/applyconfigurations/core/v1"
	"k8s.io/utils/ptr"
)

// configMapKind reflects the ConfigMaps the pods use (reflection.go).
type configMapKind struct{}

var _ reflectedKind[*corev1.ConfigMap, *applycorev1.ConfigMapApplyConfiguration] = configMapKind{}

func (configMapKind) kind() string { return "ConfigMap" }

func (configMapKind) local(objs *localObjects) objectGetter[*corev1.ConfigMap] {
	return objs.configMaps
}

func (configMapKind) cached(rc *remoteCluster) objectGetter[*corev1.ConfigMap] { return rc.configMaps }

func (configMapKind) api(rc *remoteCluster) objectAPI[*corev1.ConfigMap, *applycorev1.ConfigMapApplyConfiguration] {
	return rc.client.CoreV1().ConfigMaps(rc.namespace)
}

func (configMapKind) copyOf(local *corev1.ConfigMap, p mirrorParams) (*corev1.ConfigMap, *applycorev1.ConfigMapApplyConfiguration, bool) {
	c := remoteConfigMap(local, p)
	cfg := applycorev1.ConfigMap(c.Name, c.Namespace).WithLabels(c.Labels).WithAnnotations(c.Annotations).
		WithData(c.Data).WithBinaryData(c.BinaryData)
	if c.Immutable != nil {
		cfg.WithImmutable(*c.Immutable)
	}
	return c, cfg, true
}

func (configMapKind) sameContent(existing, desired *corev1.ConfigMap) bool {
	return equality.Semantic.DeepEqual(existing.Data, desired.Data) && equality.Semantic.DeepEqual(existing.BinaryData, desired.BinaryData) &&
		ptr.Deref(existing.Immutable, false) == ptr.Deref(desired.Immutable, false)
}

// mustReplace: an immutable ConfigMap keeps its data, and stays immutable.
func (k configMapKind) mustReplace(existing, desired *corev1.ConfigMap) bool {
	return ptr.Deref(existing.Immutable, false) && !k.sameContent(existing, desired)
}
