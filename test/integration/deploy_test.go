package integration

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/fluidos-project/resource-broker/internal/testbed"
	"github.com/fluidos-project/resource-broker/internal/testenv"
	"github.com/fluidos-project/resource-broker/internal/testimages"
)

// The deploy test's clusters: rome runs the broker, Redis, an agent and
// rb-scheduler on one 3-CPU node, so a 3-CPU pod cannot fit there; paris is
// a provider with one 6-CPU node.
var (
	deployRome  = testbed.ClusterSpec{Name: "rome", Requester: true, Nodes: []corev1.ResourceList{testbed.Resources("3", "8Gi")}}
	deployParis = testbed.ClusterSpec{Name: "paris", Nodes: []corev1.ResourceList{testbed.Resources("6", "12Gi")}}
)

// TestDeployFromInstallGuide follows docs/install.md on two clusters of
// real nodes: it runs every sh block of the guide, in order, in one bash
// (as a user pastes them into a terminal), with the settings of its first
// block set to the bed's values. The components run as the manifests
// deploy them: images built by `make images` and imported into the nodes'
// containerd, Redis and the broker behind a LoadBalancer Service, an agent
// per cluster, rb-scheduler in rome, certificates from rbctl. The bed
// gives the pods Services and DNS (real kube-proxy and CoreDNS). Then a pod
// that does not fit in rome runs in paris, the deployment is upgraded with
// that pod running, and uninstalled.
func TestDeployFromInstallGuide(t *testing.T) { deployFromGuide(t, false) }

// TestOperatorHelmDeploy is TestDeployFromInstallGuide with the agents
// installed by charts/rb-agent, as charts/README.md says in place of the
// guide's section 4: the pod that does not fit in rome runs in paris through
// them; then they are uninstalled with helm.
func TestOperatorHelmDeploy(t *testing.T) { deployFromGuide(t, true) }

// deployFromGuide runs docs/install.md; helmAgents: its section 4 by
// charts/README.md's block, and it stops after the offloaded pod.
func deployFromGuide(t *testing.T, helmAgents bool) {
	ctx := context.Background()
	root, err := testenv.ModuleRoot()
	require.NoError(t, err)
	guide, err := os.ReadFile(filepath.Join(root, "docs", "install.md"))
	require.NoError(t, err)
	blocks := shellBlocks(string(guide))
	require.GreaterOrEqual(t, len(blocks), 10, "docs/install.md: its sh blocks")

	work := filepath.Join(root, ".deploy-test") // one level under the checkout, as the guide wants
	require.NoError(t, os.RemoveAll(work))
	t.Cleanup(func() { os.RemoveAll(work) })
	tmp := t.TempDir()
	kubeconfig := filepath.Join(tmp, "kubeconfig")
	imagesOut := filepath.Join(tmp, "release-images")
	helmBin := os.Getenv("HELM")
	if helmBin == "" {
		helmBin = filepath.Join(root, "bin", "liqo", "helm") // `make liqo-bin` builds it
	}
	if helmAgents {
		_, err := os.Stat(helmBin)
		require.NoError(t, err, "helm: run `make liqo-bin` (it builds bin/liqo/helm) or set HELM")
	}
	redisImage, err := testimages.HostRedis(ctx, filepath.Join(tmp, "images"))
	require.NoError(t, err)

	sh := startGuideShell(t, root, filepath.Join(tmp, "guide.log"), map[string]string{
		"BROKER_CONTEXT": "rome", "MEMBERS": "rome paris", "REQUESTERS": "rome",
		"VERSION": "v0.1.0", "REDIS_IMAGE": redisImage.Name, "APP_IMAGE": testimages.TestApp, "PLACEHOLDER_IMAGE": testimages.Pause,
		"WORKDIR": ".deploy-test", "KUBECONFIG": kubeconfig, "HELM": helmBin,
		// make images writes here, not into the checkout's bin/images (which
		// other checkouts may share).
		"IMAGES_OUT": imagesOut,
		// One platform: the nodes are this machine's.
		"IMAGE_PLATFORMS": "linux/amd64",
	})
	next := 0
	run := func(want string) string {
		t.Helper()
		require.Less(t, next, len(blocks), "docs/install.md has no more blocks; the test wants %q", want)
		b := blocks[next]
		next++
		require.Contains(t, b.section, want, "docs/install.md: block %d is in %q", next, b.section)
		return sh.run(t, b, 10*time.Minute)
	}

	run("0. Your settings")
	run("1. Images")
	images := releaseImages(t, imagesOut, "v0.1.0")
	bed := testbed.Start(t, testbed.Options{RealNodes: true, Deployed: true,
		Clusters: []testbed.ClusterSpec{deployRome, deployParis},
		Images:   append(images, redisImage.Path), Logf: t.Logf})
	rome, paris := bed.Cluster("rome"), bed.Cluster("paris")
	writeContexts(t, kubeconfig, bed)
	redisVolume(t, rome, filepath.Join(bed.Dir, "redis-data"))

	run("2. Redis and the broker")
	run("2. Redis and the broker") // the Redis password
	run("3. Certificates")
	var out string
	if helmAgents {
		require.Contains(t, blocks[next].section, "4. An agent in every member")
		next++ // in its place:
		readme, err := os.ReadFile(filepath.Join(root, "charts", "README.md"))
		require.NoError(t, err)
		helmBlocks := shellBlocks(string(readme))
		require.Len(t, helmBlocks, 1, "charts/README.md: the agents' block")
		out = sh.run(t, helmBlocks[0], 10*time.Minute)
		t.Logf("helm:\n%s", out)
	} else {
		out = run("4. An agent in every member") // rbctl join
	}
	for _, c := range []string{"rome", "paris"} {
		assert.Regexp(t, `(?m)^the broker at https://\S+ accepts "`+c+`"$`, out, "rbctl join: the broker takes %s's new certificate", c)
	}
	run("5. rb-scheduler in every requester")
	out = run("5. rb-scheduler in every requester") // rbctl get clusters
	assert.Regexp(t, `(?m)^rome\s`, out, "rbctl get clusters lists rome")
	assert.Regexp(t, `(?m)^paris\s`, out, "rbctl get clusters lists paris")
	out = run("6. A pod that does not fit at home")
	assert.Contains(t, out, "rb-paris", "the pod runs on paris's virtual node")

	t.Run("offloaded", func(t *testing.T) {
		var pod corev1.Pod
		require.NoError(t, rome.Client.Get(ctx, client.ObjectKey{Namespace: "demo", Name: "big"}, &pod))
		assert.Equal(t, "rb-paris", pod.Spec.NodeName)
		remote := tenantPods(t, paris)
		require.Len(t, remote, 1, "the pod's copy in paris")
		assert.Equal(t, corev1.PodRunning, remote[0].Status.Phase)
		assert.True(t, strings.HasPrefix(remote[0].Spec.NodeName, "paris-node-"), "on a real node of paris: %s", remote[0].Spec.NodeName)
	})
	if helmAgents {
		t.Run("helm releases", func(t *testing.T) {
			for _, c := range []*testbed.Cluster{rome, paris} {
				var dep appsv1.Deployment
				require.NoError(t, c.Client.Get(ctx, client.ObjectKey{Namespace: "resource-broker", Name: "rb-agent"}, &dep))
				assert.Equal(t, "Helm", dep.Labels["app.kubernetes.io/managed-by"], "%s: rb-agent is the chart's", c.Name)
				assert.Equal(t, int32(2), dep.Status.ReadyReplicas, c.Name)
			}
		})
		for _, c := range []string{"rome", "paris"} {
			sh.run(t, guideBlock{section: "(the test)", text: `"$HELM" --kube-context ` + c + ` uninstall rb-agent -n resource-broker --wait`}, 5*time.Minute)
		}
		for _, c := range []*testbed.Cluster{rome, paris} {
			var dep appsv1.Deployment
			err := c.Client.Get(ctx, client.ObjectKey{Namespace: "resource-broker", Name: "rb-agent"}, &dep)
			assert.True(t, apierrors.IsNotFound(err), "%s: rb-agent uninstalled: %v", c.Name, err)
		}
		return
	}
	t.Run("deployed as the manifests say", func(t *testing.T) {
		checkDeployedPods(t, rome, map[string]int{"rb-broker": 2, "rb-redis": 1, "rb-agent": 2, "rb-scheduler": 2})
		checkDeployedPods(t, paris, map[string]int{"rb-agent": 2})
		checkProcessesNonRoot(t, map[string]int{"rb-broker": 65532, "rb-agent": 65532, "rb-scheduler": 65532, "redis-server": 999})
		for c, names := range map[*testbed.Cluster][]string{rome: {"rb-broker", "rb-scheduler", "rb-agent"}, paris: {"rb-agent"}} {
			for _, name := range names {
				var pdb policyv1.PodDisruptionBudget
				require.NoError(t, c.Client.Get(ctx, client.ObjectKey{Namespace: "resource-broker", Name: name}, &pdb))
				assert.GreaterOrEqual(t, pdb.Status.DisruptionsAllowed, int32(1), "%s %s: PodDisruptionBudget allows one disruption at a time: %+v", c.Name, name, pdb.Status)
			}
		}
	})

	// Upgrade to v0.1.1, as the guide says, with the offloaded pod running.
	var redisBefore corev1.Pod
	require.NoError(t, rome.Client.Get(ctx, client.ObjectKey{Namespace: "resource-broker", Name: "rb-redis-0"}, &redisBefore))
	sh.set(t, "VERSION", "v0.1.1")
	sh.run(t, guideBlock{section: "(the test)", text: `make images VERSION="$VERSION"`}, 10*time.Minute)
	for _, c := range bed.Clusters {
		for _, name := range []string{c.Name + "-node-1"} {
			require.NoError(t, c.RealNode(name).ImportImages(ctx, releaseImages(t, imagesOut, "v0.1.1")...))
		}
	}
	run("Upgrading")
	t.Run("upgraded", func(t *testing.T) {
		for _, c := range []*testbed.Cluster{rome, paris} {
			var pods corev1.PodList
			require.NoError(t, c.Client.List(ctx, &pods, client.InNamespace("resource-broker")))
			for _, p := range pods.Items {
				for _, ctr := range p.Spec.Containers {
					if strings.Contains(ctr.Image, "/rb-") && p.DeletionTimestamp == nil {
						assert.True(t, strings.HasSuffix(ctr.Image, ":v0.1.1"), "%s/%s runs %s", c.Name, p.Name, ctr.Image)
					}
				}
			}
		}
		var pod corev1.Pod
		require.NoError(t, rome.Client.Get(ctx, client.ObjectKey{Namespace: "demo", Name: "big"}, &pod))
		assert.Equal(t, corev1.PodRunning, pod.Status.Phase, "the offloaded pod ran through the upgrade")
		assert.Len(t, tenantPods(t, paris), 1)
		var redisAfter corev1.Pod
		require.NoError(t, rome.Client.Get(ctx, client.ObjectKey{Namespace: "resource-broker", Name: "rb-redis-0"}, &redisAfter))
		assert.Equal(t, redisBefore.UID, redisAfter.UID, "Redis is not restarted by an upgrade of the broker")
	})

	run("Uninstalling")
	require.Equal(t, len(blocks), next, "every block of docs/install.md ran")
	t.Run("what stays behind", func(t *testing.T) {
		eventually(t, 2*time.Minute, "paris: rome's tenant namespace gone", func() (bool, string) {
			var ns corev1.Namespace
			err := paris.Client.Get(ctx, client.ObjectKey{Name: "rb-rome"}, &ns)
			return apierrors.IsNotFound(err), fmt.Sprint(err)
		})
		var nodes corev1.NodeList
		require.NoError(t, rome.Client.List(ctx, &nodes))
		for _, n := range nodes.Items {
			assert.False(t, strings.HasPrefix(n.Name, "rb-"), "virtual node %s left", n.Name)
		}
		var pv corev1.PersistentVolume
		require.NoError(t, rome.Client.Get(ctx, client.ObjectKey{Name: "rb-redis-data"}, &pv))
		assert.Equal(t, corev1.VolumeReleased, pv.Status.Phase, "Redis's volume kept, as its reclaim policy says")
	})
}

// guideBlock is one sh block of docs/install.md and the heading above it.
type guideBlock struct{ section, text string }

var fence = regexp.MustCompile("(?ms)^```sh\n(.*?)^```")

// shellBlocks are the guide's sh blocks in order.
func shellBlocks(doc string) []guideBlock {
	var out []guideBlock
	section := ""
	for _, loc := range fence.FindAllStringSubmatchIndex(doc, -1) {
		for _, line := range strings.Split(doc[:loc[0]], "\n") {
			if strings.HasPrefix(line, "## ") {
				section = strings.TrimPrefix(line, "## ")
			}
		}
		out = append(out, guideBlock{section: section, text: doc[loc[2]:loc[3]]})
	}
	return out
}

// guideShell is one bash that runs the guide's blocks one after the other,
// as a terminal would: variables set by one block are there for the next.
type guideShell struct {
	stdin io.WriteCloser
	lines chan string
	done  chan struct{}
	dir   string
	n     int
}

func startGuideShell(t *testing.T, dir, logPath string, env map[string]string) *guideShell {
	cmd := exec.Command("bash", "--noprofile", "--norc")
	cmd.Dir = dir
	cmd.Env = os.Environ()
	for k, v := range env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	stdin, err := cmd.StdinPipe()
	require.NoError(t, err)
	r, w, err := os.Pipe()
	require.NoError(t, err)
	cmd.Stdout, cmd.Stderr = w, w
	require.NoError(t, cmd.Start())
	w.Close()
	logf, err := os.Create(logPath)
	require.NoError(t, err)
	s := &guideShell{stdin: stdin, lines: make(chan string, 1024), done: make(chan struct{}), dir: t.TempDir()}
	go func() {
		defer close(s.done)
		sc := bufio.NewScanner(r)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			fmt.Fprintln(logf, sc.Text())
			s.lines <- sc.Text()
		}
		logf.Close()
	}()
	t.Cleanup(func() {
		stdin.Close()
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	// Any failing command ends the shell, and the test with its output.
	_, err = io.WriteString(stdin, "set -euo pipefail\n")
	require.NoError(t, err)
	return s
}

// run runs one block (from a file, with no stdin: a command that reads it
// must be given its input in the block) and returns what it printed.
func (s *guideShell) run(t *testing.T, b guideBlock, timeout time.Duration) string {
	t.Helper()
	s.n++
	file := filepath.Join(s.dir, "block-"+strconv.Itoa(s.n)+".sh")
	require.NoError(t, os.WriteFile(file, []byte(b.text), 0o644))
	marker := fmt.Sprintf("__guide_block_%d_done__", s.n)
	_, err := fmt.Fprintf(s.stdin, "source %q </dev/null\necho %s\n", file, marker)
	require.NoError(t, err, "the shell has ended")
	var out strings.Builder
	deadline := time.After(timeout)
	for {
		select {
		case line := <-s.lines:
			if line == marker {
				t.Logf("docs/install.md, %s: block %d ran:\n%s", b.section, s.n, out.String())
				return out.String()
			}
			out.WriteString(line + "\n")
		case <-s.done:
			for len(s.lines) > 0 {
				out.WriteString(<-s.lines + "\n")
			}
			t.Fatalf("docs/install.md, %s: block %d failed:\n%s\n--- the block:\n%s", b.section, s.n, out.String(), b.text)
		case <-deadline:
			t.Fatalf("docs/install.md, %s: block %d still running after %s:\n%s\n--- the block:\n%s", b.section, s.n, timeout, out.String(), b.text)
		}
	}
}

// set sets a shell variable, as a user would between two blocks.
func (s *guideShell) set(t *testing.T, name, value string) {
	_, err := fmt.Fprintf(s.stdin, "%s=%q\n", name, value)
	require.NoError(t, err)
}

// releaseImages are the archives `make images` wrote for version.
func releaseImages(t *testing.T, dir, version string) []string {
	var out []string
	for _, c := range []string{"rb-broker", "rb-agent", "rb-scheduler"} {
		matches, err := filepath.Glob(filepath.Join(dir, c+"*"+version+"*.tar"))
		require.NoError(t, err)
		require.Len(t, matches, 1, "%s: the archive of %s %s", dir, c, version)
		out = append(out, matches[0])
	}
	return out
}

// writeContexts writes a kubeconfig with a context per cluster, named after
// it, as the guide's user has.
func writeContexts(t *testing.T, path string, bed *testbed.Bed) {
	cfg := clientcmdapi.NewConfig()
	for _, c := range bed.Clusters {
		cfg.Clusters[c.Name] = &clientcmdapi.Cluster{Server: c.Config.Host, CertificateAuthorityData: c.Config.CAData}
		cfg.AuthInfos[c.Name] = &clientcmdapi.AuthInfo{ClientCertificateData: c.Config.CertData, ClientKeyData: c.Config.KeyData}
		cfg.Contexts[c.Name] = &clientcmdapi.Context{Cluster: c.Name, AuthInfo: c.Name}
	}
	cfg.CurrentContext = bed.Clusters[0].Name
	require.NoError(t, clientcmd.WriteToFile(*cfg, path))
}

// redisVolume is the PersistentVolume Redis's claim binds to: this cluster
// has no provisioner. Redis runs as 999.
func redisVolume(t *testing.T, c *testbed.Cluster, dir string) {
	require.NoError(t, os.MkdirAll(dir, 0o700))
	require.NoError(t, os.Chown(dir, 999, 999))
	pv := &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: "rb-redis-data"},
		Spec: corev1.PersistentVolumeSpec{
			Capacity:                      corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")},
			AccessModes:                   []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			PersistentVolumeReclaimPolicy: corev1.PersistentVolumeReclaimRetain,
			PersistentVolumeSource:        corev1.PersistentVolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: dir}},
		},
	}
	require.NoError(t, c.Client.Create(context.Background(), pv))
}

// tenantPods are the pods in rome's tenant namespace of a provider.
func tenantPods(t *testing.T, c *testbed.Cluster) []corev1.Pod {
	var pods corev1.PodList
	require.NoError(t, c.Client.List(context.Background(), &pods, client.InNamespace("rb-rome")))
	var out []corev1.Pod
	for _, p := range pods.Items {
		if p.DeletionTimestamp == nil {
			out = append(out, p)
		}
	}
	return out
}

// checkDeployedPods: the components' pods (by app.kubernetes.io/name) are
// there in the manifests' numbers, Ready (readiness probes pass) and never
// restarted (liveness probes pass, no OOM under the limits).
func checkDeployedPods(t *testing.T, c *testbed.Cluster, want map[string]int) {
	var pods corev1.PodList
	require.NoError(t, c.Client.List(context.Background(), &pods, client.InNamespace("resource-broker")))
	got := map[string]int{}
	for _, p := range pods.Items {
		name := p.Labels["app.kubernetes.io/name"]
		got[name]++
		assert.True(t, podReady(&p), "%s: pod %s Ready: %+v", c.Name, p.Name, p.Status.Conditions)
		for _, st := range p.Status.ContainerStatuses {
			assert.Zero(t, st.RestartCount, "%s: pod %s container %s restarted: %+v", c.Name, p.Name, st.Name, st.LastTerminationState)
		}
	}
	assert.Equal(t, want, got, "%s: the components' pods", c.Name)
}

// uidLine is /proc/<pid>/status's real and effective uid.
var uidLine = regexp.MustCompile(`(?m)^Uid:\s+(\d+)\s+(\d+)`)

// checkProcessesNonRoot: the components' processes on this host (their
// containers; the bed runs none of them itself here) run as the users the
// manifests' security contexts name.
func checkProcessesNonRoot(t *testing.T, want map[string]int) {
	procs, err := filepath.Glob("/proc/[0-9]*/comm")
	require.NoError(t, err)
	seen := map[string]int{}
	for _, f := range procs {
		comm, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		name := strings.TrimSpace(string(comm))
		uid, ok := want[name]
		if !ok {
			continue
		}
		// Only containers of the bed's nodes (other packages' tests run
		// these binaries as host processes at the same time).
		if cg, err := os.ReadFile(filepath.Join(filepath.Dir(f), "cgroup")); err != nil || !strings.Contains(string(cg), "kubepods") {
			continue
		}
		status, err := os.ReadFile(filepath.Join(filepath.Dir(f), "status"))
		if err != nil {
			continue
		}
		m := uidLine.FindSubmatch(status)
		require.NotNil(t, m)
		assert.Equal(t, strconv.Itoa(uid), string(m[1]), "%s (%s) runs as uid %s", name, f, m[1])
		assert.Equal(t, strconv.Itoa(uid), string(m[2]), "%s (%s) runs as effective uid %s", name, f, m[2])
		seen[name]++
	}
	for name := range want {
		assert.NotZero(t, seen[name], "no %s process found", name)
	}
}
