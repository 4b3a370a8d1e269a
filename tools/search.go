package tools

import (
	"fmt"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"
)

// What ls, find and grep share: their limits and how they show names.

// limitOf applies a call's limit (at least 1: the schema says so, and
// checkBounds holds calls to it) under the configured cap.
func limitOf(limit *int, max int) int {
	if limit == nil {
		return max
	}
	return min(*limit, max)
}

// capOutput keeps the lines that fit in maxLines and maxBytes.
func (s *Set) capOutput(lines []string) (kept int, cut bool) {
	size := 0
	for i, l := range lines {
		size += len(l) + 1
		if i >= s.cfg.MaxLines || size > s.cfg.MaxBytes {
			return i, true
		}
	}
	return len(lines), false
}

func (s *Set) outputCutNote() string {
	return fmt.Sprintf("[Output cut to %d lines or %s.", s.cfg.MaxLines, kb(int64(s.cfg.MaxBytes)))
}

// shownName is how a text result writes a name: as it is when every
// character is printable, else quoted Go-style (strconv.Quote: "a\nb",
// "\x1b[31m", "\u202e"), so that a name holding a newline, a terminal
// escape sequence or a bidirectional control cannot pass for other lines,
// other names or other colours. A name that begins with '"' is quoted too,
// so a quoted name never reads as another's. Structured results keep the
// names as they are (JSON escapes them).
func shownName(name string) string {
	if name != "" && name[0] != '"' && utf8.ValidString(name) && !strings.ContainsFunc(name, func(r rune) bool { return !unicode.IsPrint(r) }) {
		return name
	}
	return strconv.Quote(name)
}
