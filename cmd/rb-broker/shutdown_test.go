package main

import (
	"context"
	"errors"
	"net/http"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fluidos-project/resource-broker/broker/client"
	"github.com/fluidos-project/resource-broker/internal/brokertest"
)

// TestAbuseShutdownWithOpenStreams: with one event stream open the broker
// took 11 s to stop (http.Server.Shutdown waits for every request, and a
// stream never ends by itself), past what a pod is given. Now SIGTERM makes
// /readyz fail at once while the API still serves (--shutdown-delay), then
// every stream ends with a reconnection hint (SSE retry) and the process
// exits, well within the grace period, with many streams open.
func TestAbuseShutdownWithOpenStreams(t *testing.T) {
	const delay = time.Second
	b := brokertest.Start(t, brokertest.Options{})
	p := b.StartProcess(os.Args[0], []string{runMainEnv + "=1", redisPasswordEnv + "="},
		"--shutdown-delay="+delay.String(), "--shutdown-timeout=20s", "--max-streams-per-cluster=100")
	ctx := context.Background()
	rome, err := client.New(p.URL, b.ClusterCertDir("rome"))
	require.NoError(t, err)
	t.Cleanup(rome.CloseIdleConnections)

	const streams = 20
	ended := make(chan error, streams)
	for range streams {
		s, err := rome.OpenEvents(ctx, "")
		require.NoError(t, err)
		go func() {
			_, _, err := s.Next()
			ended <- err
		}()
	}

	start := time.Now()
	require.NoError(t, syscall.Kill(p.Pid, syscall.SIGTERM))
	require.Eventually(t, func() bool {
		resp, err := http.Get(p.Health + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusServiceUnavailable
	}, delay/2, 20*time.Millisecond, "readiness fails first")
	_, err = rome.Clusters(ctx)
	assert.NoError(t, err, "the API still serves during the delay")

	for range streams {
		select {
		case err := <-ended:
			var se *client.StreamError
			require.True(t, errors.As(err, &se), "the stream ends as cut off, to be resumed: %v", err)
			assert.Equal(t, 200*time.Millisecond, se.Retry, "with the broker's reconnection hint")
			assert.NotEmpty(t, se.LastEventID, "and where to resume")
			assert.GreaterOrEqual(t, time.Since(start), delay, "not before the delay")
		case <-time.After(delay + 5*time.Second):
			t.Fatal("a stream did not end")
		}
	}
	require.Eventually(t, func() bool { return syscall.Kill(p.Pid, 0) != nil }, delay+3*time.Second, 20*time.Millisecond,
		"rb-broker did not exit")
	took := time.Since(start)
	t.Logf("stopped %s after SIGTERM with %d streams open (delay %s)", took.Round(time.Millisecond), streams, delay)
	assert.Less(t, took, delay+2*time.Second)
	log, err := os.ReadFile(p.Log)
	require.NoError(t, err)
	assert.Contains(t, string(log), "shutting down")
	assert.False(t, strings.Contains(string(log), "requests still in flight were cut"), "%s", log)
}
