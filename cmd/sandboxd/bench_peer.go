package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// fsserverModule is the peer the local backend's small-file calls are held
// to (issue 31): mcp-filesystem-server, a plain MCP file server over os
// calls, with neither a journal nor a confined open. bench builds it from
// the module proxy at run time, into a temporary directory; it is not a
// dependency of this module.
const (
	fsserverModule  = "github.com/mark3labs/mcp-filesystem-server"
	fsserverVersion = "v0.11.1"
)

// peerFileLines and peerLineBytes make the 4 KB file the peer pairs read,
// write and edit.
const (
	peerFileLines = 64
	peerLineBytes = 64
)

// peerText is the 4 KB file's text: peerFileLines lines of peerLineBytes,
// the first saying which call wrote it, the tenth saying word.
func peerText(call int, word string) string {
	var b strings.Builder
	for n := range peerFileLines {
		head := fmt.Sprintf("%02d ", n)
		switch n {
		case 0:
			head += fmt.Sprintf("written by call %d ", call)
		case 10:
			head += word + " "
		}
		b.WriteString(head)
		b.WriteString(strings.Repeat("x", max(0, peerLineBytes-1-len(head))))
		b.WriteByte('\n')
	}
	return b.String()
}

// peerPair is one call timed on both servers, interleaved call by call.
type peerPair struct {
	name         string
	ours, theirs benchStats
}

// peerRun is what benchPeer measured: the pairs, and the floors of the
// guarantee sandboxd's write keeps and the peer's does not (the atomic,
// flushed replacement), timed in this process in the same run.
type peerRun struct {
	// skipped, when not empty, says why there are no pairs.
	skipped string
	peer    string // the peer's module@version, or its binary
	tools   map[string]string
	pairs   []peerPair
	floors  []benchFloor
}

// benchPeer holds the local backend's read, write and edit of a 4 KB file
// to mcp-filesystem-server's, both spawned and spoken to over standard
// input and output, each over a directory of its own holding the same file,
// the calls interleaved one by one (the first of each pair alternating).
// The peer's tools are found by their names and arguments in its tools/list
// answer. Where the peer cannot be had (no Go toolchain, no module proxy),
// the run says why in skipped, and the rest of bench goes on.
func benchPeer(ctx context.Context, sio stdio, exe string, o benchOptions) (peerRun, error) {
	run := peerRun{peer: o.peer}
	bin := o.peer
	if !strings.ContainsRune(o.peer, filepath.Separator) {
		run.peer = fsserverModule + "@" + o.peer
		fmt.Fprintf(sio.err, "sandboxd bench: building %s from the module proxy…\n", run.peer)
		dir, err := os.MkdirTemp("", "sandboxd-bench-peer-")
		if err != nil {
			return run, err
		}
		defer os.RemoveAll(dir)
		if bin, err = buildFSServer(ctx, dir, o.peer); err != nil {
			run.skipped = fmt.Sprintf("%s could not be built (%v); pass --fsserver PATH to a built one", run.peer, err)
			return run, nil
		}
	}

	var dirs [2]string
	for i := range dirs {
		d, err := os.MkdirTemp("", "sandboxd-bench-peer-ws-")
		if err != nil {
			return run, err
		}
		defer os.RemoveAll(d)
		// The peer checks names against its directory after resolving
		// links: give it the real one.
		if dirs[i], err = filepath.EvalSymlinks(d); err != nil {
			return run, err
		}
		if err := os.WriteFile(filepath.Join(dirs[i], "note.txt"), []byte(peerText(0, "alpha")), 0o644); err != nil {
			return run, err
		}
	}
	ours, err := startBench(ctx, exe, "mcp", "--backend", "local", "--workspace", dirs[0], "--grant", "fs.write", "--always", "read,edit")
	if err != nil {
		return run, err
	}
	defer ours.close()
	theirs, err := startBench(ctx, bin, dirs[1])
	if err != nil {
		return run, fmt.Errorf("%s: %w", run.peer, err)
	}
	theirs.who = filepath.Base(bin)
	defer theirs.close()
	if run.tools, err = peerTools(theirs); err != nil {
		run.skipped = fmt.Sprintf("%s: %v", run.peer, err)
		return run, nil
	}

	theirPath := filepath.Join(dirs[1], "note.txt")
	edit := func(i int) (from, to string) {
		from, to = "10 alpha ", "10 omega "
		if i%2 == 1 {
			from, to = to, from
		}
		return from, to
	}
	// A side is one server's call, or (beside the write) one of the write
	// floors; each op's sides take turns going first.
	type side struct {
		c    *benchClient
		tool string
		args func(i int) any
		f    func() error // a floor, in this process
	}
	floorSteps := writeFloors(dirs[0])
	writeSides := []side{
		{c: ours, tool: "write", args: func(i int) any { return map[string]any{"path": "note.txt", "content": peerText(i, "alpha")} }},
		{c: theirs, tool: run.tools["write"], args: func(i int) any { return map[string]any{"path": theirPath, "content": peerText(i, "alpha")} }},
	}
	for _, s := range floorSteps {
		writeSides = append(writeSides, side{f: s.f})
	}
	ops := []struct {
		name  string
		sides []side
	}{
		{"read a 4 KB file", []side{
			{c: ours, tool: "read", args: func(int) any { return map[string]any{"path": "note.txt"} }},
			{c: theirs, tool: run.tools["read"], args: func(int) any { return map[string]any{"path": theirPath} }}}},
		{"write a 4 KB file", writeSides},
		{"edit one line of it", []side{
			{c: ours, tool: "edit", args: func(i int) any {
				from, to := edit(i)
				return map[string]any{"path": "note.txt", "edits": []map[string]string{{"oldText": from, "newText": to}}}
			}},
			{c: theirs, tool: run.tools["edit"], args: func(i int) any {
				from, to := edit(i)
				if run.tools["edit"] == "edit_file" {
					return map[string]any{"path": theirPath, "edits": []map[string]string{{"oldText": from, "newText": to}}}
				}
				return map[string]any{"path": theirPath, "find": from, "replace": to, "all_occurrences": false}
			}}}},
	}
	call := func(s side, i int) error {
		if s.f != nil {
			return s.f()
		}
		if err := s.c.callTool(s.tool, s.args(i)); err != nil {
			return fmt.Errorf("%s %s: %w", s.c.who, s.tool, err)
		}
		return nil
	}
	for _, op := range ops {
		durs := make([][]time.Duration, len(op.sides))
		for i := range o.calls + 4 {
			for k := range op.sides {
				j := (i + k) % len(op.sides)
				start := time.Now()
				if err := call(op.sides[j], i); err != nil {
					return run, err
				}
				if i >= 4 { // the first calls warm up: they load code and fill caches
					durs[j] = append(durs[j], time.Since(start))
				}
			}
		}
		run.pairs = append(run.pairs, peerPair{op.name, statsOf(durs[0]), statsOf(durs[1])})
		if len(durs) > 2 {
			for j, s := range floorSteps {
				run.floors = append(run.floors, benchFloor{s.name, statsOf(durs[2+j])})
			}
		}
	}
	return run, errors.Join(ours.close(), theirs.close())
}

// buildFSServer builds mcp-filesystem-server at version into dir, in a
// module of its own there that requires it (go install of a module whose
// version list the proxy withholds fails on the deprecation check), and
// returns the binary's path.
func buildFSServer(ctx context.Context, dir, version string) (string, error) {
	goBin, err := exec.LookPath("go")
	if err != nil {
		return "", errors.New("no go command on PATH")
	}
	mod := fmt.Sprintf("module sandboxd-bench-peer\n\ngo 1.24\n\nrequire %s %s\n", fsserverModule, version)
	if err := os.WriteFile(filepath.Join(dir, "go.mod"), []byte(mod), 0o644); err != nil {
		return "", err
	}
	bin := filepath.Join(dir, "mcp-filesystem-server")
	ctx, cancel := context.WithTimeout(ctx, 10*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, goBin, "build", "-mod=mod", "-o", bin, fsserverModule)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GOWORK=off", "GOFLAGS=-mod=mod")
	if out, err := cmd.CombinedOutput(); err != nil {
		msg := strings.TrimSpace(string(out))
		if i := strings.LastIndexByte(msg, '\n'); i >= 0 {
			msg = msg[i+1:]
		}
		return "", fmt.Errorf("go build: %w: %s", err, msg)
	}
	return bin, nil
}

// peerTools finds, in the peer's tools/list, the tools that read, write
// and edit a file: read_file and write_file taking a path (and content),
// and edit_file taking edits or modify_file taking find and replace.
func peerTools(c *benchClient) (map[string]string, error) {
	raw, err := c.request("tools/list", map[string]any{})
	if err != nil {
		return nil, err
	}
	var list struct {
		Tools []struct {
			Name   string `json:"name"`
			Schema struct {
				Properties map[string]json.RawMessage `json:"properties"`
			} `json:"inputSchema"`
		} `json:"tools"`
	}
	if err := json.Unmarshal(raw, &list); err != nil {
		return nil, fmt.Errorf("tools/list: %w", err)
	}
	takes := func(name string, args ...string) bool {
		for _, t := range list.Tools {
			if t.Name == name {
				return !slices.ContainsFunc(args, func(a string) bool { _, ok := t.Schema.Properties[a]; return !ok })
			}
		}
		return false
	}
	found := map[string]string{}
	for _, want := range []struct {
		op, name string
		args     []string
	}{
		{"read", "read_file", []string{"path"}},
		{"read", "read_text_file", []string{"path"}},
		{"write", "write_file", []string{"path", "content"}},
		{"edit", "edit_file", []string{"path", "edits"}},
		{"edit", "modify_file", []string{"path", "find", "replace"}},
	} {
		if _, ok := found[want.op]; !ok && takes(want.name, want.args...) {
			found[want.op] = want.name
		}
	}
	for _, op := range []string{"read", "write", "edit"} {
		if found[op] == "" {
			return nil, fmt.Errorf("its tools/list offers no tool to %s a file that bench knows", op)
		}
	}
	return found, nil
}

// writeFloor is a step of a 4 KB write, timed in this process.
type writeFloor struct {
	name string
	f    func() error
}

// writeFloors are the steps of a 4 KB write to the file system in dir with
// and without the guarantees localfs's write keeps: os.WriteFile (the
// peer's: in place, not flushed), a temporary file renamed over the target
// (atomic, not flushed), the same with the file flushed before the rename,
// and with the directory flushed after it too (what localfs.WriteFile
// does: the rename itself outlives a crash).
func writeFloors(dir string) []writeFloor {
	data := []byte(peerText(0, "alpha"))
	target := filepath.Join(dir, "floor.txt")
	atomic := func(sync, syncDir bool) func() error {
		return func() error {
			tmp := filepath.Join(dir, ".floor.txt.tmp")
			f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
			if err != nil {
				return err
			}
			_, err = f.Write(data)
			if sync && err == nil {
				err = f.Sync()
			}
			if err = errors.Join(err, f.Close()); err == nil {
				err = os.Rename(tmp, target)
			}
			if err != nil {
				os.Remove(tmp)
				return err
			}
			if syncDir {
				d, err := os.Open(dir)
				if err != nil {
					return err
				}
				defer d.Close()
				return d.Sync()
			}
			return nil
		}
	}
	return []writeFloor{
		{"4 KB `os.WriteFile` (in place, not flushed: the peer's write)", func() error { return os.WriteFile(target, data, 0o644) }},
		{"4 KB temporary file renamed over the target, not flushed", atomic(false, false)},
		{"4 KB temporary file, fsync, rename", atomic(true, false)},
		{"4 KB temporary file, fsync, rename, fsync of the directory (localfs's write)", atomic(true, true)},
	}
}

// printPeer writes benchPeer's tables: the pairs with their ratios, and the
// write floors.
func printPeer(w io.Writer, run peerRun) {
	fmt.Fprintln(w)
	if run.skipped != "" {
		fmt.Fprintf(w, "The local backend against mcp-filesystem-server: skipped: %s.\n", run.skipped)
		return
	}
	fmt.Fprintf(w, "The local backend against %s (its %s, %s, %s), a 4 KB file, calls interleaved:\n\n",
		run.peer, run.tools["read"], run.tools["write"], run.tools["edit"])
	fmt.Fprintln(w, "| local against mcp-filesystem-server | local median | local p90 | mcp-filesystem-server median | mcp-filesystem-server p90 | ratio of medians |")
	fmt.Fprintln(w, "| --- | --- | --- | --- | --- | --- |")
	for _, p := range run.pairs {
		fmt.Fprintf(w, "| %s | %s | %s | %s | %s | %s |\n", p.name, ms(p.ours.median), ms(p.ours.p90), ms(p.theirs.median), ms(p.theirs.p90), ratio(p.ours.median, p.theirs.median))
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "| write floor, in process, interleaved with the writes | median | p90 |")
	fmt.Fprintln(w, "| --- | --- | --- |")
	for _, f := range run.floors {
		fmt.Fprintf(w, "| %s | %s | %s |\n", f.name, ms(f.stats.median), ms(f.stats.p90))
	}
}
