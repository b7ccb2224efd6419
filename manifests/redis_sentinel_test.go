package manifests_test

import (
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
)

// TestRedisSentinelVariant: manifests/redis-sentinel is manifests/redis as a
// primary and a replica watched by three Sentinels (quorum 2), under the
// master name the broker's Sentinel flags use; the primary refuses writes
// without its replica and fsyncs each write; no Service spreads the broker
// over both Redis pods; the NetworkPolicies let replication and the
// Sentinels through; the init container that picks the role runs after the
// one that writes the ACL file it appends to.
func TestRedisSentinelVariant(t *testing.T) {
	objs := build(t, "redis-sentinel")
	sts := as[appsv1.StatefulSet](t, find(t, objs, "StatefulSet", "rb-redis"))
	if sts.Spec.Replicas == nil || *sts.Spec.Replicas != 2 {
		t.Errorf("StatefulSet rb-redis: replicas %v, want 2 (a primary and a replica)", sts.Spec.Replicas)
	}
	if sts.Spec.PodManagementPolicy != appsv1.ParallelPodManagement {
		t.Errorf("StatefulSet rb-redis: podManagementPolicy %q, want Parallel (either pod may be the primary)", sts.Spec.PodManagementPolicy)
	}
	pod := sts.Spec.Template.Spec
	var inits []string
	for _, c := range pod.InitContainers {
		inits = append(inits, c.Name)
	}
	if !slices.Equal(inits, []string{"acl", "role"}) {
		t.Errorf("rb-redis init containers %v, want [acl role]", inits)
	}
	if role := strings.Join(pod.InitContainers[len(pod.InitContainers)-1].Command, " "); !strings.Contains(role, "user rb-sentinel on #$hash") ||
		!strings.Contains(role, "+psync +replconf") || !strings.Contains(role, "&__sentinel__:hello") || !strings.Contains(role, "get-master-addr-by-name rb-redis") {
		t.Errorf("init container role: want the rb-sentinel ACL user (replication and Sentinel commands) and the primary asked of the Sentinels, got %s", role)
	}
	cmd := strings.Join(pod.Containers[0].Command, " ")
	if want := "redis-server /usr/local/etc/redis/redis.conf --include /usr/local/etc/redis/ha.conf --include /run/redis-acl/ha.conf"; cmd != want {
		t.Errorf("rb-redis command %q, want %q", cmd, want)
	}
	var cm *corev1.ConfigMap
	for _, v := range pod.Volumes {
		if v.ConfigMap != nil {
			c := as[corev1.ConfigMap](t, find(t, objs, "ConfigMap", v.ConfigMap.Name))
			cm = &c
		}
	}
	if cm == nil {
		t.Fatal("rb-redis: no ConfigMap volume")
	}
	if !strings.Contains(cm.Data["redis.conf"], "appendonly yes") {
		t.Error("ConfigMap: redis.conf of manifests/redis is missing")
	}
	ha := strings.Split(cm.Data["ha.conf"], "\n")
	for _, line := range []string{"min-replicas-to-write 1", "min-replicas-max-lag 10", "appendfsync always", "repl-diskless-sync-delay 0"} {
		if !slices.Contains(ha, line) {
			t.Errorf("ha.conf lacks %q", line)
		}
	}
	// The probes PING: a replica without its primary must still answer PONG.
	if slices.Contains(ha, "replica-serve-stale-data no") {
		t.Error("ha.conf: replica-serve-stale-data no fails the probes of a replica whose primary is gone (MASTERDOWN)")
	}

	sen := as[appsv1.StatefulSet](t, find(t, objs, "StatefulSet", "rb-redis-sentinel"))
	if sen.Spec.Replicas == nil || *sen.Spec.Replicas != 3 {
		t.Errorf("StatefulSet rb-redis-sentinel: replicas %v, want 3", sen.Spec.Replicas)
	}
	script := strings.Join(sen.Spec.Template.Spec.InitContainers[0].Command, " ")
	for _, want := range []string{"sentinel monitor rb-redis $primary 6379 2", "sentinel auth-user rb-redis rb-sentinel", "sentinel resolve-hostnames yes"} {
		if !strings.Contains(script, want) {
			t.Errorf("rb-redis-sentinel config lacks %q", want)
		}
	}
	headless := as[corev1.Service](t, find(t, objs, "Service", sen.Spec.ServiceName))
	if sel := labels.SelectorFromSet(headless.Spec.Selector); !sel.Matches(labels.Set(sen.Spec.Template.Labels)) || headless.Spec.Ports[0].Port != 26379 {
		t.Errorf("Service %s does not serve the Sentinels on 26379", headless.Name)
	}
	for _, u := range objs {
		if u.GetKind() == "Service" && u.GetName() == "rb-redis" {
			t.Error("Service rb-redis must not exist with Sentinel: it would send the broker to the replica")
		}
	}

	admits := func(np networkingv1.NetworkPolicy, from map[string]string, port int32) bool {
		for _, rule := range np.Spec.Ingress {
			for _, peer := range rule.From {
				sel, err := metav1.LabelSelectorAsSelector(peer.PodSelector)
				if err != nil || !sel.Matches(labels.Set(from)) {
					continue
				}
				for _, p := range rule.Ports {
					if p.Port != nil && p.Port.IntVal == port {
						return true
					}
				}
			}
		}
		return false
	}
	broker := map[string]string{"app.kubernetes.io/name": "rb-broker", "app.kubernetes.io/component": "broker"}
	redisNP := as[networkingv1.NetworkPolicy](t, find(t, objs, "NetworkPolicy", "rb-redis"))
	sentinelNP := as[networkingv1.NetworkPolicy](t, find(t, objs, "NetworkPolicy", "rb-redis-sentinel"))
	for name, ok := range map[string]bool{
		"broker -> redis":      admits(redisNP, broker, 6379),
		"redis -> redis":       admits(redisNP, sts.Spec.Template.Labels, 6379),
		"sentinel -> redis":    admits(redisNP, sen.Spec.Template.Labels, 6379),
		"broker -> sentinel":   admits(sentinelNP, broker, 26379),
		"sentinel -> sentinel": admits(sentinelNP, sen.Spec.Template.Labels, 26379),
		"redis -> sentinel":    admits(sentinelNP, sts.Spec.Template.Labels, 26379),
	} {
		if !ok {
			t.Errorf("NetworkPolicies: %s on its port is not admitted", name)
		}
	}
}
