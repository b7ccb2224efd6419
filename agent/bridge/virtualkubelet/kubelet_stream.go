package virtualkubelet

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"

	"github.com/virtual-kubelet/virtual-kubelet/errdefs"
	vkapi "github.com/virtual-kubelet/virtual-kubelet/node/api"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/httpstream"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/portforward"
	"k8s.io/client-go/tools/remotecommand"
	"k8s.io/client-go/transport/spdy"
	utilexec "k8s.io/utils/exec"
	"k8s.io/utils/ptr"
)

// The handlers of virtual-kubelet's kubelet API (kubelet.go) for one pod:
// vk speaks the kubelet's protocols to the API server (SPDY and websockets,
// stdin/stdout/stderr, tty and resize, port-forward stream pairs) and calls
// these with the names and the caller's streams; they reach the copy through
// the provider's API with client-go's clients, as kubectl does: websockets
// first, SPDY when the provider's API server (or a proxy before it) refuses
// the upgrade.

// containerLogs streams the copy's pods/log (vk's GetContainerLogs).
func (k *kubeletServer) containerLogs(ctx context.Context, n *providerNode, namespace, pod, container string, opts vkapi.ContainerLogOpts) (io.ReadCloser, error) {
	t, err := target(n, namespace, pod)
	if err != nil {
		return nil, err
	}
	query, _ := ctx.Value(queryKey{}).(url.Values)
	stream, err := t.remote.client.CoreV1().Pods(t.remote.namespace).GetLogs(t.remoteName(), logOptions(container, opts, query)).Stream(ctx)
	if err != nil {
		return nil, providerError(fmt.Errorf("logs from %s: %w", t.node.provider, err))
	}
	return stream, nil
}

// providerError keeps the status of the provider's answer where vk's
// handler can say it (400, 404); anything else is vk's 500.
func providerError(err error) error {
	var status apierrors.APIStatus
	if !errors.As(err, &status) {
		return err
	}
	switch status.Status().Code {
	case http.StatusBadRequest:
		return errdefs.AsInvalidInput(err)
	case http.StatusNotFound:
		return errdefs.AsNotFound(err)
	}
	return err
}

// logOptions are the provider's log options for vk's. vk reads no tailLines
// and tailLines=0 both as Tail 0: query (the request's) tells them apart,
// `kubectl logs -f --tail=0` shows new lines only.
func logOptions(container string, opts vkapi.ContainerLogOpts, query url.Values) *corev1.PodLogOptions {
	o := &corev1.PodLogOptions{Container: container, Follow: opts.Follow, Previous: opts.Previous, Timestamps: opts.Timestamps}
	if opts.Tail > 0 || query.Has("tailLines") {
		o.TailLines = ptr.To(int64(opts.Tail))
	}
	if opts.LimitBytes > 0 {
		o.LimitBytes = ptr.To(int64(opts.LimitBytes))
	}
	if opts.SinceSeconds > 0 {
		o.SinceSeconds = ptr.To(int64(opts.SinceSeconds))
	}
	if !opts.SinceTime.IsZero() {
		o.SinceTime = &metav1.Time{Time: opts.SinceTime}
	}
	return o
}

// runInContainer runs a command in the copy's container (pods/exec at the
// provider; vk's RunInContainer).
func (k *kubeletServer) runInContainer(ctx context.Context, n *providerNode, namespace, pod, container string, cmd []string, attach vkapi.AttachIO) error {
	t, err := target(n, namespace, pod)
	if err != nil {
		return err
	}
	return k.stream(ctx, t, "exec", &corev1.PodExecOptions{Container: container, Command: cmd,
		Stdin: attach.Stdin() != nil, Stdout: attach.Stdout() != nil, Stderr: attach.Stderr() != nil, TTY: attach.TTY()}, attach)
}

// attachToContainer attaches to the copy's container (pods/attach at the
// provider; vk's AttachToContainer).
func (k *kubeletServer) attachToContainer(ctx context.Context, n *providerNode, namespace, pod, container string, attach vkapi.AttachIO) error {
	t, err := target(n, namespace, pod)
	if err != nil {
		return err
	}
	return k.stream(ctx, t, "attach", &corev1.PodAttachOptions{Container: container,
		Stdin: attach.Stdin() != nil, Stdout: attach.Stdout() != nil, Stderr: attach.Stderr() != nil, TTY: attach.TTY()}, attach)
}

// stream runs pods/<subresource> of the copy with the caller's streams. A
// non-zero exit code is returned as the provider reported it: a
// utilexec.ExitError, itself and not wrapped, as vk's server tests for it
// with a type assertion before sending the caller the exit code; any other
// failure is the caller's error message.
func (k *kubeletServer) stream(ctx context.Context, t podTarget, subresource string, opts runtime.Object, attach vkapi.AttachIO) error {
	u := t.remote.client.CoreV1().RESTClient().Post().Namespace(t.remote.namespace).Resource("pods").Name(t.remoteName()).
		SubResource(subresource).VersionedParams(opts, scheme.ParameterCodec).URL()
	exe, err := remoteExecutor(t.remote.config, u)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	so := remotecommand.StreamOptions{Tty: attach.TTY()}
	// Only the streams the caller opened: a nil stream must stay a nil
	// interface, or the provider is asked for it.
	if in := attach.Stdin(); in != nil {
		so.Stdin = in
	}
	if out := attach.Stdout(); out != nil {
		so.Stdout = out
	}
	if errOut := attach.Stderr(); errOut != nil {
		so.Stderr = errOut
	}
	if sizes := attach.Resize(); sizes != nil {
		so.TerminalSizeQueue = sizeQueue{ctx: ctx, sizes: sizes}
	}
	log := k.log.WithValues("pod", t.String(), "provider", t.node.provider, "copy", t.remoteName())
	log.V(1).Info("kubelet endpoint: "+subresource+" session", "tty", attach.TTY())
	return exitError(exe.StreamWithContext(ctx, so), func(err error) error {
		log.V(1).Info("kubelet endpoint: "+subresource+" at the provider failed", "error", err.Error())
		return fmt.Errorf("%s in the copy %s at %s: %w", subresource, t.remoteName(), t.node.provider, err)
	})
}

// exitError is err's utilexec.ExitError (the command's exit code), else
// err as other makes it; nil for nil.
func exitError(err error, other func(error) error) error {
	var exit utilexec.ExitError
	switch {
	case err == nil:
		return nil
	case errors.As(err, &exit):
		return exit
	}
	return other(err)
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

// sizeQueue passes the caller's terminal resizes on. vk's channel never
// closes: once the caller's resize stream ends, vk's streaming server closes
// its own channel (internal/kubernetes/remotecommand/httpstream.go:470) and
// vk's relay (node/api/exec.go:217, attach.go:141) then sends zero sizes
// until the session ends; the first one ends the queue.
type sizeQueue struct {
	ctx   context.Context
	sizes <-chan vkapi.TermSize
}

func (q sizeQueue) Next() *remotecommand.TerminalSize {
	select {
	case s := <-q.sizes:
		if s.Width == 0 && s.Height == 0 {
			return nil
		}
		return &remotecommand.TerminalSize{Width: s.Width, Height: s.Height}
	case <-q.ctx.Done():
		return nil
	}
}

// portForward copies one forwarded connection (the caller's data stream for
// port) to and from the copy's port (vk's PortForward): a connection to the
// provider's pods/portforward with one error and one data stream, as kubectl
// port-forward opens for each connection it accepts. The provider's error,
// if any, is returned, and vk's server writes it to the caller's error
// stream.
func (k *kubeletServer) portForward(_ context.Context, n *providerNode, namespace, pod string, port int32, stream io.ReadWriteCloser) error {
	t, err := target(n, namespace, pod)
	if err != nil {
		return err
	}
	u := t.remote.client.CoreV1().RESTClient().Post().Namespace(t.remote.namespace).Resource("pods").Name(t.remoteName()).
		SubResource("portforward").URL()
	dialer, err := portForwardDialer(t.remote.config, u)
	if err != nil {
		return err
	}
	conn, _, err := dialer.Dial(portforward.PortForwardProtocolV1Name)
	if err != nil {
		return fmt.Errorf("port-forward to the copy %s at %s: %w", t.remoteName(), t.node.provider, err)
	}
	defer conn.Close()
	conn.SetIdleTimeout(k.idleTimeout)
	k.log.V(1).Info("kubelet endpoint: port-forward", "pod", t.String(), "provider", t.node.provider, "port", port)

	headers := http.Header{}
	headers.Set(corev1.StreamType, corev1.StreamTypeError)
	headers.Set(corev1.PortHeader, strconv.Itoa(int(port)))
	headers.Set(corev1.PortForwardRequestIDHeader, "0") // one request per connection
	errorStream, err := conn.CreateStream(headers)
	if err != nil {
		return fmt.Errorf("port-forward to %s: error stream: %w", t.node.provider, err)
	}
	_ = errorStream.Close() // read only
	remoteErr := make(chan error, 1)
	go func() {
		msg, err := io.ReadAll(errorStream)
		switch {
		case err != nil:
			remoteErr <- fmt.Errorf("reading the error stream of %s: %w", t.node.provider, err)
		case len(msg) > 0:
			remoteErr <- fmt.Errorf("%s: %s", t.node.provider, msg)
		default:
			remoteErr <- nil
		}
	}()
	headers.Set(corev1.StreamType, corev1.StreamTypeData)
	data, err := conn.CreateStream(headers)
	if err != nil {
		return fmt.Errorf("port-forward to %s: data stream: %w", t.node.provider, err)
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
