package kubernetes

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/sandboxd/sandboxd/agent"
	"github.com/sandboxd/sandboxd/workspace"
)

// AgentPort is the TCP port a session pod's agent listens on when the
// stream is direct (WithDirect).
const AgentPort = 7411

// envAgentToken is the variable the agent takes its token from (the
// agent's serve --listen); it removes it from its environment at start.
const envAgentToken = "SANDBOXD_AGENT_TOKEN"

// secretKey is the key of the token in a session's Secret.
const secretKey = "token"

// WithDirect makes the agent's stream a TCP connection from the daemon to
// the pod's address (AgentPort) in place of an attach through the API
// server: a round trip costs the network's, not the API server's and the
// kubelet's. The daemon must reach pod addresses (it runs in the cluster,
// or on a node), and the cluster's NetworkPolicies must let it in
// (deploy/kubernetes has the rule). The agent serves only a client that
// presents the session's token: 32 random bytes, kept in a Secret of the
// pod's name (owned by the pod, so it goes with it) and given to the agent
// in its environment, which the agent clears before it runs a command.
// The pod has no standard input: it ends when it is deleted.
func WithDirect() Option { return func(o *options) { o.direct = true } }

// directSpec makes pod a pod of the direct stream: its agent listens on
// AgentPort and takes its token from a Secret, which it creates.
func (p *Pod) directSpec(ctx context.Context, pod *corev1.Pod) error {
	var raw [agent.TokenLen / 2]byte
	rand.Read(raw[:])
	p.token, p.epoch = hex.EncodeToString(raw[:]), 1
	secret := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: p.name, Labels: pod.Labels},
		Data:       map[string][]byte{secretKey: []byte(p.token)},
		Type:       corev1.SecretTypeOpaque,
	}
	if _, err := p.b.client.CoreV1().Secrets(p.b.o.namespace).Create(ctx, secret, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("kubernetes backend: create the Secret of pod %s: %w", p.name, err)
	}
	pod.Annotations[annotationEpoch] = "1"
	c := &pod.Spec.Containers[0]
	c.Command = append(c.Command, "--listen", ":"+strconv.Itoa(AgentPort))
	c.Stdin, c.StdinOnce = false, false
	c.Ports = []corev1.ContainerPort{{Name: "agent", ContainerPort: AgentPort, Protocol: corev1.ProtocolTCP}}
	c.Env = append(c.Env, corev1.EnvVar{Name: envAgentToken, ValueFrom: &corev1.EnvVarSource{
		SecretKeyRef: &corev1.SecretKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: p.name}, Key: secretKey},
	}})
	return nil
}

// ownSecret makes the pod the owner of its Secret, so that the cluster
// deletes the Secret with the pod, whoever deletes it.
func (p *Pod) ownSecret(ctx context.Context, pod *corev1.Pod) error {
	patch := fmt.Sprintf(`{"metadata":{"ownerReferences":[{"apiVersion":"v1","kind":"Pod","name":%q,"uid":%q}]}}`, pod.Name, pod.UID)
	_, err := p.b.client.CoreV1().Secrets(p.b.o.namespace).Patch(ctx, p.name, types.MergePatchType, []byte(patch), metav1.PatchOptions{})
	if err != nil {
		return fmt.Errorf("kubernetes backend: give the Secret of pod %s to the pod: %w", p.name, err)
	}
	return nil
}

// deleteSecret deletes the pod's Secret, if it has one.
func (p *Pod) deleteSecret(ctx context.Context) {
	if p.token == "" {
		return
	}
	err := p.b.client.CoreV1().Secrets(p.b.o.namespace).Delete(ctx, p.name, metav1.DeleteOptions{})
	if err != nil && !apierrors.IsNotFound(err) && p.b.o.stderr != nil {
		fmt.Fprintf(p.b.o.stderr, "kubernetes backend: delete the Secret of pod %s (its owner reference removes it with the pod): %v\n", p.name, err)
	}
}

// connect connects to the pod's listening agent and completes the agent's
// handshake: it dials until the agent listens (it starts a moment after its
// container), sends the token and p's epoch, and fails as soon as the agent
// refuses it.
func (p *Pod) connect(ctx context.Context) error {
	if p.ip == "" {
		return fmt.Errorf("kubernetes backend: pod %s runs but has no address: %w", p.name, workspace.ErrUnavailable)
	}
	pre, err := agent.Preamble(p.token, p.epoch)
	if err != nil {
		return err
	}
	addr := net.JoinHostPort(p.ip, strconv.Itoa(AgentPort))
	var d net.Dialer
	for delay := 5 * time.Millisecond; ; delay = min(2*delay, 250*time.Millisecond) {
		conn, err := d.DialContext(ctx, "tcp", addr)
		if err == nil {
			if _, err = conn.Write(pre); err != nil {
				conn.Close()
				return fmt.Errorf("kubernetes backend: agent of pod %s at %s: %w: %w", p.name, addr, err, workspace.ErrUnavailable)
			}
			opts := append([]agent.ClientOption{agent.WithEndExplained(p.explainEnd), agent.WithHangup(p.kill)}, p.b.o.agentOptions...)
			ag, err := agent.NewClient(conn, opts...)
			if err != nil {
				return fmt.Errorf("kubernetes backend: agent of pod %s at %s: %w%s", p.name, addr, err, p.state(context.WithoutCancel(ctx)))
			}
			p.agent = ag
			return nil
		}
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("kubernetes backend: agent of pod %s at %s does not answer: %w (%w)%s", p.name, addr, err, ctx.Err(), p.state(context.WithoutCancel(ctx)))
		case <-t.C:
		}
	}
}

// explainEnd says why the stream of a direct agent ended: another replica
// took the pod over (which marks p moved), or how the pod ended.
func (p *Pod) explainEnd() string {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	pod, err := p.b.client.CoreV1().Pods(p.b.o.namespace).Get(ctx, p.name, metav1.GetOptions{})
	if err == nil && pod.DeletionTimestamp == nil {
		if e, _ := strconv.ParseUint(pod.Annotations[annotationEpoch], 10, 64); e > p.epoch {
			p.moved.Store(true)
			return fmt.Sprintf(" (replica %s took the session over)", pod.Annotations[LabelReplica])
		}
	}
	return p.endState()
}
