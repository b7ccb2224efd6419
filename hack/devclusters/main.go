// Command devclusters starts local member clusters for development: one real
// kube-apiserver + etcd per cluster (the envtest binaries of `make
// envtest-bin`), with resource-broker's CRDs, the agent's namespace and the
// rb-tenant ClusterRole installed, and Node objects standing in for kubelets.
// It writes an admin kubeconfig per cluster and runs until interrupted.
//
//	go run ./hack/devclusters --cluster rome=4,16Gi --cluster paris=32,128Gi --cluster berlin=64,256Gi,4
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"

	rbv1 "github.com/fluidos-project/resource-broker/api/v1alpha1"

	"github.com/spf13/pflag"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/fluidos-project/resource-broker/agent/provider"
	"github.com/fluidos-project/resource-broker/internal/kubelet"
	"github.com/fluidos-project/resource-broker/internal/testenv"
)

func main() {
	out := pflag.String("out", ".demo", "directory for the kubeconfigs")
	specs := pflag.StringArray("cluster", []string{"rome=4,16Gi", "paris=32,128Gi", "berlin=64,256Gi,4"},
		"a cluster as name=cpu,memory[,gpus] (one Node of that size); repeatable")
	pflag.Parse()
	if err := run(*out, *specs); err != nil {
		fmt.Fprintln(os.Stderr, "devclusters:", err)
		os.Exit(1)
	}
}

type spec struct {
	name string
	node corev1.ResourceList
}

func parse(s string) (spec, error) {
	name, size, ok := strings.Cut(s, "=")
	parts := strings.Split(size, ",")
	if !ok || name == "" || len(parts) < 2 || len(parts) > 3 {
		return spec{}, fmt.Errorf("--cluster %q: want name=cpu,memory[,gpus]", s)
	}
	list := corev1.ResourceList{corev1.ResourcePods: resource.MustParse("110"), corev1.ResourceEphemeralStorage: resource.MustParse("100Gi")}
	for i, key := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory, rbv1.ResourceGPU}[:len(parts)] {
		q, err := resource.ParseQuantity(parts[i])
		if err != nil {
			return spec{}, fmt.Errorf("--cluster %q: %s: %w", s, key, err)
		}
		list[key] = q
	}
	return spec{name: name, node: list}, nil
}

func run(out string, raw []string) error {
	var specs []spec
	for _, r := range raw {
		s, err := parse(r)
		if err != nil {
			return err
		}
		specs = append(specs, s)
	}
	if err := os.MkdirAll(out, 0o755); err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	var envs []*envtest.Environment
	defer func() {
		for _, e := range envs {
			_ = e.Stop()
		}
	}()
	for _, s := range specs {
		env, err := testenv.New(testenv.WithCRDDirectories(filepath.Join(mustRoot(), "manifests", "crds")))
		if err != nil {
			return err
		}
		if _, err := env.Start(); err != nil {
			return fmt.Errorf("%s: %w", s.name, err)
		}
		envs = append(envs, env)
		path, err := setUp(ctx, env, s, out)
		if err != nil {
			return fmt.Errorf("%s: %w", s.name, err)
		}
		fmt.Printf("%-8s %s  node %s-node-1: cpu %s, memory %s  kubeconfig %s\n", s.name, env.Config.Host, s.name,
			s.node.Cpu(), s.node.Memory(), path)
	}
	fmt.Println("ready; Ctrl-C stops the clusters")
	<-ctx.Done()
	return nil
}

func mustRoot() string {
	root, err := testenv.ModuleRoot()
	if err != nil {
		fmt.Fprintln(os.Stderr, "devclusters: run from inside the resource-broker module:", err)
		os.Exit(1)
	}
	return root
}

// setUp installs what an agent expects and one Ready node, and writes the kubeconfig.
func setUp(ctx context.Context, env *envtest.Environment, s spec, out string) (string, error) {
	user, err := env.AddUser(envtest.User{Name: "admin", Groups: []string{"system:masters"}}, nil)
	if err != nil {
		return "", err
	}
	kubeconfig, err := user.KubeConfig()
	if err != nil {
		return "", err
	}
	path := filepath.Join(out, s.name+".kubeconfig")
	if err := os.WriteFile(path, kubeconfig, 0o600); err != nil {
		return "", err
	}
	c, err := client.New(user.Config(), client.Options{})
	if err != nil {
		return "", err
	}
	for _, obj := range []client.Object{
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "resource-broker"}},
		provider.NewTenantClusterRole(),
	} {
		if err := c.Create(ctx, obj); err != nil {
			return "", err
		}
	}
	cs, err := kubernetes.NewForConfig(user.Config())
	if err != nil {
		return "", err
	}
	_, err = kubelet.ReadyNode(ctx, cs, s.name+"-node-1", s.node, nil)
	return path, err
}
