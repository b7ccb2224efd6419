package main

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"io"
	"log"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const (
	testVersion = "v0.0.0-test.1"
	testCommit  = "0123456789abcdef0123456789abcdef01234567"
	testCreated = "2026-01-02T03:04:05Z"
)

// TestBuildPushAndRun builds rb-broker's image for this machine's
// architecture (make images also cross-compiles linux/arm64), writes its
// OCI archive, pushes its index to a registry (go-containerregistry's, in
// process) and checks both, then runs the binary of the layer.
func TestBuildPushAndRun(t *testing.T) {
	if testing.Short() {
		t.Skip("builds rb-broker")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	reg := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	defer reg.Close()
	repo := strings.TrimPrefix(reg.URL, "http://") + "/fluidos" // 127.0.0.1:port: plain HTTP
	platform := "linux/" + runtime.GOARCH

	out := t.TempDir()
	o := options{moduleRoot: "../..", out: out, repository: repo, version: testVersion, commit: testCommit, created: testCreated,
		platforms: []string{platform}, components: []string{"rb-broker"}, push: true}
	var progress bytes.Buffer
	results, err := run(ctx, o, &progress)
	require.NoError(t, err, progress.String())
	t.Log(progress.String())
	require.Len(t, results, 1)
	r := results[0]
	assert.Equal(t, repo+"/rb-broker:"+testVersion, r.ref.String())
	assert.True(t, r.pushed)
	assert.Equal(t, filepath.Join(out, "rb-broker-"+testVersion+".oci.tar"), r.archive)

	// The archive: an OCI layout whose index.json names the image, and
	// whose one entry is the image index.
	layoutDir := t.TempDir()
	untar(t, r.archive, layoutDir)
	lp, err := layout.FromPath(layoutDir)
	require.NoError(t, err)
	top, err := lp.ImageIndex()
	require.NoError(t, err)
	topManifest, err := top.IndexManifest()
	require.NoError(t, err)
	require.Len(t, topManifest.Manifests, 1)
	entry := topManifest.Manifests[0]
	assert.Equal(t, r.digest, entry.Digest)
	assert.Equal(t, types.OCIImageIndex, entry.MediaType)
	assert.Equal(t, testVersion, entry.Annotations[annotationRefName])
	assert.Equal(t, repo+"/rb-broker:"+testVersion, entry.Annotations[annotationContainerdName])
	local, err := top.ImageIndex(entry.Digest)
	require.NoError(t, err)

	// The pushed index is the same one.
	ref, err := name.NewTag(r.ref.String())
	require.NoError(t, err)
	pushed, err := remote.Index(ref, remote.WithContext(ctx))
	require.NoError(t, err)
	pushedDigest, err := pushed.Digest()
	require.NoError(t, err)
	assert.Equal(t, r.digest, pushedDigest)

	for what, idx := range map[string]v1.ImageIndex{"archive": local, "registry": pushed} {
		t.Run(what, func(t *testing.T) { checkIndex(t, idx, platform) })
	}

	t.Run("the binary reports the stamped version", func(t *testing.T) {
		bin := filepath.Join(t.TempDir(), "rb-broker")
		require.NoError(t, os.WriteFile(bin, layerFile(t, local, "rb-broker"), 0o755))
		got, err := exec.CommandContext(ctx, bin, "--version").CombinedOutput()
		require.NoError(t, err, string(got))
		assert.Equal(t, "rb-broker "+testVersion+" (commit "+testCommit+", ", string(got[:len("rb-broker "+testVersion+" (commit "+testCommit+", ")]))
		assert.Contains(t, string(got), " linux/"+runtime.GOARCH+")\n")
	})

	t.Run("reproducible", func(t *testing.T) {
		again := o
		again.out, again.push = t.TempDir(), false
		results2, err := run(ctx, again, io.Discard)
		require.NoError(t, err)
		assert.Equal(t, r.digest, results2[0].digest, "the same sources, version and time give the same index")
		a, err := os.ReadFile(r.archive)
		require.NoError(t, err)
		b, err := os.ReadFile(results2[0].archive)
		require.NoError(t, err)
		assert.True(t, bytes.Equal(a, b), "the same archive, byte for byte")
	})
}

// checkIndex checks an index of rb-broker with one image, for platform.
func checkIndex(t *testing.T, idx v1.ImageIndex, platform string) {
	im, err := idx.IndexManifest()
	require.NoError(t, err)
	assert.Equal(t, types.OCIImageIndex, im.MediaType)
	assert.Equal(t, map[string]string{
		"org.opencontainers.image.source":      source,
		"org.opencontainers.image.version":     testVersion,
		"org.opencontainers.image.revision":    testCommit,
		"org.opencontainers.image.created":     testCreated,
		"org.opencontainers.image.title":       "rb-broker",
		"org.opencontainers.image.description": components[0].description,
	}, im.Annotations)
	require.Len(t, im.Manifests, 1)
	require.NotNil(t, im.Manifests[0].Platform)
	assert.Equal(t, platform, im.Manifests[0].Platform.String())
	assert.Equal(t, types.OCIManifestSchema1, im.Manifests[0].MediaType)

	img, err := idx.Image(im.Manifests[0].Digest)
	require.NoError(t, err)
	cf, err := img.ConfigFile()
	require.NoError(t, err)
	assert.Equal(t, "linux/"+cf.Architecture, platform)
	assert.Equal(t, "linux", cf.OS)
	assert.Equal(t, []string{"/rb-broker"}, cf.Config.Entrypoint)
	assert.Empty(t, cf.Config.Cmd)
	assert.Equal(t, "65532:65532", cf.Config.User, "numeric, not root: runAsNonRoot can check it")
	assert.Equal(t, im.Annotations, cf.Config.Labels)
	assert.Equal(t, testCreated, cf.Created.UTC().Format(time.RFC3339), "created is the commit's time, not the build's")
	mt, err := img.MediaType()
	require.NoError(t, err)
	assert.Equal(t, types.OCIManifestSchema1, mt)

	layers, err := img.Layers()
	require.NoError(t, err)
	require.Len(t, layers, 1, "one layer: the binary")
	lmt, err := layers[0].MediaType()
	require.NoError(t, err)
	assert.Equal(t, types.OCILayer, lmt)
	files := layerFiles(t, layers[0])
	require.Len(t, files, 1, "only the binary: no shell, no other file (%v)", files)
	hdr := files[0]
	assert.Equal(t, "rb-broker", strings.TrimPrefix(hdr.Name, "/"))
	assert.Equal(t, byte(tar.TypeReg), hdr.Typeflag)
	assert.Equal(t, int64(0o755), hdr.Mode)
	assert.Equal(t, 65532, hdr.Uid)
	assert.Equal(t, 65532, hdr.Gid)
}

func layerFiles(t *testing.T, l v1.Layer) []*tar.Header {
	t.Helper()
	rc, err := l.Uncompressed()
	require.NoError(t, err)
	defer rc.Close()
	tr := tar.NewReader(rc)
	var out []*tar.Header
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return out
		}
		require.NoError(t, err)
		out = append(out, hdr)
	}
}

// layerFile is the content of file in the first image of idx.
func layerFile(t *testing.T, idx v1.ImageIndex, file string) []byte {
	t.Helper()
	im, err := idx.IndexManifest()
	require.NoError(t, err)
	img, err := idx.Image(im.Manifests[0].Digest)
	require.NoError(t, err)
	layers, err := img.Layers()
	require.NoError(t, err)
	rc, err := layers[0].Uncompressed()
	require.NoError(t, err)
	defer rc.Close()
	tr := tar.NewReader(rc)
	for {
		hdr, err := tr.Next()
		require.NoError(t, err, "no %s in the layer", file)
		if strings.TrimPrefix(hdr.Name, "/") == file {
			b, err := io.ReadAll(tr)
			require.NoError(t, err)
			require.True(t, bytes.HasPrefix(b, []byte("\x7fELF")), "%s is not an ELF executable", file)
			return b
		}
	}
}

func untar(t *testing.T, archive, dir string) {
	t.Helper()
	f, err := os.Open(archive)
	require.NoError(t, err)
	defer f.Close()
	tr := tar.NewReader(f)
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return
		}
		require.NoError(t, err)
		p := filepath.Join(dir, filepath.FromSlash(hdr.Name))
		require.True(t, strings.HasPrefix(p, dir+string(filepath.Separator)), "entry %q leaves the archive", hdr.Name)
		switch hdr.Typeflag {
		case tar.TypeDir:
			require.NoError(t, os.MkdirAll(p, 0o755))
		case tar.TypeReg:
			b, err := io.ReadAll(tr)
			require.NoError(t, err)
			require.NoError(t, os.WriteFile(p, b, 0o644))
		default:
			t.Fatalf("entry %q: type %c", hdr.Name, hdr.Typeflag)
		}
	}
}

func TestOptionsRefused(t *testing.T) {
	base := options{moduleRoot: "../..", version: testVersion, commit: testCommit, created: testCreated,
		repository: "ghcr.io/fluidos-project", platforms: []string{"linux/amd64"}, components: []string{"rb-agent"}}
	for _, tc := range []struct {
		name   string
		mutate func(*options)
		want   string
	}{
		{"a version that is no tag", func(o *options) { o.version = "v1.0.0+build" }, `--version "v1.0.0+build" do not make an image reference`},
		{"a repository that is no repository", func(o *options) { o.repository = "Not A Repo" }, `--repository "Not A Repo"`},
		{"a platform that is not linux", func(o *options) { o.platforms = []string{"windows/amd64"} }, `--platforms: "windows/amd64" is not linux/<arch>`},
		{"no platform", func(o *options) { o.platforms = nil }, "--platforms: none"},
		{"an unknown component", func(o *options) { o.components = []string{"rbctl"} }, `--components: no component "rbctl" (have rb-broker, rb-agent, rb-scheduler)`},
		{"a time that is not RFC 3339", func(o *options) { o.created = "yesterday" }, `--created "yesterday": want an RFC 3339 time`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := base
			tc.mutate(&o)
			o.out = t.TempDir()
			_, err := run(context.Background(), o, io.Discard)
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.want)
			entries, _ := os.ReadDir(o.out)
			assert.Empty(t, entries, "nothing written")
		})
	}
}

func TestDefaultsFromGit(t *testing.T) {
	o := options{moduleRoot: "../..", repository: "ghcr.io/fluidos-project", platforms: []string{"linux/amd64"}, components: []string{"rb-scheduler"}}
	p, err := o.complete(context.Background())
	require.NoError(t, err)
	describe, err := exec.Command("git", "describe", "--tags", "--always", "--dirty").Output()
	require.NoError(t, err)
	assert.Equal(t, strings.TrimSpace(string(describe)), o.version)
	assert.Regexp(t, `^[0-9a-f]{40}$`, o.commit)
	commitTime, err := exec.Command("git", "show", "-s", "--format=%cI", o.commit).Output()
	require.NoError(t, err)
	want, err := time.Parse(time.RFC3339, strings.TrimSpace(string(commitTime)))
	require.NoError(t, err)
	assert.True(t, want.Equal(p.created), "created %s, the commit's time %s", p.created, want)
	assert.Regexp(t, `^v1\.\d+\.\d+$`, p.kube, "rb-scheduler is stamped with its Kubernetes release")
}

// The report's kustomize edits name the images the manifests use.
func TestReport(t *testing.T) {
	ref, err := name.NewTag("ghcr.io/fluidos-project/rb-agent:v0.1.0")
	require.NoError(t, err)
	var out bytes.Buffer
	report(&out, []result{{component: "rb-agent", ref: ref, archive: "bin/images/rb-agent-v0.1.0.oci.tar", size: 20 << 20}}, time.Second)
	assert.Contains(t, out.String(), "(cd manifests/agent && kustomize edit set image ghcr.io/fluidos-project/rb-agent=ghcr.io/fluidos-project/rb-agent:v0.1.0)")
	assert.Contains(t, out.String(), "bin/images/rb-agent-v0.1.0.oci.tar (20.0 MiB)")
}
