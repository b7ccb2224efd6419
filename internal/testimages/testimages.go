// Package testimages builds the test bed's container images from this
// module's Go sources, as tarballs that `ctr -n k8s.io images import` loads
// into a node's containerd: the test bed has no registry to pull from.
//
// Each image is one static binary in one layer (no base image, no shell,
// run as 65532:65532; internal/goimage).
// The references name a registry host that does not exist (rb.test), so
// nothing can pull them by mistake: pods use imagePullPolicy IfNotPresent or
// Never, and the kubelet finds the imported image.
//
// Build caches: a tarball's file name carries a hash of what went into it
// (the package's Go sources, go.mod, the Go version, the architecture), so an
// up-to-date one is found with a stat and returned without building.
package testimages

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/fluidos-project/resource-broker/internal/goimage"
)

// The images' references. rb.test is not a registry: see the package comment.
const (
	// Pause is the pod sandbox image (containerd's sandbox_image).
	Pause = "rb.test/pause:3.10"
	// TestApp is the test application (test/images/testapp).
	TestApp = "rb.test/testapp:v1"
)

// Image is one image Build makes.
type Image struct {
	// Name is the image's reference, as the imported image is tagged
	// (e.g. "rb.test/testapp:v1").
	Name string
	// Package is the main package of its binary, relative to the module
	// root (e.g. "./test/images/testapp").
	Package string
	// Path is the tarball Build wrote or found up to date.
	Path string
}

// images are the images Build makes, in the order it returns them. The
// binary is named after the package's directory and sits at /<name>.
var images = []Image{
	{Name: Pause, Package: "./test/images/pause"},
	{Name: TestApp, Package: "./test/images/testapp"},
}

const (
	// recipe is part of every cache key: change it when the way an image is
	// put together changes, so that old tarballs are not taken as current.
	recipe = "testimages/v1"
	// keyLen is how many hex digits of the cache key the file name carries.
	keyLen   = 16
	source   = "https://github.com/fluidos-project/resource-broker"
	lockFile = ".lock"
)

// Build makes every image as a tarball in outDir, building the binaries from
// moduleRoot with `go build` for linux and this process's architecture. An
// image whose tarball is up to date is not built again. Concurrent calls,
// from this process or others, wait for each other on a lock in outDir.
func Build(ctx context.Context, moduleRoot, outDir string) ([]Image, error) {
	moduleRoot, err := filepath.Abs(moduleRoot)
	if err != nil {
		return nil, fmt.Errorf("testimages: %w", err)
	}
	outDir, err = filepath.Abs(outDir)
	if err != nil {
		return nil, fmt.Errorf("testimages: %w", err)
	}
	goMod, err := os.ReadFile(filepath.Join(moduleRoot, "go.mod"))
	if err != nil {
		return nil, fmt.Errorf("testimages: read go.mod: %w", err)
	}
	goVersion, err := goimage.GoEnv(ctx, moduleRoot, "GOVERSION")
	if err != nil {
		return nil, fmt.Errorf("testimages: go env GOVERSION: %w", err)
	}

	out := make([]Image, len(images))
	var stale []int
	for i, im := range images {
		key, err := cacheKey(moduleRoot, im, goMod, goVersion)
		if err != nil {
			return nil, fmt.Errorf("testimages: build %s: hash sources: %w", im.Name, err)
		}
		im.Path = filepath.Join(outDir, fileBase(im.Name)+"-"+key+".tar")
		out[i] = im
		if !exists(im.Path) {
			stale = append(stale, i)
		}
	}
	if len(stale) == 0 {
		return out, nil
	}

	if err := os.MkdirAll(outDir, 0o755); err != nil {
		return nil, fmt.Errorf("testimages: %w", err)
	}
	unlock, err := lockDir(ctx, outDir)
	if err != nil {
		return nil, fmt.Errorf("testimages: lock %s: %w", outDir, err)
	}
	defer unlock()
	for _, i := range stale {
		im := out[i]
		if exists(im.Path) {
			continue // built by another process while we waited for the lock
		}
		if err := build(ctx, moduleRoot, im); err != nil {
			return nil, fmt.Errorf("testimages: build %s: %w", im.Name, err)
		}
		removeOlder(im)
	}
	return out, nil
}

// build compiles im's binary into a temporary directory and writes the image
// to im.Path, atomically.
func build(ctx context.Context, moduleRoot string, im Image) error {
	tmp, err := os.MkdirTemp("", "testimages-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)

	bin := path.Base(im.Package)
	img, err := goimage.Build(ctx, moduleRoot, tmp, goimage.Spec{
		Package:  im.Package,
		Platform: v1.Platform{OS: "linux", Architecture: runtime.GOARCH},
		Labels: map[string]string{
			"org.opencontainers.image.source": source,
			"org.opencontainers.image.title":  bin,
		},
	})
	if err != nil {
		return err
	}
	if err := writeTarball(im, img); err != nil {
		return fmt.Errorf("write %s: %w", im.Path, err)
	}
	return nil
}

// writeTarball writes img as a docker-style tarball (what `docker save` and
// `ctr images import` use) whose manifest tags it im.Name, through a
// temporary file renamed into place, so no one sees half a tarball.
func writeTarball(im Image, img v1.Image) (err error) {
	// The full reference, not docker.io-normalised: tarball tags it as given.
	ref, err := name.NewTag(im.Name, name.StrictValidation)
	if err != nil {
		return err
	}
	f, err := os.CreateTemp(filepath.Dir(im.Path), "."+fileBase(im.Name)+"-*.tmp")
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			f.Close()
			os.Remove(f.Name())
		}
	}()
	if err := tarball.Write(ref, img, f); err != nil {
		return err
	}
	if err := f.Sync(); err != nil {
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	if err := os.Chmod(f.Name(), 0o644); err != nil {
		return err
	}
	return os.Rename(f.Name(), im.Path)
}

// cacheKey hashes what im's tarball is made of: the recipe, the reference,
// the platform, the Go version, go.mod and the package's Go sources (every
// .go file under it but tests). The images are standard library only, so
// nothing outside the package goes into their binaries.
func cacheKey(moduleRoot string, im Image, goMod []byte, goVersion string) (string, error) {
	h := sha256.New()
	field := func(b []byte) {
		_ = binary.Write(h, binary.BigEndian, uint64(len(b)))
		h.Write(b)
	}
	for _, s := range []string{recipe, im.Name, "linux/" + runtime.GOARCH, goVersion} {
		field([]byte(s))
	}
	field(goMod)

	dir := filepath.Join(moduleRoot, filepath.FromSlash(im.Package))
	n := 0
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(p, ".go") || strings.HasSuffix(p, "_test.go") {
			return err
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil {
			return err
		}
		field([]byte(filepath.ToSlash(rel)))
		field(b)
		n++
		return nil
	})
	if err != nil {
		return "", err
	}
	if n == 0 {
		return "", fmt.Errorf("no Go files in %s", dir)
	}
	return hex.EncodeToString(h.Sum(nil))[:keyLen], nil
}

// fileBase names an image's tarballs: "rb.test/testapp:v1" -> "testapp-v1".
func fileBase(ref string) string {
	repo, tag, _ := strings.Cut(ref, ":")
	return path.Base(repo) + "-" + tag
}

// removeOlder removes im's tarballs of other sources than this one, so that
// outDir keeps one per image.
func removeOlder(im Image) {
	prefix := fileBase(im.Name) + "-"
	matches, _ := filepath.Glob(filepath.Join(filepath.Dir(im.Path), prefix+"*.tar"))
	for _, m := range matches {
		key := strings.TrimSuffix(strings.TrimPrefix(filepath.Base(m), prefix), ".tar")
		if m != im.Path && len(key) == keyLen {
			_ = os.Remove(m)
		}
	}
}

// lockDir takes an exclusive flock on dir's lock file, waiting for it as
// long as ctx allows. unlock releases it.
func lockDir(ctx context.Context, dir string) (unlock func(), err error) {
	f, err := os.OpenFile(filepath.Join(dir, lockFile), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, err
	}
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			return func() { f.Close() }, nil // closing releases the lock
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) && !errors.Is(err, syscall.EINTR) {
			f.Close()
			return nil, err
		}
		select {
		case <-ctx.Done():
			f.Close()
			return nil, ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func exists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}
