// Command images builds the release images of rb-broker, rb-agent and
// rb-scheduler from this repository, without Docker or a registry: `make
// images`, or
//
//	go run ./hack/images --out bin/images [--version v0.1.0] [--repository ghcr.io/me --push]
//
// Each component is one OCI image index with an image per platform
// (linux/amd64 and linux/arm64 by default), each image a static binary in
// one layer, run as 65532:65532 with no shell (internal/goimage), stamped
// with the version (--version) and labelled with the OCI annotations
// (source, version, revision, created from the commit's time, title). Each
// index is written as an OCI image layout archive,
// <out>/<component>-<tag>.oci.tar (`ctr -n k8s.io images import`, `skopeo
// copy oci-archive:...`), and with --push also pushed to --repository
// (credentials from the default keychain: docker login, podman login).
package main

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/spf13/cobra"

	"github.com/fluidos-project/resource-broker/internal/goimage"
	"github.com/fluidos-project/resource-broker/internal/testenv"
)

const (
	source         = "https://github.com/fluidos-project/resource-broker"
	versionPkg     = "github.com/fluidos-project/resource-broker/internal/version"
	kubeVersionPkg = "k8s.io/component-base/version"
	// The annotations containerd's and OCI tools' importers name an image by.
	annotationRefName        = "org.opencontainers.image.ref.name"
	annotationContainerdName = "io.containerd.image.name"
)

// component is one image: the binary of ./cmd/<name>.
type component struct {
	name, description string
	// kube stamps component-base's version with the Kubernetes release
	// (rb-scheduler is kube-scheduler), as the Makefile does.
	kube bool
}

var components = []component{
	{name: "rb-broker", description: "The central Resource Broker: scores clusters and locks capacity in Redis"},
	{name: "rb-agent", description: "The resource-broker agent of a member cluster"},
	{name: "rb-scheduler", description: "kube-scheduler with the ResourceBroker plugin", kube: true},
}

type options struct {
	moduleRoot string
	out        string
	repository string
	version    string
	commit     string
	created    string
	platforms  []string
	components []string
	push       bool
	// remote are extra options of the push (tests).
	remote []remote.Option
}

// result is one component's image index, written (and pushed).
type result struct {
	component string
	ref       name.Tag
	digest    v1.Hash
	archive   string
	size      int64
	pushed    bool
}

func main() {
	if err := newCommand().Execute(); err != nil {
		fmt.Fprintln(os.Stderr, "images:", err)
		os.Exit(1)
	}
}

func newCommand() *cobra.Command {
	o := options{}
	cmd := &cobra.Command{
		Use:           "images",
		Short:         "Build the release images of rb-broker, rb-agent and rb-scheduler (OCI image indexes), and push them with --push",
		SilenceUsage:  true,
		SilenceErrors: true,
		Args:          cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			began := time.Now()
			results, err := run(ctx, o, cmd.ErrOrStderr())
			if err != nil {
				return err
			}
			report(cmd.OutOrStdout(), results, time.Since(began))
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.moduleRoot, "module-root", "", "the module's root (default: the directory of the go.mod above the working directory)")
	f.StringVar(&o.out, "out", "bin/images", "directory to write the OCI archives into")
	f.StringVar(&o.repository, "repository", "ghcr.io/fluidos-project", "repository the images are named in (<repository>/<component>:<tag>) and pushed to")
	f.StringVar(&o.version, "version", "", "version stamped into the binaries and the image tag (default: git describe --tags --always --dirty)")
	f.StringVar(&o.commit, "commit", "", "commit stamped into the binaries and the revision label (default: git rev-parse HEAD)")
	f.StringVar(&o.created, "created", "", "creation time of the images, RFC 3339 (default: the commit's time, so that a build is reproducible)")
	f.StringSliceVar(&o.platforms, "platforms", []string{"linux/amd64", "linux/arm64"}, "platforms of each image index")
	f.StringSliceVar(&o.components, "components", componentNames(), "components to build")
	f.BoolVar(&o.push, "push", false, "push each image index to --repository (credentials from the default keychain)")
	return cmd
}

func componentNames() []string {
	var names []string
	for _, c := range components {
		names = append(names, c.name)
	}
	return names
}

// plan is what run builds, checked before anything is.
type plan struct {
	components []component
	platforms  []v1.Platform
	created    time.Time
	kube       string // k8s.io/kubernetes's version, for rb-scheduler
}

// complete fills the defaults from git and checks the options.
func (o *options) complete(ctx context.Context) (plan, error) {
	var p plan
	if o.moduleRoot == "" {
		root, err := testenv.ModuleRoot()
		if err != nil {
			return p, err
		}
		o.moduleRoot = root
	}
	git := func(args ...string) (string, error) {
		cmd := exec.CommandContext(ctx, "git", args...)
		cmd.Dir = o.moduleRoot
		out, err := cmd.Output()
		if err != nil {
			return "", fmt.Errorf("git %s: %w", strings.Join(args, " "), err)
		}
		return strings.TrimSpace(string(out)), nil
	}
	var err error
	if o.version == "" {
		if o.version, err = git("describe", "--tags", "--always", "--dirty"); err != nil {
			return p, fmt.Errorf("--version not given: %w", err)
		}
	}
	if o.commit == "" {
		if o.commit, err = git("rev-parse", "HEAD"); err != nil {
			return p, fmt.Errorf("--commit not given: %w", err)
		}
	}
	if o.created == "" {
		if o.created, err = git("show", "-s", "--format=%cI", o.commit); err != nil {
			return p, fmt.Errorf("--created not given: %w", err)
		}
	}

	var errs []error
	if p.created, err = time.Parse(time.RFC3339, o.created); err != nil {
		errs = append(errs, fmt.Errorf("--created %q: want an RFC 3339 time", o.created))
	}
	if _, err := name.NewTag(o.repository+"/rb-broker:"+o.version, name.StrictValidation); err != nil {
		errs = append(errs, fmt.Errorf("--repository %q and --version %q do not make an image reference: %w", o.repository, o.version, err))
	}
	for _, s := range o.platforms {
		pl, err := v1.ParsePlatform(s)
		if err != nil || pl.OS != "linux" || pl.Architecture == "" {
			errs = append(errs, fmt.Errorf("--platforms: %q is not linux/<arch>", s))
			continue
		}
		p.platforms = append(p.platforms, *pl)
	}
	if len(o.platforms) == 0 {
		errs = append(errs, errors.New("--platforms: none"))
	}
	for _, n := range o.components {
		i := slices.IndexFunc(components, func(c component) bool { return c.name == n })
		if i < 0 {
			errs = append(errs, fmt.Errorf("--components: no component %q (have %s)", n, strings.Join(componentNames(), ", ")))
			continue
		}
		p.components = append(p.components, components[i])
		if components[i].kube && p.kube == "" {
			cmd := exec.CommandContext(ctx, goimage.GoCommand(), "list", "-m", "-f", "{{.Version}}", "k8s.io/kubernetes")
			cmd.Dir = o.moduleRoot
			out, err := cmd.Output()
			if err != nil {
				return p, fmt.Errorf("go list -m k8s.io/kubernetes: %w", err)
			}
			p.kube = strings.TrimSpace(string(out))
		}
	}
	if len(o.components) == 0 {
		errs = append(errs, errors.New("--components: none"))
	}
	return p, errors.Join(errs...)
}

// run builds, writes and pushes every component's image index; progress
// goes to log.
func run(ctx context.Context, o options, log io.Writer) ([]result, error) {
	p, err := o.complete(ctx)
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(o.out, 0o755); err != nil {
		return nil, err
	}
	var results []result
	for _, c := range p.components {
		r, err := buildComponent(ctx, o, p, c, log)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", c.name, err)
		}
		results = append(results, r)
	}
	return results, nil
}

func buildComponent(ctx context.Context, o options, p plan, c component, log io.Writer) (result, error) {
	r := result{component: c.name}
	var err error
	if r.ref, err = name.NewTag(o.repository+"/"+c.name+":"+o.version, name.StrictValidation); err != nil {
		return r, err
	}
	tmp, err := os.MkdirTemp("", "rb-images-")
	if err != nil {
		return r, err
	}
	defer os.RemoveAll(tmp) // the layers, read until the index is written and pushed

	labels := map[string]string{
		"org.opencontainers.image.source":      source,
		"org.opencontainers.image.version":     o.version,
		"org.opencontainers.image.revision":    o.commit,
		"org.opencontainers.image.created":     p.created.UTC().Format(time.RFC3339),
		"org.opencontainers.image.title":       c.name,
		"org.opencontainers.image.description": c.description,
	}
	ldflags := fmt.Sprintf("-X %s.version=%s -X %s.commit=%s", versionPkg, o.version, versionPkg, o.commit)
	if c.kube {
		minor := strings.SplitN(strings.TrimPrefix(p.kube, "v"), ".", 3)
		if len(minor) < 2 {
			return r, fmt.Errorf("k8s.io/kubernetes version %q", p.kube)
		}
		ldflags += fmt.Sprintf(" -X %[1]s.gitVersion=%[2]s -X %[1]s.gitMajor=1 -X %[1]s.gitMinor=%[3]s", kubeVersionPkg, p.kube, minor[1])
	}

	var idx v1.ImageIndex = empty.Index
	for _, pl := range p.platforms {
		began := time.Now()
		img, err := goimage.Build(ctx, o.moduleRoot, tmp, goimage.Spec{
			Package: "./cmd/" + c.name, Platform: pl, LDFlags: ldflags, Labels: labels, Created: p.created,
		})
		if err != nil {
			return r, err
		}
		fmt.Fprintf(log, "%s %s built in %s\n", c.name, pl.String(), time.Since(began).Round(100*time.Millisecond))
		desc := v1.Descriptor{Platform: &pl}
		idx = mutate.AppendManifests(idx, mutate.IndexAddendum{Add: img, Descriptor: desc})
	}
	// The index carries the annotations too: registries show them per tag.
	idx = mutate.Annotations(idx, labels).(v1.ImageIndex)
	if r.digest, err = idx.Digest(); err != nil {
		return r, err
	}

	r.archive = filepath.Join(o.out, c.name+"-"+r.ref.TagStr()+".oci.tar")
	if r.size, err = writeArchive(r.archive, r.ref, idx); err != nil {
		return r, fmt.Errorf("write %s: %w", r.archive, err)
	}
	if o.push {
		began := time.Now()
		opts := append([]remote.Option{remote.WithContext(ctx), remote.WithAuthFromKeychain(authn.DefaultKeychain)}, o.remote...)
		if err := remote.WriteIndex(r.ref, idx, opts...); err != nil {
			return r, fmt.Errorf("push %s: %w", r.ref, err)
		}
		r.pushed = true
		fmt.Fprintf(log, "%s pushed to %s in %s\n", c.name, r.ref, time.Since(began).Round(100*time.Millisecond))
	}
	return r, nil
}

// writeArchive writes idx as an OCI image layout in a tar archive at path,
// its index.json naming it ref (as containerd's and OCI tools' importers
// read it), through a temporary file renamed into place. It returns the
// archive's size.
func writeArchive(path string, ref name.Tag, idx v1.ImageIndex) (int64, error) {
	dir, err := os.MkdirTemp("", "rb-images-layout-")
	if err != nil {
		return 0, err
	}
	defer os.RemoveAll(dir)
	lp, err := layout.Write(dir, empty.Index)
	if err != nil {
		return 0, err
	}
	if err := lp.AppendIndex(idx, layout.WithAnnotations(map[string]string{
		annotationRefName:        ref.TagStr(),
		annotationContainerdName: ref.Name(),
	})); err != nil {
		return 0, err
	}

	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+"-*.tmp")
	if err != nil {
		return 0, err
	}
	defer os.Remove(f.Name()) // after the rename, nothing to remove
	if err := tarDir(f, dir); err != nil {
		f.Close()
		return 0, err
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return 0, err
	}
	if err := f.Close(); err != nil {
		return 0, err
	}
	if err := os.Chmod(f.Name(), 0o644); err != nil {
		return 0, err
	}
	return st.Size(), os.Rename(f.Name(), path)
}

// tarDir writes dir's files to w as a tar archive, in name order and with
// fixed times and owners, so that the same layout gives the same archive.
func tarDir(w io.Writer, dir string) error {
	var paths []string
	if err := filepath.WalkDir(dir, func(p string, _ fs.DirEntry, err error) error {
		if err == nil && p != dir {
			paths = append(paths, p)
		}
		return err
	}); err != nil {
		return err
	}
	sort.Strings(paths)
	tw := tar.NewWriter(w)
	for _, p := range paths {
		st, err := os.Lstat(p)
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil {
			return err
		}
		hdr := &tar.Header{Name: filepath.ToSlash(rel), ModTime: time.Unix(0, 0), Mode: 0o644}
		switch {
		case st.IsDir():
			hdr.Typeflag, hdr.Name, hdr.Mode = tar.TypeDir, hdr.Name+"/", 0o755
		case st.Mode().IsRegular():
			hdr.Typeflag, hdr.Size = tar.TypeReg, st.Size()
		default:
			return fmt.Errorf("%s: not a file or directory", p)
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		if hdr.Typeflag == tar.TypeReg {
			if err := copyFile(tw, p); err != nil {
				return err
			}
		}
	}
	return tw.Close()
}

func copyFile(w io.Writer, p string) error {
	f, err := os.Open(p)
	if err != nil {
		return err
	}
	defer f.Close()
	_, err = io.Copy(w, f)
	return err
}

// report prints the images and how to use them: the archives to import,
// and the kustomize edits that point the manifests at these tags.
func report(w io.Writer, results []result, took time.Duration) {
	for _, r := range results {
		pushed := ""
		if r.pushed {
			pushed = ", pushed"
		}
		fmt.Fprintf(w, "%-13s %s@%s\n              %s (%.1f MiB%s)\n", r.component, r.ref, r.digest, r.archive, float64(r.size)/(1<<20), pushed)
	}
	fmt.Fprintf(w, "done in %s\n\nImport into a node's containerd: ctr -n k8s.io images import <archive>\n", took.Round(100*time.Millisecond))
	fmt.Fprintf(w, "Point the manifests at these images:\n")
	for _, r := range results {
		base := strings.TrimPrefix(r.component, "rb-")
		fmt.Fprintf(w, "  (cd manifests/%s && kustomize edit set image ghcr.io/fluidos-project/%s=%s)\n", base, r.component, r.ref)
	}
}
