package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"

	"github.com/sandboxd/sandboxd/agent"
)

// EnvToken is the variable a listening agent (serve --listen) takes its
// token from. The agent removes it from its environment before it starts
// any command, and is not dumpable, so its commands cannot read it from
// /proc/1/environ either.
const EnvToken = "SANDBOXD_AGENT_TOKEN"

// listenToken is the token of a listening agent — the value of EnvToken,
// which it removes from the environment — or "" when addr is "" (the agent
// serves its standard input).
func listenToken(addr string) (string, error) {
	token := os.Getenv(EnvToken)
	os.Unsetenv(EnvToken)
	if addr == "" {
		return "", nil
	}
	if len(token) != agent.TokenLen {
		return "", fmt.Errorf("--listen needs a token of %d characters in $%s", agent.TokenLen, EnvToken)
	}
	return token, nil
}

// serveListener serves srv to the clients that connect to addr and
// present the token (agent.Server.ServeListener), one at a time, until the
// container ends: a listening agent is ended by deleting its pod, not by
// the end of a stream.
func serveListener(ctx context.Context, log *slog.Logger, srv *agent.Server, addr, token string) int {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		log.Error("cannot listen", "err", err)
		return 1
	}
	log.Info("listening", "address", ln.Addr().String())
	err = srv.ServeListener(ctx, ln, token)
	if err != nil && !errors.Is(err, context.Canceled) {
		log.Error("listener ended", "err", err)
		return 1
	}
	return 0
}
