// Package testenv starts a real test control plane (kube-apiserver and etcd,
// through controller-runtime's envtest) for tests.
//
// The binaries are the ones `make envtest-bin` builds from go.mod's
// Kubernetes version into <module root>/bin/k8s. KUBEBUILDER_ASSETS, when
// set (the Makefile exports it), names that directory instead. Nothing is
// downloaded.
//
//	func TestSomething(t *testing.T) {
//		cfg := testenv.Start(t, testenv.WithCRDDirectories(testenv.ModulePath(t, "bin", "crds", "cert-manager")))
//		c, err := client.New(cfg, client.Options{})
//		...
//	}
//
// Start registers a cleanup that stops the control plane at the end of the
// test. Each call starts its own control plane (a few seconds); share one
// per package from TestMain with New when that matters.
//
// Start sets controller-runtime's global logger once per process (to
// discard, or to WithLogger's) unless the test already did: the first
// ctrl.SetLogger call in a process wins.
package testenv

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"
)

const (
	// AssetsEnv names the directory holding kube-apiserver, etcd and kubectl.
	AssetsEnv = "KUBEBUILDER_ASSETS"
	// DefaultAssetsDir is where `make envtest-bin` puts them, relative to
	// the module root.
	DefaultAssetsDir = "bin/k8s"

	// defaultStartTimeout replaces envtest's 20 s: a cold kube-apiserver on a
	// loaded 2-core machine can take longer than that.
	defaultStartTimeout = 90 * time.Second
	startTimeoutEnv     = "KUBEBUILDER_CONTROLPLANE_START_TIMEOUT"
)

// Option configures the control plane before it starts.
type Option func(*options)

type options struct {
	crdDirs      []string
	crds         []*apiextensionsv1.CustomResourceDefinition
	apiServerArg map[string][]string
	startTimeout time.Duration
	logger       *logr.Logger
	configure    []func(*envtest.Environment)
	prepare      []func(*envtest.Environment) error // before the control plane starts
}

// WithCRDDirectories installs the CRDs (YAML or JSON files) found in each
// directory before Start returns, and waits until they are served. A missing
// directory is an error.
func WithCRDDirectories(dirs ...string) Option {
	return func(o *options) { o.crdDirs = append(o.crdDirs, dirs...) }
}

// WithCRDs installs the given CRDs before Start returns.
func WithCRDs(crds ...*apiextensionsv1.CustomResourceDefinition) Option {
	return func(o *options) { o.crds = append(o.crds, crds...) }
}

// WithAPIServerArg sets a kube-apiserver flag (name without dashes), e.g.
// WithAPIServerArg("feature-gates", "SomeGate=true").
func WithAPIServerArg(name string, values ...string) Option {
	return func(o *options) {
		if o.apiServerArg == nil {
			o.apiServerArg = map[string][]string{}
		}
		o.apiServerArg[name] = values
	}
}

// WithStartTimeout bounds how long etcd and kube-apiserver may each take to
// start (default 90 s, or KUBEBUILDER_CONTROLPLANE_START_TIMEOUT).
func WithStartTimeout(d time.Duration) Option {
	return func(o *options) { o.startTimeout = d }
}

// WithLogger is the logger given to controller-runtime (see the package doc).
func WithLogger(l logr.Logger) Option {
	return func(o *options) { o.logger = &l }
}

// WithEnvironment gives direct access to the envtest.Environment before it
// starts, for anything the other options do not cover.
func WithEnvironment(fn func(*envtest.Environment)) Option {
	return func(o *options) { o.configure = append(o.configure, fn) }
}

var setLoggerOnce sync.Once

// Start starts a test control plane, installs the requested CRDs, registers
// a t.Cleanup that stops it, and returns an admin (system:masters) config.
// It fails the test when the binaries are missing or the start fails.
func Start(t testing.TB, opts ...Option) *rest.Config {
	t.Helper()
	env, err := New(opts...)
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	began := time.Now()
	cfg, err := env.Start()
	if err != nil {
		// A partial start (etcd up, CRD install failed) still has to stop.
		_ = env.Stop()
		t.Fatalf("testenv: starting the control plane (%s): %v", env.ControlPlane.APIServer.Path, err)
	}
	t.Logf("testenv: control plane up in %s (%s)", time.Since(began).Round(time.Millisecond), cfg.Host)
	t.Cleanup(func() {
		if err := env.Stop(); err != nil {
			t.Errorf("testenv: stopping the control plane: %v", err)
		}
	})
	return cfg
}

// New returns a configured, not yet started envtest.Environment whose binary
// paths are resolved and checked, for callers that manage its lifetime
// themselves (e.g. one control plane per package in TestMain: env.Start(),
// then env.Stop()).
func New(opts ...Option) (*envtest.Environment, error) {
	o := options{}
	for _, opt := range opts {
		opt(&o)
	}

	setLoggerOnce.Do(func() {
		l := logr.Discard()
		if o.logger != nil {
			l = *o.logger
		}
		ctrllog.SetLogger(l)
	})

	dir, err := AssetsDir()
	if err != nil {
		return nil, err
	}
	paths := map[string]string{}
	for _, name := range []string{"kube-apiserver", "etcd", "kubectl"} {
		p := filepath.Join(dir, name)
		if fi, err := os.Stat(p); err != nil || fi.IsDir() || fi.Mode().Perm()&0o111 == 0 {
			if name == "kubectl" {
				continue // only needed by tests that ask envtest for kubectl
			}
			return nil, fmt.Errorf("%s not found in %s (%s or <module root>/%s): run \"make envtest-bin\"",
				name, dir, AssetsEnv, DefaultAssetsDir)
		}
		paths[name] = p
	}

	for _, d := range o.crdDirs {
		if fi, err := os.Stat(d); err != nil || !fi.IsDir() {
			return nil, fmt.Errorf("CRD directory %s does not exist", d)
		}
	}

	env := &envtest.Environment{
		BinaryAssetsDirectory: dir,
		CRDDirectoryPaths:     o.crdDirs,
		CRDs:                  o.crds,
		ErrorIfCRDPathMissing: true,
	}
	api := env.ControlPlane.GetAPIServer()
	api.Path = paths["kube-apiserver"]
	env.ControlPlane.Etcd = &envtest.Etcd{Path: paths["etcd"]}
	env.ControlPlane.KubectlPath = paths["kubectl"]
	for name, values := range o.apiServerArg {
		api.Configure().Set(name, values...)
	}

	switch {
	case o.startTimeout > 0:
		env.ControlPlaneStartTimeout = o.startTimeout
	case os.Getenv(startTimeoutEnv) == "":
		env.ControlPlaneStartTimeout = defaultStartTimeout
	}

	for _, fn := range o.configure {
		fn(env)
	}
	for _, fn := range o.prepare {
		if err := fn(env); err != nil {
			return nil, err
		}
	}
	return env, nil
}

// AssetsDir is the directory with the control plane binaries:
// $KUBEBUILDER_ASSETS when set, else <module root>/bin/k8s.
func AssetsDir() (string, error) {
	if dir := os.Getenv(AssetsEnv); dir != "" {
		return filepath.Abs(dir)
	}
	root, err := ModuleRoot()
	if err != nil {
		return "", fmt.Errorf("%s is unset and %w", AssetsEnv, err)
	}
	return filepath.Join(root, filepath.FromSlash(DefaultAssetsDir)), nil
}

// ModuleRoot is the nearest directory at or above the working directory
// (a test's package directory) that holds a go.mod.
func ModuleRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		} else if !errors.Is(err, os.ErrNotExist) {
			return "", err
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("no go.mod found above the working directory")
		}
		dir = parent
	}
}

// ModulePath joins elem to the module root, failing the test if there is none.
func ModulePath(t testing.TB, elem ...string) string {
	t.Helper()
	root, err := ModuleRoot()
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	return filepath.Join(append([]string{root}, elem...)...)
}
