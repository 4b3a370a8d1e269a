package tools

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strings"
)

// EgressTracer traces the network connections of the commands a Set runs
// (bash, a background command, workspace_exec) through the session's
// egress: each command's environment names its call to the egress proxy,
// and its result lists what the proxy decided for the connections it made
// (EgressDecision). The daemon's sessions have one where commands have no
// network of their own but the proxy (package runner); elsewhere Env's is
// nil, and results carry no egress.
type EgressTracer interface {
	// TraceEgress begins tracing the commands of the call named call.
	TraceEgress(call string) EgressTrace
}

// EgressTrace is the trace of one call's commands.
type EgressTrace interface {
	// Env is what the commands' environment needs: the proxy's variables
	// naming the call, and what trusts the proxy's certificates. It is
	// empty while the session has no egress.
	Env() map[string]string
	// Take returns the decisions made for the commands' connections since
	// the last Take. With ended (the commands have ended), it first waits
	// a little, or until ctx ends, for the connections still open to end,
	// and reports those that do not as open.
	Take(ctx context.Context, ended bool) []EgressDecision
	// Off says why commands have no network, when that is why one failed
	// to reach a host: no egress at all, or only through the proxy.
	Off() string
	// Close forgets the trace.
	Close()
}

// EgressDecision is what the egress proxy decided for the connections a
// command made to one destination with one outcome (they are counted
// together). It never holds a URL's path, a header or a secret's value.
type EgressDecision struct {
	Host string `json:"host"`
	Port int    `json:"port"`
	// Outcome is ok, refused (the policy, or a secret's destinations),
	// failed (allowed but not reached), capped (the session's byte cap),
	// cut (the policy changed while it was open), or open (still open
	// when the result was made).
	Outcome string `json:"outcome"`
	// Reason says why it was refused, failed or cut.
	Reason string `json:"reason,omitempty"`
	// Connections counts them.
	Connections int   `json:"connections"`
	BytesUp     int64 `json:"bytesUp"`
	BytesDown   int64 `json:"bytesDown"`
	// Inspected says the proxy terminated their TLS to put secrets in (or
	// inspects every destination).
	Inspected bool `json:"inspected,omitempty"`
	// Secrets names the secrets put into their requests.
	Secrets []string `json:"secrets,omitempty"`
}

// egressTrace begins the trace of a command of c, or returns nil when the
// session has no tracer.
func (s *Set) egressTrace(c *call) EgressTrace {
	if s.env.Egress == nil {
		return nil
	}
	return s.env.Egress.TraceEgress(c.callID)
}

// egressNotes is what a command's result tells the model of its
// connections: one line per decision that is not a plain success, and a
// line on the sandbox's network when the output shows a program that
// could not resolve or reach a host.
func egressNotes(tr EgressTrace, decisions []EgressDecision, output string) []string {
	if tr == nil {
		return nil
	}
	var notes []string
	var ok []string
	for _, d := range decisions {
		hp := fmt.Sprintf("%s:%d", d.Host, d.Port)
		what := fmt.Sprintf("%s %s", hp, d.Outcome)
		if d.Connections > 1 {
			what += fmt.Sprintf(" (%d connections)", d.Connections)
		}
		if len(d.Secrets) > 0 {
			what += ", secret " + strings.Join(d.Secrets, ", ") + " put in"
		}
		switch d.Outcome {
		case "ok", "open":
			ok = append(ok, what)
		case "refused":
			notes = append(notes, fmt.Sprintf("[Egress: %s: %s. The sandbox's egress policy decides this, and only its operator can change it (egress.allow); retrying another way will not work.]", what, d.Reason))
		default:
			notes = append(notes, fmt.Sprintf("[Egress: %s: %s.]", what, d.Reason))
		}
	}
	if len(ok) > 0 {
		notes = append([]string{"[Egress: " + strings.Join(ok, "; ") + ".]"}, notes...)
	}
	if off := tr.Off(); off != "" && unreachable(output) {
		notes = append(notes, "["+off+"]")
	}
	return notes
}

// unreachableSigns are what programs print when they could not resolve a
// name or reach a host by themselves.
var unreachableSigns = []string{
	"could not resolve host", "temporary failure in name resolution", "name or service not known",
	"no such host", "getaddrinfo", "eai_again", "enotfound", "network is unreachable",
	"failed to establish a new connection", "name resolution", "couldn't resolve",
}

func unreachable(output string) bool {
	low := strings.ToLower(output)
	return slices.ContainsFunc(unreachableSigns, func(s string) bool { return strings.Contains(low, s) })
}

// MergeEgress adds decisions to into, counting those of one destination
// and outcome together (the order of first appearance is kept).
func MergeEgress(into []EgressDecision, decisions ...EgressDecision) []EgressDecision {
	for _, d := range decisions {
		i := slices.IndexFunc(into, func(o EgressDecision) bool {
			return o.Host == d.Host && o.Port == d.Port && o.Outcome == d.Outcome && o.Reason == d.Reason
		})
		if i < 0 {
			d.Secrets = slices.Clone(d.Secrets)
			d.Connections = cmp.Or(d.Connections, 1)
			into = append(into, d)
			continue
		}
		o := &into[i]
		o.Connections += cmp.Or(d.Connections, 1)
		o.BytesUp += d.BytesUp
		o.BytesDown += d.BytesDown
		o.Inspected = o.Inspected || d.Inspected
		for _, n := range d.Secrets {
			if !slices.Contains(o.Secrets, n) {
				o.Secrets = append(o.Secrets, n)
			}
		}
	}
	return into
}
