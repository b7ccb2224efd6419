package testimages

import (
	"archive/tar"
	"context"
	"errors"
	"io"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestHostRedis: the image holds every command manifests/redis runs, the
// libraries they load and the loader, under the host's redis version's tag.
// (That the containers run on it is TestDeployFromInstallGuide's.)
func TestHostRedis(t *testing.T) {
	im, err := HostRedis(context.Background(), t.TempDir())
	require.NoError(t, err)
	assert.True(t, strings.HasPrefix(im.Name, RedisRepository+":7."), im.Name)
	img, err := tarball.ImageFromPath(im.Path, nil)
	require.NoError(t, err)
	layers, err := img.Layers()
	require.NoError(t, err)
	require.Len(t, layers, 1)
	rc, err := layers[0].Uncompressed()
	require.NoError(t, err)
	defer rc.Close()
	files := map[string]bool{}
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		require.NoError(t, err)
		files["/"+strings.TrimSuffix(h.Name, "/")] = true
	}
	for _, cmd := range redisCommands {
		assert.True(t, files["/usr/bin/"+cmd], "/usr/bin/%s", cmd)
	}
	assert.True(t, files["/bin"], "/bin links to usr/bin")
	var libc, loader bool
	for f := range files {
		libc = libc || strings.Contains(f, "/libc.so")
		loader = loader || strings.Contains(f, "/ld-linux")
	}
	assert.True(t, libc, "libc")
	assert.True(t, loader, "the dynamic loader")
	cfg, err := img.ConfigFile()
	require.NoError(t, err)
	assert.Equal(t, []string{"redis-server"}, cfg.Config.Cmd)
}
