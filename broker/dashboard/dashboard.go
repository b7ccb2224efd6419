// Package dashboard is the broker's web dashboard: read-only pages for the
// federation's operators, served by the broker itself under /dashboard/ on
// its mutual-TLS API listener (server.Config.Dashboard), rendered on the
// server from the same store the API reads (html/template), with one small
// script that reloads the page's content when the broker's event streams
// show a change (EventSource). Templates, style and script are embedded:
// nothing is fetched from the network at run time.
//
// Access is an operator's client certificate: its common name is one of
// Config.Operators. A member's certificate (any other name) is refused, and
// the broker refuses operators' names on the members' API (server.Config).
// No secret reaches a page: grants are never rendered (only whether there
// is one), nor anything of Redis but the figures.
package dashboard

import (
	"context"
	"embed"
	"fmt"
	"html/template"
	"io/fs"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/go-logr/logr"

	"github.com/fluidos-project/resource-broker/broker/store"
)

//go:embed assets
var assets embed.FS

// Path is where the broker serves the dashboard.
const Path = "/dashboard/"

// Config configures a Dashboard.
type Config struct {
	Store *store.Store
	// Cells, when the broker is split into more than one, are shown one at
	// a time: ?cell=<name> on any page (the default cell without it), with
	// a link to each cell in the header. Store is then ignored.
	Cells *store.Cells
	// Operators are the common names of the client certificates that may
	// read the dashboard.
	Operators []string
	Log       logr.Logger
	// SampleInterval is how often the capacity history takes a sample;
	// default DefaultSampleInterval.
	SampleInterval time.Duration
	// Window is how far back the capacity plot goes; default an hour.
	Window time.Duration
}

// DefaultSampleInterval is Config.SampleInterval's default: 360 samples an hour.
const DefaultSampleInterval = 10 * time.Second

// Dashboard serves the pages.
type Dashboard struct {
	store *store.Store
	// cell is the name of store's cell, when there are several: cells
	// (sorted) with the default first in defaultCell; byCell holds a copy of
	// the dashboard per cell, its store that cell's, whose mux serves the
	// requests that name it.
	cell, defaultCell string
	cells             []string
	byCell            map[string]*Dashboard
	operators         map[string]bool
	log               logr.Logger
	every             time.Duration
	window            time.Duration
	pages             map[string]*template.Template
	mux               *http.ServeMux
	// stopped is closed when Run returns: the live streams end with it (a
	// server's graceful shutdown would wait for them), and the pages
	// reconnect to a replica still serving.
	stopped chan struct{}
}

// New returns a dashboard; it fails when no operator is named (nobody could
// read it) or a template does not parse.
func New(cfg Config) (*Dashboard, error) {
	if len(cfg.Operators) == 0 {
		return nil, fmt.Errorf("dashboard: no operator: name at least one operator certificate's common name")
	}
	if cfg.SampleInterval <= 0 {
		cfg.SampleInterval = DefaultSampleInterval
	}
	if cfg.Window <= 0 {
		cfg.Window = time.Hour
	}
	d := &Dashboard{store: cfg.Store, operators: map[string]bool{}, log: cfg.Log, every: cfg.SampleInterval,
		window: cfg.Window, pages: map[string]*template.Template{}, stopped: make(chan struct{})}
	for _, op := range cfg.Operators {
		d.operators[op] = true
	}
	for _, page := range []string{"overview", "reservations", "decision", "audit", "usage", "history", "error"} {
		t, err := template.New("layout.html").Funcs(funcs).ParseFS(assets, "assets/layout.html", "assets/"+page+".html")
		if err != nil {
			return nil, fmt.Errorf("dashboard: template %s: %w", page, err)
		}
		d.pages[page] = t
	}
	if cfg.Cells != nil && len(cfg.Cells.Names()) > 1 {
		d.cells, d.defaultCell = cfg.Cells.Names(), cfg.Cells.Default()
		d.byCell = map[string]*Dashboard{}
		for _, n := range d.cells {
			c := *d
			c.store, c.cell = cfg.Cells.Cell(n), n
			c.mux = c.routes()
			d.byCell[n] = &c
		}
		d.store, d.cell = d.byCell[d.defaultCell].store, d.defaultCell
	}
	d.mux = d.routes()
	return d, nil
}

// routes are the pages of d's store.
func (d *Dashboard) routes() *http.ServeMux {
	static, _ := fs.Sub(assets, "assets/static")
	mux := http.NewServeMux()
	mux.Handle("GET /dashboard/static/", http.StripPrefix("/dashboard/static/", http.FileServerFS(static)))
	mux.HandleFunc("GET /dashboard/{$}", d.overview)
	mux.HandleFunc("GET /dashboard/reservations", d.reservations)
	mux.HandleFunc("GET /dashboard/reservations/{requester}/{id}", d.decision)
	mux.HandleFunc("GET /dashboard/audit", d.audit)
	mux.HandleFunc("GET /dashboard/usage", d.usage)
	mux.HandleFunc("GET /dashboard/history", d.history)
	mux.HandleFunc("GET /dashboard/events", d.events)
	mux.HandleFunc("/dashboard/", func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			d.fail(w, r, http.StatusMethodNotAllowed, "the dashboard is read-only")
			return
		}
		d.fail(w, r, http.StatusNotFound, "no page "+r.URL.Path)
	})
	return mux
}

// IsOperator reports whether cn names an operator's certificate.
func (d *Dashboard) IsOperator(cn string) bool { return d.operators[cn] }

// Operators lists the operators' names.
func (d *Dashboard) Operators() []string {
	out := make([]string, 0, len(d.operators))
	for op := range d.operators {
		out = append(out, op)
	}
	slices.Sort(out)
	return out
}

// ServeHTTP serves a page to an operator's certificate, and refuses any other.
func (d *Dashboard) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h := w.Header()
	// The pages load nothing but their own style and script, and are never framed.
	h.Set("Content-Security-Policy", "default-src 'none'; style-src 'self'; script-src 'self'; img-src 'self'; connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Referrer-Policy", "no-referrer")
	h.Set("Cache-Control", "no-store")
	if r.TLS == nil || len(r.TLS.PeerCertificates) == 0 {
		d.fail(w, r, http.StatusUnauthorized, "the dashboard needs an operator's client certificate")
		return
	}
	cn := r.TLS.PeerCertificates[0].Subject.CommonName
	if !d.operators[cn] {
		d.fail(w, r, http.StatusForbidden, fmt.Sprintf(
			"the client certificate %q is not an operator's: the dashboard is for the operators the broker names (--dashboard-operators), never for a member's certificate", cn))
		return
	}
	if name := r.URL.Query().Get("cell"); name != "" && d.byCell != nil {
		c, ok := d.byCell[name]
		if !ok {
			d.fail(w, r, http.StatusNotFound, fmt.Sprintf("no cell %q: the broker's cells are %s", name, strings.Join(d.cells, ", ")))
			return
		}
		c.mux.ServeHTTP(w, r)
		return
	}
	d.mux.ServeHTTP(w, r)
}

// fail answers an error page.
func (d *Dashboard) fail(w http.ResponseWriter, r *http.Request, code int, msg string) {
	d.render(w, r, code, "error", "Error", struct {
		Code    int
		Status  string
		Message string
	}{code, http.StatusText(code), msg})
}

// page is what the layout reads.
type page struct {
	Title    string
	Nav      string // the page's name, to mark its link
	Fragment bool   // only <main>'s content: the live script's reload
	// Cell is the cell shown, and Cells every cell, when there are several.
	Cell  string
	Cells []string
	Data  any
}

// render answers a page with code; with ?fragment=1 only its main
// content, which the live script swaps in.
func (d *Dashboard) render(w http.ResponseWriter, r *http.Request, code int, name, title string, data any) {
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(code)
	p := page{Title: title, Nav: name, Fragment: r.URL.Query().Get("fragment") == "1", Data: data, Cells: d.cells}
	if d.cells != nil {
		p.Cell = d.cell
	}
	tmpl := "layout.html"
	if p.Fragment {
		tmpl = "main"
	}
	if err := d.pages[name].ExecuteTemplate(w, tmpl, p); err != nil {
		d.log.Error(err, "render dashboard page", "page", name)
	}
}

// storeError answers a failed read of the broker state.
func (d *Dashboard) storeError(w http.ResponseWriter, r *http.Request, err error) {
	if r.Context().Err() != nil {
		return
	}
	d.log.Error(err, "dashboard: read broker state", "path", r.URL.Path)
	d.fail(w, r, http.StatusServiceUnavailable, "broker state unavailable, retry: "+err.Error())
}

// Run takes the capacity samples until ctx ends, then ends the live
// streams. Run it once, beside the server.
func (d *Dashboard) Run(ctx context.Context) {
	defer close(d.stopped)
	t := time.NewTicker(d.every)
	defer t.Stop()
	each := []*Dashboard{d}
	if d.byCell != nil {
		each = each[:0]
		for _, n := range d.cells {
			each = append(each, d.byCell[n])
		}
	}
	for {
		for _, c := range each {
			if err := c.sample(ctx); err != nil && ctx.Err() == nil {
				d.log.Error(err, "dashboard: capacity sample", "cell", c.cell)
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
