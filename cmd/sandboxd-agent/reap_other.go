//go:build !linux

package main

import (
	"context"
	"log/slog"
)

const probeEnv = "SANDBOXD_AGENT_PROBE"

// reapOrphans does nothing: the agent is PID 1 of Linux containers only.
func reapOrphans(context.Context, *slog.Logger, bool) {}

// probePidfds reports false: there are no pidfds.
func probePidfds() bool { return false }

// undumpable does nothing: ptrace protection is Linux's PR_SET_DUMPABLE.
func undumpable() error { return nil }
