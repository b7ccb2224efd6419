package virtualkubelet

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/httpstream"
	remotecommandconsts "k8s.io/apimachinery/pkg/util/remotecommand"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/portforward"
	"k8s.io/client-go/tools/remotecommand"
	"k8s.io/client-go/transport/spdy"
	pfserver "k8s.io/kubelet/pkg/cri/streaming/portforward"
	rcserver "k8s.io/kubelet/pkg/cri/streaming/remotecommand"
	utilexec "k8s.io/utils/exec"
)

// The streaming routes speak the kubelet's protocols to the API server with
// the kubelet's own server side (k8s.io/kubelet/pkg/cri/streaming: SPDY and
// websockets, stdin/stdout/stderr, tty and resize, port-forward stream
// pairs), and reach the copy through the provider's API with client-go's
// clients, as kubectl does: websockets first, SPDY when the provider's API
// server (or a proxy before it) refuses the upgrade.

// containerLogs streams the copy's pods/log.
func (k *kubeletServer) containerLogs(w http.ResponseWriter, r *http.Request, t podTarget) {
	opts, err := logOptions(r.PathValue("container"), r.URL.Query())
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	stream, err := t.remote.client.CoreV1().Pods(t.remote.namespace).GetLogs(t.remoteName(), opts).Stream(r.Context())
	if err != nil {
		http.Error(w, fmt.Sprintf("logs from %s: %v", t.node.provider, err), providerCode(err))
		return
	}
	defer stream.Close()
	w.Header().Set("Content-Type", "text/plain")
	w.WriteHeader(http.StatusOK)
	flusher, _ := w.(http.Flusher)
	buf := make([]byte, 32<<10)
	for {
		nr, rerr := stream.Read(buf)
		if nr > 0 {
			if _, werr := w.Write(buf[:nr]); werr != nil {
				return
			}
			if flusher != nil {
				flusher.Flush() // kubectl logs -f shows lines as they come
			}
		}
		if rerr != nil {
			return
		}
	}
}

// providerCode is the HTTP status to answer with for an error of the
// provider's API: its own when it has one (a missing container is 404 here
// too), else 502.
func providerCode(err error) int {
	var status apierrors.APIStatus
	if errors.As(err, &status) && status.Status().Code != 0 {
		return int(status.Status().Code)
	}
	return http.StatusBadGateway
}

// logOptions reads the kubelet's containerLogs query.
func logOptions(container string, q url.Values) (*corev1.PodLogOptions, error) {
	o := &corev1.PodLogOptions{Container: container}
	boolean := func(name string, dst *bool) error {
		if v := q.Get(name); v != "" {
			b, err := strconv.ParseBool(v)
			if err != nil {
				return fmt.Errorf("%s: %w", name, err)
			}
			*dst = b
		}
		return nil
	}
	integer := func(name string, dst **int64, lowest int64) error {
		if v := q.Get(name); v != "" {
			i, err := strconv.ParseInt(v, 10, 64)
			if err != nil || i < lowest {
				return fmt.Errorf("%s: %q is not an integer >= %d", name, v, lowest)
			}
			*dst = &i
		}
		return nil
	}
	if err := errors.Join(boolean("follow", &o.Follow), boolean("previous", &o.Previous), boolean("timestamps", &o.Timestamps),
		integer("tailLines", &o.TailLines, 0), integer("limitBytes", &o.LimitBytes, 1), integer("sinceSeconds", &o.SinceSeconds, 1)); err != nil {
		return nil, err
	}
	if v := q.Get("sinceTime"); v != "" {
		t, err := time.Parse(time.RFC3339, v)
		if err != nil {
			return nil, fmt.Errorf("sinceTime: %w", err)
		}
		o.SinceTime = &metav1.Time{Time: t}
	}
	return o, nil
}

// exec runs a command in the copy's container (pods/exec at the provider).
func (k *kubeletServer) exec(w http.ResponseWriter, r *http.Request, t podTarget) {
	opts, err := rcserver.NewOptions(r)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	container := r.PathValue("container")
	rcserver.ServeExec(w, r, remoteSession{k: k, t: t}, t.String(), "", container, r.URL.Query()[corev1.ExecCommandParam], opts,
		streamIdleTimeout, streamCreationTimeout, remotecommandconsts.SupportedStreamingProtocols)
}

// attach attaches to the copy's container (pods/attach at the provider).
func (k *kubeletServer) attach(w http.ResponseWriter, r *http.Request, t podTarget) {
	opts, err := rcserver.NewOptions(r)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	rcserver.ServeAttach(w, r, remoteSession{k: k, t: t}, t.String(), "", r.PathValue("container"), opts,
		streamIdleTimeout, streamCreationTimeout, remotecommandconsts.SupportedStreamingProtocols)
}

// portForward forwards the caller's port-forward streams to the copy's ports
// (pods/portforward at the provider).
func (k *kubeletServer) portForward(w http.ResponseWriter, r *http.Request, t podTarget) {
	opts, err := pfserver.NewV4Options(r) // the ports, for websocket callers
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	pfserver.ServePortForward(w, r, remoteSession{k: k, t: t}, t.String(), "", opts,
		streamIdleTimeout, streamCreationTimeout, pfserver.SupportedProtocols)
}

// remoteSession runs the kubelet's streaming sessions of one pod at the
// provider: rcserver.Executor, rcserver.Attacher, pfserver.PortForwarder.
type remoteSession struct {
	k *kubeletServer
	t podTarget
}

func (s remoteSession) ExecInContainer(ctx context.Context, _ string, _ types.UID, container string, cmd []string,
	in io.Reader, out, errOut io.WriteCloser, tty bool, resize <-chan remotecommand.TerminalSize, _ time.Duration) error {
	opts := &corev1.PodExecOptions{Container: container, Command: cmd, Stdin: in != nil, Stdout: out != nil, Stderr: errOut != nil, TTY: tty}
	return s.stream(ctx, "exec", opts, in, out, errOut, tty, resize)
}

func (s remoteSession) AttachContainer(ctx context.Context, _ string, _ types.UID, container string,
	in io.Reader, out, errOut io.WriteCloser, tty bool, resize <-chan remotecommand.TerminalSize) error {
	opts := &corev1.PodAttachOptions{Container: container, Stdin: in != nil, Stdout: out != nil, Stderr: errOut != nil, TTY: tty}
	return s.stream(ctx, "attach", opts, in, out, errOut, tty, resize)
}

// stream runs pods/<subresource> of the copy with the caller's streams. A
// non-zero exit code is returned as the provider reported it (a
// utilexec.ExitError), which the kubelet's server turns into the exit code
// the caller sees; any other failure is the caller's error message.
func (s remoteSession) stream(ctx context.Context, subresource string, opts runtime.Object,
	in io.Reader, out, errOut io.WriteCloser, tty bool, resize <-chan remotecommand.TerminalSize) error {
	u := s.t.remote.client.CoreV1().RESTClient().Post().Namespace(s.t.remote.namespace).Resource("pods").Name(s.t.remoteName()).
		SubResource(subresource).VersionedParams(opts, scheme.ParameterCodec).URL()
	exe, err := remoteExecutor(s.t.remote.config, u)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	so := remotecommand.StreamOptions{Tty: tty}
	// Only the streams the caller opened: a nil stream must stay a nil
	// interface, or the provider is asked for it.
	if in != nil {
		so.Stdin = in
	}
	if out != nil {
		so.Stdout = out
	}
	if errOut != nil {
		so.Stderr = errOut
	}
	if resize != nil {
		so.TerminalSizeQueue = sizeQueue{ctx: ctx, sizes: resize}
	}
	log := s.k.log.WithValues("pod", s.t.String(), "provider", s.t.node.provider, "copy", s.t.remoteName())
	log.V(1).Info("kubelet endpoint: "+subresource+" session", "tty", tty)
	err = exe.StreamWithContext(ctx, so)
	var exit utilexec.ExitError
	if errors.As(err, &exit) {
		return exit
	}
	if err != nil {
		log.V(1).Info("kubelet endpoint: "+subresource+" at the provider failed", "error", err.Error())
		return fmt.Errorf("%s in the copy %s at %s: %w", subresource, s.t.remoteName(), s.t.node.provider, err)
	}
	return nil
}

// remoteExecutor runs a remote command at url like kubectl: websockets, or
// SPDY when the upgrade to websockets fails.
func remoteExecutor(cfg *rest.Config, u *url.URL) (remotecommand.Executor, error) {
	spdyExec, err := remotecommand.NewSPDYExecutor(cfg, http.MethodPost, u)
	if err != nil {
		return nil, err
	}
	wsExec, err := remotecommand.NewWebSocketExecutor(cfg, http.MethodGet, u.String())
	if err != nil {
		return nil, err
	}
	return remotecommand.NewFallbackExecutor(wsExec, spdyExec, upgradeFailed)
}

// upgradeFailed: kubectl's test for falling back from websockets to SPDY.
func upgradeFailed(err error) bool {
	return httpstream.IsUpgradeFailure(err) || httpstream.IsHTTPSProxyError(err)
}

// sizeQueue passes the caller's terminal resizes on.
type sizeQueue struct {
	ctx   context.Context
	sizes <-chan remotecommand.TerminalSize
}

func (q sizeQueue) Next() *remotecommand.TerminalSize {
	select {
	case s, ok := <-q.sizes:
		if !ok {
			return nil
		}
		return &s
	case <-q.ctx.Done():
		return nil
	}
}

// PortForward copies one forwarded connection (the caller's data stream for
// port) to and from the copy's port: a connection to the provider's
// pods/portforward with one error and one data stream, as kubectl
// port-forward opens for each connection it accepts. The provider's error,
// if any, is returned, and the kubelet's server writes it to the caller's
// error stream.
func (s remoteSession) PortForward(_ context.Context, _ string, _ types.UID, port int32, stream io.ReadWriteCloser) error {
	u := s.t.remote.client.CoreV1().RESTClient().Post().Namespace(s.t.remote.namespace).Resource("pods").Name(s.t.remoteName()).
		SubResource("portforward").URL()
	dialer, err := portForwardDialer(s.t.remote.config, u)
	if err != nil {
		return err
	}
	conn, _, err := dialer.Dial(portforward.PortForwardProtocolV1Name)
	if err != nil {
		return fmt.Errorf("port-forward to the copy %s at %s: %w", s.t.remoteName(), s.t.node.provider, err)
	}
	defer conn.Close()
	conn.SetIdleTimeout(streamIdleTimeout)
	s.k.log.V(1).Info("kubelet endpoint: port-forward", "pod", s.t.String(), "provider", s.t.node.provider, "port", port)

	headers := http.Header{}
	headers.Set(corev1.StreamType, corev1.StreamTypeError)
	headers.Set(corev1.PortHeader, strconv.Itoa(int(port)))
	headers.Set(corev1.PortForwardRequestIDHeader, "0") // one request per connection
	errorStream, err := conn.CreateStream(headers)
	if err != nil {
		return fmt.Errorf("port-forward to %s: error stream: %w", s.t.node.provider, err)
	}
	_ = errorStream.Close() // read only
	remoteErr := make(chan error, 1)
	go func() {
		msg, err := io.ReadAll(errorStream)
		switch {
		case err != nil:
			remoteErr <- fmt.Errorf("reading the error stream of %s: %w", s.t.node.provider, err)
		case len(msg) > 0:
			remoteErr <- fmt.Errorf("%s: %s", s.t.node.provider, msg)
		default:
			remoteErr <- nil
		}
	}()
	headers.Set(corev1.StreamType, corev1.StreamTypeData)
	data, err := conn.CreateStream(headers)
	if err != nil {
		return fmt.Errorf("port-forward to %s: data stream: %w", s.t.node.provider, err)
	}
	remoteDone, localFailed := make(chan struct{}), make(chan struct{})
	go func() {
		_, _ = io.Copy(stream, data)
		close(remoteDone)
	}()
	go func() {
		defer data.Close() // no more from the caller: half-close towards the pod
		if _, err := io.Copy(data, stream); err != nil {
			close(localFailed)
		}
	}()
	// As kubectl: the connection is over when the pod's side is done (a
	// caller that stops sending may still be reading), or the caller's side
	// fails.
	select {
	case <-remoteDone:
		return <-remoteErr
	case <-localFailed:
		return nil
	}
}

// portForwardDialer dials the provider's pods/portforward like kubectl:
// SPDY tunnelled in websockets, or plain SPDY when that upgrade fails.
func portForwardDialer(cfg *rest.Config, u *url.URL) (httpstream.Dialer, error) {
	transport, upgrader, err := spdy.RoundTripperFor(cfg)
	if err != nil {
		return nil, err
	}
	spdyDialer := spdy.NewDialer(upgrader, &http.Client{Transport: transport}, http.MethodPost, u)
	tunnel, err := portforward.NewSPDYOverWebsocketDialer(u, cfg)
	if err != nil {
		return nil, err
	}
	return portforward.NewFallbackDialer(tunnel, spdyDialer, upgradeFailed), nil
}
