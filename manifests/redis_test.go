package manifests_test

import (
	"context"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"

	"github.com/fluidos-project/resource-broker/internal/redistest"
	redismanifest "github.com/fluidos-project/resource-broker/manifests/redis"
)

// redisSecret is the Secret with the broker's Redis password, which the
// operator creates (manifests/redis/README.md).
const redisSecret = "rb-redis-broker"

// TestRedisFromTheSecret runs, outside Kubernetes, what the rb-redis pod
// runs: the init container's script on the ConfigMap's users.acl and a
// password file as the Secret volume holds it, then redis-server with the
// ConfigMap's redis.conf and the ACL file the script wrote (only the port,
// address, data directory and file paths changed), then the pod's probes.
// The broker's user logs in from a non-loopback address (protected mode on),
// nobody else does, and the script writes exactly the ACL every test Redis
// loads (redismanifest.UsersACL).
func TestRedisFromTheSecret(t *testing.T) {
	objs := build(t, "redis")
	sts := as[appsv1.StatefulSet](t, find(t, objs, "StatefulSet", "rb-redis"))
	pod := sts.Spec.Template.Spec
	if len(pod.InitContainers) != 1 || len(pod.Containers) != 1 {
		t.Fatalf("rb-redis: want one init container (the ACL) and one container, got %d and %d", len(pod.InitContainers), len(pod.Containers))
	}
	initCtr, ctr := pod.InitContainers[0], pod.Containers[0]
	var cm *corev1.ConfigMap
	for _, v := range pod.Volumes {
		if v.ConfigMap != nil {
			c := as[corev1.ConfigMap](t, find(t, objs, "ConfigMap", v.ConfigMap.Name))
			cm = &c
		}
		if v.Secret != nil && (v.Secret.SecretName != redisSecret || len(v.Secret.Items) != 1 || v.Secret.Items[0].Key != "password") {
			t.Errorf("rb-redis: volume %s: want Secret %s's key password, got %+v", v.Name, redisSecret, v.Secret)
		}
		if v.EmptyDir != nil && v.Name == "acl" && v.EmptyDir.Medium != corev1.StorageMediumMemory {
			t.Errorf("rb-redis: the ACL file's volume must be in memory, got %+v", v.EmptyDir)
		}
	}
	if cm == nil {
		t.Fatal("rb-redis: no ConfigMap volume")
	}
	conf := cm.Data["redis.conf"]
	for _, line := range []string{"protected-mode yes", "appendonly yes", "appendfsync everysec", "aclfile " + env(t, initCtr, "ACL_FILE")} {
		if !slices.Contains(strings.Split(conf, "\n"), line) {
			t.Errorf("redis.conf lacks %q", line)
		}
	}
	if strings.Contains(conf, "requirepass") || strings.Contains(cm.Data["users.acl"], ">") {
		t.Error("the ConfigMap holds a password")
	}

	// The init container's script, with its files moved to a temporary directory.
	dir := t.TempDir()
	password := "from-the-secret-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	files := map[string]string{"PASSWORD_FILE": filepath.Join(dir, "password"), "ACL_TEMPLATE": filepath.Join(dir, "users.acl.template"),
		"ACL_FILE": filepath.Join(dir, "users.acl")}
	must(t, os.WriteFile(files["PASSWORD_FILE"], []byte(password+"\n"), 0o600)) // as `kubectl create secret --from-file` of an echo
	must(t, os.WriteFile(files["ACL_TEMPLATE"], []byte(cm.Data["users.acl"]), 0o644))
	runIn := func(c corev1.Container, command []string, files map[string]string) ([]byte, error) {
		cmd := exec.Command(command[0], command[1:]...)
		cmd.Env = []string{"PATH=" + os.Getenv("PATH")}
		for _, e := range c.Env {
			v := e.Value
			if f, ok := files[e.Name]; ok {
				v = f
			}
			cmd.Env = append(cmd.Env, e.Name+"="+v)
		}
		return cmd.CombinedOutput()
	}
	if out, err := runIn(initCtr, initCtr.Command, files); err != nil {
		t.Fatalf("init container %s: %v\n%s", initCtr.Name, err, out)
	}
	acl, err := os.ReadFile(files["ACL_FILE"])
	must(t, err)
	if string(acl) != redismanifest.UsersACL(password) {
		t.Errorf("the init container wrote\n%s\nthe tests' Redis loads\n%s", acl, redismanifest.UsersACL(password))
	}
	if strings.Contains(string(acl), password) {
		t.Error("the ACL file holds the password itself")
	}
	if st, err := os.Stat(files["ACL_FILE"]); err != nil || st.Mode().Perm() != 0o600 {
		t.Errorf("ACL file mode: %v %v, want 0600", st.Mode(), err)
	}
	empty := filepath.Join(dir, "empty")
	must(t, os.WriteFile(empty, []byte("\n"), 0o600))
	if out, err := runIn(initCtr, initCtr.Command, map[string]string{"PASSWORD_FILE": empty, "ACL_TEMPLATE": files["ACL_TEMPLATE"],
		"ACL_FILE": filepath.Join(dir, "refused.acl")}); err == nil || !strings.Contains(string(out), "is empty") {
		t.Errorf("an empty password: want the init container to fail and say so, got %v: %s", err, out)
	}

	// redis-server with the ConfigMap's redis.conf, on 127.0.0.2: Redis
	// counts only 127.0.0.1 and ::1 as local, so protected mode applies.
	// (redis-server changes to "dir" as it reads it: replace /data in the file.)
	confPath := filepath.Join(dir, "redis.conf")
	if !strings.Contains(conf, "\ndir /data\n") {
		t.Fatal("redis.conf: no dir /data")
	}
	must(t, os.WriteFile(confPath, []byte(strings.Replace(conf, "\ndir /data\n", "\ndir "+dir+"\n", 1)), 0o644))
	port := freePort(t)
	addr := net.JoinHostPort("127.0.0.2", strconv.Itoa(port))
	startRedisServer(t, confPath, "--port", strconv.Itoa(port), "--bind", "127.0.0.2", "--aclfile", files["ACL_FILE"])
	remote := func(o *redis.Options) *redis.Client {
		o.Addr, o.MaxRetries = addr, -1
		o.Dialer = func(ctx context.Context, network, addr string) (net.Conn, error) {
			d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP("127.0.0.2")}}
			return d.DialContext(ctx, network, addr)
		}
		c := redis.NewClient(o)
		t.Cleanup(func() { _ = c.Close() })
		return c
	}
	ctx := context.Background()
	broker := remote(&redis.Options{Username: redismanifest.BrokerUser, Password: password, DisableIdentity: true})
	if err := broker.Set(ctx, "rb:{b}:k", "v", 0).Err(); err != nil {
		t.Errorf("the broker's user from a non-loopback address: %v", err)
	}
	if err := remote(&redis.Options{}).Get(ctx, "rb:{b}:k").Err(); err == nil || !strings.Contains(err.Error(), "NOAUTH") {
		t.Errorf("no login: want NOAUTH, got %v", err)
	}
	if err := remote(&redis.Options{Username: redismanifest.BrokerUser, Password: password + "x"}).Ping(ctx).Err(); err == nil ||
		!strings.Contains(err.Error(), "WRONGPASS") {
		t.Errorf("a wrong password: want WRONGPASS, got %v", err)
	}
	if err := broker.ConfigGet(ctx, "appendonly").Err(); err == nil || !strings.HasPrefix(err.Error(), "NOPERM") {
		t.Errorf("CONFIG GET as the broker: want NOPERM, got %v", err)
	}

	// The probes, against that server.
	for name, p := range map[string]*corev1.Probe{"readiness": ctr.ReadinessProbe, "liveness": ctr.LivenessProbe} {
		if p == nil || p.Exec == nil {
			t.Errorf("%s probe: not an exec probe", name)
			continue
		}
		command := slices.Clone(p.Exec.Command)
		last := len(command) - 1
		if !strings.Contains(command[last], "-p 6379") {
			t.Errorf("%s probe %q: does not name port 6379", name, command)
			continue
		}
		command[last] = strings.Replace(command[last], "-p 6379", "-h 127.0.0.2 -p "+strconv.Itoa(port), 1)
		if out, err := runIn(ctr, command, map[string]string{"PASSWORD_FILE": files["PASSWORD_FILE"]}); err != nil {
			t.Errorf("%s probe fails on a healthy Redis: %v\n%s", name, err, out)
		}
		if _, err := runIn(ctr, command, map[string]string{"PASSWORD_FILE": empty}); err == nil {
			t.Errorf("%s probe passes without the password", name)
		}
	}
}

// TestRedisSecretFitsTogether: the broker connects as the user of users.acl
// with the password of the Secret that rb-redis hashes.
func TestRedisSecretFitsTogether(t *testing.T) {
	dep := as[appsv1.Deployment](t, find(t, build(t, "broker"), "Deployment", "rb-broker"))
	ctr := dep.Spec.Template.Spec.Containers[0]
	if !slices.Contains(ctr.Args, "--redis-username="+redismanifest.BrokerUser) {
		t.Errorf("rb-broker args %q: no --redis-username=%s", ctr.Args, redismanifest.BrokerUser)
	}
	var file string
	for _, a := range ctr.Args {
		if f, ok := strings.CutPrefix(a, "--redis-password-file="); ok {
			file = f
		}
		if strings.Contains(a, "redis://") && strings.Contains(a, "@") {
			t.Errorf("rb-broker arg %q: credentials in the Redis URL", a)
		}
	}
	var mounted bool
	for _, m := range ctr.VolumeMounts {
		for _, v := range dep.Spec.Template.Spec.Volumes {
			if v.Name != m.Name || v.Secret == nil || v.Secret.SecretName != redisSecret {
				continue
			}
			for _, it := range v.Secret.Items {
				mounted = mounted || (it.Key == "password" && filepath.Join(m.MountPath, it.Path) == file)
			}
		}
	}
	if !mounted {
		t.Errorf("rb-broker: --redis-password-file=%s is not Secret %s's key password", file, redisSecret)
	}
}

func env(t *testing.T, c corev1.Container, name string) string {
	t.Helper()
	for _, e := range c.Env {
		if e.Name == name {
			return e.Value
		}
	}
	t.Fatalf("container %s: no env %s", c.Name, name)
	return ""
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func freePort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.2:0")
	must(t, err)
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// startRedisServer runs redis-server conf args... until the test ends and
// waits until it accepts connections.
func startRedisServer(t *testing.T, conf string, args ...string) {
	t.Helper()
	bin, err := redistest.Binary()
	must(t, err)
	log := filepath.Join(filepath.Dir(conf), "redis.log")
	cmd := exec.Command(bin, append([]string{conf, "--logfile", log}, args...)...)
	must(t, cmd.Start())
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	t.Cleanup(func() { _ = cmd.Process.Kill(); <-exited })
	addr := net.JoinHostPort(args[slices.Index(args, "--bind")+1], args[slices.Index(args, "--port")+1])
	for deadline := time.Now().Add(10 * time.Second); ; {
		if c, err := net.Dial("tcp", addr); err == nil {
			c.Close()
			return
		}
		select {
		case <-exited:
			data, _ := os.ReadFile(log)
			t.Fatalf("redis-server exited:\n%s", data)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatal("redis-server does not accept connections")
		}
		time.Sleep(20 * time.Millisecond)
	}
}
