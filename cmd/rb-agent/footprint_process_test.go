package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"
)

// The processes BenchmarkAgentFootprint (footprint_bench_test.go) measures:
// rb-agent and the informer baseline, started, watched and stopped.

// process is one measured subprocess.
type process struct {
	name  string
	cmd   *exec.Cmd
	log   string
	done  chan struct{}
	lines chan string // stdout lines, when captured
}

func (fx *footprintFixture) start(b *testing.B, name, path string, args, env []string, captureStdout bool) *process {
	b.Helper()
	logDir := fx.dir
	if fx.cfg.profileDir != "" { // keep the logs with the profiles
		logDir = fx.cfg.profileDir
		if err := os.MkdirAll(logDir, 0o755); err != nil {
			b.Fatal(err)
		}
	}
	p := &process{name: name, log: filepath.Join(logDir, name+".log"), done: make(chan struct{})}
	logf, err := os.OpenFile(p.log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		b.Fatal(err)
	}
	p.cmd = exec.Command(path, args...)
	p.cmd.Env = append(os.Environ(), env...)
	p.cmd.Stderr = logf
	var stdout io.ReadCloser
	if captureStdout {
		if stdout, err = p.cmd.StdoutPipe(); err != nil {
			b.Fatal(err)
		}
	} else {
		p.cmd.Stdout = logf
	}
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := p.cmd.Start(); err != nil {
		b.Fatal(err)
	}
	if captureStdout {
		p.lines = make(chan string, 64)
		go func() {
			sc := bufio.NewScanner(stdout)
			for sc.Scan() {
				fmt.Fprintln(logf, sc.Text())
				select {
				case p.lines <- sc.Text():
				default:
				}
			}
		}()
	}
	go func() {
		_ = p.cmd.Wait()
		logf.Close()
		close(p.done)
	}()
	b.Cleanup(p.stop)
	return p
}

// stop ends the process: SIGTERM, then SIGKILL after 15 s.
func (p *process) stop() {
	select {
	case <-p.done:
		return
	default:
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(15 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.done
	}
}

func (p *process) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

func (p *process) tail() string {
	data, _ := os.ReadFile(p.log)
	lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-30):], "\n")
}

// waitLine waits for a line of the process's stdout that starts with prefix.
func (p *process) waitLine(ctx context.Context, prefix string, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	for {
		select {
		case l := <-p.lines:
			if strings.HasPrefix(l, prefix) {
				return nil
			}
		case <-p.done:
			return fmt.Errorf("%s exited", p.name)
		case <-ctx.Done():
			return fmt.Errorf("no line %q within %s", prefix, timeout)
		}
	}
}

func (fx *footprintFixture) startAgent(b *testing.B) *process {
	args := []string{
		"--kubeconfig=" + fx.kubeconfig,
		"--cluster-id=" + footprintClusterID,
		"--broker-url=" + fx.brokerURL,
		"--broker-cert-dir=" + fx.certDir,
		"--namespace=" + footprintNamespace,
		"--leader-elect=false",
		"--metrics-bind-address=0",
		"--health-probe-bind-address=0",
		"--kubelet-address=127.0.0.1:" + strconv.Itoa(freePort(b)),
		"--node-ip=127.0.0.1",
		"--price-cpu=0.03", "--price-memory=0.004",
	}
	if fx.cfg.profileDir != "" {
		args = append(args, "--pprof-bind-address=127.0.0.1:"+strconv.Itoa(freePort(b)))
	}
	// RB_FOOTPRINT_AGENT_ENV adds environment variables to rb-agent, e.g.
	// GOMEMLIMIT=64MiB or GOGC=50, to see what the runtime's tuning changes.
	return fx.start(b, "rb-agent", fx.agentBin, args, strings.Fields(os.Getenv("RB_FOOTPRINT_AGENT_ENV")), false)
}

func (fx *footprintFixture) startInformer(b *testing.B) *process {
	self, err := os.Executable()
	if err != nil {
		b.Fatal(err)
	}
	return fx.start(b, "informer", self, []string{"-test.run=^TestFootprintInformerProcess$", "-test.timeout=0", "-test.count=1"},
		[]string{informerKubeconfigEnv + "=" + fx.kubeconfig}, true)
}

func freePort(tb testing.TB) int {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

const informerKubeconfigEnv = "RB_FOOTPRINT_INFORMER_KUBECONFIG"

// TestFootprintInformerProcess is the informer baseline of
// BenchmarkAgentFootprint, run as a subprocess of it (this test binary with
// -test.run selecting this test): a plain client-go shared informer factory
// on Pods and Nodes, full objects, protobuf, a handler that counts pods.
// It prints "synced pods=N nodes=M" once its caches are synced, then runs
// until SIGTERM. Without the environment variable it is skipped.
func TestFootprintInformerProcess(t *testing.T) {
	kc := os.Getenv(informerKubeconfigEnv)
	if kc == "" {
		t.Skip("the informer baseline of BenchmarkAgentFootprint, run by it as a subprocess")
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", kc)
	if err != nil {
		t.Fatal(err)
	}
	cfg.ContentType = runtime.ContentTypeProtobuf
	cfg.AcceptContentTypes = runtime.ContentTypeProtobuf + "," + runtime.ContentTypeJSON
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	var pods atomic.Int64
	factory := informers.NewSharedInformerFactory(cs, 0)
	podInf, nodeInf := factory.Core().V1().Pods().Informer(), factory.Core().V1().Nodes().Informer()
	reg, err := podInf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { pods.Add(1) },
		UpdateFunc: func(any, any) {},
		DeleteFunc: func(any) { pods.Add(-1) },
	})
	if err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	factory.Start(stop)
	if !toolscache.WaitForCacheSync(stop, reg.HasSynced, nodeInf.HasSynced) {
		t.Fatal("caches did not sync")
	}
	fmt.Printf("synced pods=%d nodes=%d \n", pods.Load(), len(nodeInf.GetStore().ListKeys()))
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	<-sig
	close(stop)
	os.Exit(0)
}
