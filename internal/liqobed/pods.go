package liqobed

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/fluidos-project/resource-broker/internal/backoff"
	"github.com/fluidos-project/resource-broker/internal/testbed"
)

// virtualKubeletLabel marks the Deployments of Liqo's virtual kubelets
// (github.com/liqotech/liqo/pkg/vkMachinery.KubeletBaseLabels).
const virtualKubeletLabel = "offloading.liqo.io/component"

// sandbox runs a Liqo binary in its own mount namespace with private
// tmpfs over the fixed paths below /tmp it writes to (mountPoints); exec
// keeps the pid.
var sandbox = "set -e; for d in " + strings.Join(mountPoints, " ") +
	"; do mount -t tmpfs -o mode=0700,size=16m liqobed \"$d\"; done; exec \"$0\" \"$@\""

// standIn runs the one replica of a Liqo Deployment as a host process.
type standIn struct {
	c      *Cluster
	key    string // namespace/name of the Deployment
	uid    types.UID
	binary string // base name of the container's command
	proc   *testbed.Process
	probe  string // 127.0.0.1:<port> of its health probe ("" if none)
	port   int    // its serving port (webhook, virtual kubelet; 0 if none)

	mu       sync.Mutex
	restarts int
	stopping chan struct{}
	done     chan struct{}
	stopOnce sync.Once
}

func (c *Cluster) standIns() []*standIn {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]*standIn, 0, len(c.pods))
	for _, s := range c.pods {
		out = append(out, s)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].key < out[j].key })
	return out
}

// run starts the stand-in of Deployment d and keeps it running (restarting
// it when it exits) until stop.
func (c *Cluster) run(ctx context.Context, d *appsv1.Deployment) (*standIn, error) {
	s, err := c.newStandIn(ctx, d)
	if err != nil {
		return nil, fmt.Errorf("Deployment %s/%s: %w", d.Namespace, d.Name, err)
	}
	c.mu.Lock()
	c.pods[s.key] = s
	c.mu.Unlock()
	if err := s.proc.Start(); err != nil {
		close(s.done)
		return s, err
	}
	go s.keep()
	return s, nil
}

// newStandIn translates the Deployment's pod template into a host process.
func (c *Cluster) newStandIn(ctx context.Context, d *appsv1.Deployment) (*standIn, error) {
	spec := d.Spec.Template.Spec
	if len(spec.Containers) != 1 || len(spec.Containers[0].Command) == 0 {
		return nil, errors.New("expected one container with a command")
	}
	ctr := spec.Containers[0]
	binary := path.Base(ctr.Command[0])
	bin := filepath.Join(c.liqo.BinDir, binary)
	if _, err := os.Stat(bin); err != nil {
		return nil, fmt.Errorf("the container runs %s, not in %s", ctr.Command[0], c.liqo.BinDir)
	}
	sa := spec.ServiceAccountName
	if sa == "" {
		sa = "default"
	}
	podName := d.Name + "-host"
	kubeconfig, err := c.serviceAccountKubeconfig(ctx, d.Namespace, sa)
	if err != nil {
		return nil, err
	}
	env := map[string]string{}
	var envList []string
	for _, e := range ctr.Env {
		v, err := c.envValue(ctx, d.Namespace, podName, e, env)
		if err != nil {
			return nil, fmt.Errorf("env %s: %w", e.Name, err)
		}
		env[e.Name] = v
		envList = append(envList, e.Name+"="+v)
	}
	args := make([]string, 0, len(ctr.Command)-1+len(ctr.Args)+4)
	for _, a := range append(ctr.Command[1:], ctr.Args...) {
		args = append(args, expand(a, env))
	}
	s := &standIn{c: c, key: d.Namespace + "/" + d.Name, uid: d.UID, binary: binary,
		stopping: make(chan struct{}), done: make(chan struct{})}
	// Host processes share one network namespace: own ports, loopback probes, no metrics.
	ports, err := testbed.FreePorts(2)
	if err != nil {
		return nil, err
	}
	switch binary {
	case "liqo-controller-manager":
		s.probe = "127.0.0.1:" + strconv.Itoa(ports[0])
		args = append(args, "--health-probe-address="+s.probe, "--metrics-address=0", "--webhook-port="+strconv.Itoa(ports[1]))
	case "webhook":
		s.probe, s.port = "127.0.0.1:"+strconv.Itoa(ports[0]), ports[1]
		args = append(args, "--health-probe-address="+s.probe, "--metrics-address=0", "--webhook-port="+strconv.Itoa(s.port))
	case "crd-replicator":
		args = append(args, "--metrics-address=0")
	case "virtual-kubelet":
		s.port = ports[0]
		args = append(args, "--listen-port="+strconv.Itoa(s.port))
	}
	name := "liqo-" + c.Name + "-" + d.Name
	if d.Namespace != Namespace {
		name = "liqo-" + c.Name + "-" + d.Namespace + "-" + d.Name
	}
	s.proc = &testbed.Process{
		Name:    name,
		Path:    mustLookPath("unshare"),
		Args:    append([]string{"-m", "--propagation", "private", "sh", "-c", sandbox, bin}, args...),
		Env:     append(envList, "KUBECONFIG="+kubeconfig, "TMPDIR=/tmp"),
		LogPath: filepath.Join(c.liqo.bed.LogDir, name+".log"),
	}
	return s, nil
}

func mustLookPath(name string) string {
	p, err := exec.LookPath(name)
	if err != nil {
		return name
	}
	return p
}

// keep restarts the process when it exits, with a back-off, until stop.
func (s *standIn) keep() {
	defer close(s.done)
	retry := backoff.Exponential(time.Second, 10*time.Second)
	for {
		select {
		case <-s.stopping:
			return
		case <-s.proc.Exited():
		}
		select {
		case <-s.stopping:
			return
		case <-time.After(retry.Step()):
		}
		s.mu.Lock()
		s.restarts++
		s.mu.Unlock()
		if err := s.proc.Start(); err != nil {
			fmt.Fprintf(os.Stderr, "liqobed: restart %s: %v\n", s.proc.Name, err)
		}
	}
}

func (s *standIn) restartCount() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.restarts
}

// stop ends the process (SIGTERM, then SIGKILL after a grace period).
func (s *standIn) stop() error {
	var err error
	s.stopOnce.Do(func() {
		close(s.stopping)
		<-s.done
		err = s.proc.Stop(20 * time.Second)
	})
	return err
}

// serviceAccountKubeconfig writes a kubeconfig with a token of the
// ServiceAccount (what the pod would mount) for the cluster's API server.
func (c *Cluster) serviceAccountKubeconfig(ctx context.Context, ns, sa string) (string, error) {
	tr := &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To(int64(12 * 3600))}}
	var last error
	err := wait(ctx, 30*time.Second, nil, "a token of ServiceAccount "+ns+"/"+sa, func() (bool, error) {
		tok, err := c.Clientset.CoreV1().ServiceAccounts(ns).CreateToken(ctx, sa, tr, metav1.CreateOptions{})
		if err != nil {
			last = err
			return false, nil
		}
		tr = tok
		return true, nil
	})
	if err != nil {
		return "", fmt.Errorf("%w: %v", err, last)
	}
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["cluster"] = &clientcmdapi.Cluster{Server: c.Config.Host, CertificateAuthorityData: c.Config.CAData}
	cfg.AuthInfos["sa"] = &clientcmdapi.AuthInfo{Token: tr.Status.Token}
	cfg.Contexts["sa"] = &clientcmdapi.Context{Cluster: "cluster", AuthInfo: "sa", Namespace: ns}
	cfg.CurrentContext = "sa"
	file := filepath.Join(c.dir, "sa-"+ns+"-"+sa+".kubeconfig")
	return file, clientcmd.WriteToFile(*cfg, file)
}

// envValue resolves a container's environment variable as the kubelet would.
func (c *Cluster) envValue(ctx context.Context, ns, podName string, e corev1.EnvVar, env map[string]string) (string, error) {
	if e.ValueFrom == nil {
		return expand(e.Value, env), nil
	}
	switch f := e.ValueFrom; {
	case f.FieldRef != nil:
		switch f.FieldRef.FieldPath {
		case "metadata.name":
			return podName, nil
		case "metadata.namespace":
			return ns, nil
		case "status.podIP", "status.hostIP":
			return c.IP, nil
		case "spec.serviceAccountName", "spec.nodeName":
			return "", nil
		}
		return "", fmt.Errorf("unsupported fieldRef %s", f.FieldRef.FieldPath)
	case f.ConfigMapKeyRef != nil:
		var cm corev1.ConfigMap
		if err := c.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: f.ConfigMapKeyRef.Name}, &cm); err != nil {
			return "", err
		}
		return cm.Data[f.ConfigMapKeyRef.Key], nil
	case f.SecretKeyRef != nil:
		var sec corev1.Secret
		if err := c.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: f.SecretKeyRef.Name}, &sec); err != nil {
			return "", err
		}
		return string(sec.Data[f.SecretKeyRef.Key]), nil
	}
	return "", errors.New("unsupported valueFrom")
}

// expand replaces $(VAR) by env's VAR as Kubernetes does for args and env
// ($$ is a literal $; unknown references stay as they are).
func expand(s string, env map[string]string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] != '$' || i+1 >= len(s) {
			b.WriteByte(s[i])
			continue
		}
		switch s[i+1] {
		case '$':
			b.WriteByte('$')
			i++
		case '(':
			end := strings.IndexByte(s[i:], ')')
			if end < 0 {
				b.WriteString(s[i:])
				return b.String()
			}
			name := s[i+2 : i+end]
			if v, ok := env[name]; ok {
				b.WriteString(v)
			} else {
				b.WriteString(s[i : i+end+1])
			}
			i += end
		default:
			b.WriteByte('$')
		}
	}
	return b.String()
}

// superviseVirtualKubelets runs a stand-in for every virtual-kubelet
// Deployment Liqo creates in any of the clusters, and stops it when the
// Deployment goes (or is being deleted).
func (l *Liqo) superviseVirtualKubelets() {
	defer l.wg.Done()
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	for {
		for _, c := range l.Clusters {
			c.syncVirtualKubelets(l.ctx)
		}
		select {
		case <-l.ctx.Done():
			return
		case <-tick.C:
		}
	}
}

func (c *Cluster) syncVirtualKubelets(ctx context.Context) {
	var list appsv1.DeploymentList
	if err := c.Client.List(ctx, &list, client.MatchingLabels{virtualKubeletLabel: "virtual-kubelet"}); err != nil {
		return
	}
	want := map[string]*appsv1.Deployment{}
	for i := range list.Items {
		d := &list.Items[i]
		if d.DeletionTimestamp.IsZero() {
			want[d.Namespace+"/"+d.Name] = d
		}
	}
	for _, s := range c.standIns() {
		if s.binary != "virtual-kubelet" {
			continue
		}
		if d, ok := want[s.key]; ok && d.UID == s.uid {
			continue
		}
		c.mu.Lock()
		delete(c.pods, s.key)
		c.mu.Unlock()
		c.liqo.stops.Add(1)
		go func() {
			defer c.liqo.stops.Done()
			if err := s.stop(); err != nil {
				fmt.Fprintf(os.Stderr, "liqobed: %v\n", err)
			}
		}()
	}
	for key, d := range want {
		c.mu.Lock()
		_, running := c.pods[key]
		c.mu.Unlock()
		if running {
			continue
		}
		if _, err := c.run(ctx, d); err != nil && ctx.Err() == nil {
			fmt.Fprintf(os.Stderr, "liqobed: %s: virtual kubelet %s: %v\n", c.Name, key, err)
		}
	}
}

// VirtualKubelets lists the running virtual-kubelet stand-ins of the
// cluster: namespace/name of the Deployment -> pid.
func (c *Cluster) VirtualKubelets() map[string]int {
	out := map[string]int{}
	for _, s := range c.standIns() {
		if s.binary == "virtual-kubelet" && s.proc.Running() {
			out[s.key] = s.proc.Pid()
		}
	}
	return out
}

var errTimeout = errors.New("timed out")

// wait polls cond every 100ms until it holds, the stand-in's process
// exits, ctx ends or timeout passes.
func wait(ctx context.Context, timeout time.Duration, s *standIn, what string, cond func() (bool, error)) error {
	deadline := time.Now().Add(timeout)
	var exited <-chan struct{}
	if s != nil {
		exited = s.proc.Exited()
	}
	for {
		ok, err := cond()
		if err != nil {
			return fmt.Errorf("waiting for %s: %w", what, err)
		}
		if ok {
			return nil
		}
		select {
		case <-exited:
			return fmt.Errorf("waiting for %s: %s exited (%v):\n%s", what, s.proc.Name, s.proc.Err(), s.proc.Tail(30))
		case <-ctx.Done():
			return fmt.Errorf("waiting for %s: %w", what, ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			tailText := ""
			if s != nil {
				tailText = "\n" + s.proc.Name + ":\n" + s.proc.Tail(30)
			}
			return fmt.Errorf("waiting for %s: %w after %s%s", what, errTimeout, timeout, tailText)
		}
	}
}

// rssOf is the resident set size of a process in bytes (0 if unknown).
func rssOf(pid int) int64 {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(raw), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "VmRSS:" {
			kb, _ := strconv.ParseInt(f[1], 10, 64)
			return kb << 10
		}
	}
	return 0
}
