package virtualkubelet

import (
	"runtime/debug"
	"sync"

	"k8s.io/apimachinery/pkg/util/version"
	baseversion "k8s.io/component-base/version"
)

// kubeletVersionMetadata marks the version as ours. Build metadata
// ("+rb"), not a pre-release ("-rb"): semver ignores it when comparing, so the
// virtual kubelet compares equal to the Kubernetes release it is built
// against, as version-skew checks and anything gating on a node's version
// expect (a pre-release would sort before the release).
const kubeletVersionMetadata = "rb"

// unknownKubeletVersion is what kubernetesVersion makes of a module version
// that is not a staging release.
const unknownKubeletVersion = "v0.0.0+" + kubeletVersionMetadata

// kubeletVersion is the virtual nodes' status.nodeInfo.kubeletVersion: the
// Kubernetes version the agent is built against (client-go v0.X.Y is
// Kubernetes v1.X.Y), e.g. v1.35.8+rb. Semver, as the version field of a
// kubelet is. A binary without module information (a test binary) reports
// the release of its Kubernetes libraries, v1.X.0+rb.
var kubeletVersion = sync.OnceValue(func() string {
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, d := range bi.Deps {
			if d.Path != "k8s.io/client-go" {
				continue
			}
			if d.Replace != nil {
				d = d.Replace
			}
			if v := kubernetesVersion(d.Version); v != unknownKubeletVersion {
				return v
			}
		}
	}
	return "v" + version.MustParseMajorMinor(baseversion.DefaultKubeBinaryVersion).WithPatch(0).WithBuildMetadata(kubeletVersionMetadata).String()
})

// kubernetesVersion maps a k8s.io staging module version (v0.35.8) to the
// Kubernetes release it belongs to (v1.35.8+rb).
func kubernetesVersion(module string) string {
	v, err := version.ParseSemantic(module)
	if err != nil || v.Major() != 0 || v.Minor() == 0 {
		return unknownKubeletVersion // not a staging release such as v0.35.8 (a pseudo-version, say)
	}
	return "v" + v.WithMajor(1).WithBuildMetadata(kubeletVersionMetadata).String()
}
