// Command testapp is the test bed's application image (rb.test/testapp:v1): a
// small HTTP server that says where it runs, burns CPU on request and exits
// with a chosen code, so tests can see placement, load and restarts.
//
//	GET  /                          {"cluster","node","pod","namespace","hostname","hostIP","podIP"}
//	GET  /healthz                   200 "ok"
//	GET  /env                       the process's environment, as a JSON object
//	GET  /readyz                    200 "ready", or 503 once made unready (a readiness probe)
//	POST /ready?ready=false         200; /readyz answers 503 from now on (true: 200 again)
//	POST /burn?cpu=1.5&seconds=30   202; burns 1.5 cores for 30 s
//	POST /exit?code=3               200; then the process exits with code 3
//
// The image has no shell, so `testapp get URL` is its client, for `kubectl
// exec` and pod-to-pod checks: it prints the body of a GET and exits 0, or
// prints the error and exits 1; `testapp post URL` does the same with an
// empty POST. `testapp api PATH` GETs PATH of the API server with the pod's
// service account, as client-go's in-cluster config would. `testapp lookup
// NAME` prints the IP addresses NAME resolves to in the pod (its
// /etc/resolv.conf: the cluster's DNS, the pod's search path) as a JSON
// array, sorted; 1 if it does not resolve. Two more commands give a container a fate
// (crash loops, completions, the OOM killer) without a server:
//
//	testapp exit CODE   exits with CODE at once
//	testapp sleep SECS  works (sleeps) SECS seconds, then exits 0 (a Job's task)
//	testapp alloc MIB   allocates MIB MiB, touching every page, then sleeps until SIGTERM
//
// The identity comes from the environment (CLUSTER_NAME, NODE_NAME, POD_NAME,
// POD_NAMESPACE, HOST_IP, POD_IP), which pods set with the downward API. Standard library
// only: it is built with CGO_ENABLED=0 into a one-file image.
package main

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"math"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"
)

const (
	maxBurnCores   = 8
	maxBurnSeconds = 3600
	// burnPeriod is the duty cycle of a burning goroutine: busy for a share
	// of it, asleep for the rest, so fractional cores come out right.
	burnPeriod = 100 * time.Millisecond
	// exitDelay lets the answer to /exit reach the client before we go.
	exitDelay       = 100 * time.Millisecond
	shutdownTimeout = 5 * time.Second
)

func main() {
	if len(os.Args) == 3 {
		switch os.Args[1] {
		case "get", "post":
			os.Exit(request(os.Args[1], os.Args[2], os.Stdout, os.Stderr))
		case "api":
			os.Exit(apiGet(os.Args[2], os.Getenv, serviceAccountDir, os.Stdout, os.Stderr))
		case "lookup":
			os.Exit(lookup(os.Args[2], net.DefaultResolver, os.Stdout, os.Stderr))
		case "exit":
			os.Exit(exitWith(os.Args[2], os.Stderr))
		case "sleep":
			os.Exit(sleepFor(os.Args[2], os.Stderr))
		case "alloc":
			os.Exit(alloc(os.Args[2], os.Stdout, os.Stderr, func() {
				ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
				defer stop()
				<-ctx.Done()
			}))
		}
	}
	listen := flag.String("listen", ":8080", "address to listen on (PORT, when set and --listen is not, gives :$PORT)")
	flag.Parse()
	if port := os.Getenv("PORT"); port != "" && !flagSet("listen") {
		*listen = ":" + port
	}

	// Logs go to stdout, so that `kubectl logs` shows them.
	log.SetOutput(os.Stdout)
	log.SetFlags(log.LstdFlags | log.Lmicroseconds | log.LUTC)

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if err := run(ctx, *listen); err != nil {
		log.Printf("testapp: %v", err)
		os.Exit(1)
	}
}

// request prints the body of a GET or an empty POST (verb "get" or
// "post") of url to out; 0 on a 2xx answer, else 1.
func request(verb, url string, out, errOut io.Writer) int {
	cl := &http.Client{Timeout: 10 * time.Second}
	var resp *http.Response
	var err error
	if verb == "post" {
		resp, err = cl.Post(url, "text/plain", nil)
	} else {
		resp, err = cl.Get(url)
	}
	if err != nil {
		fmt.Fprintf(errOut, "testapp %s: %v\n", verb, err)
		return 1
	}
	defer resp.Body.Close()
	if _, err := io.Copy(out, resp.Body); err != nil {
		fmt.Fprintf(errOut, "testapp %s: %v\n", verb, err)
		return 1
	}
	if resp.StatusCode/100 != 2 {
		fmt.Fprintf(errOut, "testapp %s: %s\n", verb, resp.Status)
		return 1
	}
	return 0
}

// lookup prints the addresses name resolves to as a sorted JSON array; 0 if
// it resolves, else 1.
func lookup(name string, r *net.Resolver, out, errOut io.Writer) int {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	addrs, err := r.LookupHost(ctx, name)
	if err != nil {
		fmt.Fprintf(errOut, "testapp lookup: %v\n", err)
		return 1
	}
	sort.Strings(addrs)
	b, _ := json.Marshal(addrs)
	fmt.Fprintln(out, string(b))
	return 0
}

// serviceAccountDir is where a pod's service account token, CA and
// namespace are mounted.
const serviceAccountDir = "/var/run/secrets/kubernetes.io/serviceaccount"

// apiGet GETs path of the cluster's API server as client-go's in-cluster
// config does: the address from KUBERNETES_SERVICE_HOST and _PORT, the
// server verified with saDir/ca.crt, the token of saDir/token read afresh
// for the request (the kubelet rotates it). It prints the body; 0 on a 2xx
// answer, else 1 (with the status, e.g. 403 Forbidden). It names the
// token's SHA-256 on errOut.
func apiGet(path string, env func(string) string, saDir string, out, errOut io.Writer) int {
	fail := func(err error) int {
		fmt.Fprintf(errOut, "testapp api: %v\n", err)
		return 1
	}
	host, port := env("KUBERNETES_SERVICE_HOST"), env("KUBERNETES_SERVICE_PORT")
	if host == "" || port == "" {
		return fail(errors.New("KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT must be set (not in a pod?)"))
	}
	token, err := os.ReadFile(filepath.Join(saDir, "token"))
	if err != nil {
		return fail(err)
	}
	caPEM, err := os.ReadFile(filepath.Join(saDir, "ca.crt"))
	if err != nil {
		return fail(err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		return fail(errors.New("ca.crt holds no certificate"))
	}
	cl := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}}}
	req, err := http.NewRequest(http.MethodGet, "https://"+net.JoinHostPort(host, port)+path, nil)
	if err != nil {
		return fail(err)
	}
	req.Header.Set("Authorization", "Bearer "+strings.TrimSpace(string(token)))
	// Which token it was, for a caller that watches them being renewed.
	fmt.Fprintf(errOut, "testapp api: token sha256:%x\n", sha256.Sum256(token))
	resp, err := cl.Do(req)
	if err != nil {
		return fail(err)
	}
	defer resp.Body.Close()
	if _, err := io.Copy(out, resp.Body); err != nil {
		return fail(err)
	}
	if resp.StatusCode/100 != 2 {
		return fail(errors.New(resp.Status))
	}
	return 0
}

// exitWith is the exit code arg names (2 if it names none).
func exitWith(arg string, errOut io.Writer) int {
	code, err := strconv.Atoi(arg)
	if err != nil || code < 0 || code > 255 {
		fmt.Fprintf(errOut, "testapp exit: code must be an exit code in [0, 255], got %q\n", arg)
		return 2
	}
	fmt.Fprintf(errOut, "testapp exit: exiting with code %d\n", code)
	return code
}

// sleepFor sleeps arg seconds (at most maxBurnSeconds), then returns 0; a
// SIGTERM ends it early with 143, as a shell's sleep killed by it.
func sleepFor(arg string, errOut io.Writer) int {
	secs, err := strconv.ParseFloat(arg, 64)
	if err != nil || secs < 0 || secs > maxBurnSeconds {
		fmt.Fprintf(errOut, "testapp sleep: want seconds in [0, %d], got %q\n", maxBurnSeconds, arg)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	select {
	case <-time.After(time.Duration(secs * float64(time.Second))):
		fmt.Fprintf(errOut, "testapp sleep: done after %ss\n", arg)
		return 0
	case <-ctx.Done():
		return 143
	}
}

// maxAllocMiB bounds testapp alloc.
const maxAllocMiB = 64 << 10

// alloc allocates arg MiB, writing to every page so that the memory is
// really used (and charged to the container's cgroup), reports it on out,
// then holds it until hold returns. 0 once done, 2 on a bad argument.
func alloc(arg string, out, errOut io.Writer, hold func()) int {
	mib, err := strconv.Atoi(arg)
	if err != nil || mib < 1 || mib > maxAllocMiB {
		fmt.Fprintf(errOut, "testapp alloc: MiB must be a whole number in [1, %d], got %q\n", maxAllocMiB, arg)
		return 2
	}
	const page = 4096
	held := make([][]byte, 0, mib)
	for i := range mib {
		b := make([]byte, 1<<20)
		for j := 0; j < len(b); j += page {
			b[j] = 1
		}
		held = append(held, b)
		if (i+1)%16 == 0 || i+1 == mib {
			fmt.Fprintf(out, "testapp alloc: %d MiB allocated\n", i+1)
		}
	}
	hold()
	runtime.KeepAlive(held)
	return 0
}

// run serves until ctx ends (SIGTERM), then shuts down within shutdownTimeout.
func run(ctx context.Context, addr string) error {
	srv := &http.Server{
		Addr:              addr,
		Handler:           logRequests(newHandler(os.Getenv, os.Exit)),
		ReadHeaderTimeout: 10 * time.Second,
	}
	errc := make(chan error, 1)
	go func() { errc <- srv.ListenAndServe() }()
	log.Printf("testapp listening on %s cluster=%s node=%s", addr, os.Getenv("CLUSTER_NAME"), os.Getenv("NODE_NAME"))

	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	log.Printf("testapp shutting down")
	sctx, cancel := context.WithTimeout(context.Background(), shutdownTimeout)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil && !errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	return nil
}

// identity is the answer to GET /.
type identity struct {
	Cluster   string `json:"cluster"`
	Node      string `json:"node"`
	Pod       string `json:"pod"`
	Namespace string `json:"namespace"`
	Hostname  string `json:"hostname"`
	// HostIP and PodIP come from the downward API (status.hostIP,
	// status.podIP): the node the container really runs on, which a
	// bridged pod's spec.nodeName (its virtual node) does not tell.
	HostIP string `json:"hostIP"`
	PodIP  string `json:"podIP"`
}

// newHandler serves the testapp's routes. env reads the environment and exit
// ends the process; tests pass fakes.
func newHandler(env func(string) string, exit func(int)) http.Handler {
	mux := http.NewServeMux()

	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, _ *http.Request) {
		hostname, _ := os.Hostname()
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(identity{
			Cluster:   env("CLUSTER_NAME"),
			Node:      env("NODE_NAME"),
			Pod:       env("POD_NAME"),
			Namespace: env("POD_NAMESPACE"),
			HostIP:    env("HOST_IP"),
			PodIP:     env("POD_IP"),
			Hostname:  hostname,
		})
	})

	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		_, _ = io.WriteString(w, "ok")
	})

	mux.HandleFunc("GET /env", func(w http.ResponseWriter, _ *http.Request) {
		env := map[string]string{}
		for _, kv := range os.Environ() {
			if k, v, ok := strings.Cut(kv, "="); ok {
				env[k] = v
			}
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(env)
	})

	var unready atomic.Bool
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		if unready.Load() {
			http.Error(w, "not ready", http.StatusServiceUnavailable)
			return
		}
		_, _ = io.WriteString(w, "ready")
	})

	mux.HandleFunc("POST /ready", func(w http.ResponseWriter, r *http.Request) {
		ready, err := strconv.ParseBool(r.URL.Query().Get("ready"))
		if err != nil {
			http.Error(w, fmt.Sprintf("ready must be true or false, got %q", r.URL.Query().Get("ready")), http.StatusBadRequest)
			return
		}
		unready.Store(!ready)
		log.Printf("ready=%t", ready)
		fmt.Fprintf(w, "ready=%t\n", ready)
	})

	mux.HandleFunc("POST /burn", func(w http.ResponseWriter, r *http.Request) {
		q := r.URL.Query()
		cores, err := strconv.ParseFloat(q.Get("cpu"), 64)
		if err != nil || math.IsNaN(cores) || cores <= 0 || cores > maxBurnCores {
			http.Error(w, fmt.Sprintf("cpu must be a number of cores in (0, %d], got %q", maxBurnCores, q.Get("cpu")), http.StatusBadRequest)
			return
		}
		seconds, err := strconv.Atoi(q.Get("seconds"))
		if err != nil || seconds < 1 || seconds > maxBurnSeconds {
			http.Error(w, fmt.Sprintf("seconds must be a whole number in [1, %d], got %q", maxBurnSeconds, q.Get("seconds")), http.StatusBadRequest)
			return
		}
		burn(cores, time.Duration(seconds)*time.Second)
		w.WriteHeader(http.StatusAccepted)
		fmt.Fprintf(w, "burning %g cores for %d s\n", cores, seconds)
	})

	mux.HandleFunc("POST /exit", func(w http.ResponseWriter, r *http.Request) {
		code, err := strconv.Atoi(r.URL.Query().Get("code"))
		if err != nil || code < 0 || code > 255 {
			http.Error(w, fmt.Sprintf("code must be an exit code in [0, 255], got %q", r.URL.Query().Get("code")), http.StatusBadRequest)
			return
		}
		w.Header().Set("Connection", "close")
		fmt.Fprintf(w, "exiting with code %d\n", code)
		if f, ok := w.(http.Flusher); ok {
			f.Flush()
		}
		log.Printf("exit %d requested", code)
		go func() {
			time.Sleep(exitDelay)
			exit(code)
		}()
	})

	return mux
}

// burn keeps cores CPUs busy for d in the background: ceil(cores) goroutines,
// each busy for its share of every burnPeriod.
func burn(cores float64, d time.Duration) {
	n := int(math.Ceil(cores))
	busy := time.Duration(float64(burnPeriod) * cores / float64(n))
	deadline := time.Now().Add(d)
	for range n {
		go func() {
			for time.Now().Before(deadline) {
				start := time.Now()
				for time.Since(start) < busy {
					// Spin.
				}
				time.Sleep(burnPeriod - busy)
			}
		}()
	}
	log.Printf("burning %g cores for %s", cores, d)
}

// logRequests logs one line per request, with its status and duration.
func logRequests(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		sw := &statusWriter{ResponseWriter: w, status: http.StatusOK}
		h.ServeHTTP(sw, r)
		log.Printf("%s %s %d %s from %s", r.Method, r.URL.RequestURI(), sw.status, time.Since(start).Round(time.Microsecond), r.RemoteAddr)
	})
}

// statusWriter remembers the status code for the log line.
type statusWriter struct {
	http.ResponseWriter
	status int
}

func (w *statusWriter) WriteHeader(code int) {
	w.status = code
	w.ResponseWriter.WriteHeader(code)
}

// Unwrap lets http.ResponseController (and Flush) reach the real writer.
func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

func (w *statusWriter) Flush() {
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

func flagSet(name string) bool {
	set := false
	flag.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}
