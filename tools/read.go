package tools

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"strings"
	"unicode/utf8"

	"github.com/google/jsonschema-go/jsonschema"
	"github.com/sandboxd/sandboxd/workspace"
)

// ReadResult is the structured content of read for a text file.
type ReadResult struct {
	Path       string `json:"path"`
	Content    string `json:"content"`
	StartLine  int    `json:"startLine"`
	EndLine    int    `json:"endLine"`
	TotalLines int    `json:"totalLines"`
	NextOffset int    `json:"nextOffset"` // 0 when the window reaches the end
	Truncated  bool   `json:"truncated"`
	// InvalidUTF8 says bytes that are not UTF-8 were shown as U+FFFD.
	InvalidUTF8 bool `json:"invalidUtf8,omitempty"`
}

// ReadImageResult is the structured content of read for an image; the
// image itself is Result.Image.
type ReadImageResult struct {
	Path     string `json:"path"`
	MIMEType string `json:"mimeType"`
	Bytes    int64  `json:"bytes"`
	Width    int    `json:"width"`
	Height   int    `json:"height"`
}

// ReadBinaryResult is the structured content of read for a binary file,
// which is reported, not shown.
type ReadBinaryResult struct {
	Path     string `json:"path"`
	Binary   bool   `json:"binary"` // always true
	MIMEType string `json:"mimeType"`
	Bytes    int64  `json:"bytes"`
}

// readOutput is the structured content of read: a *ReadResult, a
// *ReadImageResult or a *ReadBinaryResult.
type readOutput interface{ readOutput() }

func (*ReadResult) readOutput()       {}
func (*ReadImageResult) readOutput()  {}
func (*ReadBinaryResult) readOutput() {}

type readArgs struct {
	Path   string `json:"path" jsonschema:"the file, relative to the workspace root (or absolute inside it)"`
	Offset *int   `json:"offset,omitempty" jsonschema:"the first line to show, from 1"`
	Limit  *int   `json:"limit,omitempty" jsonschema:"the most lines to show (at most {{.MaxLines}})"`
}

var readTool = newTool(spec[readArgs, readOutput]{
	name: "read", skill: "workspace.read",
	describe: func(s *Set) string {
		c := s.cfg
		img := "Images are reported as binary files, not shown."
		if c.ReadImages {
			img = fmt.Sprintf("PNG, JPEG, GIF and WebP files (recognised from their bytes, whatever their name) are returned as images you can see, up to %s and %d pixels a side.",
				kb(min(MaxImageBytes, c.MaxFileBytes)), MaxImageSide)
		}
		return fmt.Sprintf("Read a file of the workspace. Text is shown %s at a time from offset; the result ends with the offset to continue from. %s Other binary files are reported, not shown. Files over %s are refused.",
			s.limits(), img, kb(c.MaxFileBytes))
	},
	constrain: func(props map[string]*jsonschema.Schema) { minimum(props, 1, "offset", "limit") },
	variants:  []any{ReadResult{}, ReadImageResult{}, ReadBinaryResult{}},
	handle:    (*Set).read,
	readOnly:  yes,
})

// limits says how much read, find and grep show, for descriptions.
func (s *Set) limits() string {
	return fmt.Sprintf("%d lines or %s", s.cfg.MaxLines, kb(int64(s.cfg.MaxBytes)))
}

// resolve turns a path the model wrote into a workspace name.
func (s *Set) resolve(p string) (string, error) {
	return workspace.Resolve(s.root, p)
}

// regularFile checks that name is a regular file no larger than
// maxFileBytes, and returns its size.
func (s *Set) regularFile(ctx context.Context, fsys workspace.FileSystem, name, tool string) (int64, error) {
	info, err := fsys.Stat(ctx, name)
	if err != nil {
		return 0, err
	}
	if info.IsDir() {
		return 0, newError(workspace.ErrNotAFile, "%s is a directory; %s works on files (use ls or find for a directory)", displayName(name), tool)
	}
	if !info.Mode().IsRegular() {
		return 0, newError(workspace.ErrNotAFile, "%s is a %s, not a regular file; %s refuses it rather than wait on it", displayName(name), fileKind(info.Mode()), tool)
	}
	if info.Size() > s.cfg.MaxFileBytes {
		return 0, s.tooLarge(name, info.Size())
	}
	return info.Size(), nil
}

func (s *Set) tooLarge(name string, size int64) error {
	e := newError(workspace.ErrFileTooLarge, "%s is %s, over the %s a file may be (maxFileBytes); it was not read. Read parts of it with bash (head, tail, sed -n), or, for an image, read a smaller copy (scaled down or recompressed with bash)",
		name, kb(size), kb(s.cfg.MaxFileBytes))
	e.res.Path, e.res.Bytes = name, size
	return e
}

func fileKind(m fs.FileMode) string {
	switch {
	case m&fs.ModeNamedPipe != 0:
		return "named pipe"
	case m&fs.ModeSocket != 0:
		return "socket"
	case m&fs.ModeDevice != 0:
		return "device"
	}
	return "special file"
}

// load reads a regular file under the size limit: one ReadFile (one round
// trip to an agent), which refuses what is no regular file and a file over
// the limit without reading it. Only then does it look (Stat) at what is
// there, to say what it is.
func (s *Set) load(ctx context.Context, fsys workspace.FileSystem, name, tool string) ([]byte, error) {
	data, err := fsys.ReadFile(ctx, name, s.cfg.MaxFileBytes)
	if err != nil {
		return nil, s.explain(ctx, fsys, name, tool, err)
	}
	return data, nil
}

// explain is err, a failure to read name as a regular file within the
// limit, with what is there said when it is not one (a look, Stat).
func (s *Set) explain(ctx context.Context, fsys workspace.FileSystem, name, tool string, err error) error {
	if errors.Is(err, workspace.ErrNotAFile) || errors.Is(err, workspace.ErrFileTooLarge) {
		if _, serr := s.regularFile(ctx, fsys, name, tool); serr != nil {
			return serr
		}
		if errors.Is(err, workspace.ErrFileTooLarge) { // shrunk since
			return s.tooLarge(name, s.cfg.MaxFileBytes+1)
		}
	}
	return err
}

func (s *Set) read(ctx context.Context, p readArgs, c *call) (Result, error) {
	if p.Path == "" {
		return Result{}, invalid("path is required")
	}
	offset, limit := 1, s.cfg.MaxLines
	if p.Offset != nil { // at least 1, as the schema says (checkBounds)
		offset = *p.Offset
	}
	if p.Limit != nil {
		limit = min(*p.Limit, s.cfg.MaxLines)
	}
	name, err := s.resolve(p.Path)
	if err != nil {
		return Result{}, err
	}
	data, err := s.load(ctx, c.fsys, name, "read")
	if err != nil {
		return Result{}, err
	}
	if s.cfg.ReadImages {
		if mime := sniffImage(data); mime != "" {
			return s.readImage(name, mime, data)
		}
	}
	if mime, ok := binaryType(data); ok {
		text := fmt.Sprintf("[Binary file %s (%s, %s) not shown.]", name, mime, kb(int64(len(data))))
		return Result{Text: text, Structured: &ReadBinaryResult{Path: name, Binary: true, MIMEType: mime, Bytes: int64(len(data))}}, nil
	}
	r, notice, err := window(data, offset, limit, s.cfg.MaxBytes)
	if err != nil {
		return Result{}, err
	}
	r.Path = name
	text := r.Content
	if notice != "" {
		if text != "" && !strings.HasSuffix(text, "\n") {
			text += "\n"
		}
		text += "\n" + notice
	}
	return Result{Text: text, Structured: r}, nil
}

// window cuts the text window [offset, offset+limit) out of data, within
// maxBytes, and says what the model should know about it.
func window(data []byte, offset, limit, maxBytes int) (*ReadResult, string, error) {
	total := bytes.Count(data, []byte("\n"))
	if len(data) > 0 && data[len(data)-1] != '\n' {
		total++
	}
	r := &ReadResult{TotalLines: total}
	if offset > total {
		if total == 0 && offset == 1 {
			return r, "", nil
		}
		return nil, "", invalid("offset %d is past the end of the file (%d lines)", offset, total)
	}
	rest := data
	for range offset - 1 {
		i := bytes.IndexByte(rest, '\n')
		rest = rest[i+1:] // offset <= total: every skipped line has its '\n'
	}
	start := len(data) - len(rest)
	end, line, cutLine := start, offset-1, false
	for line < total && line-offset+1 < limit {
		next := len(data)
		if i := bytes.IndexByte(data[end:], '\n'); i >= 0 {
			next = end + i + 1
		}
		if next-start > maxBytes {
			if line == offset-1 { // a single line over the limit: show its start
				end = start + validPrefix(data[start:start+maxBytes])
				line, cutLine = line+1, true
			}
			break
		}
		end, line = next, line+1
	}
	var notes []string
	content, bad := toValidUTF8(data[start:end])
	r.Content, r.InvalidUTF8 = content, bad
	r.StartLine, r.EndLine = offset, line
	if line < total {
		r.Truncated, r.NextOffset = true, line+1
	}
	switch {
	case cutLine:
		notes = append(notes, fmt.Sprintf("[Line %d is longer than %s: showing its first %s. Read the rest with bash (sed -n '%dp' FILE | cut -c N-). Use offset=%d to continue.]",
			offset, kb(int64(maxBytes)), kb(int64(end-start)), offset, line+1))
		r.Truncated, r.NextOffset = true, line+1
		if line >= total {
			r.NextOffset = 0
		}
	case r.Truncated:
		notes = append(notes, fmt.Sprintf("[Showing lines %d-%d of %d. Use offset=%d to continue.]", offset, line, total, line+1))
	}
	if bad {
		notes = append(notes, "[The file is not valid UTF-8: bytes that are not are shown as U+FFFD.]")
	}
	return r, strings.Join(notes, "\n"), nil
}

// validPrefix returns the length of b cut back so that it does not end in
// the middle of a rune.
func validPrefix(b []byte) int {
	n := len(b)
	i := n - 1
	for i > 0 && i > n-utf8.UTFMax && !utf8.RuneStart(b[i]) {
		i--
	}
	if i < 0 || utf8.FullRune(b[i:]) {
		return n
	}
	return i
}

// toValidUTF8 replaces every byte that is not part of valid UTF-8 with
// U+FFFD, and says whether it did.
func toValidUTF8(b []byte) (string, bool) {
	if utf8.Valid(b) {
		return string(b), false
	}
	var sb strings.Builder
	sb.Grow(len(b) + 16)
	for len(b) > 0 {
		r, size := utf8.DecodeRune(b)
		if r == utf8.RuneError && size == 1 {
			sb.WriteRune(utf8.RuneError)
		} else {
			sb.Write(b[:size])
		}
		b = b[size:]
	}
	return sb.String(), true
}

// binaryType reports whether data is a binary file, and its MIME type. A
// NUL byte in the first 8 KiB makes a file binary, as does a signature of a
// known binary format; text that is merely not UTF-8 (Latin-1, say) or that
// holds control characters (a log with colours) is text.
func binaryType(data []byte) (string, bool) {
	head := data[:min(len(data), 8<<10)]
	mime := http.DetectContentType(head)
	if bytes.IndexByte(head, 0) >= 0 {
		if strings.HasPrefix(mime, "text/") {
			mime = "application/octet-stream"
		}
		return mime, true
	}
	if strings.HasPrefix(mime, "text/") || mime == "application/octet-stream" || mime == "application/json" {
		return "", false
	}
	return mime, true
}

func (s *Set) readImage(name, mime string, data []byte) (Result, error) {
	size := int64(len(data))
	reject := func(why, todo string) error {
		e := newError(workspace.ErrImageRejected, "%s (%s, %s) was not sent: %s. %s", name, mime, kb(size), why, todo)
		e.res.Path, e.res.MIMEType, e.res.Bytes = name, mime, size
		return e
	}
	smaller := "Read a smaller copy: scale it down or recompress it with bash, then read that"
	w, h, ok := imageSize(mime, data)
	switch {
	case size > MaxImageBytes:
		return Result{}, reject(fmt.Sprintf("it is over the %s an image may be", kb(MaxImageBytes)), smaller)
	case !ok:
		return Result{}, reject("its header gives no size (it may be damaged or truncated)", "Check the file with bash (file, identify), or recreate it")
	case w > MaxImageSide || h > MaxImageSide:
		return Result{}, reject(fmt.Sprintf("it is %dx%d pixels, over the %d an image may have on a side", w, h, MaxImageSide), smaller)
	}
	return Result{
		Text:       fmt.Sprintf("[Image %s (%s, %s).]", name, mime, kb(size)),
		Structured: &ReadImageResult{Path: name, MIMEType: mime, Bytes: size, Width: w, Height: h},
		Image:      &Image{MIMEType: mime, Data: data},
	}, nil
}

// sniffImage returns the MIME type of a PNG, JPEG, GIF or WebP image, from
// its bytes, or "".
func sniffImage(b []byte) string {
	switch {
	case bytes.HasPrefix(b, []byte("\x89PNG\r\n\x1a\n")):
		return "image/png"
	case bytes.HasPrefix(b, []byte("\xff\xd8\xff")):
		return "image/jpeg"
	case bytes.HasPrefix(b, []byte("GIF87a")), bytes.HasPrefix(b, []byte("GIF89a")):
		return "image/gif"
	case len(b) >= 12 && string(b[:4]) == "RIFF" && string(b[8:12]) == "WEBP":
		return "image/webp"
	}
	return ""
}

// imageSize reads an image's width and height from its header; ok is false
// when the header gives none.
func imageSize(mime string, b []byte) (w, h int, ok bool) {
	be16 := func(i int) int { return int(binary.BigEndian.Uint16(b[i:])) }
	le16 := func(i int) int { return int(binary.LittleEndian.Uint16(b[i:])) }
	le24 := func(i int) int { return int(b[i]) | int(b[i+1])<<8 | int(b[i+2])<<16 }
	switch mime {
	case "image/png":
		if len(b) >= 24 && string(b[12:16]) == "IHDR" {
			w, h = int(binary.BigEndian.Uint32(b[16:])), int(binary.BigEndian.Uint32(b[20:]))
		}
	case "image/gif":
		if len(b) >= 10 {
			w, h = le16(6), le16(8)
		}
	case "image/webp":
		if len(b) < 16 {
			break
		}
		switch chunk := string(b[12:16]); {
		case chunk == "VP8 " && len(b) >= 30:
			if b[23] == 0x9d && b[24] == 0x01 && b[25] == 0x2a {
				w, h = le16(26)&0x3fff, le16(28)&0x3fff
			}
		case chunk == "VP8L" && len(b) >= 25:
			if b[20] == 0x2f {
				bits := binary.LittleEndian.Uint32(b[21:])
				w, h = int(bits&0x3fff)+1, int(bits>>14&0x3fff)+1
			}
		case chunk == "VP8X" && len(b) >= 30:
			w, h = le24(24)+1, le24(27)+1
		}
	case "image/jpeg":
		for i := 2; i+4 <= len(b); {
			if b[i] != 0xff {
				return 0, 0, false
			}
			m := b[i+1]
			switch {
			case m == 0xff: // fill byte
				i++
				continue
			case m == 0xd8 || m == 0x01 || m >= 0xd0 && m <= 0xd7: // no length
				i += 2
				continue
			case m == 0xd9 || m == 0xda: // end of image, start of scan: no frame header before
				return 0, 0, false
			case m >= 0xc0 && m <= 0xcf && m != 0xc4 && m != 0xc8 && m != 0xcc:
				if i+9 <= len(b) {
					h, w = be16(i+5), be16(i+7)
				}
				return w, h, w > 0 && h > 0
			}
			i += 2 + be16(i+2)
		}
	}
	return w, h, w > 0 && h > 0
}
