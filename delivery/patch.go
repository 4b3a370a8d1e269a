package delivery

import (
	"bytes"
	"compress/zlib"
	"fmt"
	"io"
	"strings"

	"github.com/pmezard/go-difflib/difflib"
)

// zeroOID is git's name for "no object" in a patch's index line.
const zeroOID = "0000000000000000000000000000000000000000"

// WritePatch writes changes as a git-format patch that `git apply` applies
// to the baseline: text as unified hunks with three lines of context, a
// last line without its newline marked as git marks it, binary content
// (a NUL in its first 8000 bytes, git's test) as a "GIT binary patch"
// literal, mode changes as git writes them, and a change between a file
// and a link as a deletion and an addition. Index lines carry full object
// names, which git needs to apply a binary patch. A change of permission
// bits git does not keep (0600 to 0644) is left out. Text before the first
// "diff --git" line, the header, is ignored by git apply; every line of it
// is indented so none can be read as part of a diff.
func WritePatch(w io.Writer, header string, changes []Change, st *Store) error {
	var b bytes.Buffer
	for line := range strings.Lines(header) {
		b.WriteString("    " + line)
	}
	if header != "" {
		b.WriteString("\n\n")
	}
	if _, err := w.Write(b.Bytes()); err != nil {
		return err
	}
	for _, c := range changes {
		if c.gitInvisible() {
			continue
		}
		if c.Old != nil && c.New != nil && c.Old.isLink() != c.New.isLink() {
			// git writes a change of type as a deletion and an addition.
			if err := writeFileDiff(w, Change{Path: c.Path, Old: c.Old}, st); err != nil {
				return err
			}
			c.Old = nil
		}
		if err := writeFileDiff(w, c, st); err != nil {
			return err
		}
	}
	return nil
}

// writeFileDiff writes one path's diff.
func writeFileDiff(w io.Writer, c Change, st *Store) error {
	var b bytes.Buffer
	oldOID, newOID := zeroOID, zeroOID
	var old, cur []byte
	var err error
	from, to := quoted("a/", c.Path), quoted("b/", c.Path)
	fmt.Fprintf(&b, "diff --git %s %s\n", from, to)
	switch {
	case c.Old == nil:
		fmt.Fprintf(&b, "new file mode %s\n", c.New.gitMode())
	case c.New == nil:
		fmt.Fprintf(&b, "deleted file mode %s\n", c.Old.gitMode())
	case c.Old.gitMode() != c.New.gitMode():
		fmt.Fprintf(&b, "old mode %s\nnew mode %s\n", c.Old.gitMode(), c.New.gitMode())
	}
	if c.Old != nil {
		oldOID = c.Old.OID
		if old, err = st.Get(oldOID); err != nil {
			return err
		}
	}
	if c.New != nil {
		newOID = c.New.OID
		if cur, err = st.Get(newOID); err != nil {
			return err
		}
	}
	if oldOID != newOID {
		fmt.Fprintf(&b, "index %s..%s", oldOID, newOID)
		if c.Old != nil && c.New != nil && c.Old.gitMode() == c.New.gitMode() {
			fmt.Fprintf(&b, " %s", c.New.gitMode())
		}
		b.WriteString("\n")
	}
	if c.Old == nil {
		from = "/dev/null"
	}
	if c.New == nil {
		to = "/dev/null"
	}
	switch {
	case oldOID == newOID:
	case isBinary(old) || isBinary(cur):
		b.WriteString("GIT binary patch\n")
		if err := writeLiteral(&b, cur); err != nil {
			return err
		}
		if err := writeLiteral(&b, old); err != nil {
			return err
		}
	default:
		d, err := difflib.GetUnifiedDiffString(difflib.UnifiedDiff{
			A: diffLines(string(old)), B: diffLines(string(cur)), FromFile: label(from), ToFile: label(to), Context: 3,
		})
		if err != nil {
			return err
		}
		b.WriteString(d)
	}
	_, err = w.Write(b.Bytes())
	return err
}

// quoted is prefix and name as git writes them in a patch, under its
// default core.quotePath: as they are, or, when name holds a control
// character, a double quote, a backslash or a byte past ASCII, in double
// quotes with each of those escaped as C does (\t, \n, \", \\, \ooo). A
// name with a newline or a tab written raw would end the header's line or
// the name early, and git apply would refuse the whole patch.
func quoted(prefix, name string) string {
	if !strings.ContainsFunc(name, func(r rune) bool { return r < 0x20 || r >= 0x7f || r == '"' || r == '\\' }) {
		return prefix + name
	}
	var b strings.Builder
	b.WriteByte('"')
	b.WriteString(prefix)
	for i := 0; i < len(name); i++ {
		switch c := name[i]; {
		case c == '"' || c == '\\':
			b.WriteByte('\\')
			b.WriteByte(c)
		case c >= 0x07 && c <= 0x0d:
			b.WriteByte('\\')
			b.WriteByte("abtnvfr"[c-0x07])
		case c < 0x20 || c >= 0x7f:
			fmt.Fprintf(&b, "\\%03o", c)
		default:
			b.WriteByte(c)
		}
	}
	b.WriteByte('"')
	return b.String()
}

// label is a "---" or "+++" line's name: git ends one holding a space
// with a tab, so that no reader takes what follows the space for a date.
func label(name string) string {
	if strings.Contains(name, " ") {
		return name + "\t"
	}
	return name
}

// diffLines splits s into lines that keep their "\n"; a last line without
// one is marked as git marks it.
func diffLines(s string) []string {
	if s == "" {
		return nil
	}
	lines := strings.SplitAfter(s, "\n")
	if lines[len(lines)-1] == "" {
		return lines[:len(lines)-1]
	}
	lines[len(lines)-1] += "\n\\ No newline at end of file\n"
	return lines
}

// isBinary is git's test: a NUL in the first 8000 bytes.
func isBinary(data []byte) bool {
	return bytes.IndexByte(data[:min(len(data), 8000)], 0) >= 0
}

// writeLiteral writes data as a binary patch's "literal" hunk: deflated,
// then in lines of at most 52 bytes, each a length character and base85.
func writeLiteral(b *bytes.Buffer, data []byte) error {
	var z bytes.Buffer
	zw := zlib.NewWriter(&z)
	zw.Write(data)
	if err := zw.Close(); err != nil {
		return err
	}
	fmt.Fprintf(b, "literal %d\n", len(data))
	for rest := z.Bytes(); len(rest) > 0; {
		n := min(len(rest), 52)
		if n <= 26 {
			b.WriteByte(byte('A' + n - 1))
		} else {
			b.WriteByte(byte('a' + n - 27))
		}
		b.WriteString(base85(rest[:n]))
		b.WriteByte('\n')
		rest = rest[n:]
	}
	b.WriteByte('\n')
	return nil
}

// base85 encodes data in git's base85 alphabet, zero-padded to a multiple
// of four bytes.
func base85(data []byte) string {
	const alphabet = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz!#$%&()*+-;<=>?@^_`{|}~"
	var out strings.Builder
	for i := 0; i < len(data); i += 4 {
		var v uint32
		for j := range 4 {
			v <<= 8
			if i+j < len(data) {
				v |= uint32(data[i+j])
			}
		}
		var group [5]byte
		for k := 4; k >= 0; k-- {
			group[k] = alphabet[v%85]
			v /= 85
		}
		out.Write(group[:])
	}
	return out.String()
}
