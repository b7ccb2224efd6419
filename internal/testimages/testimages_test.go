package testimages

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestBuild(t *testing.T) {
	if testing.Short() {
		t.Skip("builds two binaries")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	root, err := filepath.Abs("../..")
	require.NoError(t, err)
	dir := t.TempDir()

	// Two builds at once into the same directory: the lock makes the second
	// wait and then find the first one's tarballs.
	began := time.Now()
	var (
		wg      sync.WaitGroup
		results [2][]Image
		errs    [2]error
	)
	for i := range results {
		wg.Go(func() { results[i], errs[i] = Build(ctx, root, dir) })
	}
	wg.Wait()
	cold := time.Since(began)
	require.NoError(t, errs[0])
	require.NoError(t, errs[1])
	require.Equal(t, results[0], results[1])
	images := results[0]
	require.Len(t, images, 2)
	assert.Equal(t, Pause, images[0].Name)
	assert.Equal(t, TestApp, images[1].Name)
	for _, im := range images {
		st, err := os.Stat(im.Path)
		require.NoError(t, err)
		t.Logf("%s: %s, %.1f MiB", im.Name, filepath.Base(im.Path), float64(st.Size())/(1<<20))
	}
	t.Logf("cold build: %s", cold.Round(time.Millisecond))

	bins, binDir := map[string]string{}, t.TempDir()
	for _, im := range images {
		t.Run(path.Base(im.Package), func(t *testing.T) {
			bins[im.Name] = checkImage(t, im, binDir)
		})
	}

	t.Run("cache hit", func(t *testing.T) {
		before := statAll(t, images)
		began := time.Now()
		again, err := Build(ctx, root, dir)
		took := time.Since(began)
		require.NoError(t, err)
		assert.Equal(t, images, again)
		after := statAll(t, images)
		for i := range images {
			assert.True(t, os.SameFile(before[i], after[i]), "%s was replaced", images[i].Path)
			assert.Equal(t, before[i].ModTime(), after[i].ModTime(), "%s was rewritten", images[i].Path)
		}
		t.Logf("warm build: %s", took.Round(time.Millisecond))
		assert.Less(t, took, 2*time.Second, "a cache hit should not build")
		entries, err := os.ReadDir(dir)
		require.NoError(t, err)
		assert.Len(t, entries, len(images)+1, "one tarball per image and the lock file")
	})

	if runtime.GOOS != "linux" {
		return // the binaries are for linux
	}
	run := func(title, image string, f func(*testing.T, string)) {
		t.Run(title, func(t *testing.T) {
			if bins[image] == "" {
				t.Skip("no binary: the image's check failed")
			}
			f(t, bins[image])
		})
	}
	run("testapp runs", TestApp, runTestApp)
	run("pause runs", Pause, runPause)
	run("pause reaps as PID 1", Pause, runPauseReaps)
}

// checkImage checks im's tarball (tag, config, the one layer) and returns
// the path of its binary, extracted into binDir.
func checkImage(t *testing.T, im Image, binDir string) string {
	t.Helper()
	bin := path.Base(im.Package)

	m, err := tarball.LoadManifest(func() (io.ReadCloser, error) { return os.Open(im.Path) })
	require.NoError(t, err)
	require.Len(t, m, 1)
	assert.Equal(t, []string{im.Name}, m[0].RepoTags, "the image is tagged with its full reference")

	tag, err := name.NewTag(im.Name)
	require.NoError(t, err)
	img, err := tarball.ImageFromPath(im.Path, &tag)
	require.NoError(t, err)
	cf, err := img.ConfigFile()
	require.NoError(t, err)
	assert.Equal(t, "linux", cf.OS)
	assert.Equal(t, runtime.GOARCH, cf.Architecture)
	assert.Equal(t, []string{"/" + bin}, cf.Config.Entrypoint)
	assert.Equal(t, "65532:65532", cf.Config.User)
	assert.Equal(t, "/", cf.Config.WorkingDir)
	assert.Equal(t, bin, cf.Config.Labels["org.opencontainers.image.title"])
	assert.NotEmpty(t, cf.Config.Labels["org.opencontainers.image.source"])

	layers, err := img.Layers()
	require.NoError(t, err)
	require.Len(t, layers, 1)
	rc, err := layers[0].Uncompressed()
	require.NoError(t, err)
	defer rc.Close()
	tr := tar.NewReader(rc)
	var files []string
	extracted := ""
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		require.NoError(t, err)
		files = append(files, hdr.Name)
		if strings.TrimPrefix(hdr.Name, "/") != bin {
			continue
		}
		assert.Equal(t, byte(tar.TypeReg), hdr.Typeflag)
		assert.Equal(t, int64(0o755), hdr.Mode)
		assert.Equal(t, 65532, hdr.Uid)
		assert.Equal(t, 65532, hdr.Gid)
		b, err := io.ReadAll(tr)
		require.NoError(t, err)
		require.True(t, bytes.HasPrefix(b, []byte("\x7fELF")), "/%s is not an ELF executable", bin)
		extracted = filepath.Join(binDir, bin)
		require.NoError(t, os.WriteFile(extracted, b, 0o755))
	}
	require.NotEmpty(t, extracted, "no /%s in the layer (files: %v)", bin, files)
	return extracted
}

func statAll(t *testing.T, images []Image) []os.FileInfo {
	t.Helper()
	out := make([]os.FileInfo, len(images))
	for i, im := range images {
		st, err := os.Stat(im.Path)
		require.NoError(t, err)
		out[i] = st
	}
	return out
}

// runTestApp runs the image's testapp binary: it serves, logs, shuts down on
// SIGTERM with 0 and exits with the code /exit asks for.
func runTestApp(t *testing.T, bin string) {
	start := func() (*exec.Cmd, func(time.Duration) (int, error), *syncBuffer, string) {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		addr := l.Addr().String()
		require.NoError(t, l.Close())
		cmd := exec.Command(bin, "--listen", addr)
		cmd.Env = append(os.Environ(), "CLUSTER_NAME=rome", "NODE_NAME=rome-1")
		out := &syncBuffer{}
		cmd.Stdout, cmd.Stderr = out, out
		require.NoError(t, cmd.Start())
		t.Cleanup(func() { _ = cmd.Process.Kill() })
		wait := waiter(cmd)
		require.Eventually(t, func() bool {
			resp, err := http.Get("http://" + addr + "/healthz")
			if err != nil {
				return false
			}
			resp.Body.Close()
			return resp.StatusCode == http.StatusOK
		}, 10*time.Second, 20*time.Millisecond, "testapp did not serve /healthz:\n%s", out)
		return cmd, wait, out, addr
	}

	cmd, wait, out, addr := start()
	resp, err := http.Get("http://" + addr + "/")
	require.NoError(t, err)
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	assert.Contains(t, string(body), `"cluster":"rome","node":"rome-1"`)
	require.NoError(t, cmd.Process.Signal(syscall.SIGTERM))
	code, err := wait(6 * time.Second)
	require.NoError(t, err, out)
	assert.Equal(t, 0, code, out)
	assert.Contains(t, out.String(), "testapp listening on "+addr+" cluster=rome node=rome-1")
	assert.Contains(t, out.String(), "GET /healthz 200")

	_, wait, out, addr = start()
	resp, err = http.Post("http://"+addr+"/exit?code=3", "", nil)
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, http.StatusOK, resp.StatusCode)
	code, err = wait(5 * time.Second)
	require.NoError(t, err, out)
	assert.Equal(t, 3, code, out)
}

// runPause runs the image's pause binary: it waits for SIGTERM, then exits 0.
func runPause(t *testing.T, bin string) {
	cmd := exec.Command(bin)
	stderr, err := cmd.StderrPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Kill() })
	wait := waiter(cmd)
	// Its first line comes once it handles signals (it is not PID 1 here).
	line := make([]byte, 128)
	n, err := stderr.Read(line)
	require.NoError(t, err)
	require.Contains(t, string(line[:n]), "not PID 1")

	_, err = wait(300 * time.Millisecond)
	require.Error(t, err, "pause exited by itself")
	require.NoError(t, cmd.Process.Signal(syscall.SIGTERM))
	code, err := wait(5 * time.Second)
	require.NoError(t, err)
	assert.Equal(t, 0, code)
}

// runPauseReaps runs pause as PID 1 of a new PID namespace, orphans two
// processes into it and checks they leave no zombies. Needs root and
// util-linux's unshare and nsenter.
func runPauseReaps(t *testing.T, bin string) {
	if os.Geteuid() != 0 {
		t.Skip("needs root for a PID namespace")
	}
	for _, tool := range []string{"unshare", "nsenter", "sh", "sleep"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("needs %s", tool)
		}
	}
	if out, err := exec.Command("unshare", "--pid", "--fork", "true").CombinedOutput(); err != nil {
		t.Skipf("no PID namespaces here: %v %s", err, out)
	}

	cmd := exec.Command("unshare", "--pid", "--fork", "--kill-child", bin)
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Kill() })
	wait := waiter(cmd)
	var pause int
	require.Eventually(t, func() bool {
		kids := children(cmd.Process.Pid)
		if len(kids) == 1 {
			pause = kids[0].pid
		}
		return pause != 0
	}, 5*time.Second, 10*time.Millisecond, "no pause under unshare")
	time.Sleep(100 * time.Millisecond) // let it install its handlers

	// sh exits at once; its two sleeps are orphaned to the namespace's PID 1.
	// (Their output goes elsewhere, or CombinedOutput would wait for them.)
	orphans := "sleep 1 >/dev/null 2>&1 & sleep 1 >/dev/null 2>&1 & exit 0"
	out, err := exec.Command("nsenter", "-t", strconv.Itoa(pause), "-p", "sh", "-c", orphans).CombinedOutput()
	require.NoError(t, err, string(out))
	require.Eventually(t, func() bool { return len(children(pause)) == 2 }, 2*time.Second, 10*time.Millisecond,
		"the sleeps were not reparented to pause")
	if !assert.Eventually(t, func() bool { return len(children(pause)) == 0 }, 5*time.Second, 20*time.Millisecond) {
		t.Fatalf("pause left children (Z: zombies): %v", children(pause))
	}

	require.NoError(t, syscall.Kill(pause, syscall.SIGTERM))
	code, err := wait(5 * time.Second)
	require.NoError(t, err)
	assert.Equal(t, 0, code)
}

type proc struct {
	pid   int
	state string
}

// children lists the processes whose parent is ppid, zombies included.
func children(ppid int) []proc {
	entries, _ := os.ReadDir("/proc")
	var out []proc
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		// pid (comm) state ppid ...; comm may hold anything, so cut at the last ')'.
		s := string(b)
		fields := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
		if len(fields) > 1 && fields[1] == strconv.Itoa(ppid) {
			out = append(out, proc{pid: pid, state: fields[0]})
		}
	}
	return out
}

// waiter waits for a started cmd; the function it returns waits up to d for
// cmd to exit and gives its exit code. It may be called again after a timeout.
func waiter(cmd *exec.Cmd) func(d time.Duration) (int, error) {
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	return func(d time.Duration) (int, error) {
		select {
		case err := <-done:
			done <- err // for a later call
			return exitCode(err)
		case <-time.After(d):
			return 0, fmt.Errorf("still running after %s", d)
		}
	}
}

// exitCode is the code of a process that exited, from cmd.Wait's error; a
// process killed by a signal has none.
func exitCode(err error) (int, error) {
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			return -1, fmt.Errorf("killed by %v", ws.Signal())
		}
		return ee.ExitCode(), nil
	}
	return 0, err
}

// syncBuffer is a bytes.Buffer a process writes to while the test reads it.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

func TestCacheKey(t *testing.T) {
	root := t.TempDir()
	write := func(rel, content string) {
		p := filepath.Join(root, filepath.FromSlash(rel))
		require.NoError(t, os.MkdirAll(filepath.Dir(p), 0o755))
		require.NoError(t, os.WriteFile(p, []byte(content), 0o644))
	}
	goMod := []byte("module example.com/m\n")
	write("go.mod", string(goMod))
	write("app/main.go", "package main\nfunc main() {}\n")
	im := Image{Name: "rb.test/app:v1", Package: "./app"}
	key := func(im Image, goMod []byte, goVersion string) string {
		t.Helper()
		k, err := cacheKey(root, im, goMod, goVersion)
		require.NoError(t, err)
		require.Len(t, k, keyLen)
		return k
	}

	k0 := key(im, goMod, "go1.26.0")
	assert.Equal(t, k0, key(im, goMod, "go1.26.0"), "stable")

	write("app/main_test.go", "package main\n")
	write("app/README.md", "docs\n")
	assert.Equal(t, k0, key(im, goMod, "go1.26.0"), "tests and other files do not count")

	assert.NotEqual(t, k0, key(im, goMod, "go1.26.1"), "the Go version counts")
	assert.NotEqual(t, k0, key(im, []byte("module example.com/m\n\ngo 1.26\n"), "go1.26.0"), "go.mod counts")
	assert.NotEqual(t, k0, key(Image{Name: "rb.test/app:v2", Package: "./app"}, goMod, "go1.26.0"), "the reference counts")

	write("app/internal/x.go", "package x\n")
	k1 := key(im, goMod, "go1.26.0")
	assert.NotEqual(t, k0, k1, "a Go file below the package counts")
	write("app/main.go", "package main\nfunc main() { println() }\n")
	assert.NotEqual(t, k1, key(im, goMod, "go1.26.0"), "an edit counts")

	_, err := cacheKey(root, Image{Name: "rb.test/none:v1", Package: "./none"}, goMod, "go1.26.0")
	assert.Error(t, err)
}

func TestFileBase(t *testing.T) {
	assert.Equal(t, "testapp-v1", fileBase(TestApp))
	assert.Equal(t, "pause-3.10", fileBase(Pause))
}

func TestBuildError(t *testing.T) {
	if testing.Short() {
		t.Skip("runs go build")
	}
	// A module whose image package does not compile: the error names the
	// image and the step.
	root := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(root, "go.mod"), []byte("module example.com/m\n\ngo 1.22\n"), 0o644))
	for _, im := range images {
		dir := filepath.Join(root, filepath.FromSlash(im.Package))
		require.NoError(t, os.MkdirAll(dir, 0o755))
		require.NoError(t, os.WriteFile(filepath.Join(dir, "main.go"), []byte("package main\nfunc main() { undefined() }\n"), 0o644))
	}
	_, err := Build(context.Background(), root, t.TempDir())
	require.Error(t, err)
	assert.Contains(t, err.Error(), "testimages: build "+Pause+": go build ./test/images/pause for linux/"+runtime.GOARCH+": ")
	assert.Contains(t, err.Error(), "undefined")
}
