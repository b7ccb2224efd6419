package server

import (
	"context"
	"crypto/tls"
	"errors"
	"net"
	"net/http"
	"time"

	"golang.org/x/sync/errgroup"
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
}

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
	}
}

// Run serves until ctx ends, then shuts down gracefully. It also runs the
// expiry timer: every replica does, which is safe because expiry is atomic.
func (s *Server) Run(ctx context.Context, o RunOptions) error {
	if o.ExpiryInterval == 0 {
		o.ExpiryInterval = time.Second
	}
	if err := s.store.LoadScripts(ctx); err != nil {
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
	g.Go(func() error {
		<-ctx.Done()
		shutdown, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		for _, srv := range servers {
			_ = srv.Shutdown(shutdown)
		}
		return nil
	})
	return g.Wait()
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
		n, clamped, err := s.store.Expire(ctx)
		if err != nil {
			if ctx.Err() == nil {
				s.metrics.scriptErrors.WithLabelValues("expire").Inc()
				s.log.Error(err, "expire reservations")
			}
			continue
		}
		if n > 0 {
			s.metrics.ended.WithLabelValues("expired").Add(float64(n))
			s.log.V(1).Info("expired reservations", "count", n)
		}
		if clamped > 0 {
			s.metrics.clamps.Add(float64(clamped))
		}
	}
}
