// Package goimage builds a container image of one static Go binary of this
// module, without Docker or a base image: `go build` (CGO_ENABLED=0,
// -trimpath) for the image's platform, then one layer holding only the
// binary at /<name>, owned by and run as 65532:65532 (distroless's
// "nonroot"). No shell, no package manager, nothing else to patch.
//
// internal/testimages (the test bed's images) and hack/images (the release
// images of rb-broker, rb-agent and rb-scheduler) are made with it.
package goimage

import (
	"archive/tar"
	"compress/gzip"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// NonRoot is the user and group that own the binary and run it.
const NonRoot = 65532

// Spec is one image to build.
type Spec struct {
	// Package is the binary's main package, relative to the module root
	// (e.g. "./cmd/rb-agent"); the binary is named after its directory.
	Package string
	// Platform is the image's; OS linux is all this package builds.
	Platform v1.Platform
	// LDFlags go to the linker after "-s -w" (e.g. -X version stamps).
	LDFlags string
	// Labels are the image config's labels.
	Labels map[string]string
	// Created is the image's creation time (the config's and the layer's
	// history; zero is Go's zero time). A fixed time, such as the commit's,
	// keeps the image reproducible: the same sources give the same digest.
	Created time.Time
}

// Binary is the name of the spec's binary, at /<Binary> in the image.
func (s Spec) Binary() string { return path.Base(s.Package) }

// Build compiles the spec's binary from moduleRoot into dir and returns the
// image made of it. The image reads its layer from dir when it is written:
// keep dir until then.
func Build(ctx context.Context, moduleRoot, dir string, s Spec) (v1.Image, error) {
	if s.Platform.OS != "linux" || s.Platform.Architecture == "" {
		return nil, fmt.Errorf("platform %s: want linux/<arch>", s.Platform.String())
	}
	goVersion, err := GoEnv(ctx, moduleRoot, "GOVERSION")
	if err != nil {
		return nil, fmt.Errorf("go env GOVERSION: %w", err)
	}
	bin := s.Binary()
	binPath := filepath.Join(dir, bin+"-"+s.Platform.Architecture+s.Platform.Variant)
	ldflags := strings.TrimSpace("-s -w " + s.LDFlags)
	cmd := exec.CommandContext(ctx, GoCommand(), "build", "-trimpath", "-buildvcs=false", "-ldflags="+ldflags, "-o", binPath, s.Package)
	cmd.Dir = moduleRoot
	// Static, for the image's platform; later entries win over the caller's own.
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH="+s.Platform.Architecture)
	if s.Platform.Architecture == "arm" && s.Platform.Variant != "" {
		cmd.Env = append(cmd.Env, "GOARM="+strings.TrimPrefix(s.Platform.Variant, "v"))
	}
	if out, err := cmd.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("go build %s for %s: %w\n%s", s.Package, s.Platform.String(), err, out)
	}

	layerPath := binPath + ".layer.tar.gz"
	if err := writeLayer(layerPath, binPath, bin); err != nil {
		return nil, fmt.Errorf("layer of %s: %w", bin, err)
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return os.Open(layerPath) },
		tarball.WithMediaType(types.OCILayer))
	if err != nil {
		return nil, err
	}
	created := v1.Time{Time: s.Created.UTC()}
	img, err := mutate.ConfigFile(mutate.MediaType(empty.Image, types.OCIManifestSchema1), &v1.ConfigFile{
		Architecture: s.Platform.Architecture,
		Variant:      s.Platform.Variant,
		OS:           "linux",
		Created:      created,
		RootFS:       v1.RootFS{Type: "layers"},
		Config: v1.Config{
			Entrypoint: []string{"/" + bin},
			User:       fmt.Sprintf("%d:%d", NonRoot, NonRoot),
			WorkingDir: "/",
			Labels:     s.Labels,
		},
	})
	if err != nil {
		return nil, err
	}
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	return mutate.Append(img, mutate.Addendum{
		Layer: layer,
		History: v1.History{
			Created: created,
			CreatedBy: fmt.Sprintf("CGO_ENABLED=0 GOOS=linux GOARCH=%s go build -trimpath -ldflags='-s -w' %s (%s)",
				s.Platform.Architecture, s.Package, goVersion),
		},
	})
}

// writeLayer writes a gzipped layer holding the binary at /<bin>,
// executable and owned by NonRoot. Its time is fixed so that the layer's
// digest depends on the binary only.
func writeLayer(layerPath, binPath, bin string) error {
	src, err := os.Open(binPath)
	if err != nil {
		return err
	}
	defer src.Close()
	st, err := src.Stat()
	if err != nil {
		return err
	}
	dst, err := os.Create(layerPath)
	if err != nil {
		return err
	}
	defer dst.Close()

	zw := gzip.NewWriter(dst) // no name or time in the header: reproducible
	tw := tar.NewWriter(zw)
	if err := tw.WriteHeader(&tar.Header{
		Typeflag: tar.TypeReg,
		Name:     bin,
		Mode:     0o755,
		Uid:      NonRoot,
		Gid:      NonRoot,
		Size:     st.Size(),
		ModTime:  time.Unix(0, 0),
	}); err != nil {
		return err
	}
	if _, err := io.Copy(tw, src); err != nil {
		return err
	}
	if err := tw.Close(); err != nil {
		return err
	}
	if err := zw.Close(); err != nil {
		return err
	}
	return dst.Close()
}

// GoEnv is `go env key` in dir.
func GoEnv(ctx context.Context, dir, key string) (string, error) {
	cmd := exec.CommandContext(ctx, GoCommand(), "env", key)
	cmd.Dir = dir
	out, err := cmd.Output()
	if err != nil {
		return "", err
	}
	return strings.TrimSpace(string(out)), nil
}

// GoCommand is the go command: from PATH, else this toolchain's.
func GoCommand() string {
	if p, err := exec.LookPath("go"); err == nil {
		return p
	}
	return filepath.Join(runtime.GOROOT(), "bin", "go") //nolint:staticcheck // fallback when go is not on PATH
}
