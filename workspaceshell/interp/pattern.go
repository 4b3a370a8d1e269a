package interp

import (
	"fmt"
	"regexp"
	"strings"
	"unicode/utf8"
)

// grep and rg: one searcher, two front ends. Patterns are compiled to Go's
// RE2 (linear time: no pattern can hold the line): grep's basic and extended
// syntaxes are translated, -P and rg patterns are taken as RE2, whose syntax
// covers what they commonly use (no look-around, no back-references).

// lineMatcher matches single lines.
type lineMatcher struct {
	re   *regexp.Regexp // the pattern; with word set, wrapped so group 1 is the word
	cont *regexp.Regexp // word mode: the pattern after a known non-word character
	word bool
}

// wordClass is what -w takes as a word constituent: letters, digits, "_".
const nonWord = `[^\pL\pN_]`

// newLineMatcher compiles patterns (alternatives) of the given syntax: 'G'
// (POSIX basic), 'E' (extended), 'F' (fixed strings) or 'P' (RE2 as it is).
func newLineMatcher(patterns []string, syntax byte, ignoreCase, word, whole bool) (*lineMatcher, error) {
	alts := make([]string, len(patterns))
	for i, p := range patterns {
		switch syntax {
		case 'F':
			alts[i] = regexp.QuoteMeta(p)
		case 'G', 'E':
			t, err := posixToRE2(p, syntax == 'E')
			if err != nil {
				return nil, err
			}
			alts[i] = t
		default:
			alts[i] = p
		}
	}
	expr := "(?:" + strings.Join(alts, ")|(?:") + ")"
	if len(alts) == 0 {
		expr = `[^\s\S]` // no pattern matches nothing
	}
	if whole {
		expr = "^(?:" + expr + ")$"
	}
	flags := ""
	if ignoreCase {
		flags = "(?i)"
	}
	m := &lineMatcher{word: word && !whole}
	compile := func(e string) (*regexp.Regexp, error) {
		re, err := regexp.Compile(flags + e)
		if err != nil {
			return nil, fmt.Errorf("invalid regular expression: %v", strings.TrimPrefix(err.Error(), "error parsing regexp: "))
		}
		if syntax == 'G' || syntax == 'E' {
			re.Longest() // POSIX: leftmost-longest
		}
		return re, nil
	}
	var err error
	if m.word {
		if m.re, err = compile("(?:^|" + nonWord + ")(" + expr + ")(?:" + nonWord + "|$)"); err != nil {
			return nil, err
		}
		m.cont, err = compile(nonWord + "(" + expr + ")(?:" + nonWord + "|$)")
		return m, err
	}
	m.re, err = compile(expr)
	return m, err
}

func (m *lineMatcher) match(line []byte) bool { return m.re.Match(line) }

// spans returns the non-empty matches in line, left to right.
func (m *lineMatcher) spans(line []byte) [][2]int {
	var out [][2]int
	if !m.word {
		for _, loc := range m.re.FindAllIndex(line, -1) {
			if loc[1] > loc[0] {
				out = append(out, [2]int{loc[0], loc[1]})
			}
		}
		return out
	}
	pos := 0
	for pos <= len(line) {
		var loc []int
		shift := 0
		if pos == 0 {
			loc = m.re.FindSubmatchIndex(line)
		} else {
			_, size := utf8.DecodeLastRune(line[:pos])
			shift = pos - size
			loc = m.cont.FindSubmatchIndex(line[shift:])
		}
		if loc == nil {
			break
		}
		s, e := loc[2]+shift, loc[3]+shift
		if e == s {
			pos = e + 1
			continue
		}
		out = append(out, [2]int{s, e})
		pos = e
	}
	return out
}

// posixToRE2 translates a POSIX basic (ere false) or extended regular
// expression, with GNU's extensions (\< \> \w \s \b \| \+ \?), to RE2.
// Back-references have no RE2 form and fail.
func posixToRE2(p string, ere bool) (string, error) {
	var b strings.Builder
	atStart := true // where "*" is literal and "^" an anchor
	for i := 0; i < len(p); {
		c := p[i]
		start := atStart
		atStart = false
		switch {
		case c == '\\':
			if i+1 == len(p) {
				return "", fmt.Errorf("trailing backslash (\\)")
			}
			n := p[i+1]
			i += 2
			switch {
			case !ere && (n == '(' || n == '|'):
				b.WriteByte(n)
				atStart = true
			case !ere && n == ')':
				b.WriteByte(n)
			case !ere && n == '{':
				if start {
					b.WriteString(`\{`)
				} else {
					b.WriteByte('{')
				}
			case !ere && n == '}':
				b.WriteByte('}')
			case !ere && (n == '+' || n == '?'):
				if start {
					b.WriteString(`\` + string(n))
				} else {
					b.WriteByte(n)
				}
			case n == '<' || n == '>':
				b.WriteString(`\b`)
			case n >= '1' && n <= '9':
				return "", fmt.Errorf("back-references (\\%c) are not supported: patterns are RE2", n)
			case strings.IndexByte("wWsSbB", n) >= 0:
				b.WriteString(`\` + string(n))
			case n == '`':
				b.WriteString(`\A`)
			case n == '\'':
				b.WriteString(`\z`)
			default:
				b.WriteString(regexp.QuoteMeta(string(n)))
			}
			continue
		case c == '[':
			j, class, err := bracket(p, i)
			if err != nil {
				return "", err
			}
			b.WriteString(class)
			i = j
			continue
		case c == '*' || (ere && (c == '+' || c == '?')):
			if start {
				b.WriteString(`\` + string(c))
			} else {
				b.WriteByte(c)
			}
		case c == '^':
			if start || ere {
				b.WriteByte('^')
				atStart = true
			} else {
				b.WriteString(`\^`)
			}
		case c == '$':
			rest := p[i+1:]
			if ere || rest == "" || strings.HasPrefix(rest, `\)`) || strings.HasPrefix(rest, `\|`) {
				b.WriteByte('$')
			} else {
				b.WriteString(`\$`)
			}
		case ere && (c == '(' || c == '|'):
			b.WriteByte(c)
			atStart = true
		case ere && c == ')':
			b.WriteByte(c)
		case ere && c == '{':
			if start || !interval.MatchString(p[i:]) {
				b.WriteString(`\{`)
			} else {
				b.WriteByte('{')
			}
		case strings.IndexByte("(){}|+?", c) >= 0:
			b.WriteString(`\` + string(c))
		default:
			b.WriteByte(c)
		}
		i++
	}
	return b.String(), nil
}

var interval = regexp.MustCompile(`^\{[0-9]+(,[0-9]*)?\}`)

// bracket translates the bracket expression at p[i] and returns the index
// after it. Backslashes are literal inside POSIX brackets.
func bracket(p string, i int) (int, string, error) {
	var b strings.Builder
	b.WriteByte('[')
	j := i + 1
	if j < len(p) && p[j] == '^' {
		b.WriteByte('^')
		j++
	}
	first := true
	for ; j < len(p); j++ {
		c := p[j]
		switch {
		case c == ']' && !first:
			b.WriteByte(']')
			return j + 1, b.String(), nil
		case c == '[' && j+1 < len(p) && (p[j+1] == ':' || p[j+1] == '=' || p[j+1] == '.'):
			end := strings.Index(p[j+2:], string(p[j+1])+"]")
			if end < 0 {
				return 0, "", fmt.Errorf("unmatched [ in a character class")
			}
			if p[j+1] != ':' {
				return 0, "", fmt.Errorf("[%c…%c] in a bracket expression is not supported", p[j+1], p[j+1])
			}
			b.WriteString(p[j : j+2+end+2])
			j += 2 + end + 1
		case c == '\\' || c == '[' || c == ']':
			b.WriteString(`\` + string(c))
		default:
			b.WriteByte(c)
		}
		first = false
	}
	return 0, "", fmt.Errorf("unmatched [, [^, [:, [., or [=")
}
