package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/fluidos-project/resource-broker/internal/redistest"
	"github.com/fluidos-project/resource-broker/internal/testbed"
)

var began = time.Now()

func say(format string, args ...any) {
	fmt.Printf("%s  %s\n", bold(fmt.Sprintf("[%6.1fs]", time.Since(began).Seconds())), fmt.Sprintf(format, args...))
}

var tty = isTerminal(os.Stdout)

func bold(s string) string {
	if !tty {
		return s
	}
	return "\033[1m" + s + "\033[0m"
}

// isTerminal tells whether f is a terminal: a character device other than
// /dev/null (enough for the demo's wording and colours).
func isTerminal(f *os.File) bool {
	st, err := f.Stat()
	if err != nil || st.Mode()&os.ModeCharDevice == 0 {
		return false
	}
	null, err := os.Stat(os.DevNull)
	return err != nil || !os.SameFile(st, null)
}

// progress reports the parts of the bed as they come up (the bed starts
// them in parallel and says nothing until it is done).
func progress(dir string, embedded bool, done <-chan struct{}) {
	type milestone struct{ path, what string }
	redis := "redis-server started"
	if embedded {
		redis = "embedded Redis (miniredis) started"
	}
	ms := []milestone{
		{filepath.Join(dir, "logs", "redis.log"), redis},
		{filepath.Join(dir, "logs", "rb-broker-0.log"), "rb-broker replicas starting"},
	}
	for _, c := range []string{"rome", "paris", "berlin"} {
		ms = append(ms, milestone{filepath.Join(dir, "clusters", c, "kubeconfig"), c + " control plane up"})
	}
	for _, c := range []string{"rome", "paris", "berlin"} {
		ms = append(ms, milestone{filepath.Join(dir, "logs", "agent-"+c+".log"), "rb-agent and rb-scheduler of " + c + " starting"})
	}
	seen := map[string]bool{}
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-done:
			return
		case <-tick.C:
		}
		for _, m := range ms {
			if seen[m.path] {
				continue
			}
			if _, err := os.Stat(m.path); err == nil {
				seen[m.path] = true
				say("  %s", m.what)
			}
		}
	}
}

func phases(t map[string]time.Duration) string {
	var keys []string
	for k := range t {
		if k != "total" {
			keys = append(keys, k)
		}
	}
	sort.Slice(keys, func(i, j int) bool { return t[keys[i]] > t[keys[j]] })
	var parts []string
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%s %s", k, t[k].Round(10*time.Millisecond)))
	}
	if len(parts) > 6 {
		parts = append(parts[:6], "…")
	}
	return strings.Join(parts, ", ")
}

// rel shortens p to a path relative to the working directory when under it.
func rel(p string) string {
	wd, err := os.Getwd()
	if err != nil {
		return p
	}
	r, err := filepath.Rel(wd, p)
	if err != nil || strings.HasPrefix(r, "..") {
		return p
	}
	return r
}

func printCommands(bed *testbed.Bed, kubeconfigs map[string]string, real, metrics bool, dash dashboardProxy) {
	w := os.Stdout
	kubectl := rel(filepath.Join(mustRoot(), "bin", "k8s", "kubectl"))
	k := func(c string) string { return kubectl + " --kubeconfig " + rel(kubeconfigs[c]) }
	fmt.Fprintln(w)
	fmt.Fprintln(w, bold("Look around while it runs:"))
	fmt.Fprintf(w, "  dashboard: %s   # live; rb-dashboard does the same: %s --broker-url %s --cert-dir %s\n",
		dash.url, rel(filepath.Join(mustRoot(), "bin", "rb-dashboard")), bed.BrokerURL, rel(dash.certDir))
	fmt.Fprintln(w, "  kubeconfigs:", rel(filepath.Dir(kubeconfigs["rome"]))+"/{rome,paris,berlin}.kubeconfig")
	fmt.Fprintf(w, "  %s get pods -n %s -o wide\n", k("rome"), namespace)
	fmt.Fprintf(w, "  %s get nodes\n", k("rome"))
	fmt.Fprintf(w, "  %s get reservations -A\n", k("rome"))
	fmt.Fprintf(w, "  %s get pods -n rb-rome -o wide      # the copies at the provider\n", k("paris"))
	fmt.Fprintf(w, "  %s get pods -n rb-rome -o wide\n", k("berlin"))
	if real {
		var pods corev1.PodList
		if err := bed.Cluster("rome").Client.List(context.Background(), &pods, client.InNamespace(namespace)); err == nil && len(pods.Items) > 0 {
			p := pods.Items[0]
			fmt.Fprintf(w, "  %s exec -n %s %s -- /testapp get http://127.0.0.1:8080/   # runs in the container at the provider\n", k("rome"), namespace, p.Name)
			fmt.Fprintf(w, "  %s logs -n %s %s\n", k("rome"), namespace, p.Name)
			fmt.Fprintf(w, "  curl http://%s:8080/                # the pod IP rome shows is the container's at the provider\n", p.Status.PodIP)
			if metrics {
				fmt.Fprintf(w, "  %s top pod -n %s                      # the borrowed pods' real usage at the provider\n", k("rome"), namespace)
				fmt.Fprintf(w, "  %s top node                           # %s: what rome's pods use there, not the provider's total\n", k("rome"), p.Spec.NodeName)
				fmt.Fprintf(w, "  %s get --raw /api/v1/nodes/%s/proxy/stats/summary\n", k("rome"), p.Spec.NodeName)
			}
		}
	}
	switch {
	case !real:
		fmt.Fprintln(w, "  # kubectl top: no metrics-server with stand-in nodes (they run nothing to measure)")
	case !metrics:
		fmt.Fprintln(w, "  # kubectl top: metrics-server is not built (make metrics-server-bin)")
	}
	_, port, _ := strings.Cut(bed.Redis.Addr, ":")
	cli := "redis-cli -p " + port
	var cliNotes []string
	if !bed.Redis.Embedded {
		// The default user is off (manifests/redis/users.acl): log in as the
		// bed's administrator, whose password is this bed's own.
		cli = fmt.Sprintf("REDISCLI_AUTH=%s redis-cli --user %s -p %s", bed.Redis.Users.AdminPassword, redistest.AdminUser, port)
		cliNotes = append(cliNotes, "Redis runs the ACL of manifests/redis; the brokers log in as rb-broker, you as the bed's administrator")
	}
	if _, err := exec.LookPath("redis-cli"); err != nil {
		cliNotes = append(cliNotes, "redis-cli is not on PATH (Debian/Ubuntu: apt-get install -y redis-tools)")
	}
	if bed.Redis.Embedded {
		// redis-cli 7 asks for COMMAND DOCS before a prompt or a stdin
		// script, and aborts on miniredis' answer; one command per call works.
		cliNotes = append(cliNotes, "the embedded miniredis answers redis-cli one command per call, as below "+
			"(an interactive redis-cli aborts on it)")
	}
	prefix := bed.Store.Key()
	var rsv string
	if ids, err := bed.RDB.Keys(context.Background(), prefix+"resv:*").Result(); err == nil && len(ids) > 0 {
		sort.Strings(ids)
		rsv = ids[0]
	}
	if rsv == "" {
		rsv = prefix + "resv:<id>"
	}
	for _, n := range cliNotes {
		fmt.Fprintf(w, "  # %s\n", n)
	}
	fmt.Fprintf(w, "  %s --scan --pattern 'rb:*'\n", cli)
	fmt.Fprintf(w, "  %s HGETALL '%scluster:paris'\n", cli, prefix)
	fmt.Fprintf(w, "  %s HGETALL '%s'\n", cli, rsv)
	fmt.Fprintf(w, "  %s XREVRANGE '%saudit' + - COUNT 3\n", cli, prefix)
	rbctl := rel(filepath.Join(mustRoot(), "bin", "rbctl"))
	rc := fmt.Sprintf("%s --broker-url %s --cert-dir %s", rbctl, bed.BrokerURL, rel(bed.Cluster("rome").CertDir))
	fmt.Fprintf(w, "  %s clusters\n", rc)
	fmt.Fprintf(w, "  %s reservations\n", rc)
	// Keys name <requester>/<id>; rome, the requester, addresses its ids bare.
	id := strings.TrimPrefix(rsv, prefix+"resv:")
	if _, bare, ok := strings.Cut(id, "/"); ok {
		id = bare
	}
	fmt.Fprintf(w, "  %s explain %s\n", rc, id)
	fmt.Fprintln(w, "  logs:", rel(bed.LogDir)+"/")
	fmt.Fprintln(w)
}
