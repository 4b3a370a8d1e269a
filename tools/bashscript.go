package tools

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"path"
	"strings"

	"github.com/sandboxd/sandboxd/workspace"
)

// What a bash call runs: the model's command, preceded, when bashKeepState
// is set, by the lines that carry the working directory and the exported
// variables over from the call before; and, when that is longer than an
// argument may be, passed in a file rather than on the command line.

// InlineScriptMax is the longest script passed to the shell as its -c
// argument. A longer one is written to a file of RuntimeDir and sourced from
// there, so the kernel's limit on one argument (MAX_ARG_STRLEN, 128 KiB)
// and the agent's frame (1 MiB) never bound a command: only maxFileBytes
// does.
const InlineScriptMax = 64 << 10

// RuntimeDir is where the tools keep what a session's commands need between
// calls (the bash state, long scripts): sandboxd's bookkeeping, under
// .sandboxd (protected, excluded, never delivered, ignored by git).
const RuntimeDir = workspace.BookkeepingDir + "/runtime"

// stateFile is where bashKeepState keeps the working directory and the
// exported variables between calls: shell lines that the next call sources.
const stateFile = RuntimeDir + "/bash-state"

// script returns what the shell runs for command, and a function that
// removes what it wrote for it (a long script's file). save says whether the
// command's state is kept for the next call (a foreground one; a background
// command starts from the kept state but does not change it).
func (s *Set) script(ctx context.Context, command string, save bool) (string, func(), error) {
	full := command
	if s.cfg.BashKeepState && s.notBash() == "" {
		full = statePrefix(save) + command
		if save { // where the command writes its state, ignored by git
			if err := workspace.Bookkeeping(ctx, s.env.FS, RuntimeDir, 0o755); err != nil {
				return "", nil, err
			}
		}
	}
	if int64(len(full)) > s.cfg.MaxFileBytes {
		return "", nil, invalid("command is %s, over the %s a command may be (maxFileBytes): put it in a file with write and run that", kb(int64(len(full))), kb(s.cfg.MaxFileBytes))
	}
	if len(full) <= InlineScriptMax {
		return full, func() {}, nil
	}
	var rnd [8]byte
	_, _ = rand.Read(rnd[:])
	name := path.Join(RuntimeDir, "scripts", "bash-"+hex.EncodeToString(rnd[:])+".sh")
	if err := workspace.Bookkeeping(ctx, s.env.FS, path.Dir(name), 0o755); err != nil {
		return "", nil, err
	}
	// The file removes itself first, on the command's first line (so its
	// line numbers are its own): a shell has it open (bash has read it
	// whole), and the command never sees it.
	if err := s.env.FS.WriteFile(ctx, name, []byte("rm -f -- '"+name+"'; "+full), 0o600); err != nil {
		return "", nil, err
	}
	// Removed after the command too (best effort): it removed itself unless
	// the shell never started.
	remove := func() { _ = s.env.FS.Remove(context.WithoutCancel(ctx), name) }
	return ". '" + name + "'", remove, nil
}

// statePrefix is the line that goes before a command under bashKeepState:
// it notes the exported variables the command starts with, restores the
// state the last call kept (a cd and exports), and — when save is set —
// sets an EXIT trap that writes the state anew: the working directory, and
// each exported variable that differs from what the call was given (or was
// removed). It is one line, so the command's line numbers are its own. A
// command that replaces the EXIT trap, or is killed, keeps no state.
func statePrefix(save bool) string {
	var b strings.Builder
	b.WriteString(`__sandboxd_state="$PWD/` + stateFile + `"; declare -A __sandboxd_env0; for __sandboxd_n in $(compgen -e); do __sandboxd_env0[$__sandboxd_n]=${!__sandboxd_n}; done; `)
	if save {
		b.WriteString(`__sandboxd_save() { local n; mkdir -p "${__sandboxd_state%/*}" && { printf 'cd -- %q 2>/dev/null || true\n' "$PWD"; ` +
			`for n in $(compgen -e); do case $n in PWD|OLDPWD|SHLVL|_|__sandboxd_*) continue;; esac; ` +
			`if [[ ! -v "__sandboxd_env0[$n]" || "${__sandboxd_env0[$n]}" != "${!n}" ]]; then printf 'export %s=%q\n' "$n" "${!n}"; fi; done; ` +
			`for n in "${!__sandboxd_env0[@]}"; do [[ -v $n ]] || printf 'unset %s\n' "$n"; done; } > "$__sandboxd_state.$$" && mv -f "$__sandboxd_state.$$" "$__sandboxd_state"; }; ` +
			`trap __sandboxd_save EXIT; `)
	}
	b.WriteString(`[ -r "$__sandboxd_state" ] && . "$__sandboxd_state"; unset __sandboxd_n; `)
	return b.String()
}

// statelessNote is what the bash tool's description says of state between
// calls, under s's settings.
func (s *Set) statelessNote() string {
	if s.cfg.BashKeepState && s.notBash() == "" {
		return " The working directory and exported variables carry over from one call to the next (other shell variables, functions and options do not; a command killed, or that sets its own EXIT trap, keeps none)."
	}
	return " Each call is a new shell in the workspace root: cd, exported variables and other shell state are gone by the next call (chain commands with && in one call, or use paths from the root)."
}
