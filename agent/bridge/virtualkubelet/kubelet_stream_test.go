package virtualkubelet

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	vkapi "github.com/virtual-kubelet/virtual-kubelet/node/api"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/httpstream"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/portforward"
	"k8s.io/client-go/tools/remotecommand"
	"k8s.io/client-go/transport/spdy"
	utilexec "k8s.io/utils/exec"
	"k8s.io/utils/ptr"
)

// TestPortForwardTimeouts: a port-forward through virtual-kubelet's handler
// (kubeletAPI) stays open while idle for longer than the creation timeout,
// and is closed after the idle timeout; a stream pair left half-opened
// times out after the creation timeout. vk v1.13.0 swaps the two for
// port-forward (kubeletAPI): this fails if it stops doing so.
func TestPortForwardTimeouts(t *testing.T) {
	const idle, creation = 2 * time.Second, 500 * time.Millisecond
	srv := httptest.NewServer(kubeletAPI(vkapi.PodHandlerConfig{
		PortForward: func(_ context.Context, namespace, pod string, port int32, stream io.ReadWriteCloser) error {
			if namespace != "shop" || pod != "web-0" || port != 8080 {
				return fmt.Errorf("unexpected %s/%s:%d", namespace, pod, port)
			}
			_, err := io.Copy(stream, stream) // echo
			return err
		},
		StreamIdleTimeout:     idle,
		StreamCreationTimeout: creation,
	}))
	defer srv.Close()

	u, err := url.Parse(srv.URL + "/portForward/shop/web-0")
	require.NoError(t, err)
	transport, upgrader, err := spdy.RoundTripperFor(&rest.Config{Host: srv.URL})
	require.NoError(t, err)
	conn, _, err := spdy.NewDialer(upgrader, &http.Client{Transport: transport}, http.MethodPost, u).Dial(portforward.PortForwardProtocolV1Name)
	require.NoError(t, err)
	defer conn.Close()

	stream := func(typ, request string) httpstream.Stream {
		h := http.Header{}
		h.Set(corev1.StreamType, typ)
		h.Set(corev1.PortHeader, "8080")
		h.Set(corev1.PortForwardRequestIDHeader, request)
		s, err := conn.CreateStream(h)
		require.NoError(t, err)
		return s
	}
	errorStream := stream(corev1.StreamTypeError, "0")
	require.NoError(t, errorStream.Close())
	data := stream(corev1.StreamTypeData, "0")
	echo := func(msg string) {
		t.Helper()
		_, err := data.Write([]byte(msg))
		require.NoError(t, err)
		buf := make([]byte, len(msg))
		_, err = io.ReadFull(data, buf)
		require.NoError(t, err)
		assert.Equal(t, msg, string(buf))
	}
	echo("hello")

	start := time.Now()
	lone := stream(corev1.StreamTypeError, "1") // its data stream never comes
	msg := make([]byte, 512)
	n, _ := lone.Read(msg) // the error, written when the pair is dropped (the stream stays open)
	assert.Contains(t, string(msg[:n]), "timed out waiting for streams")
	assert.Less(t, time.Since(start), idle, "a half-opened pair waits for the creation timeout, not the idle one")

	time.Sleep(2 * creation) // idle, longer than the creation timeout
	echo("still there")

	start = time.Now()
	select {
	case <-conn.CloseChan():
		assert.Greater(t, time.Since(start), idle*3/4, "closed by the idle timeout, not the creation one")
	case <-time.After(idle + 5*time.Second):
		t.Fatal("an idle port-forward is never closed")
	}
}

// TestExecExitCode: the provider's exit code, as client-go reports it
// (possibly wrapped), comes back to the caller through vk's exec handler.
func TestExecExitCode(t *testing.T) {
	srv := httptest.NewServer(kubeletAPI(vkapi.PodHandlerConfig{
		RunInContainer: func(_ context.Context, _, _, _ string, cmd []string, attach vkapi.AttachIO) error {
			_, _ = io.WriteString(attach.Stdout(), "out\n")
			code, _ := strconv.Atoi(cmd[0])
			var err error
			if code != 0 {
				err = fmt.Errorf("wrapped: %w", utilexec.CodeExitError{Err: errors.New("command terminated"), Code: code})
			}
			return exitError(err, func(err error) error { return err })
		},
		StreamIdleTimeout:     time.Minute,
		StreamCreationTimeout: time.Minute,
	}))
	defer srv.Close()

	for _, code := range []int{0, 3} {
		u, err := url.Parse(fmt.Sprintf("%s/exec/shop/web-0/main?command=%d&output=1", srv.URL, code))
		require.NoError(t, err)
		exe, err := remotecommand.NewSPDYExecutor(&rest.Config{Host: srv.URL}, http.MethodPost, u)
		require.NoError(t, err)
		var out strings.Builder
		err = exe.StreamWithContext(t.Context(), remotecommand.StreamOptions{Stdout: &out})
		assert.Equal(t, "out\n", out.String())
		if code == 0 {
			assert.NoError(t, err)
			continue
		}
		var exit utilexec.ExitError
		require.ErrorAs(t, err, &exit)
		assert.Equal(t, code, exit.ExitStatus())
	}
}

func TestLogOptions(t *testing.T) {
	since := time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)
	o := logOptions("main", vkapi.ContainerLogOpts{Follow: true, Previous: true, Timestamps: true, Tail: 5, LimitBytes: 100, SinceTime: since}, url.Values{"tailLines": {"5"}})
	assert.Equal(t, &corev1.PodLogOptions{Container: "main", Follow: true, Previous: true, Timestamps: true,
		TailLines: ptr.To[int64](5), LimitBytes: ptr.To[int64](100), SinceTime: &metav1.Time{Time: since}}, o)
	assert.Equal(t, ptr.To[int64](0), logOptions("main", vkapi.ContainerLogOpts{Follow: true}, url.Values{"tailLines": {"0"}}).TailLines,
		"--tail=0: no old lines")
	assert.Nil(t, logOptions("main", vkapi.ContainerLogOpts{}, nil).TailLines, "every line")
	assert.Equal(t, ptr.To[int64](30), logOptions("main", vkapi.ContainerLogOpts{SinceSeconds: 30}, nil).SinceSeconds)
}
