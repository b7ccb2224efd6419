package server_test

// BenchmarkHandlerReserve measures the server's own Go cost per reservation
// request, without the network: the v2 handler called in-process
// (ServeHTTP with a recorded response and a verified client certificate in
// the request's TLS state) against Store.Reserve alone, on a replayed
// reservation so that Redis answers from one HGETALL. ns/op and allocs/op of
// the two lines differ by what the handler adds: routing, identity, decoding,
// validation, metrics and encoding.

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/stretchr/testify/require"

	"github.com/fluidos-project/resource-broker/broker/api"
	"github.com/fluidos-project/resource-broker/broker/server"
	"github.com/fluidos-project/resource-broker/broker/store"
	"github.com/fluidos-project/resource-broker/internal/brokertest"
)

func BenchmarkHandlerReserve(b *testing.B) {
	ctx := context.Background()
	bk := brokertest.Start(b, brokertest.Options{Store: store.Config{StaleThreshold: time.Hour}, ExpiryInterval: time.Hour})
	_, err := bk.Store.Advertise(ctx, "p000", benchProvider(rand.New(rand.NewPCG(1, 1)), "p000"))
	require.NoError(b, err)
	h := server.New(server.Config{Store: bk.Store, Log: logr.Discard()}).Handler()
	body, err := json.Marshal(reservation("replay-0", "500m", "1Gi"))
	require.NoError(b, err)
	state := &tls.ConnectionState{PeerCertificates: []*x509.Certificate{{Subject: pkix.Name{CommonName: "requester-0"}}}}
	serve := func(want int) {
		req := httptest.NewRequest(http.MethodPost, "/api/v2/reservations", bytes.NewReader(body))
		req.TLS = state
		req.Header.Set("Content-Type", "application/json")
		w := httptest.NewRecorder()
		h.ServeHTTP(w, req)
		if w.Code != want {
			b.Fatalf("%d: %s", w.Code, w.Body)
		}
	}
	serve(http.StatusCreated)
	direct, err := reservation("replay-0", "500m", "1Gi").ToStore("requester-0", api.Limits{DefaultDuration: time.Hour})
	require.NoError(b, err)

	b.Run("store-direct", func(b *testing.B) {
		b.ReportAllocs()
		cpu := readCPU(b, bk.RDB)
		b.ResetTimer()
		for range b.N {
			if _, err := bk.Store.Reserve(ctx, direct); err != nil {
				b.Fatal(err)
			}
		}
		b.StopTimer()
		reportCPU(b, bk.RDB, cpu)
	})
	b.Run("handler", func(b *testing.B) {
		b.ReportAllocs()
		cpu := readCPU(b, bk.RDB)
		b.ResetTimer()
		for range b.N {
			serve(http.StatusOK)
		}
		b.StopTimer()
		reportCPU(b, bk.RDB, cpu)
	})
}
