package virtualkubelet

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/util/version"
	baseversion "k8s.io/component-base/version"
)

func TestKubeletVersion(t *testing.T) {
	v := kubeletVersion()
	parsed, err := version.ParseSemantic(v)
	require.NoError(t, err, "the node's kubeletVersion must be semver: %s", v)
	assert.Equal(t, uint(1), parsed.Major())
	assert.Equal(t, "rb", parsed.BuildMetadata())

	// The release of the Kubernetes libraries this test is built with (a
	// test binary has no module information: rb-agent reports the patch
	// release too, see below).
	assert.Equal(t, version.MustParseMajorMinor(baseversion.DefaultKubeBinaryVersion).Minor(), parsed.Minor(), v)
	// Build metadata does not count in comparisons: the node is as new as the release.
	assert.True(t, parsed.EqualTo(version.MajorMinor(1, parsed.Minor()).WithPatch(parsed.Patch())), v)

	for module, want := range map[string]string{
		"v0.35.8":                            "v1.35.8+rb",
		"v0.36.0-alpha.1":                    "v1.36.0-alpha.1+rb",
		"v0.0.0-20250101000000-0123456789ab": unknownKubeletVersion, // a pseudo-version
		"v1.2.3":                             unknownKubeletVersion,
		"(devel)":                            unknownKubeletVersion,
	} {
		got := kubernetesVersion(module)
		assert.Equal(t, want, got, module)
		_, err := version.ParseSemantic(got)
		assert.NoError(t, err, got)
	}
}
