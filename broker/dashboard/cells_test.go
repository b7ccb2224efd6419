package dashboard_test

import (
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fluidos-project/resource-broker/broker/dashboard"
	"github.com/fluidos-project/resource-broker/broker/store"
	"github.com/fluidos-project/resource-broker/internal/brokertest"
)

// TestDashboardCells: a broker split into cells (eu, the default, and us,
// by the label region) over a real Redis Cluster shows one cell at a time:
// the default cell without ?cell=, the other through the header's cell
// links, whose pages, links, filters and live updates all stay in it; a
// cell it does not have is a 404 that names the cells.
func TestDashboardCells(t *testing.T) {
	b := brokertest.StartCells(t, brokertest.Options{Operators: []string{operator}, DashboardSample: 200 * time.Millisecond},
		[]string{"eu", "us"}, store.CellRule{Label: "region", Default: "eu"})
	for id, region := range map[string]string{"eu-1": "eu", "eu-2": "eu", "us-1": "us", "us-2": "us"} {
		b.Advertise(id, "16", "64Gi", "", "0.03", map[string]string{"region": region})
	}
	reserve(t, b, "eu-2", "eu-web", "2", "4Gi")
	reserve(t, b, "us-2", "us-web", "2", "4Gi")
	bd := &bed{Broker: b, Pages: proxy(t, b, operator) + dashboard.Path, browser: newBrowser(t, 1280, 900), shots: screenshotDir(t)}
	clusters := `Array.from(document.querySelectorAll('[data-cluster]')).map(c => c.dataset.cluster).sort()`
	rows := `Array.from(document.querySelectorAll('[data-reservation]')).map(r => r.dataset.reservation).sort()`
	cellLinks := `Object.fromEntries(Array.from(document.querySelectorAll('nav.cells a')).map(a => [a.textContent, a.getAttribute('aria-current') === 'true']))`
	hrefOf := func(label string) string {
		return eval[string](t, bd, `Array.from(document.querySelectorAll('nav[aria-label=Pages] a')).find(a => a.textContent === '`+label+`').getAttribute('href')`)
	}

	bd.open(t, "")
	assert.Equal(t, []string{"eu-1", "eu-2"}, eval[[]string](t, bd, clusters), "the default cell")
	assert.Equal(t, map[string]bool{"eu": true, "us": false}, eval[map[string]bool](t, bd, cellLinks))
	assert.Equal(t, "/dashboard/reservations?cell=eu", hrefOf("Reservations"))

	bd.run(t, chromedp.Click(chromedp.CSS(`nav.cells a:nth-of-type(2)`)), chromedp.WaitVisible(chromedp.CSS(`body[data-cell=us] #live.on`)))
	assert.Equal(t, []string{"us-1", "us-2"}, eval[[]string](t, bd, clusters), "us, from its link")
	assert.Equal(t, map[string]bool{"eu": false, "us": true}, eval[map[string]bool](t, bd, cellLinks))
	assert.Equal(t, "/dashboard/reservations?cell=us", hrefOf("Reservations"))
	bd.screenshot(t, "cells")

	bd.run(t, chromedp.Click(chromedp.CSS(`nav[aria-label=Pages] a:nth-of-type(2)`)), chromedp.WaitVisible(chromedp.CSS(`form.filters`)),
		chromedp.WaitVisible(chromedp.CSS(`#live.on`)))
	assert.Equal(t, []string{"us-2/us-web"}, eval[[]string](t, bd, rows), "us's reservations only")
	// The filter form keeps the cell (typed, as an operator does: the live
	// reload leaves a focused form alone).
	bd.run(t, chromedp.SendKeys(chromedp.CSS(`input[name=requester]`), "us-2\r"))
	require.Eventually(t, func() bool {
		return eval[string](t, bd, `location.search`) == "?cell=us&requester=us-2&provider=&state="
	},
		10*time.Second, 50*time.Millisecond, "the filter's page, in us: %s", eval[string](t, bd, `location.search`))
	bd.run(t, chromedp.WaitVisible(chromedp.CSS(`body[data-cell=us] #live.on`)))
	assert.Equal(t, []string{"us-2/us-web"}, eval[[]string](t, bd, rows))
	// Live: a new reservation in us shows without a reload.
	reserve(t, b, "us-2", "us-api", "1", "1Gi")
	require.Eventually(t, func() bool {
		return len(eval[[]string](t, bd, rows)) == 2
	}, 10*time.Second, 100*time.Millisecond, "us-api shows on the open page")

	resp, err := http.Get(bd.Pages + "?cell=asia")
	require.NoError(t, err)
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	assert.Equal(t, http.StatusNotFound, resp.StatusCode)
	assert.Contains(t, string(body), `no cell &#34;asia&#34;: the broker&#39;s cells are eu, us`)
}
