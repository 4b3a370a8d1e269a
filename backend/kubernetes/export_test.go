package kubernetes

import (
	"context"
	"fmt"
	"io"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes/scheme"

	"github.com/sandboxd/sandboxd/agent"
)

// AgentAt starts a second agent in the pod's agent container, through the
// API server's exec, that serves the directory root (an absolute path in the
// container, which must exist) and returns its client. It runs as the
// container's user, under the same isolation; its process ends when the
// client is closed. The tests use it for a directory beside the workspace;
// a session needs none, so it is API of the tests alone.
func (p *Pod) AgentAt(ctx context.Context, root string, opts ...agent.ClientOption) (*agent.Client, error) {
	u := p.b.client.CoreV1().RESTClient().Post().Resource("pods").Namespace(p.b.o.namespace).Name(p.name).SubResource("exec").
		VersionedParams(&corev1.PodExecOptions{
			Container: ContainerAgent, Command: []string{mountAgent + "/sandboxd-agent", "serve", "--root", root},
			Stdin: true, Stdout: true, Stderr: true,
		}, scheme.ParameterCodec).URL()
	s, err := p.b.stream(ctx, u, "exec in pod "+p.name, io.Discard)
	if err != nil {
		return nil, err
	}
	ag, err := agent.NewClient(s, opts...)
	if err != nil {
		s.Close()
		return nil, fmt.Errorf("kubernetes backend: agent at %s in pod %s: %w", root, p.name, err)
	}
	return ag, nil
}
