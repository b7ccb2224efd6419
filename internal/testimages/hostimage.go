package testimages

import (
	"archive/tar"
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"runtime"
	"sort"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// RedisRepository is the repository of Redis (HostRedis); the tag is the
// version of the host's redis-server.
const RedisRepository = "rb.test/redis"

// redisCommands are what manifests/redis runs in its containers: the server,
// the probes' redis-cli, and the shell tools of the init container's script.
var redisCommands = []string{"redis-server", "redis-cli", "sh", "cat", "cut", "grep", "mv", "sed", "sha256sum"}

// HostRedis packs the host's redis-server (the Debian package the tests run
// everywhere else) into an image with what manifests/redis's containers run
// besides it, for the deploy test: no registry here serves the official
// image the manifests name (redis:7.2), so the test points them at this one.
// The commands sit in /usr/bin (/bin links there) with the shared libraries
// ldd finds, at the paths ldd gives.
func HostRedis(ctx context.Context, outDir string) (Image, error) {
	out, err := exec.CommandContext(ctx, "redis-server", "--version").Output()
	if err != nil {
		return Image{}, fmt.Errorf("redis-server --version: %w (apt-get install -y redis-server)", err)
	}
	m := regexp.MustCompile(`v=([0-9.]+)`).FindSubmatch(out)
	if m == nil {
		return Image{}, fmt.Errorf("redis-server --version: no version in %q", out)
	}
	im := Image{Name: RedisRepository + ":" + string(m[1])}
	im.Path = filepath.Join(outDir, fileBase(im.Name)+".tar")
	files := map[string]string{} // path in the image -> file on the host
	for _, cmd := range redisCommands {
		p, err := exec.LookPath(cmd)
		if err != nil {
			return Image{}, err
		}
		real, err := filepath.EvalSymlinks(p)
		if err != nil {
			return Image{}, err
		}
		files["/usr/bin/"+cmd] = real
		libs, err := sharedLibraries(ctx, real)
		if err != nil {
			return Image{}, err
		}
		for _, lib := range libs {
			files[lib] = lib
		}
	}
	layerPath := filepath.Join(outDir, "."+fileBase(im.Name)+".layer.tar")
	if err := os.MkdirAll(outDir, 0o755); err != nil {
		return Image{}, err
	}
	if err := writeFilesLayer(layerPath, files); err != nil {
		return Image{}, err
	}
	defer os.Remove(layerPath)
	layer, err := tarball.LayerFromFile(layerPath, tarball.WithMediaType(types.OCIUncompressedLayer))
	if err != nil {
		return Image{}, err
	}
	img, err := mutate.ConfigFile(mutate.MediaType(empty.Image, types.OCIManifestSchema1), &v1.ConfigFile{
		Architecture: runtime.GOARCH, OS: "linux", RootFS: v1.RootFS{Type: "layers"},
		Config: v1.Config{
			Env:        []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"},
			Cmd:        []string{"redis-server"},
			WorkingDir: "/data",
			Labels:     map[string]string{"org.opencontainers.image.description": "the host's redis-server " + string(m[1]) + " for the deploy test"},
		},
	})
	if err != nil {
		return Image{}, err
	}
	img, err = mutate.AppendLayers(mutate.ConfigMediaType(img, types.OCIConfigJSON), layer)
	if err != nil {
		return Image{}, err
	}
	return im, writeTarball(im, img)
}

// sharedLibraries lists the libraries (and the loader) ldd resolves for bin.
func sharedLibraries(ctx context.Context, bin string) ([]string, error) {
	out, err := exec.CommandContext(ctx, "ldd", bin).Output()
	if err != nil {
		if bytes.Contains(out, []byte("not a dynamic executable")) {
			return nil, nil
		}
		return nil, fmt.Errorf("ldd %s: %w", bin, err)
	}
	var libs []string
	for _, line := range strings.Split(string(out), "\n") {
		for _, f := range strings.Fields(line) {
			if strings.HasPrefix(f, "/") {
				libs = append(libs, f)
			}
		}
	}
	return libs, nil
}

// writeFilesLayer writes an uncompressed layer with each host file at its
// path (contents of the file a link points to), the directories above them,
// and /bin linking to usr/bin.
func writeFilesLayer(layerPath string, files map[string]string) error {
	f, err := os.Create(layerPath)
	if err != nil {
		return err
	}
	defer f.Close()
	tw := tar.NewWriter(f)
	epoch := time.Unix(0, 0)
	dirs := map[string]bool{}
	var paths []string
	for p := range files {
		paths = append(paths, p)
		for d := path.Dir(p); d != "/" && d != "."; d = path.Dir(d) {
			dirs[d] = true
		}
	}
	sort.Strings(paths)
	var dirList []string
	for d := range dirs {
		dirList = append(dirList, d)
	}
	sort.Strings(dirList)
	for _, d := range dirList {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: strings.TrimPrefix(d, "/") + "/", Mode: 0o755, ModTime: epoch}); err != nil {
			return err
		}
	}
	if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeSymlink, Name: "bin", Linkname: "usr/bin", Mode: 0o777, ModTime: epoch}); err != nil {
		return err
	}
	for _, p := range paths {
		src, err := os.Open(files[p])
		if err != nil {
			return err
		}
		st, err := src.Stat()
		if err != nil {
			src.Close()
			return err
		}
		err = tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: strings.TrimPrefix(p, "/"), Mode: int64(st.Mode().Perm()), Size: st.Size(), ModTime: epoch})
		if err == nil {
			_, err = io.Copy(tw, src)
		}
		src.Close()
		if err != nil {
			return err
		}
	}
	if err := tw.Close(); err != nil {
		return err
	}
	return f.Close()
}
