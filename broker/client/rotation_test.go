package client_test

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"math/big"
	"net/http"
	"net/http/httptrace"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fluidos-project/resource-broker/broker/client"
	"github.com/fluidos-project/resource-broker/internal/brokertest"
	"github.com/fluidos-project/resource-broker/internal/certauthority"
	"github.com/fluidos-project/resource-broker/internal/certdir"
)

// TestCertificateRotationWithoutRestart rotates every certificate of a
// running broker and of an agent's client, over real mutual TLS, as
// cert-manager and the kubelet do it (a ..data link swap in the mounted
// Secret directories), while the client calls the broker without pause and
// without retries:
//
//  1. the broker's serving certificate is renewed: new connections get it;
//  2. the client's certificate is renewed: its new connections present it;
//  3. the CA is rotated with an overlap: both sides trust the old and the new
//     CA, the client moves to a certificate of the new CA, the broker too,
//     then both drop the old CA.
//
// No call fails at any step, and nothing restarts. Afterwards a certificate
// of the removed CA is refused: at a new handshake, on a keep-alive
// connection made before the rotation (its next request), and on an event
// stream opened before it (ended with an error event).
func TestCertificateRotationWithoutRestart(t *testing.T) {
	ctx := context.Background()
	const check = 50 * time.Millisecond
	b := brokertest.Start(t, brokertest.Options{CertCheckInterval: check})
	oldCA := b.CA
	newCA, err := certauthority.NewCA("rb-broker-ca-2")
	require.NoError(t, err)
	bothCAs := append(append([]byte{}, oldCA.CertPEM...), newCA.CertPEM...)

	clientDir := filepath.Join(t.TempDir(), "rome")
	writeClient := func(ca *certauthority.CA, caPEM []byte) *big.Int {
		pair, err := ca.IssueClient("rome")
		require.NoError(t, err)
		require.NoError(t, certdir.WriteAtomic(clientDir, brokertest.TLSFiles(pair, caPEM)))
		cert, err := pair.TLSCertificate()
		require.NoError(t, err)
		return cert.Leaf.SerialNumber
	}
	writeClient(oldCA, oldCA.CertPEM)
	c, err := client.New(b.URL, clientDir, client.WithCertCheckInterval(check), client.WithRetries(0, 0))
	require.NoError(t, err)
	t.Cleanup(c.CloseIdleConnections)

	// What the client of the old CA keeps from before the rotation: a
	// keep-alive connection and an event stream.
	oldPair, err := oldCA.IssueClient("rome")
	require.NoError(t, err)
	oldCert, err := oldPair.TLSCertificate()
	require.NoError(t, err)
	oldTLS := &tls.Config{RootCAs: poolOf(t, bothCAs), Certificates: []tls.Certificate{oldCert}}
	oldConn := &http.Client{Transport: &http.Transport{TLSClientConfig: oldTLS}}
	t.Cleanup(oldConn.CloseIdleConnections)
	code, _, reused := get(t, oldConn, b.URL+"/api/v2/clusters")
	require.Equal(t, http.StatusOK, code)
	require.False(t, reused)
	streamEnd := openStream(t, oldTLS, b.URL)

	// The load: calls without pause, each failure counted with its error.
	var calls atomic.Int64
	var mu sync.Mutex
	var failures []string
	loadCtx, stopLoad := context.WithCancel(ctx)
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; loadCtx.Err() == nil; i++ {
				var err error
				if (i+w)%2 == 0 {
					_, err = c.Clusters(loadCtx)
				} else {
					_, err = c.Advertise(loadCtx, "rome", advertisement("8", "16Gi", "0.03"))
				}
				if err != nil && loadCtx.Err() == nil {
					mu.Lock()
					failures = append(failures, err.Error())
					mu.Unlock()
				}
				calls.Add(1)
			}
		}()
	}
	// step waits until cond holds and a few more calls went through.
	step := func(name string, cond func() bool) {
		t.Helper()
		require.Eventually(t, cond, 10*time.Second, 10*time.Millisecond, name)
		n := calls.Load()
		require.Eventually(t, func() bool { return calls.Load() >= n+20 }, 10*time.Second, time.Millisecond, "%s: calls continue", name)
		t.Logf("%s: done after %d calls", name, calls.Load())
	}
	servedBy := func(ca *certauthority.CA, serial *big.Int) func() bool {
		return func() bool {
			conn, err := tls.Dial("tcp", strings.TrimPrefix(b.URL, "https://"), &tls.Config{RootCAs: poolOf(t, bothCAs),
				GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return &oldCert, nil }})
			if err != nil {
				return false
			}
			defer conn.Close()
			leaf := conn.ConnectionState().PeerCertificates[0]
			return leaf.SerialNumber.Cmp(serial) == 0 && leaf.CheckSignatureFrom(ca.Cert) == nil
		}
	}
	rotateServer := func(ca *certauthority.CA, caPEM []byte) *big.Int {
		pair, err := ca.IssueServer("rb-broker", []string{"127.0.0.1"})
		require.NoError(t, err)
		b.RotateServer(pair, caPEM)
		cert, err := pair.TLSCertificate()
		require.NoError(t, err)
		return cert.Leaf.SerialNumber
	}
	step("load running", func() bool { return calls.Load() > 0 })

	// 1. The broker's serving certificate is renewed.
	serial := rotateServer(oldCA, oldCA.CertPEM)
	step("1. broker certificate renewed", servedBy(oldCA, serial))

	// 2. The client's certificate is renewed.
	serial = writeClient(oldCA, oldCA.CertPEM)
	step("2. client certificate renewed", func() bool { return c.Certificate().SerialNumber.Cmp(serial) == 0 })

	// 3. CA rotation with an overlap. The client moves to the new CA only
	// once the broker trusts it, as an operator waits for the CA bundle to
	// reach the broker before renewing the members' certificates.
	rotateServer(oldCA, bothCAs)
	newPair, err := newCA.IssueClient("rome")
	require.NoError(t, err)
	newCert, err := newPair.TLSCertificate()
	require.NoError(t, err)
	step("3. the broker trusts both CAs", func() bool {
		err := probe(b.URL, &tls.Config{RootCAs: poolOf(t, bothCAs), Certificates: []tls.Certificate{newCert}})
		return err == nil
	})
	serial = writeClient(newCA, bothCAs)
	step("3a. client on the new CA", func() bool { return c.Certificate().SerialNumber.Cmp(serial) == 0 })
	serial = rotateServer(newCA, bothCAs)
	step("3b. broker on the new CA", servedBy(newCA, serial))
	writeClient(newCA, newCA.CertPEM) // the client drops the old CA
	serial = rotateServer(newCA, newCA.CertPEM)
	refused := func() bool {
		err := probe(b.URL, oldTLS)
		return err != nil && strings.Contains(err.Error(), "certificate")
	}
	step("3c. the old CA removed", refused)

	stopLoad()
	wg.Wait()
	assert.Empty(t, failures, "calls failed during the rotation")
	assert.Greater(t, calls.Load(), int64(100))
	assert.True(t, servedBy(newCA, serial)())
	_, err = c.Clusters(ctx)
	require.NoError(t, err, "the rotated client works")

	// The old CA's certificate, everywhere.
	code, body, reused := get(t, oldConn, b.URL+"/api/v2/clusters")
	assert.True(t, reused, "the keep-alive connection made before the rotation")
	assert.Equal(t, http.StatusUnauthorized, code)
	assert.Contains(t, body, "no longer trusted")
	_, _, _, err = tryGet(oldConn, b.URL+"/api/v2/clusters")
	assert.ErrorContains(t, err, "certificate", "a new connection is refused at the handshake")
	select {
	case last := <-streamEnd:
		assert.Contains(t, last, "no longer trusted", "the event stream ends with an error event")
	case <-time.After(10 * time.Second):
		t.Error("the event stream of the old certificate is still open")
	}
	old, err := client.NewWithTLS(b.URL, oldTLS, client.WithRetries(0, 0))
	require.NoError(t, err)
	_, err = old.Clusters(ctx)
	assert.Error(t, err)
}

// probe makes one request on a new connection with cfg and reads the first
// byte of the answer: with TLS 1.3 the server's verdict on the client
// certificate comes with that first read.
func probe(url string, cfg *tls.Config) error {
	conn, err := tls.Dial("tcp", strings.TrimPrefix(url, "https://"), cfg)
	if err != nil {
		return err
	}
	defer conn.Close()
	if _, err = conn.Write([]byte("GET /api/v2/clusters HTTP/1.1\r\nHost: x\r\n\r\n")); err != nil {
		return err
	}
	_, err = conn.Read(make([]byte, 1))
	return err
}

func poolOf(t *testing.T, pemCerts []byte) *x509.CertPool {
	t.Helper()
	pool := x509.NewCertPool()
	require.True(t, pool.AppendCertsFromPEM(pemCerts))
	return pool
}

// tryGet GETs url and says whether the connection was a kept-alive one.
func tryGet(hc *http.Client, url string) (code int, body string, reused bool, err error) {
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		return 0, "", false, err
	}
	req = req.WithContext(httptrace.WithClientTrace(req.Context(), &httptrace.ClientTrace{
		GotConn: func(i httptrace.GotConnInfo) { reused = i.Reused }}))
	resp, err := hc.Do(req)
	if err != nil {
		return 0, "", reused, err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(data), reused, err
}

func get(t *testing.T, hc *http.Client, url string) (int, string, bool) {
	t.Helper()
	code, body, reused, err := tryGet(hc, url)
	require.NoError(t, err)
	return code, body, reused
}

// openStream opens GET /api/v2/events with tlsConfig and returns the data
// of its last error event, or what ended it, once it ends.
func openStream(t *testing.T, tlsConfig *tls.Config, base string) <-chan string {
	t.Helper()
	tr := &http.Transport{TLSClientConfig: tlsConfig}
	t.Cleanup(tr.CloseIdleConnections)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/api/v2/events", nil)
	require.NoError(t, err)
	resp, err := tr.RoundTrip(req)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	end := make(chan string, 1)
	go func() {
		defer resp.Body.Close()
		sc := bufio.NewScanner(resp.Body)
		last, isError := "", false
		for sc.Scan() {
			line := sc.Text()
			switch {
			case line == "event: error":
				isError = true
			case isError && strings.HasPrefix(line, "data: "):
				last = strings.TrimPrefix(line, "data: ")
			}
		}
		if last == "" {
			last = fmt.Sprintf("ended without an error event: %v", sc.Err())
		}
		end <- last
	}()
	return end
}
