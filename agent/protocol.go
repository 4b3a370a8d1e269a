// Package agent carries the workspace ports — FileSystem and Bash — over one
// long-lived byte stream, such as the attached standard input and output of a
// container's PID 1.
//
// A Server serves any workspace.FileSystem and workspace.Bash over a stream;
// the sandboxd-agent binary runs one inside every session container, over
// localfs and localexec. A Client speaks to it from the host and is itself a
// workspace.FileSystem (with every extension interface: links, MkdirAll,
// RemoveAll, Lock, and Walk, Grep and Swap done by the agent in one round
// trip) and a workspace.Bash:
//
//	c, err := agent.NewClient(stream) // handshake
//	defer c.Close()
//	data, err := c.ReadFile(ctx, "go.mod", 1<<20)
//
// # Protocol
//
// The stream carries frames in both directions. A frame is a 4-byte
// big-endian length (of what follows, at most MaxFrame), then a type byte, a
// flags byte, a 4-byte call ID, a 4-byte header length, a JSON header and a
// raw payload. The client opens with Hello (its protocol version); the server
// answers Hello (its version and build). A call is a Call frame (the request
// as the JSON header, and the first chunk of its input as payload), then Data
// frames with more input up to one flagged End. The server answers with Data
// frames (a result body in chunks, or a command's output, one stream per
// frame) and one Reply frame (an error in the header, the last chunk of the
// body as payload). Calls run concurrently and their frames interleave; no
// frame is larger than MaxFrame, so a 32 MB file streams in chunks without
// holding up other calls. Cancel ends a call early (its Reply still comes).
// Window grants flow-control credit for a command's standard input and output,
// so a command that does not read its input, or a slow Output callback, holds
// up only its own call.
//
// Accept turns the direction around: the call waits until a program in the
// agent's world connects to the loopback address it names (the agent listens
// there from the first Accept on), and then carries that connection's bytes
// both ways — the agent's Data frames are what the program sent, the
// client's what it receives, each side flagging End when its direction is
// over — under the same Window credit as a command's input and output.
// Dial is its mirror, the way in: the agent connects to the loopback
// address it names (a server a program started there) and carries that
// connection the same way.
//
// Errors cross the stream as kind names (workspace.Kind.Name) and are restored
// with workspace.KindByName, so errors.Is works on the client as it would
// against the adapter the agent serves.
//
// # Trust
//
// The client treats what the agent sends as untrusted: frame sizes, body sizes
// and credits are bounded, names in results are checked (fs.ValidPath, inside
// the directory asked about, no "/" in a directory entry), and malformed input
// fails the call or, when the stream can no longer be followed, the whole
// client — never a panic or a hang. Once the stream breaks or closes, every
// pending and later call fails with workspace.ErrUnavailable.
package agent

import (
	"bufio"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"io/fs"
	"path"
	"strings"
	"time"

	"github.com/sandboxd/sandboxd/workspace"
)

// ProtocolVersion is the version of the wire protocol this package speaks.
// Client and server must speak the same one; 2 added the swap operation, 3
// the swap's conditions (real, sum, lock: a swap of protocol 2 would ignore
// them and write), 4 the swap's edit (one of protocol 3 would write nothing
// over the file).
const ProtocolVersion = 4

const (
	// MaxFrame bounds a frame's length (everything after the 4-byte length).
	MaxFrame = 1 << 20
	// chunkSize bounds the payload of a frame this package sends.
	chunkSize = 256 << 10
	// window is the flow-control credit, in bytes, for each direction of a
	// command's input and output.
	window = 1 << 20
	// frameFixed is the size of the fixed part after the length prefix:
	// type, flags, ID, header length.
	frameFixed = 1 + 1 + 4 + 4
)

// Frame types.
const (
	frameHello  byte = 1 // both ways, once, ID 0: hello header
	frameCall   byte = 2 // client→server: request header, first input chunk
	frameData   byte = 3 // both ways: input, body or output chunk
	frameReply  byte = 4 // server→client: the end of a call; error header
	frameCancel byte = 5 // client→server: end the call now
	frameWindow byte = 6 // both ways: 4-byte payload, credit in bytes
)

// Frame flags.
const (
	flagEnd    byte = 1 // the last input frame of a call
	flagStderr byte = 2 // output frame of a command's standard error
	flagResize byte = 4 // client→server, of a pty call: a new terminal size (see ptySize), not input
)

// frame is one decoded frame. Its slices are owned by the frame.
type frame struct {
	typ     byte
	flags   byte
	id      uint32
	header  []byte
	payload []byte
}

var errFrame = errors.New("malformed frame")

// readFrame reads one frame. It never allocates more than MaxFrame bytes, and
// fails with an error wrapping errFrame for a frame that breaks the format.
func readFrame(r *bufio.Reader) (frame, error) { return readFrameSealed(r, false) }

// errSeal is the error of a sealed frame whose trailer does not match.
var errSeal = fmt.Errorf("%w: its seal does not match (a frame cut short, or a stream taken over)", errFrame)

// readFrameSealed is readFrame, for a frame followed by its seal when
// sealed is set (see sealTrailer): one whose seal does not match fails
// with errSeal.
func readFrameSealed(r *bufio.Reader, sealed bool) (frame, error) {
	var pre [4 + frameFixed]byte
	if _, err := io.ReadFull(r, pre[:4]); err != nil {
		return frame{}, err
	}
	n := binary.BigEndian.Uint32(pre[:4])
	if n < frameFixed || n > MaxFrame {
		return frame{}, fmt.Errorf("%w: length %d", errFrame, n)
	}
	if _, err := io.ReadFull(r, pre[4:]); err != nil {
		return frame{}, noEOF(err)
	}
	f := frame{typ: pre[4], flags: pre[5], id: binary.BigEndian.Uint32(pre[6:10])}
	hlen := binary.BigEndian.Uint32(pre[10:14])
	rest := n - frameFixed
	if f.typ < frameHello || f.typ > frameWindow {
		return frame{}, fmt.Errorf("%w: type %d", errFrame, f.typ)
	}
	if hlen > rest {
		return frame{}, fmt.Errorf("%w: header length %d of %d", errFrame, hlen, rest)
	}
	buf := make([]byte, rest)
	if _, err := io.ReadFull(r, buf); err != nil {
		return frame{}, noEOF(err)
	}
	if sealed {
		var seal [sealTrailer]byte
		if _, err := io.ReadFull(r, seal[:]); err != nil {
			return frame{}, noEOF(err)
		}
		sum := crc32.Update(crc32.Checksum(pre[:], castagnoli), castagnoli, buf)
		if binary.BigEndian.Uint32(seal[:]) != sum {
			return frame{}, errSeal
		}
	}
	f.header, f.payload = buf[:hlen:hlen], buf[hlen:]
	return f, nil
}

// noEOF turns an end of stream inside a frame into io.ErrUnexpectedEOF.
func noEOF(err error) error {
	if err == io.EOF {
		return io.ErrUnexpectedEOF
	}
	return err
}

// appendFrame encodes a frame onto b. The caller keeps it within MaxFrame.
func appendFrame(b []byte, typ, flags byte, id uint32, header, payload []byte) []byte {
	b = binary.BigEndian.AppendUint32(b, uint32(frameFixed+len(header)+len(payload)))
	b = append(b, typ, flags)
	b = binary.BigEndian.AppendUint32(b, id)
	b = binary.BigEndian.AppendUint32(b, uint32(len(header)))
	b = append(b, header...)
	return append(b, payload...)
}

// credit decodes a Window frame's payload.
func credit(f frame) (int, bool) {
	if len(f.payload) != 4 {
		return 0, false
	}
	n := binary.BigEndian.Uint32(f.payload)
	return int(n), n > 0 && n <= window
}

// hello is the handshake header, both ways.
type hello struct {
	Version int    `json:"version"`
	Build   string `json:"build,omitempty"`
	// Shell is the program that runs scripts (server→client; see
	// workspace.ShellOf), "" when unknown.
	Shell string `json:"shell,omitempty"`
	// Seal, from the client, asks that every frame it sends after the
	// handshake carry a sealTrailer; from the server, that it checks them.
	// Both must say so for frames to be sealed (an agent that predates it
	// says nothing, and reads frames as they were).
	Seal bool `json:"seal,omitempty"`
	// Background (server→client) says the agent keeps background commands
	// itself (workspace.BackgroundBash: the bg* operations), beyond any one
	// connection.
	Background bool `json:"background,omitempty"`
	// Boot (server→client) names this run of the agent: a new value means
	// the agent started again (its container did), and what it kept —
	// background commands — is gone.
	Boot string `json:"boot,omitempty"`
	// Terminal (server→client) says the agent runs commands on a
	// pseudo-terminal (workspace.TerminalBash: the pty operation).
	Terminal bool `json:"terminal,omitempty"`
}

// Sealed frames and resynchronisation. A container's standard input
// outlives each client attached to it: the engine passes on whatever a
// client wrote, a frame cut short by its death included, and then whatever
// the next client writes. So that no frame is ever completed by another
// client's bytes, a client that asks (hello.Seal) follows every frame after
// the handshake with the CRC-32C (Castagnoli) of the frame's bytes, length
// prefix included; the agent acts on no frame whose trailer does not match.
// A new client on such a stream (WithResync) first sends resyncBreak zero
// bytes — more than any frame still expected could take, so that whatever
// was cut short ends in a bad trailer or a bad length — then a resync line,
// "\x00sandboxd-resync " and a nonce of 32 hex digits and "\n", then its
// Hello. The agent, at any frame it cannot act on, ends the connection it
// served (its calls are cancelled, as at the end of a stream), skips
// input up to a resync line, writes the same line back and serves a new
// connection from the Hello that follows. The client skips what the agent
// sent up to its own line: output of the former connection's calls, or
// bytes a command wrote to fool it, which cannot hold the nonce.
const (
	sealTrailer  = 4
	resyncPrefix = "\x00sandboxd-resync "
	resyncNonce  = 32
	resyncBreak  = 4 + MaxFrame + sealTrailer + 16
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// sealFrame appends the trailer of the frame b ends with, which starts at
// start.
func sealFrame(b []byte, start int) []byte {
	return binary.BigEndian.AppendUint32(b, crc32.Checksum(b[start:], castagnoli))
}

// resyncLine is the line that starts a connection on a shared stream.
func resyncLine(nonce string) []byte { return []byte(resyncPrefix + nonce + "\n") }

// awaitResync reads r up to and including a resync line, and returns its
// nonce; want, when not "", is the one nonce accepted (a client waits for
// its own). A line's first byte, NUL, is no hex digit, so a line is found
// wherever it starts, a broken or foreign one before it or not.
func awaitResync(r *bufio.Reader, want string) (string, error) {
	matched := 0 // bytes of the prefix matched
	var nonce []byte
	for {
		b, err := r.ReadByte()
		if err != nil {
			return "", err
		}
		switch {
		case matched < len(resyncPrefix) && b == resyncPrefix[matched]:
			matched++
			continue
		case matched == len(resyncPrefix) && len(nonce) < resyncNonce && ('0' <= b && b <= '9' || 'a' <= b && b <= 'f'):
			nonce = append(nonce, b)
			continue
		case matched == len(resyncPrefix) && len(nonce) == resyncNonce && b == '\n':
			if want == "" || string(nonce) == want {
				return string(nonce), nil
			}
		}
		matched, nonce = 0, nonce[:0]
		if b == resyncPrefix[0] {
			matched = 1
		}
	}
}

// request is a Call frame's header. Op selects the operation; the other
// fields are its arguments.
type request struct {
	Op      string                 `json:"op"`
	Name    string                 `json:"name,omitempty"`
	NewName string                 `json:"newName,omitempty"` // rename
	Target  string                 `json:"target,omitempty"`  // symlink
	Perm    uint32                 `json:"perm,omitempty"`
	Max     int64                  `json:"max,omitempty"`  // readfile
	Size    int64                  `json:"size,omitempty"` // writefile, swap: bytes of input
	Root    string                 `json:"root,omitempty"` // swap: the workspace root, for RealPath
	Real    string                 `json:"real,omitempty"` // swap: where name must lead
	Sum     []byte                 `json:"sum,omitempty"`  // swap: the SHA-256 the old contents must have
	Lock    bool                   `json:"lock,omitempty"` // swap: under the file's write lock
	Edit    bool                   `json:"edit,omitempty"` // swap: the input is a textedit.Edit in JSON, to apply in place of data
	Walk    *workspace.WalkRequest `json:"walk,omitempty"`
	Grep    *workspace.GrepRequest `json:"grep,omitempty"`
	Run     *runRequest            `json:"run,omitempty"`
	Addr    string                 `json:"addr,omitempty"`   // accept, handoff: the loopback address to listen on; dial: to connect to
	Socket  string                 `json:"socket,omitempty"` // handoff: the Unix socket to pass connections to
	Token   []byte                 `json:"token,omitempty"`  // handoff: what each message to the socket carries
	Bg      *bgRequest             `json:"bg,omitempty"`     // bgstart, bgread, bgkill
	Pty     *ptyRequest            `json:"pty,omitempty"`    // pty: the terminal (the command is Run)
}

// Operations.
const (
	opStat      = "stat"
	opLstat     = "lstat"
	opReadDir   = "readdir"
	opReadFile  = "readfile"
	opWriteFile = "writefile"
	opSwap      = "swap"
	opMkdir     = "mkdir"
	opMkdirAll  = "mkdirall"
	opRemove    = "remove"
	opRemoveAll = "removeall"
	opRename    = "rename"
	opSymlink   = "symlink"
	opReadlink  = "readlink"
	opLock      = "lock"
	opWalk      = "walk"
	opGrep      = "grep"
	opRun       = "run"
	opPty       = "pty" // run on a pseudo-terminal (workspace.TerminalBash)
	opAccept    = "accept"
	opDial      = "dial" // connect to a loopback port in the agent's world and carry the connection
	opHandoff   = "handoff"
	opListen    = "listen"
	// The agent's background commands (workspace.BackgroundBash), kept
	// beyond any one connection.
	opBgStart = "bgstart"
	opBgRead  = "bgread"
	opBgKill  = "bgkill"
	opBgList  = "bglist"
)

// bgRequest is the argument of the bg* operations.
type bgRequest struct {
	ID    string        `json:"id,omitempty"`    // bgread, bgkill
	Wait  time.Duration `json:"wait,omitempty"`  // bgread
	Run   *runRequest   `json:"run,omitempty"`   // bgstart: the command (its Stdin unset)
	Stdin []byte        `json:"stdin,omitempty"` // bgstart
	Keep  int64         `json:"keep,omitempty"`  // bgstart
	Label string        `json:"label,omitempty"` // bgstart: how it is shown
	Max   int           `json:"max,omitempty"`   // bgstart
}

// wireSwap is a workspace.SwapResult as it crosses the stream.
type wireSwap struct {
	Real    string    `json:"real"`
	Old     *wireInfo `json:"old,omitempty"`
	OldData []byte    `json:"oldData,omitempty"`
	HasData bool      `json:"hasData,omitempty"` // OldData is there (it may be empty)
	New     *wireInfo `json:"new,omitempty"`
	Unmet   bool      `json:"unmet,omitempty"` // a condition did not hold: nothing written
}

func encodeSwap(res workspace.SwapResult) wireSwap {
	w := wireSwap{Real: res.Real, OldData: res.OldData, HasData: res.OldData != nil, Unmet: res.Unmet}
	if res.Old != nil {
		w.Old = encodeInfo(res.Old)
	}
	if res.New != nil {
		w.New = encodeInfo(res.New)
	}
	return w
}

// decodeSwap decodes and checks a Swap body against its request: a clean
// workspace name, information that checks, old contents only of a regular
// file and within the request's bound, names that are Real's; Unmet only
// for a request with conditions, and then with no new file; a write only
// where the conditions hold, as far as the answer shows it (the real name,
// the old contents' sum); for an edit, old contents it applies to, its
// result (Data) computed from them here.
func decodeSwap(body []byte, req workspace.SwapRequest) (workspace.SwapResult, error) {
	var w wireSwap
	if err := json.Unmarshal(body, &w); err != nil {
		return workspace.SwapResult{}, err
	}
	if !fs.ValidPath(w.Real) || w.Real == "." {
		return workspace.SwapResult{}, fmt.Errorf("bad name %q", w.Real)
	}
	res := workspace.SwapResult{Real: w.Real, Unmet: w.Unmet}
	for _, i := range []struct {
		w  *wireInfo
		fi *fs.FileInfo
	}{{w.Old, &res.Old}, {w.New, &res.New}} {
		if i.w == nil {
			continue
		}
		if err := i.w.check(); err != nil {
			return workspace.SwapResult{}, err
		}
		if i.w.Name != path.Base(w.Real) {
			return workspace.SwapResult{}, fmt.Errorf("information of %q for %q", i.w.Name, w.Real)
		}
		*i.fi = &fileInfo{*i.w}
	}
	if w.HasData {
		if res.Old == nil || !res.Old.Mode().IsRegular() || int64(len(w.OldData)) > req.Max {
			return workspace.SwapResult{}, fmt.Errorf("old contents of %d bytes that cannot be", len(w.OldData))
		}
		res.OldData = w.OldData
		if res.OldData == nil {
			res.OldData = []byte{}
		}
	}
	switch {
	case res.Unmet && req.Real == "" && len(req.OldSum) == 0:
		return workspace.SwapResult{}, errors.New("a swap without conditions reported them unmet")
	case res.Unmet && res.New != nil:
		return workspace.SwapResult{}, errors.New("an unmet swap reported a new file")
	case !res.Unmet && !req.Met(res):
		return workspace.SwapResult{}, errors.New("a swap wrote where its conditions did not hold")
	case !res.Unmet && req.Edit != nil:
		// What an edit wrote is not sent: it is the edit of the old
		// contents, computed here again rather than believed.
		data, err := req.Edited(res)
		if err != nil {
			return workspace.SwapResult{}, fmt.Errorf("an edit that does not apply to the old contents reported written: %w", err)
		}
		res.Data = data
	}
	return res, nil
}

// runRequest is workspace.Command without its callbacks and readers.
type runRequest struct {
	Script  string            `json:"script,omitempty"`
	Argv    []string          `json:"argv,omitempty"`
	Dir     string            `json:"dir,omitempty"`
	Env     map[string]string `json:"env,omitempty"`
	Timeout time.Duration     `json:"timeout,omitempty"`
	Stdin   bool              `json:"stdin,omitempty"` // input follows as Data frames
	// Combined is workspace.Command.Combined: one stream, in order. An
	// agent that predates it ignores it and sends the two apart.
	Combined bool `json:"combined,omitempty"`
}

// replyHeader is a Reply frame's header; an empty header is success.
type replyHeader struct {
	Err *wireError `json:"err,omitempty"`
}

// dataHeader is the optional header of the first Data frame of a body.
type dataHeader struct {
	Size int64 `json:"size,omitempty"` // the whole body's size, a hint
}

// wireError is an error as it crosses the stream.
type wireError struct {
	Kind string `json:"kind,omitempty"` // a workspace.Kind name, or "" when unclassified
	Op   string `json:"op,omitempty"`   // set when the error was an *fs.PathError
	Path string `json:"path,omitempty"`
	Msg  string `json:"msg,omitempty"`
}

// maxErrorText bounds the message and path of an error from the agent.
const maxErrorText = 4 << 10

func encodeError(err error) *wireError {
	w := &wireError{Msg: err.Error()}
	if k := workspace.KindOf(err); k != nil {
		w.Kind = k.Name()
	}
	var pe *fs.PathError
	if errors.As(err, &pe) {
		w.Op, w.Path, w.Msg = pe.Op, pe.Path, pe.Err.Error()
	}
	return w
}

// decode restores an error as an *fs.PathError: the agent's op and path when
// it sent an *fs.PathError, else those of the call. Its Err is the Kind itself
// when the message is the kind's own, and otherwise a RemoteError that unwraps
// to the kind.
func (w *wireError) decode(op, name string) error {
	kind := workspace.KindByName(w.Kind)
	var err error
	if kind != nil && (w.Msg == "" || w.Msg == kind.Error()) {
		err = kind
	} else {
		err = &RemoteError{Kind: kind, Msg: clip(w.Msg)}
	}
	if w.Op != "" {
		op, name = clip(w.Op), clip(w.Path)
	}
	return &fs.PathError{Op: op, Path: name, Err: err}
}

func clip(s string) string {
	if len(s) > maxErrorText {
		return s[:maxErrorText] + "…"
	}
	return s
}

// RemoteError is an error the agent reported, or one about the agent itself.
// It unwraps to its Kind, so errors.Is(err, workspace.ErrNotFound) works.
type RemoteError struct {
	Kind *workspace.Kind // nil when the agent did not classify the error
	Msg  string
}

func (e *RemoteError) Error() string {
	if e.Msg == "" && e.Kind != nil {
		return e.Kind.Error()
	}
	return e.Msg
}

func (e *RemoteError) Unwrap() error {
	if e.Kind == nil {
		return nil
	}
	return e.Kind
}

// wireInfo is an fs.FileInfo as it crosses the stream.
type wireInfo struct {
	Name  string `json:"n"`
	Size  int64  `json:"s"`
	Mode  uint32 `json:"m"`
	MTime int64  `json:"t"` // Unix nanoseconds
}

func encodeInfo(fi fs.FileInfo) *wireInfo {
	return &wireInfo{Name: fi.Name(), Size: fi.Size(), Mode: uint32(fi.Mode()), MTime: fi.ModTime().UnixNano()}
}

// modeBits are the fs.FileMode bits a file's mode may carry.
const modeBits = fs.ModeType | fs.ModePerm | fs.ModeSetuid | fs.ModeSetgid | fs.ModeSticky

func (w *wireInfo) check() error {
	switch {
	case !validBase(w.Name) && w.Name != ".":
		return fmt.Errorf("bad file name %q", w.Name)
	case w.Size < 0:
		return fmt.Errorf("bad size %d", w.Size)
	case fs.FileMode(w.Mode)&^modeBits != 0:
		return fmt.Errorf("bad mode %#o", w.Mode)
	}
	return nil
}

// validBase reports whether s is one directory entry's name.
func validBase(s string) bool {
	return s != "." && fs.ValidPath(s) && !containsSlash(s)
}

func containsSlash(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] == '/' || s[i] == 0 {
			return true
		}
	}
	return false
}

// fileInfo is a decoded wireInfo.
type fileInfo struct{ w wireInfo }

func (fi *fileInfo) Name() string       { return fi.w.Name }
func (fi *fileInfo) Size() int64        { return fi.w.Size }
func (fi *fileInfo) Mode() fs.FileMode  { return fs.FileMode(fi.w.Mode) }
func (fi *fileInfo) ModTime() time.Time { return time.Unix(0, fi.w.MTime) }
func (fi *fileInfo) IsDir() bool        { return fi.Mode().IsDir() }
func (fi *fileInfo) Sys() any           { return nil }
func (fi *fileInfo) String() string     { return fs.FormatFileInfo(fi) }

// wireDirEntry is an fs.DirEntry with its information, so that Info costs no
// further round trip. Info is nil when the entry vanished before it was read.
type wireDirEntry struct {
	Name string    `json:"n"`
	Type uint32    `json:"y"`
	Info *wireInfo `json:"i,omitempty"`
}

type dirEntry struct {
	w   wireDirEntry
	dir string
}

func (d *dirEntry) Name() string      { return d.w.Name }
func (d *dirEntry) IsDir() bool       { return d.Type().IsDir() }
func (d *dirEntry) Type() fs.FileMode { return fs.FileMode(d.w.Type) }
func (d *dirEntry) String() string    { return fs.FormatDirEntry(d) }
func (d *dirEntry) Info() (fs.FileInfo, error) {
	if d.w.Info == nil {
		return nil, workspace.PathError("lstat", joinName(d.dir, d.w.Name), workspace.ErrNotFound)
	}
	return &fileInfo{*d.w.Info}, nil
}

func joinName(dir, name string) string {
	if dir == "." || dir == "" {
		return name
	}
	return dir + "/" + name
}

// decodeDir decodes and checks a ReadDir body: names that are single valid
// entries, sorted and unique, types and information that agree.
func decodeDir(body []byte, dir string) ([]fs.DirEntry, error) {
	var ws []wireDirEntry
	if err := json.Unmarshal(body, &ws); err != nil {
		return nil, err
	}
	out := make([]fs.DirEntry, len(ws))
	for i := range ws {
		w := ws[i]
		if !validBase(w.Name) || w.Name == ".." {
			return nil, fmt.Errorf("bad entry name %q", w.Name)
		}
		if i > 0 && ws[i-1].Name >= w.Name {
			return nil, fmt.Errorf("entries not sorted at %q", w.Name)
		}
		if fs.FileMode(w.Type)&^fs.ModeType != 0 {
			return nil, fmt.Errorf("bad entry type %#o", w.Type)
		}
		if w.Info != nil {
			if err := w.Info.check(); err != nil {
				return nil, err
			}
			if w.Info.Name != w.Name || fs.FileMode(w.Info.Mode).Type() != fs.FileMode(w.Type) {
				return nil, fmt.Errorf("entry %q disagrees with its information", w.Name)
			}
		}
		out[i] = &dirEntry{w: w, dir: dir}
	}
	return out, nil
}

// under reports whether name is start or below it; start "." holds every
// name but itself.
func under(name, start string) bool {
	if !fs.ValidPath(name) || name == "." {
		return false
	}
	if start == "." {
		return true
	}
	return name == start || len(name) > len(start) && name[len(start)] == '/' && name[:len(start)] == start
}

func startOf(dir string) string {
	if dir == "" {
		return "."
	}
	return dir
}

// depthBelow is how deep name, under start, lies below it (1: an entry of
// start).
func depthBelow(name, start string) int {
	if start == "." {
		return strings.Count(name, "/") + 1
	}
	return strings.Count(name[len(start):], "/")
}

// decodeWalk decodes and checks a Walk body against its request.
func decodeWalk(body []byte, req workspace.WalkRequest) (workspace.WalkResult, error) {
	var res workspace.WalkResult
	if err := json.Unmarshal(body, &res); err != nil {
		return workspace.WalkResult{}, err
	}
	start, found := startOf(req.Dir), 0
	for _, e := range res.Entries {
		if !under(e.Path, start) {
			return workspace.WalkResult{}, fmt.Errorf("walk entry %q is not under %q", e.Path, start)
		}
		if req.MaxDepth > 0 && e.Path != start && depthBelow(e.Path, start) > req.MaxDepth {
			return workspace.WalkResult{}, fmt.Errorf("walk entry %q lies deeper than %d below %q", e.Path, req.MaxDepth, start)
		}
		if e.Err != nil {
			if !req.Errors || e.Type != fs.ModeDir || e.Path == start {
				return workspace.WalkResult{}, fmt.Errorf("walk entry %q reports an error unasked or not for a directory below the start", e.Path)
			}
			continue
		}
		if found++; req.Limit > 0 && found > req.Limit {
			return workspace.WalkResult{}, fmt.Errorf("walk returned %d entries over its limit %d", found, req.Limit)
		}
		if e.Type&^fs.ModeType != 0 {
			return workspace.WalkResult{}, fmt.Errorf("walk entry %q has a bad type %#o", e.Path, uint32(e.Type))
		}
		if !req.Info && (e.Mode != 0 || e.Size != 0 || !e.ModTime.IsZero() || e.Link != "") {
			return workspace.WalkResult{}, fmt.Errorf("walk entry %q describes itself unasked", e.Path)
		}
		if e.Mode != 0 && e.Mode.Type() != e.Type {
			return workspace.WalkResult{}, fmt.Errorf("walk entry %q has the mode %v for the type %v", e.Path, e.Mode, e.Type)
		}
	}
	return res, nil
}

// decodeGrep decodes and checks a Grep body against its request.
func decodeGrep(body []byte, req workspace.GrepRequest) (workspace.GrepResult, error) {
	var res workspace.GrepResult
	if err := json.Unmarshal(body, &res); err != nil {
		return workspace.GrepResult{}, err
	}
	start := startOf(req.Dir)
	matches := 0
	for _, l := range res.Lines {
		if !under(l.Path, start) {
			return workspace.GrepResult{}, fmt.Errorf("grep line in %q is not under %q", l.Path, start)
		}
		if l.Binary && (!req.Binary || !l.Match || l.Text != "") {
			return workspace.GrepResult{}, fmt.Errorf("grep line in %q is a binary file's, unasked", l.Path)
		}
		if l.Line < 1 {
			return workspace.GrepResult{}, fmt.Errorf("grep line number %d", l.Line)
		}
		if req.MaxLineChars > 0 && len(l.Text) > 4*req.MaxLineChars {
			return workspace.GrepResult{}, fmt.Errorf("grep line longer than %d characters", req.MaxLineChars)
		}
		if l.Match {
			matches++
		}
	}
	if matches != res.Matches || req.Limit > 0 && matches > req.Limit {
		return workspace.GrepResult{}, fmt.Errorf("grep reports %d matches of %d lines", res.Matches, matches)
	}
	return res, nil
}

// wireResult is a workspace.Result as it crosses the stream.
type wireResult struct {
	ExitCode int           `json:"exitCode"`
	Signal   string        `json:"signal,omitempty"`
	TimedOut bool          `json:"timedOut,omitempty"`
	Duration time.Duration `json:"duration"`
}

func decodeResult(body []byte) (workspace.Result, error) {
	var w wireResult
	if err := json.Unmarshal(body, &w); err != nil {
		return workspace.Result{}, err
	}
	if w.ExitCode < -1 || w.ExitCode > 255 || w.Duration < 0 || !validSignal(w.Signal) {
		return workspace.Result{}, fmt.Errorf("bad result %+v", w)
	}
	return workspace.Result{ExitCode: w.ExitCode, Signal: w.Signal, TimedOut: w.TimedOut, Duration: w.Duration}, nil
}

// validSignal accepts "" and names like "SIGKILL" or "SIGRTMIN+3".
func validSignal(s string) bool {
	if s == "" {
		return true
	}
	if len(s) > 16 || len(s) < 4 || s[:3] != "SIG" {
		return false
	}
	for _, r := range s[3:] {
		if !('A' <= r && r <= 'Z' || '0' <= r && r <= '9' || r == '+' || r == '-') {
			return false
		}
	}
	return true
}
