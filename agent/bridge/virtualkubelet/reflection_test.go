package virtualkubelet

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
)

func TestCopyKey(t *testing.T) {
	marked := func(name, ns, origin string) *corev1.ConfigMap {
		return &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name, Annotations: map[string]string{
			OriginNamespaceAnnotation: ns, OriginNameAnnotation: origin}}}
	}
	long := strings.Repeat("x", 250)
	for _, c := range []struct {
		name string
		obj  *corev1.ConfigMap
		want types.NamespacedName
		ok   bool
	}{
		{"a copy", marked("shop.settings", "shop", "settings"), types.NamespacedName{Namespace: "shop", Name: "settings"}, true},
		{"a dotted name", marked("shop.a.b", "shop", "a.b"), types.NamespacedName{Namespace: "shop", Name: "a.b"}, true},
		{"a shortened name, marked", marked(RemoteName("shop", long), "shop", long), types.NamespacedName{Namespace: "shop", Name: long}, true},
		{"someone else's object under a copy's name", marked("shop.settings", "shop", "other"), types.NamespacedName{Namespace: "shop", Name: "settings"}, true},
		{"not a copy's name", marked("settings", "", ""), types.NamespacedName{}, false},
	} {
		key, ok := copyKey(c.obj)
		assert.Equal(t, c.ok, ok, c.name)
		assert.Equal(t, c.want, key, c.name)
	}
}

func TestMustReplace(t *testing.T) {
	cm := func(immutable bool, data string) *corev1.ConfigMap {
		return &corev1.ConfigMap{Immutable: ptr.To(immutable), Data: map[string]string{"k": data}}
	}
	var cms configMapKind
	assert.False(t, cms.mustReplace(cm(false, "a"), cm(false, "b")), "mutable: applied")
	assert.False(t, cms.mustReplace(cm(true, "a"), cm(true, "a")), "immutable, same data: its labels can be applied")
	assert.True(t, cms.mustReplace(cm(true, "a"), cm(true, "b")), "immutable data changed")
	assert.True(t, cms.mustReplace(cm(true, "a"), cm(false, "a")), "immutable stays immutable")
	assert.True(t, cms.sameContent(&corev1.ConfigMap{Immutable: ptr.To(false)}, &corev1.ConfigMap{Data: map[string]string{}}),
		"unset is false, empty is none")

	secret := func(typ corev1.SecretType, immutable bool, data string) *corev1.Secret {
		return &corev1.Secret{Type: typ, Immutable: ptr.To(immutable), Data: map[string][]byte{"k": []byte(data)}}
	}
	var secrets secretKind
	assert.False(t, secrets.mustReplace(secret(corev1.SecretTypeOpaque, false, "a"), secret(corev1.SecretTypeOpaque, false, "b")))
	assert.True(t, secrets.mustReplace(secret(corev1.SecretTypeOpaque, false, "a"), secret(corev1.SecretTypeBasicAuth, false, "a")), "type changed")
	assert.True(t, secrets.mustReplace(secret(corev1.SecretTypeOpaque, true, "a"), secret(corev1.SecretTypeOpaque, true, "b")), "immutable data changed")
}
