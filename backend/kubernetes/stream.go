package kubernetes

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/url"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/remotecommand"
	"k8s.io/streaming/pkg/httpstream"

	"github.com/sandboxd/sandboxd/agent"
)

// Stream protocols of the attach stream (WithStreamProtocol).
const (
	// StreamWebSocket is WebSocket (remotecommand v5), falling back to SPDY
	// where the API server refuses the upgrade, as kubectl does.
	StreamWebSocket = "websocket"
	// StreamSPDY is SPDY alone.
	StreamSPDY = "spdy"
)

// WithStreamProtocol picks the attach stream's protocol: StreamWebSocket
// (the default) or StreamSPDY.
func WithStreamProtocol(p string) Option { return func(o *options) { o.protocol = p } }

// attachStream is the agent's stream over an attach (or exec) of the pod's
// agent container through the API server: writes go to the agent's standard
// input, reads come from its standard output, its standard error goes to a
// sink.
type attachStream struct {
	inR  *io.PipeReader
	inW  *io.PipeWriter
	outR *io.PipeReader
	outW *io.PipeWriter

	cancel context.CancelFunc
	done   chan struct{}
	once   sync.Once
}

func (s *attachStream) Read(p []byte) (int, error)  { return s.outR.Read(p) }
func (s *attachStream) Write(p []byte) (int, error) { return s.inW.Write(p) }

// Close ends PID 1's input — the pod keeps stdin open for one attach only
// (stdinOnce), so the agent sees its input end and exits — and, once the
// stream has ended or a few seconds have passed, drops the connection.
func (s *attachStream) Close() error {
	s.once.Do(func() {
		s.inW.Close()
		s.outR.CloseWithError(errors.New("attach stream closed"))
		select {
		case <-s.done:
		case <-time.After(5 * time.Second):
		}
		s.cancel()
	})
	return nil
}

// attach opens the attach stream of the agent container of pod.
func (b *Backend) attach(ctx context.Context, pod string, stderr io.Writer) (*attachStream, error) {
	u := b.client.CoreV1().RESTClient().Post().Resource("pods").Namespace(b.o.namespace).Name(pod).SubResource("attach").
		VersionedParams(&corev1.PodAttachOptions{Container: ContainerAgent, Stdin: true, Stdout: true, Stderr: true}, scheme.ParameterCodec).URL()
	return b.stream(ctx, u, "attach to pod "+pod, stderr)
}

// stream opens the remotecommand stream of u (an attach or exec URL).
func (b *Backend) stream(ctx context.Context, u *url.URL, what string, stderr io.Writer) (*attachStream, error) {
	exec, err := b.executor(u)
	if err != nil {
		return nil, fmt.Errorf("kubernetes backend: %s: %w", what, err)
	}
	s := &attachStream{done: make(chan struct{})}
	s.inR, s.inW = io.Pipe()
	s.outR, s.outW = io.Pipe()
	// The stream outlives the call that opened it: it ends with Close.
	sctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	s.cancel = cancel
	go func() {
		defer close(s.done)
		err := exec.StreamWithContext(sctx, remotecommand.StreamOptions{Stdin: s.inR, Stdout: s.outW, Stderr: agent.LogSink(stderr)})
		if err == nil {
			err = io.EOF
		} else {
			err = fmt.Errorf("%s: %w", what, err)
		}
		s.outW.CloseWithError(err)
		// Writes from now on fail, and so does one that waits; the
		// executor's copy of stdin, if it still runs, sees EOF.
		s.inW.Close()
	}()
	return s, nil
}

// executor is the remotecommand executor of the attach URL u in the
// configured protocol.
func (b *Backend) executor(u *url.URL) (remotecommand.Executor, error) {
	spdy, err := remotecommand.NewSPDYExecutor(b.config, "POST", u)
	if err != nil || b.o.protocol == StreamSPDY {
		return spdy, err
	}
	ws, err := remotecommand.NewWebSocketExecutor(b.config, "GET", u.String())
	if err != nil {
		return nil, err
	}
	return remotecommand.NewFallbackExecutor(ws, spdy, func(err error) bool {
		return httpstream.IsUpgradeFailure(err) || httpstream.IsHTTPSProxyError(err)
	})
}
