package server

import (
	"context"
	"crypto/tls"
	"errors"
	"net"
	"net/http"
	"time"

	"golang.org/x/sync/errgroup"
	"k8s.io/klog/v2"

	"github.com/fluidos-project/resource-broker/broker/store"
)

// RunOptions say where to listen.
type RunOptions struct {
	APIListener net.Listener // wrapped in TLS with Certs (or TLSConfig)
	// Certs serves the API's TLS, reloading rotated files; connections whose
	// client CA was removed are refused (see Certs).
	Certs *Certs
	// TLSConfig is a fixed configuration instead of Certs.
	TLSConfig      *tls.Config
	HealthListener net.Listener // plain HTTP; nil to serve health only on the API
	ExpiryInterval time.Duration
	// ShutdownDelay is how long, once ctx ends, the replica keeps serving
	// while /readyz fails, so that Services and load balancers stop sending
	// it new clients first; default 0.
	ShutdownDelay time.Duration
	// ShutdownTimeout bounds the rest of the shutdown: the event streams are
	// ended at once (with a reconnection hint), then requests in flight may
	// finish within it; default DefaultShutdownTimeout.
	ShutdownTimeout time.Duration
}

// DefaultShutdownTimeout is RunOptions.ShutdownTimeout's default.
const DefaultShutdownTimeout = 10 * time.Second

// NewHTTPServer returns an http.Server with the broker's timeouts.
func NewHTTPServer(h http.Handler, tlsConfig *tls.Config) *http.Server {
	return &http.Server{
		Handler:           h,
		TLSConfig:         tlsConfig,
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       15 * time.Second,
		WriteTimeout:      15 * time.Second, // event streams extend their own deadline
		IdleTimeout:       2 * time.Minute,
		MaxHeaderBytes:    32 << 10,
		// net/http's own errors (TLS handshakes, panics in handlers) go to
		// klog like the rest of the log, in its format.
		ErrorLog: klog.NewStandardLogger("ERROR"),
	}
}

// Run serves until ctx ends, then shuts down gracefully. It also runs the
// expiry timer: every replica does, which is safe because expiry is atomic.
func (s *Server) Run(ctx context.Context, o RunOptions) error {
	if o.ExpiryInterval == 0 {
		o.ExpiryInterval = time.Second
	}
	for _, st := range s.stores() {
		if err := st.LoadScripts(ctx); err != nil {
			return err
		}
	}
	if err := s.loadMemberCells(ctx); err != nil {
		return err
	}
	if o.Certs != nil {
		s.certs = o.Certs
		o.TLSConfig = o.Certs.TLSConfig()
	}
	if o.TLSConfig == nil {
		return errors.New("server: RunOptions need Certs or a TLSConfig")
	}
	apiSrv := NewHTTPServer(s.Handler(), o.TLSConfig)
	if s.certs != nil {
		apiSrv.ConnContext = connContext
	}
	servers := []*http.Server{apiSrv}
	g, ctx := errgroup.WithContext(ctx)
	g.Go(func() error { return ignoreClosed(apiSrv.Serve(tls.NewListener(o.APIListener, o.TLSConfig))) })
	if o.HealthListener != nil {
		healthSrv := NewHTTPServer(s.HealthHandler(), nil)
		servers = append(servers, healthSrv)
		g.Go(func() error { return ignoreClosed(healthSrv.Serve(o.HealthListener)) })
	}
	g.Go(func() error { s.expireLoop(ctx, o.ExpiryInterval); return nil })
	if s.cells != nil {
		g.Go(func() error { s.refreshMemberCells(ctx); return nil })
	}
	g.Go(func() error {
		<-ctx.Done()
		s.shutdown(servers, o.ShutdownDelay, o.ShutdownTimeout)
		return nil
	})
	return g.Wait()
}

// shutdown stops serving in the order that loses no client: readiness fails
// first (new clients go to other replicas), after delay the event streams end
// with a reconnection hint (their clients resume elsewhere from their last
// event id: http.Server.Shutdown alone waits for them, and they never end),
// then the servers stop, waiting at most timeout for requests in flight.
func (s *Server) shutdown(servers []*http.Server, delay, timeout time.Duration) {
	s.draining.Store(true)
	s.log.Info("shutting down: not ready", "delay", delay)
	time.Sleep(delay)
	s.endStreams.Do(func() { close(s.streamsEnd) })
	if timeout <= 0 {
		timeout = DefaultShutdownTimeout
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	for _, srv := range servers {
		if err := srv.Shutdown(ctx); err != nil {
			s.log.Error(err, "shutdown: requests still in flight were cut")
		}
	}
	if s.cells == nil {
		s.hub.stop()
	}
	for _, h := range s.hubs {
		h.stop()
	}
}

func ignoreClosed(err error) error {
	if errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return err
}

func (s *Server) expireLoop(ctx context.Context, every time.Duration) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		for _, st := range s.stores() { // with cells, each cell's in turn
			s.expire(ctx, st)
		}
	}
}

// expire runs one cell's expiry and records its outcome.
func (s *Server) expire(ctx context.Context, st *store.Store) {
	res, err := st.ExpireRun(ctx)
	if err != nil {
		if ctx.Err() == nil {
			s.metrics.scriptErrors.WithLabelValues("expire").Inc()
			s.log.Error(err, "expire reservations")
		}
		return
	}
	if res.Outage > 0 {
		s.metrics.outages.Inc()
		s.metrics.outageSecs.Add(res.Outage.Seconds())
		s.log.Info("broker outage over: its time does not count against leases", "outage", res.Outage.Round(time.Millisecond))
	}
	if res.Credited > 0 {
		s.metrics.credited.Add(float64(res.Credited))
		s.log.Info("leases due during the outage get a whole lease to renew", "count", res.Credited)
	}
	for action, n := range map[string]int64{"parked": res.Parked, "unparked": res.Unparked, "moved": res.Moved} {
		if n > 0 {
			s.metrics.covered.WithLabelValues(action).Add(float64(n))
		}
	}
	n, clamped := res.Expired, res.Clamped
	if n > 0 {
		s.metrics.ended.WithLabelValues("expired").Add(float64(n))
		s.log.V(1).Info("expired reservations", "count", n)
	}
	if clamped > 0 {
		s.metrics.clamps.Add(float64(clamped))
	}
}
