package agent

import (
	"context"
	"crypto/subtle"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"sync"
	"time"
)

// TokenLen is the length of a listening agent's token: 64 hex digits (32
// random bytes).
const TokenLen = 64

// preambleLen is the length of what a client sends before the protocol on
// a listening agent's connection: the token, the epoch in 16 hex digits, a
// newline.
const preambleLen = TokenLen + 16 + 1

// Preamble is what a client sends first on a connection to a listening
// agent (ServeListener): the agent's token and the connection's epoch. The
// agent serves the connection only if the token is its own and the epoch
// is above that of every connection it served before.
func Preamble(token string, epoch uint64) ([]byte, error) {
	if len(token) != TokenLen {
		return nil, fmt.Errorf("agent token: %d characters, want %d", len(token), TokenLen)
	}
	return fmt.Appendf(nil, "%s%016x\n", token, epoch), nil
}

// ServeListener serves the client of one connection of ln at a time, until
// ctx ends or ln fails. A connection must first send the Preamble of token
// (an agent's secret, TokenLen characters, compared in constant time) and
// an epoch above every one served before, within ten seconds; one that does
// not is closed unanswered. An accepted connection replaces the one being
// served: that one is closed and its calls in flight are cancelled (their
// commands killed, as Serve does) before the new one is served, so that
// exactly one client — the one of the highest epoch — drives the agent.
// The host uses it for a direct connection to an agent in a pod, and so a
// daemon that takes a session over from another gets a clean stream.
func (s *Server) ServeListener(ctx context.Context, ln net.Listener, token string) error {
	if len(token) != TokenLen {
		return fmt.Errorf("agent token: %d characters, want %d", len(token), TokenLen)
	}
	stop := context.AfterFunc(ctx, func() { ln.Close() })
	defer stop()
	var (
		mu      sync.Mutex // held while a connection takes over
		epoch   uint64
		current context.CancelFunc
		served  chan struct{}
		wg      sync.WaitGroup
	)
	defer wg.Wait()
	for {
		conn, err := ln.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			return err
		}
		wg.Go(func() {
			e, ok := readPreamble(conn, token)
			mu.Lock()
			if !ok || e <= epoch {
				mu.Unlock()
				s.opts.log.Warn("agent: connection refused", "remote", conn.RemoteAddr().String(), "authenticated", ok)
				conn.Close()
				return
			}
			epoch = e
			if current != nil {
				current()
				<-served
			}
			cctx, cancel := context.WithCancel(ctx)
			done := make(chan struct{})
			current, served = cancel, done
			mu.Unlock()
			defer close(done)
			defer cancel()
			s.opts.log.Info("agent: serving a connection", "remote", conn.RemoteAddr().String(), "epoch", e)
			if err := s.Serve(cctx, conn); err != nil && cctx.Err() == nil {
				s.opts.log.Warn("agent: connection ended", "err", err)
			}
			conn.Close()
		})
	}
}

// readPreamble reads a connection's preamble and reports its epoch and
// whether its token is token.
func readPreamble(conn net.Conn, token string) (uint64, bool) {
	conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	defer conn.SetReadDeadline(time.Time{})
	var buf [preambleLen]byte
	if _, err := io.ReadFull(conn, buf[:]); err != nil || buf[preambleLen-1] != '\n' {
		return 0, false
	}
	if subtle.ConstantTimeCompare(buf[:TokenLen], []byte(token)) != 1 {
		return 0, false
	}
	e, err := strconv.ParseUint(string(buf[TokenLen:preambleLen-1]), 16, 64)
	return e, err == nil
}
