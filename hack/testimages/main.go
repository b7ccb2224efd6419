// Command testimages builds the test bed's images (internal/testimages) as
// tarballs and prints where they are: `make test-images`, or
//
//	go run ./hack/testimages --out bin/images
//
// Import one into a node's containerd with
// `ctr -n k8s.io images import <tarball>`.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/fluidos-project/resource-broker/internal/testenv"
	"github.com/fluidos-project/resource-broker/internal/testimages"
)

func main() {
	out := flag.String("out", "bin/images", "directory to write the tarballs into")
	root := flag.String("module-root", "", "the module's root (default: the directory of the go.mod above the working directory)")
	flag.Parse()

	if err := run(*root, *out); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

func run(root, out string) error {
	if root == "" {
		var err error
		if root, err = testenv.ModuleRoot(); err != nil {
			return err
		}
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	began := time.Now()
	images, err := testimages.Build(ctx, root, out)
	if err != nil {
		return err
	}
	for _, im := range images {
		size := "?"
		if st, err := os.Stat(im.Path); err == nil {
			size = fmt.Sprintf("%.1f MiB", float64(st.Size())/(1<<20))
		}
		fmt.Printf("%-20s %s (%s)\n", im.Name, im.Path, size)
	}
	fmt.Printf("done in %s; import with: ctr -n k8s.io images import <tarball>\n", time.Since(began).Round(time.Millisecond))
	return nil
}
