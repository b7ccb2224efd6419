// Package version is the version of this module's binaries, stamped at
// build time by the Makefile and the image build (hack/images):
//
//	go build -ldflags "-X github.com/fluidos-project/resource-broker/internal/version.version=v0.1.0 \
//	  -X github.com/fluidos-project/resource-broker/internal/version.commit=<git rev-parse HEAD>"
//
// An unstamped build (`go build`, `go run`) reports "devel" and the commit Go
// recorded from the working tree, if any (-buildvcs).
package version

import (
	"fmt"
	"runtime"
	"runtime/debug"
	"strings"

	"github.com/spf13/cobra"
)

// Stamped with -ldflags -X; see the package comment.
var (
	version string
	commit  string
)

// Info is what a binary reports with --version.
type Info struct {
	// Version is `git describe --tags --always --dirty` of the build, or
	// "devel" when it was not stamped.
	Version string
	// Commit is the full commit hash, empty when unknown; Dirty says the
	// working tree had changes (only known for unstamped builds).
	Commit string
	Dirty  bool
	// GoVersion and Platform are those of the binary.
	GoVersion, Platform string
}

// Get returns this binary's version.
func Get() Info {
	bi, _ := debug.ReadBuildInfo()
	return get(version, commit, bi)
}

func get(version, commit string, bi *debug.BuildInfo) Info {
	in := Info{Version: version, Commit: commit, GoVersion: runtime.Version(), Platform: runtime.GOOS + "/" + runtime.GOARCH}
	if in.Version == "" {
		in.Version = "devel"
	}
	if in.Commit == "" && bi != nil {
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				in.Commit = s.Value
			case "vcs.modified":
				in.Dirty = s.Value == "true"
			}
		}
	}
	return in
}

// String is the line --version prints after the program's name, e.g.
// "v0.1.0-3-g06c3c40 (commit 06c3c40…, go1.26.0 linux/amd64)".
func (in Info) String() string {
	var b strings.Builder
	b.WriteString(in.Version)
	b.WriteString(" (")
	if in.Commit != "" {
		fmt.Fprintf(&b, "commit %s", in.Commit)
		if in.Dirty {
			b.WriteString(" with local changes")
		}
		b.WriteString(", ")
	}
	fmt.Fprintf(&b, "%s %s)", in.GoVersion, in.Platform)
	return b.String()
}

// AddFlag gives cmd a --version flag that prints "<name> <Get()>" and quits
// (cobra's own version handling, with the flag declared here so that cobra
// does not take -v, which is klog's verbosity).
func AddFlag(cmd *cobra.Command) {
	cmd.Version = Get().String()
	cmd.SetVersionTemplate("{{.Name}} {{.Version}}\n")
	cmd.Flags().Bool("version", false, "print the version and quit")
}

// Module is the version of a module this binary was built with (e.g.
// "k8s.io/kubernetes" for rb-scheduler's kube-scheduler), empty if it was not.
func Module(path string) string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return ""
	}
	for _, d := range bi.Deps {
		if d.Path == path {
			if d.Replace != nil && d.Replace.Version != "" {
				return d.Replace.Version
			}
			return d.Version
		}
	}
	return ""
}
