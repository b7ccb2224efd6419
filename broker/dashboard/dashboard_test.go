package dashboard_test

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/chromedp/chromedp/kb"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fluidos-project/resource-broker/broker/api"
	"github.com/fluidos-project/resource-broker/internal/brokertest"
)

// figures are a page's [data-field] texts by section and row.
const clusterFigures = `Object.fromEntries(Array.from(document.querySelectorAll('[data-cluster]')).map(c => [c.dataset.cluster, {
  stale: c.classList.contains('stale'),
  res: Object.fromEntries(Array.from(c.querySelectorAll('[data-res]')).map(r => [r.dataset.res,
    Object.fromEntries(Array.from(r.querySelectorAll('[data-field]')).map(f => [f.dataset.field, f.textContent]))]))}]))`

type clusterCard struct {
	Stale bool
	Res   map[string]map[string]string
}

func qs(q interface{ String() string }) string { return q.String() }

// TestDashboardOverviewMatchesAPI: the federation page and the usage page
// show the API's figures (GET /api/v2/clusters, GET /api/v2/usage), and the
// capacity history and audit pages render the reservations made.
func TestDashboardOverviewMatchesAPI(t *testing.T) {
	b := startBed(t)
	reserve(t, b.Broker, "rome", "web-1", "2", "4Gi")
	reserve(t, b.Broker, "rome", "web-2", "3", "6Gi")
	reserve(t, b.Broker, "paris", "batch-1", "6", "16Gi")

	b.open(t, "")
	code, data := b.Do("rome", http.MethodGet, "/api/v2/clusters", nil)
	require.Equal(t, http.StatusOK, code, "%s", data)
	clusters := brokertest.Decode[api.ClusterList](t, data).Items
	require.Len(t, clusters, 3)
	page := eval[map[string]clusterCard](t, b, clusterFigures)
	require.Len(t, page, 3)
	for _, c := range clusters {
		card, ok := page[c.ClusterID]
		require.True(t, ok, "cluster %s on the page", c.ClusterID)
		assert.Equal(t, !c.Live, card.Stale, c.ClusterID)
		r := c.Resources
		for res, want := range map[string][4]string{
			"cpu":    {qs(r.Allocated.CPU), qs(r.Reserved.CPU), qs(r.Available.CPU), qs(r.Allocatable.CPU)},
			"memory": {qs(r.Allocated.Memory), qs(r.Reserved.Memory), qs(r.Available.Memory), qs(r.Allocatable.Memory)},
		} {
			got := card.Res[res]
			assert.Equal(t, want, [4]string{got["owner"], got["reserved"], got["free"], got["total"]}, "%s %s: owner, reserved, free, allocatable", c.ClusterID, res)
		}
		if r.Allocatable.GPU != nil {
			assert.Equal(t, r.Allocatable.GPU.String(), card.Res["gpu"]["total"], c.ClusterID)
		} else {
			assert.Empty(t, card.Res["gpu"], "%s advertises no GPU: none shown", c.ClusterID)
		}
	}
	reservedSomewhere := false
	for _, c := range clusters {
		reservedSomewhere = reservedSomewhere || !c.Resources.Reserved.CPU.IsZero()
	}
	require.True(t, reservedSomewhere, "the reservations show as reserved capacity")
	b.screenshot(t, "overview")

	// oslo advertises nothing and holds no live reservation: the ended one
	// it keeps lists it.
	reserve(t, b.Broker, "oslo", "once", "1", "1Gi")
	code, data = b.Do("oslo", http.MethodDelete, "/api/v2/reservations/once", nil)
	require.Equal(t, http.StatusOK, code, "%s", data)
	b.open(t, "usage")
	code, data = b.Do("rome", http.MethodGet, "/api/v2/usage", nil)
	require.Equal(t, http.StatusOK, code, "%s", data)
	usage := brokertest.Decode[[]api.MemberUsage](t, data)
	rows := eval[map[string]map[string]string](t, b, `Object.fromEntries(Array.from(document.querySelectorAll('[data-member]')).map(m => [m.dataset.member,
	  Object.fromEntries(Array.from(m.querySelectorAll('td[data-field], [data-limit]')).map(f => [f.dataset.field || 'limit-' + f.dataset.limit, f.dataset.field ? f.textContent : f.querySelector('[data-field=limit]').textContent]))]))`)
	require.Len(t, rows, len(usage))
	require.Contains(t, rows, "oslo")
	assert.Equal(t, "1", rows["oslo"]["ended"])
	for _, u := range usage {
		row := rows[u.Cluster]
		assert.Equal(t, strconv.FormatInt(u.Reservations, 10), row["reservations"], u.Cluster)
		assert.Equal(t, qs(u.Resources.CPU), row["cpu"], u.Cluster)
		assert.Equal(t, qs(u.Resources.Memory), row["memory"], u.Cluster)
		assert.Equal(t, qs(u.Limits.MaxResources.CPU), row["limit-cpu"], u.Cluster)
		assert.Equal(t, strconv.FormatInt(*u.Limits.MaxReservations, 10), row["limit-reservations"], u.Cluster)
		assert.Equal(t, strconv.FormatInt(u.EndedReservations, 10), row["ended"], u.Cluster)
	}
	b.screenshot(t, "usage")

	// The history samples every 200ms here: a few samples show the reserved
	// CPU (11 cores) as the API counts it.
	b.open(t, "history")
	b.run(t, chromedp.Poll[chromedp.Void](`document.querySelector('[data-chart=cpu] [data-field=reserved]')?.textContent === '11'`,
		chromedp.WithPollingTimeout(10*time.Second)))
	points := eval[string](t, b, `document.querySelector('[data-chart=cpu] polyline.reserved').getAttribute('points')`)
	assert.GreaterOrEqual(t, len(strings.Fields(points)), 2, "the reserved line has samples: %q", points)
	b.screenshot(t, "history")

	b.open(t, "audit")
	n := eval[int](t, b, `document.querySelectorAll('[data-audit]').length`)
	assert.Equal(t, 4, n, "one audit entry per decision (oslo's too)")
	b.screenshot(t, "audit")
}

// TestDashboardLiveReservation: a reservation made through the API appears
// on the open list, and the federation page's reserved capacity moves,
// within a second, without a reload.
func TestDashboardLiveReservation(t *testing.T) {
	b := startBed(t)
	reserve(t, b.Broker, "rome", "before", "1", "1Gi")
	b.open(t, "reservations")
	require.Equal(t, 1, eval[int](t, b, `document.querySelectorAll('[data-reservation]').length`))
	marker := eval[int](t, b, `window.__notReloaded = 1`) // gone if the page reloaded

	start := time.Now()
	r := reserve(t, b.Broker, "paris", "live-1", "2", "2Gi")
	b.run(t, chromedp.Poll[chromedp.Void](`!!document.querySelector('[data-reservation="paris/live-1"]')`, chromedp.WithPollingTimeout(time.Second),
		chromedp.WithPollingInterval(10*time.Millisecond)))
	took := time.Since(start)
	t.Logf("the new reservation appeared on the page %s after the API call began", took)
	assert.Less(t, took, time.Second)
	assert.Equal(t, marker, eval[int](t, b, `window.__notReloaded`), "swapped in place, no reload")
	assert.Equal(t, r.Provider, eval[string](t, b, `document.querySelector('[data-reservation="paris/live-1"] td:nth-child(3)').textContent`))
	b.screenshot(t, "reservations")

	// Filters: by requester, and a page a time.
	b.open(t, "reservations?requester=paris")
	assert.Equal(t, []string{"paris/live-1"}, eval[[]string](t, b, `Array.from(document.querySelectorAll('[data-reservation]')).map(r => r.dataset.reservation)`))

	// The federation page: the provider's reserved CPU moves live too.
	b.open(t, "")
	sel := fmt.Sprintf(`[data-cluster=%q] [data-res=cpu] [data-field=reserved]`, r.Provider)
	before := eval[string](t, b, fmt.Sprintf(`document.querySelector('%s').textContent`, sel))
	start = time.Now()
	code, data := b.Do("paris", http.MethodDelete, "/api/v2/reservations/live-1", nil)
	require.Equal(t, http.StatusOK, code, "%s", data)
	b.run(t, chromedp.Poll[chromedp.Void](fmt.Sprintf(`document.querySelector('%s').textContent !== %q`, sel, before),
		chromedp.WithPollingTimeout(time.Second), chromedp.WithPollingInterval(10*time.Millisecond)))
	t.Logf("the release showed on the federation page after %s", time.Since(start))
	_, data = b.Do("rome", http.MethodGet, "/api/v2/clusters/"+r.Provider, nil)
	assert.Equal(t, qs(brokertest.Decode[api.Cluster](t, data).Resources.Reserved.CPU), eval[string](t, b, fmt.Sprintf(`document.querySelector('%s').textContent`, sel)))
}

// TestDashboardDecisionShowsScores: a reservation's page shows its
// candidates' scores and the weights, as the API and the audit hold them.
func TestDashboardDecisionShowsScores(t *testing.T) {
	b := startBed(t)
	reserve(t, b.Broker, "rome", "why", "2", "4Gi")
	_, data := b.Do("rome", http.MethodGet, "/api/v2/reservations/why", nil)
	r := brokertest.Decode[api.Reservation](t, data)
	require.GreaterOrEqual(t, len(r.Candidates), 2, "paris and berlin were candidates")

	// From the list, with the keyboard: the reservation's link, then Enter.
	b.open(t, "reservations")
	b.run(t, chromedp.Focus(chromedp.CSS(`a[href="/dashboard/reservations/rome/why"]`)), chromedp.KeyEvent(kb.Enter))
	b.run(t, chromedp.WaitVisible(chromedp.CSS("#candidates")), chromedp.WaitVisible(chromedp.CSS("#live.on")))
	type row struct{ Cluster, Score, Resource, Cost string }
	rows := eval[[]row](t, b, `Array.from(document.querySelectorAll('[data-candidate]')).map(r => ({Cluster: r.dataset.candidate,
	  Score: r.querySelector('[data-field=score]').textContent, Resource: r.querySelector('[data-field=resource-score]').textContent,
	  Cost: r.querySelector('[data-field=cost-score]').textContent}))`)
	require.Len(t, rows, len(r.Candidates))
	for i, c := range r.Candidates {
		f := func(v float64) string { return strconv.FormatFloat(v, 'f', 2, 64) }
		assert.Equal(t, row{c.Cluster, f(c.Score), f(c.ResourceScore), f(c.CostScore)}, rows[i], "candidate %d", i)
	}
	assert.Equal(t, r.Provider, rows[0].Cluster, "the winner first")
	assert.Equal(t, "0.7", eval[string](t, b, `document.querySelector('[data-field=weight-resources]').textContent`))
	assert.Equal(t, "0.3", eval[string](t, b, `document.querySelector('[data-field=weight-cost]').textContent`))
	b.screenshot(t, "decision")
}

// TestDashboardRefusesMemberCertificate: a member's certificate gets no
// page, an operator's certificate is no member on the API, and no secret
// (a grant's token, the Redis password) reaches a page.
func TestDashboardRefusesMemberCertificate(t *testing.T) {
	b := startBed(t)
	r := reserve(t, b.Broker, "rome", "granted", "1", "1Gi")
	grant := api.Grant{Endpoint: "https://" + r.Provider + ":6443", CABundle: []byte("-----BEGIN CERTIFICATE-----"), Token: "tok-SECRET-4f1c9",
		Namespace: "rb-rome", ExpiresAt: time.Now().Add(time.Hour).UTC().Truncate(time.Second)}
	code, data := b.Do(r.Provider, http.MethodPost, "/api/v2/reservations/granted/grant?requester=rome", grant)
	require.Equal(t, http.StatusOK, code, "%s", data)

	// In the browser, through a proxy holding rome's certificate.
	member := proxy(t, b.Broker, "rome")
	ctx := b.browser
	resp, err := chromedp.Run(ctx, chromedp.NavigateResponse(member+"/dashboard/"))
	require.NoError(t, err)
	assert.Equal(t, int64(http.StatusForbidden), resp.Status)
	msg := eval[string](t, b, `document.getElementById('error-message').textContent`)
	assert.Contains(t, msg, `"rome" is not an operator's`)
	assert.Zero(t, eval[int](t, b, `document.querySelectorAll('[data-cluster]').length`), "nothing of the federation shown")
	b.screenshot(t, "refused")
	// The live stream and the other pages too.
	for _, path := range []string{"/dashboard/events", "/dashboard/reservations", "/dashboard/reservations/rome/granted", "/dashboard/audit"} {
		resp, err := http.Get(member + path)
		require.NoError(t, err)
		resp.Body.Close()
		assert.Equal(t, http.StatusForbidden, resp.StatusCode, path)
		assert.Equal(t, "text/html; charset=utf-8", resp.Header.Get("Content-Type"), path)
	}
	// Without a certificate the broker ends the handshake.
	_, err = b.HTTPClient(&tls.Config{RootCAs: b.CA.Pool()}).Get(b.URL + "/dashboard/")
	assert.Error(t, err)
	// The operator's certificate reads no member's API, and changes nothing.
	code, data = b.Do(operator, http.MethodGet, "/api/v2/clusters", nil)
	assert.Equal(t, http.StatusForbidden, code, "%s", data)
	code, data = b.Do(operator, http.MethodPost, "/api/v2/reservations", api.ReservationRequest{ID: "x", Resources: brokertest.Quantities("1", "1Gi", "")})
	assert.Equal(t, http.StatusForbidden, code, "%s", data)
	resp2, err := http.Post(b.Pages+"reservations", "application/x-www-form-urlencoded", strings.NewReader("x=1"))
	require.NoError(t, err)
	resp2.Body.Close()
	assert.Equal(t, http.StatusMethodNotAllowed, resp2.StatusCode, "read-only")

	// No secret on any page the operator reads.
	for _, path := range []string{"", "reservations", "reservations/rome/granted", "audit", "usage", "history"} {
		resp, err := http.Get(b.Pages + path)
		require.NoError(t, err)
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		require.NoError(t, err)
		require.Equal(t, http.StatusOK, resp.StatusCode, path)
		assert.NotContains(t, string(body), grant.Token, path)
		assert.NotContains(t, string(body), b.Redis.Users.BrokerPassword, path)
		assert.NotContains(t, resp.Header.Get("Content-Security-Policy"), "unsafe", path)
	}
	b.open(t, "reservations/rome/granted")
	assert.Contains(t, eval[string](t, b, `document.querySelector('dl.facts').textContent`), "(granted)")

	// Its pair's access gone (expired): still Active, still granted.
	gone, err := b.Broker.RDB.Del(context.Background(), b.Broker.Store.Key("grant:", r.Provider, ":", "rome")).Result()
	require.NoError(t, err)
	require.EqualValues(t, 1, gone)
	b.open(t, "reservations/rome/granted")
	assert.Contains(t, eval[string](t, b, `document.querySelector('dl.facts').textContent`), "(granted)", "the pair's access expired")
}

// TestDashboardKeyboardAndPhone: every page is reached with the keyboard
// alone, and at a phone's width nothing overflows the screen sideways.
func TestDashboardKeyboardAndPhone(t *testing.T) {
	b := startBed(t)
	reserve(t, b.Broker, "rome", "phone-1", "2", "4Gi")
	b.open(t, "")
	// Tab: the skip link first, then the pages' links, in order.
	var order []string
	for range 6 {
		b.run(t, chromedp.KeyEvent(kb.Tab))
		order = append(order, eval[string](t, b, `document.activeElement.textContent.trim()`))
	}
	assert.Equal(t, []string{"Skip to content", "Federation", "Reservations", "Audit log", "Usage", "Capacity"}, order)
	b.run(t, chromedp.KeyEvent(kb.Enter)) // Capacity
	b.run(t, chromedp.WaitVisible(chromedp.CSS("h1")))
	assert.Equal(t, "Capacity over time", eval[string](t, b, `document.querySelector('h1').textContent`))
	b.run(t, chromedp.KeyEvent(kb.Tab), chromedp.KeyEvent(kb.Tab))
	assert.Equal(t, "Federation", eval[string](t, b, `document.activeElement.textContent`))
	assert.NotEqual(t, "none", eval[string](t, b, `getComputedStyle(document.activeElement).outlineStyle`), "the focused link is outlined")

	phone := newBrowser(t, 390, 844)
	require.NoError(t, chromedp.Do(phone, chromedp.EmulateViewport(390, 844, chromedp.EmulateMobile)))
	pb := &bed{Broker: b.Broker, Pages: b.Pages, browser: phone, shots: b.shots}
	for _, path := range []string{"", "reservations", "reservations/rome/phone-1", "audit", "usage", "history"} {
		pb.open(t, path)
		overflow := eval[int](t, pb, `document.documentElement.scrollWidth - window.innerWidth`)
		assert.LessOrEqual(t, overflow, 0, "/dashboard/%s is wider than a phone (%d px too wide)", path, overflow)
	}
	pb.open(t, "")
	pb.screenshot(t, "phone")
}

// TestDashboardReservationsPaginate: following the Next links in the
// browser lists every live reservation once, as the API lists them, and a
// bad filter is answered with a clear message.
func TestDashboardReservationsPaginate(t *testing.T) {
	b := startBed(t)
	want := map[string]bool{}
	for i := range 18 {
		for _, requester := range []string{"rome", "paris"} {
			id := fmt.Sprintf("p-%02d", i)
			reserve(t, b.Broker, requester, id, "100m", "64Mi")
			want[requester+"/"+id] = true
		}
	}
	// The API's view, member by member (each lists its own).
	api := map[string]bool{}
	for _, requester := range []string{"rome", "paris"} {
		cont := ""
		for {
			_, data := b.Do(requester, http.MethodGet, "/api/v2/reservations?role=requester&limit=10&continue="+cont, nil)
			l := brokertest.Decode[apiList](t, data)
			for _, r := range l.Items {
				api[r.Requester+"/"+r.ID] = true
			}
			if cont = l.Continue; cont == "" {
				break
			}
		}
	}
	require.Equal(t, want, api)

	b.open(t, "reservations")
	seen := map[string]bool{}
	pages := 0
	for {
		pages++
		// Each id at least once: like the API's lists (SSCAN), a page may
		// repeat an id while Redis rehashes the set, and never misses one.
		for _, id := range eval[[]string](t, b, `Array.from(document.querySelectorAll('[data-reservation]')).map(r => r.dataset.reservation)`) {
			seen[id] = true
		}
		next := eval[string](t, b, `document.getElementById('next')?.getAttribute('href') ?? ''`)
		if next == "" {
			break
		}
		require.Less(t, pages, 10)
		b.open(t, strings.TrimPrefix(next, "/dashboard/")) // the Next link
	}
	assert.Equal(t, want, seen)
	assert.GreaterOrEqual(t, pages, 2, "36 reservations take two pages of 25")

	for path, msg := range map[string]string{
		"reservations?state=Gone":     "state: must be Reserved or Active",
		"reservations?requester=Rome": "requester:",
		"reservations?continue=!!!":   "continue: not a position of this list",
		"audit?before=yesterday":      "before: not a stream id",
		"reservations/rome/nope":      "no reservation nope of rome",
	} {
		resp, err := http.Get(b.Pages + path)
		require.NoError(t, err)
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		assert.Contains(t, []int{http.StatusBadRequest, http.StatusNotFound}, resp.StatusCode, path)
		assert.True(t, strings.Contains(string(body), msg), "%s: the page says %q", path, msg)
	}
}

type apiList = api.ReservationList

// TestDashboardMarksStaleClusters: a cluster whose advertisements stopped
// is marked stale on the federation page, as the API judges it.
func TestDashboardMarksStaleClusters(t *testing.T) {
	b := startBedWith(t, 2*time.Second)
	time.Sleep(2500 * time.Millisecond)
	advertise(t, b.Broker, "rome", "16", "64Gi", "", "4", "8Gi", "0.03") // rome only keeps advertising
	b.open(t, "")
	_, data := b.Do("rome", http.MethodGet, "/api/v2/clusters", nil)
	page := eval[map[string]clusterCard](t, b, clusterFigures)
	stale := 0
	for _, c := range brokertest.Decode[api.ClusterList](t, data).Items {
		assert.Equal(t, !c.Live, page[c.ClusterID].Stale, c.ClusterID)
		if !c.Live {
			stale++
		}
	}
	assert.Equal(t, 2, stale, "paris and berlin went stale")
	assert.Equal(t, "2", eval[string](t, b, `document.getElementById('stale-count').textContent`))
	assert.Equal(t, "stale", eval[string](t, b, `document.querySelector('[data-cluster=paris] .badge').textContent`))
	b.screenshot(t, "stale")
}
