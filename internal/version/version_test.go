package version

import (
	"bytes"
	"runtime"
	"runtime/debug"
	"testing"

	"github.com/spf13/cobra"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestGet(t *testing.T) {
	platform := runtime.GOOS + "/" + runtime.GOARCH
	vcs := &debug.BuildInfo{Settings: []debug.BuildSetting{
		{Key: "vcs.revision", Value: "0123456789abcdef0123456789abcdef01234567"},
		{Key: "vcs.modified", Value: "true"},
	}}

	stamped := get("v0.1.0-3-g0123456", "0123456789abcdef0123456789abcdef01234567", vcs)
	assert.Equal(t, Info{Version: "v0.1.0-3-g0123456", Commit: "0123456789abcdef0123456789abcdef01234567",
		GoVersion: runtime.Version(), Platform: platform}, stamped, "the stamp wins over what Go recorded")
	assert.Equal(t, "v0.1.0-3-g0123456 (commit 0123456789abcdef0123456789abcdef01234567, "+runtime.Version()+" "+platform+")", stamped.String())

	fromGo := get("", "", vcs)
	assert.Equal(t, "devel", fromGo.Version)
	assert.Equal(t, "0123456789abcdef0123456789abcdef01234567", fromGo.Commit)
	assert.True(t, fromGo.Dirty)
	assert.Contains(t, fromGo.String(), "with local changes")

	bare := get("", "", nil)
	assert.Equal(t, "devel ("+runtime.Version()+" "+platform+")", bare.String())
}

func TestAddFlag(t *testing.T) {
	ran := false
	cmd := &cobra.Command{Use: "rb-test", Run: func(*cobra.Command, []string) { ran = true }}
	cmd.Flags().Int("v", 0, "klog's verbosity") // as rb-broker and rb-agent have it
	AddFlag(cmd)
	var out bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetArgs([]string{"--version"})
	require.NoError(t, cmd.Execute())
	assert.False(t, ran, "--version quits")
	assert.Equal(t, "rb-test "+Get().String()+"\n", out.String())
	assert.Empty(t, cmd.Flags().Lookup("version").Shorthand, "-v is not --version")
}
