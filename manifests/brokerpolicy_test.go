package manifests_test

import (
	"path"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"

	"github.com/fluidos-project/resource-broker/broker/model"
	"github.com/fluidos-project/resource-broker/broker/policy"
)

// TestBrokerPolicyAndGrantKey: the broker's fair-share policy is the
// generated ConfigMap (a new name for each edit: the Deployment rolls out),
// mounted where --policy-file reads it, and valid (the broker would refuse
// to start on a mistake); the grant keys come from Secret
// rb-broker-grant-key at --grant-key-file.
func TestBrokerPolicyAndGrantKey(t *testing.T) {
	objs := build(t, "broker")
	dep := as[appsv1.Deployment](t, find(t, objs, "Deployment", "rb-broker"))
	pod := dep.Spec.Template.Spec
	ctr := pod.Containers[0]
	flag := func(name string) string {
		for _, a := range ctr.Args {
			if v, ok := strings.CutPrefix(a, "--"+name+"="); ok {
				return v
			}
		}
		t.Fatalf("rb-broker args %q lack --%s", ctr.Args, name)
		return ""
	}
	volumeAt := func(file string) corev1.Volume {
		for _, m := range ctr.VolumeMounts {
			if m.MountPath == path.Dir(file) {
				for _, v := range pod.Volumes {
					if v.Name == m.Name {
						return v
					}
				}
			}
		}
		t.Fatalf("nothing mounted at %s", path.Dir(file))
		return corev1.Volume{}
	}

	policyFile := flag("policy-file")
	v := volumeAt(policyFile)
	if v.ConfigMap == nil || !strings.HasPrefix(v.ConfigMap.Name, "rb-broker-policy-") {
		t.Fatalf("--policy-file %s: want the generated ConfigMap rb-broker-policy-<hash>, got %+v", policyFile, v)
	}
	cm := as[corev1.ConfigMap](t, find(t, objs, "ConfigMap", v.ConfigMap.Name))
	p, err := policy.Parse([]byte(cm.Data[path.Base(policyFile)]))
	if err != nil {
		t.Fatalf("the shipped policy: %v", err)
	}
	if l := p.Limits("any"); l.Reservations == nil || l.CPU == nil || l.Priority == nil || l.Rate == 0 {
		t.Errorf("the shipped policy should limit every requester: %+v", l)
	}
	big := model.Advertisement{Capacity: model.Resources{CPU: 1 << 40}, Allocatable: model.Resources{CPU: 1 << 40}}
	if err := p.CheckAdvertisement("any", big); err == nil {
		t.Error("the shipped policy should bound what a provider advertises")
	}

	keyFile := flag("grant-key-file")
	v = volumeAt(keyFile)
	if v.Secret == nil || v.Secret.SecretName != "rb-broker-grant-key" || len(v.Secret.Items) != 1 ||
		v.Secret.Items[0].Key != "keys" || v.Secret.Items[0].Path != path.Base(keyFile) {
		t.Errorf("--grant-key-file %s: want Secret rb-broker-grant-key's key keys, got %+v", keyFile, v)
	}
}
