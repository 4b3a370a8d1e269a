package interp

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"
)

// ---- cat

var catFlags = flagSpec[catOptions]{bools: "nbsETAvet", long: map[string]string{"number": "n", "number-nonblank": "b",
	"squeeze-blank": "s", "show-ends": "E", "show-tabs": "T", "show-all": "A", "show-nonprinting": "v"},
	set: map[string]setter[catOptions]{
		"n": on(func(o *catOptions) { o.number = true }), "b": on(func(o *catOptions) { o.nonblank = true }),
		"s": on(func(o *catOptions) { o.squeeze = true }), "E": on(func(o *catOptions) { o.ends = true }),
		"T": on(func(o *catOptions) { o.tabs = true }), "v": on(func(o *catOptions) { o.nonprint = true }),
		"A": on(func(o *catOptions) { o.nonprint, o.ends, o.tabs = true, true, true }),
		"e": on(func(o *catOptions) { o.nonprint, o.ends = true, true }),
		"t": on(func(o *catOptions) { o.nonprint, o.tabs = true, true }),
	}}

// catOptions are cat's options: -n, -b, -s, -E, -T, -v (-A, -e, -t set several).
type catOptions struct {
	number   bool
	nonblank bool
	squeeze  bool
	ends     bool
	tabs     bool
	nonprint bool
}

func cmdCat(c *call) int {
	var o catOptions
	ops, st, ok := parseFlags(c, &catFlags, &o)
	if !ok {
		return st
	}
	plain := !o.number && !o.nonblank && !o.squeeze && !o.ends && !o.tabs && !o.nonprint
	if len(ops) == 0 {
		ops = []string{"-"}
	}
	status, lineNo, prevBlank := 0, 0, false
	for _, a := range ops {
		if c.stopped() {
			break
		}
		if plain && a == "-" {
			c.out.Flush()
			if _, err := copyCtx(c.ctx, c.out, c.in); err != nil && c.ctx.Err() == nil && !errors.Is(err, io.ErrClosedPipe) {
				c.errorf("-: %s", ErrorText(err))
				status = 1
			}
			continue
		}
		data, err := c.readInput(a)
		if err != nil {
			c.fail(a, err)
			status = 1
			continue
		}
		if plain {
			c.write(data)
			continue
		}
		for line := range bytes.SplitAfterSeq(data, []byte("\n")) {
			if len(line) == 0 {
				continue // after the last newline
			}
			body, nl := bytes.CutSuffix(line, []byte("\n"))
			blank := len(body) == 0
			if o.squeeze && blank && prevBlank {
				continue
			}
			prevBlank = blank
			var b strings.Builder
			if (o.number && !o.nonblank) || (o.nonblank && !blank) {
				lineNo++
				fmt.Fprintf(&b, "%6d\t", lineNo)
			}
			for _, ch := range body {
				switch {
				case ch == '\t' && o.tabs:
					b.WriteString("^I")
				case ch == '\t':
					b.WriteByte(ch)
				case o.nonprint && ch >= 128:
					b.WriteString("M-")
					ch -= 128
					fallthrough
				case o.nonprint && (ch < 32 || ch == 127):
					if ch < 32 {
						b.WriteByte('^')
						b.WriteByte(ch + 64)
					} else if ch == 127 {
						b.WriteString("^?")
					} else {
						b.WriteByte(ch)
					}
				default:
					b.WriteByte(ch)
				}
			}
			if nl {
				if o.ends {
					b.WriteByte('$')
				}
				b.WriteByte('\n')
			}
			if !c.print(b.String()) {
				break
			}
		}
	}
	return status
}

// ---- head and tail

var headTailFlags = flagSpec[headTailOptions]{bools: "qvf", values: "nc", numeric: "n",
	long: map[string]string{"lines": "n=", "bytes": "c=", "quiet": "q", "silent": "q", "verbose": "v"},
	set: map[string]setter[headTailOptions]{
		"n": setCount, "c": setCount,
		"q": on(func(o *headTailOptions) { o.headers = -1 }),
		"v": on(func(o *headTailOptions) { o.headers = 1 }),
		"f": func(*call, *headTailOptions, string, string) error {
			return usagef("-f is not supported: the shell tool does not follow files")
		},
	}}

// headTailOptions are head's and tail's options: -n or -c, -q, -v.
type headTailOptions struct {
	ct      count
	headers int // 0: when several files; -1 never; 1 always
}

// setCount reads -n's or -c's value.
func setCount(_ *call, o *headTailOptions, name, val string) error {
	ct, ok := parseCount(val, name == "c")
	if !ok {
		what := "lines"
		if name == "c" {
			what = "bytes"
		}
		return usagef("invalid number of %s: '%s'", what, val)
	}
	o.ct = ct
	return nil
}

// count is head's or tail's -n/-c argument: a number, "+N" (tail: from N)
// or "-N" (head: all but the last N).
type count struct {
	n           int64
	bytes       bool
	plus, minus bool
}

func parseCount(v string, bytes bool) (count, bool) {
	ct := count{bytes: bytes}
	switch {
	case strings.HasPrefix(v, "+"):
		ct.plus, v = true, v[1:]
	case strings.HasPrefix(v, "-"):
		ct.minus, v = true, v[1:]
	}
	mult := int64(1)
	for suf, m := range map[string]int64{"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "k": 1 << 10, "KB": 1000, "MB": 1000 * 1000} {
		if s, ok := strings.CutSuffix(v, suf); ok && isDigits(s) {
			v, mult = s, m
			break
		}
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n < 0 {
		return ct, false
	}
	ct.n = n * mult
	return ct, true
}

func cmdHead(c *call) int { return headTail(c, true) }
func cmdTail(c *call) int { return headTail(c, false) }

func headTail(c *call, head bool) int {
	o := headTailOptions{ct: count{n: 10}}
	ops, st, ok := parseFlags(c, &headTailFlags, &o)
	if !ok {
		return st
	}
	ct, headers := o.ct, o.headers
	if len(ops) == 0 {
		ops = []string{"-"}
	}
	show := headers == 1 || (headers == 0 && len(ops) > 1)
	status := 0
	for i, a := range ops {
		if c.stopped() {
			break
		}
		name := a
		if a == "-" {
			name = "standard input"
		}
		if head && a == "-" && !ct.minus && !ct.bytes {
			if show {
				c.headerLine(i, name)
			}
			c.headLinesStream(ct.n)
			continue
		}
		data, err := c.readInput(a)
		if err != nil {
			c.errorf("cannot open '%s' for reading: %s", a, ErrorText(err))
			status = 1
			continue
		}
		if show {
			c.headerLine(i, name)
		}
		c.write(cutHeadTail(data, ct, head))
	}
	return status
}

func (c *call) headerLine(i int, name string) {
	if i > 0 {
		c.print("\n")
	}
	c.print("==> " + name + " <==\n")
}

// headLinesStream copies the first n lines of stdin without reading further,
// so head ends a pipeline early.
func (c *call) headLinesStream(n int64) {
	br := bufio.NewReader(c.in)
	for ; n > 0 && !c.stopped(); n-- {
		line, err := br.ReadBytes('\n')
		c.write(line)
		if err != nil {
			return
		}
	}
}

// cutHeadTail returns the part of data head or tail shows.
func cutHeadTail(data []byte, ct count, head bool) []byte {
	if ct.bytes {
		n := int(min(ct.n, int64(len(data))))
		switch {
		case head && ct.minus:
			return data[:len(data)-n]
		case head:
			return data[:n]
		case ct.plus:
			return data[max(0, min(int(ct.n)-1, len(data))):]
		default:
			return data[len(data)-n:]
		}
	}
	// lineStart(k) is the offset of line k (0-based); len(data) past the end.
	var starts []int
	starts = append(starts, 0)
	for i, b := range data {
		if b == '\n' && i+1 < len(data) {
			starts = append(starts, i+1)
		}
	}
	lines := int64(len(starts))
	if len(data) == 0 {
		lines = 0
	}
	at := func(k int64) int {
		if k >= lines {
			return len(data)
		}
		if k <= 0 {
			return 0
		}
		return starts[k]
	}
	switch {
	case head && ct.minus:
		return data[:at(lines-ct.n)]
	case head:
		return data[:at(ct.n)]
	case ct.plus:
		return data[at(ct.n-1):]
	default:
		return data[at(lines-ct.n):]
	}
}

// ---- wc

var wcFlags = flagSpec[map[string]bool]{bools: "lwcmL", long: map[string]string{"lines": "l", "words": "w", "bytes": "c",
	"chars": "m", "max-line-length": "L"},
	set: map[string]setter[map[string]bool]{"l": wcShow, "w": wcShow, "c": wcShow, "m": wcShow, "L": wcShow}}

// wcShow asks wc for the count the option names.
func wcShow(_ *call, show *map[string]bool, name, _ string) error {
	(*show)[name] = true
	return nil
}

func cmdWc(c *call) int {
	show := map[string]bool{}
	ops, st, ok := parseFlags(c, &wcFlags, &show)
	if !ok {
		return st
	}
	if len(show) == 0 {
		show = map[string]bool{"l": true, "w": true, "c": true}
	}
	stdin := len(ops) == 0
	if stdin {
		ops = []string{"-"}
	}
	type counts struct {
		vals [5]int64 // l w m c L
		name string
		ok   bool
	}
	order := []string{"l", "w", "m", "c", "L"}
	var rows []counts
	var total counts
	status, regularBytes, minWidth := 0, int64(0), 1
	for _, a := range ops {
		data, err := c.readInput(a)
		if err != nil {
			c.fail(a, err)
			status = 1
			continue
		}
		if a == "-" {
			minWidth = 7
		} else {
			regularBytes += int64(len(data))
		}
		var k counts
		k.name, k.ok = a, true
		if stdin {
			k.name = ""
		}
		k.vals = wcCount(data)
		for i := range k.vals {
			if i == 4 {
				total.vals[i] = max(total.vals[i], k.vals[i])
			} else {
				total.vals[i] += k.vals[i]
			}
		}
		rows = append(rows, k)
	}
	if len(ops) > 1 {
		total.name, total.ok = "total", true
		rows = append(rows, total)
	}
	width := len(strconv.FormatInt(regularBytes, 10))
	width = max(width, minWidth)
	if len(show) == 1 && len(ops) == 1 {
		width = 1
	}
	for _, k := range rows {
		var fields []string
		for i, o := range order {
			if show[o] {
				fields = append(fields, fmt.Sprintf("%*d", width, k.vals[i]))
			}
		}
		line := strings.Join(fields, " ")
		if k.name != "" {
			line += " " + k.name
		}
		c.print(line + "\n")
	}
	return status
}

func wcCount(data []byte) [5]int64 {
	var v [5]int64
	v[3] = int64(len(data))
	inWord := false
	lineLen := int64(0)
	for len(data) > 0 {
		r, size := utf8.DecodeRune(data)
		data = data[size:]
		v[2]++
		switch {
		case r == '\n':
			v[0]++
			v[4] = max(v[4], lineLen)
			lineLen = 0
		case r == '\t':
			lineLen += 8 - lineLen%8
		default:
			lineLen++
		}
		if unicode.IsSpace(r) {
			inWord = false
		} else if !inWord {
			inWord = true
			v[1]++
		}
	}
	v[4] = max(v[4], lineLen)
	return v
}
