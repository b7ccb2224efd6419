package goimage

import (
	"context"
	"os"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A module of its own with one main package: the image's config and
// history, and the same digest from a second build (hack/images's test runs
// a built binary and checks its -ldflags stamp).
func TestBuild(t *testing.T) {
	if testing.Short() {
		t.Skip("runs go build")
	}
	root := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(root, "go.mod"), []byte("module example.com/m\n\ngo 1.22\n"), 0o644))
	require.NoError(t, os.MkdirAll(filepath.Join(root, "cmd", "hello"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(root, "cmd", "hello", "main.go"),
		[]byte("package main\n\nvar greeting = \"unset\"\n\nfunc main() { println(greeting) }\n"), 0o644))
	created := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	spec := Spec{Package: "./cmd/hello", Platform: v1.Platform{OS: "linux", Architecture: runtime.GOARCH},
		LDFlags: "-X main.greeting=stamped", Labels: map[string]string{"org.opencontainers.image.title": "hello"}, Created: created}
	assert.Equal(t, "hello", spec.Binary())

	build := func() v1.Image {
		img, err := Build(context.Background(), root, t.TempDir(), spec)
		require.NoError(t, err)
		return img
	}
	img := build()
	cf, err := img.ConfigFile()
	require.NoError(t, err)
	assert.Equal(t, []string{"/hello"}, cf.Config.Entrypoint)
	assert.Equal(t, "65532:65532", cf.Config.User)
	assert.Equal(t, spec.Labels, cf.Config.Labels)
	assert.True(t, created.Equal(cf.Created.Time), "created %s", cf.Created)
	require.Len(t, cf.History, 1)
	assert.True(t, created.Equal(cf.History[0].Created.Time))
	assert.Contains(t, cf.History[0].CreatedBy, "go build -trimpath")

	d1, err := img.Digest()
	require.NoError(t, err)
	d2, err := build().Digest()
	require.NoError(t, err)
	assert.Equal(t, d1, d2, "reproducible")
}

func TestBuildRefusesOtherPlatforms(t *testing.T) {
	for _, p := range []v1.Platform{{OS: "windows", Architecture: "amd64"}, {OS: "linux"}} {
		_, err := Build(context.Background(), t.TempDir(), t.TempDir(), Spec{Package: "./x", Platform: p})
		require.Error(t, err)
		assert.Contains(t, err.Error(), "want linux/<arch>")
	}
}
