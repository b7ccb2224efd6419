package dashboard_test

import (
	"context"
	"crypto/tls"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"

	"github.com/fluidos-project/resource-broker/broker/api"
	"github.com/fluidos-project/resource-broker/broker/dashboard"
	"github.com/fluidos-project/resource-broker/broker/policy"
	"github.com/fluidos-project/resource-broker/broker/store"
	"github.com/fluidos-project/resource-broker/internal/brokertest"
)

// The dashboard's tests run a real broker (real redis-server, mutual TLS)
// and drive Debian's headless Chromium through it. Headless Chromium cannot
// present a client certificate (it would need a system-wide policy and an
// NSS database), so the browser opens the pages through the proxy of
// rb-dashboard (dashboard.NewProxy), which presents the operator's (or, to
// be refused, a member's) certificate to the broker, as on an operator's
// machine.

const operator = "ops"

// bed is a broker with a dashboard, three clusters and a browser.
type bed struct {
	*brokertest.Broker
	Pages   string // http://127.0.0.1:port/dashboard/ through the operator's proxy
	browser context.Context
	shots   string
}

func startBed(t *testing.T) *bed { return startBedWith(t, 0) }

// startBedWith takes the stale threshold of the broker (0: its default).
func startBedWith(t *testing.T, stale time.Duration) *bed {
	t.Helper()
	p, err := policy.Parse([]byte("apiVersion: broker.fluidos.eu/v1alpha1\nkind: BrokerPolicy\n" +
		`requesters: {default: {maxReservations: 20, maxResources: {cpu: "12", memory: 48Gi}}}` + "\n"))
	require.NoError(t, err)
	b := brokertest.Start(t, brokertest.Options{Store: store.Config{Policy: p, StaleThreshold: stale}, Operators: []string{operator},
		DashboardSample: 200 * time.Millisecond})
	advertise(t, b, "rome", "16", "64Gi", "", "4", "8Gi", "0.03")
	advertise(t, b, "paris", "8", "32Gi", "", "1", "2Gi", "0.02")
	advertise(t, b, "berlin", "32", "128Gi", "4", "12", "40Gi", "0.05")
	bd := &bed{Broker: b, Pages: proxy(t, b, operator) + dashboard.Path, browser: newBrowser(t, 1280, 900), shots: screenshotDir(t)}
	return bd
}

// advertise publishes a cluster whose owner uses some of it.
func advertise(t *testing.T, b *brokertest.Broker, id, cpu, mem, gpu, usedCPU, usedMem, price string) {
	t.Helper()
	q := brokertest.Quantities(cpu, mem, gpu)
	body := api.Advertisement{
		ClusterName: id, Endpoint: "https://" + id + ".example:6443",
		Resources: api.ClusterResources{Capacity: q, Allocatable: q, Allocated: brokertest.Quantities(usedCPU, usedMem, "")},
		Prices:    &api.Prices{Currency: "EUR", CPU: brokertest.MustQ(price), Memory: brokertest.MustQ("0.004"), GPU: brokertest.MustQ("0.9")},
	}
	code, data := b.Do(id, http.MethodPut, "/api/v2/clusters/"+id+"/advertisement", body)
	require.Equal(t, http.StatusOK, code, "%s", data)
}

// reserve asks for capacity as requester and returns the decision.
func reserve(t *testing.T, b *brokertest.Broker, requester, id, cpu, mem string) api.Reservation {
	t.Helper()
	code, data := b.Do(requester, http.MethodPost, "/api/v2/reservations",
		api.ReservationRequest{ID: id, Resources: brokertest.Quantities(cpu, mem, ""), Duration: "30m"})
	require.Equal(t, http.StatusCreated, code, "%s", data)
	return brokertest.Decode[api.Reservation](t, data)
}

// proxy serves the broker's dashboard over plain HTTP on loopback,
// presenting cn's client certificate to the broker (rb-dashboard's proxy).
func proxy(t *testing.T, b *brokertest.Broker, cn string) string {
	t.Helper()
	pair, err := b.CA.IssueClient(cn)
	require.NoError(t, err)
	cert, err := pair.TLSCertificate()
	require.NoError(t, err)
	u, err := url.Parse(b.URL)
	require.NoError(t, err)
	srv := httptest.NewServer(dashboard.NewProxy(u, &tls.Config{RootCAs: b.CA.Pool(), Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}))
	t.Cleanup(srv.Close)
	return srv.URL
}

// newBrowser starts Debian's headless Chromium for t. Without it the test
// fails (never skips): CI installs it (.ci/run).
func newBrowser(t *testing.T, width, height int) context.Context {
	t.Helper()
	path := os.Getenv("RB_CHROMIUM")
	if path == "" {
		var err error
		if path, err = exec.LookPath("chromium"); err != nil {
			t.Fatalf("chromium not found (the dashboard's browser tests need it): apt-get install -y chromium, or set RB_CHROMIUM to a Chromium binary")
		}
	}
	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(path), chromedp.WindowSize(width, height),
		chromedp.UserDataDir(t.TempDir()), chromedp.Flag("no-proxy-server", true))
	if os.Geteuid() == 0 {
		opts = append(opts, chromedp.NoSandbox) // Chromium refuses to run its sandbox as root
	}
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancel := chromedp.NewContext(actx)
	t.Cleanup(func() { cancel(); cancelAlloc() })
	require.NoError(t, chromedp.Do(ctx), "start chromium %s", path) // starts the browser
	return ctx
}

// screenshotDir is where the tests write their screenshots:
// RB_DASHBOARD_SCREENSHOTS (git-ignored test-artifacts/ in CI), else a
// temporary directory.
func screenshotDir(t *testing.T) string {
	if dir := os.Getenv("RB_DASHBOARD_SCREENSHOTS"); dir != "" {
		require.NoError(t, os.MkdirAll(dir, 0o755))
		return dir
	}
	return t.TempDir()
}

// run runs browser steps within a deadline.
func (b *bed) run(t *testing.T, steps ...chromedp.Action[chromedp.Void]) {
	t.Helper()
	ctx, cancel := context.WithTimeout(b.browser, 30*time.Second)
	defer cancel()
	require.NoError(t, chromedp.Do(ctx, steps...))
}

// eval evaluates a JavaScript expression on the page.
func eval[T any](t *testing.T, b *bed, expr string) T {
	t.Helper()
	ctx, cancel := context.WithTimeout(b.browser, 10*time.Second)
	defer cancel()
	v, err := chromedp.Run(ctx, chromedp.Evaluate[T](expr))
	require.NoError(t, err, "evaluate %s", expr)
	return v
}

// open navigates to a page and waits until its live stream is connected.
func (b *bed) open(t *testing.T, path string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(b.browser, 30*time.Second)
	defer cancel()
	resp, err := chromedp.Run(ctx, chromedp.NavigateResponse(b.Pages+path))
	require.NoError(t, err)
	require.Equal(t, int64(http.StatusOK), resp.Status, "GET %s", path)
	b.run(t, chromedp.WaitVisible(chromedp.CSS("#live.on")))
}

// screenshot writes the page as dashboard-<name>.png.
func (b *bed) screenshot(t *testing.T, name string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(b.browser, 30*time.Second)
	defer cancel()
	png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	require.NoError(t, err)
	path := filepath.Join(b.shots, "dashboard-"+name+".png")
	require.NoError(t, os.WriteFile(path, png, 0o644))
	t.Logf("screenshot %s (%d bytes)", path, len(png))
}
