package virtualkubelet

import (
	"fmt"
	"maps"
	"strconv"
	"testing"

	corev1 "k8s.io/api/core/v1"
)

// BenchmarkHomeView: what a borrowed pod's copy costs in home-network mode
// as its home namespace holds more Services (one port each). "inline": the
// copy carries the Service variables, computed for it (the first version);
// "configmap": it reads them from the provider's ConfigMaps (serviceenv.go):
// per copy, the ConfigMaps' data from the cache (unchanged Services),
// compared with what the provider holds (serviceEnvs.ensure, its GET aside). Reported: the copy's size as the API server stores it
// (protobuf), the variables it carries per container, and the ConfigMaps'.
func BenchmarkHomeView(b *testing.B) {
	master := service("default", "kubernetes", "198.18.100.1", corev1.ServicePort{Name: "https", Port: 443, Protocol: corev1.ProtocolTCP})
	for _, n := range []int{10, 100, 1000} {
		services := make([]*corev1.Service, n)
		for i := range services {
			services[i] = service("shop", "backend-"+strconv.Itoa(i), fmt.Sprintf("198.18.%d.%d", 100+i/250, 1+i%250),
				corev1.ServicePort{Name: "http", Port: 8080, Protocol: corev1.ProtocolTCP})
			services[i].ResourceVersion = strconv.Itoa(1000 + i)
		}
		b.Run(fmt.Sprintf("services=%d/inline", n), func(b *testing.B) {
			var copyBytes, vars int
			for b.Loop() {
				view := &homeView{network: HomeNetwork{DNS: "198.18.100.10"}, env: serviceEnv(master, services, true)}
				remote, err := remotePod(testPod(), mirrorParams{clusterID: "rome", namespace: "rb-rome", network: view})
				if err != nil {
					b.Fatal(err)
				}
				copyBytes, vars = remote.Size(), len(remote.Spec.Containers[0].Env)
			}
			b.ReportMetric(float64(copyBytes), "copy-bytes")
			b.ReportMetric(float64(vars), "vars/container")
			b.ReportMetric(0, "configmap-bytes")
		})
		b.Run(fmt.Sprintf("services=%d/configmap", n), func(b *testing.B) {
			var cache serviceEnvCache
			held := cache.get("shop", master, services) // what the provider holds
			var copyBytes, vars, cmBytes int
			for b.Loop() {
				chunks := cache.get("shop", master, services)
				view := &homeView{network: HomeNetwork{DNS: "198.18.100.10"}}
				cmBytes = 0
				for i, data := range chunks {
					if !maps.Equal(data, held[i]) {
						b.Fatal("the ConfigMaps differ")
					}
					view.envFrom = append(view.envFrom, serviceEnvName("shop", i))
					cmBytes += (&corev1.ConfigMap{Data: data}).Size()
				}
				remote, err := remotePod(testPod(), mirrorParams{clusterID: "rome", namespace: "rb-rome", network: view})
				if err != nil {
					b.Fatal(err)
				}
				copyBytes, vars = remote.Size(), len(remote.Spec.Containers[0].Env)
			}
			b.ReportMetric(float64(copyBytes), "copy-bytes")
			b.ReportMetric(float64(vars), "vars/container")
			b.ReportMetric(float64(cmBytes), "configmap-bytes")
		})
	}
}
