package egress

import (
	"bytes"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"net/http"
	"path"
	"slices"
	"strings"
)

// Secret is a credential the proxy puts into a session's requests in place
// of its placeholder, for the destinations it may go to: a session holds
// the placeholder (in a variable of its environment), never the value.
//
// The proxy replaces the placeholder only in a request it sees — plain
// HTTP, or HTTPS it inspects, which it does for every destination a secret
// may go to — whose host and port match Allow (and method Methods, path
// Paths, when set), and only where such tokens go: the value of a header
// (Authorization: Bearer …, X-Api-Key: …) and the user or password of
// Basic authorization (which is what a URL's user:password@, or git's
// credential helper's answer, become on the wire). A request it sees that
// carries a placeholder anywhere else — to another destination, or in its
// URL — is refused with a 403 that says why; the value is never sent
// there. The value is read (Value) for each request that needs it, so it
// may rotate; it never appears in a Record, an answer of the proxy's or an
// error, and where a response holds it as written (an echo) it is masked
// with asterisks of its length. Bodies of requests are neither searched nor
// changed.
type Secret struct {
	// Name names the secret in records and refusals.
	Name string
	// Placeholder is what the session holds in its place: 16 or more
	// letters, digits, '_' or '-', distinct from every other secret's.
	Placeholder string
	// Allow are the destinations it may go to: "HOST:PORT" rules and
	// presets, as Policy.Allow. They must also be allowed by the policy to
	// be reached at all.
	Allow []string
	// Methods, when not empty, are the request methods it may go with.
	Methods []string
	// Paths, when not empty, are the path prefixes a request's path must
	// lie under ("/repos/acme/" holds "/repos/acme/x"; "/repos/acme" holds
	// it and "/repos/acme" itself, not "/repos/acme-2"). A path with "."
	// or ".." segments, "//" or an encoded '/' is refused for them.
	Paths []string
	// Value returns the secret. Its error's text is shown to the session
	// (and must not hold the value): say what is missing and where.
	Value func() (string, error)

	rules []Rule
}

// WithSecrets gives the proxy the session's secrets. It needs WithTLS to
// see HTTPS requests: New fails without it.
func WithSecrets(secrets ...Secret) Option {
	return func(o *options) { o.secrets = append(o.secrets, secrets...) }
}

// minPlaceholder is the shortest placeholder: long enough that it appears
// in no request by chance.
const minPlaceholder = 16

func compileSecrets(in []Secret) ([]Secret, error) {
	out := make([]Secret, 0, len(in))
	for _, s := range in {
		switch {
		case s.Name == "":
			return nil, errors.New("egress: a secret without a name")
		case len(s.Placeholder) < minPlaceholder || strings.Trim(s.Placeholder, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-") != "":
			return nil, fmt.Errorf("egress: secret %s: its placeholder must be %d or more letters, digits, '_' or '-'", s.Name, minPlaceholder)
		case s.Value == nil:
			return nil, fmt.Errorf("egress: secret %s has no Value", s.Name)
		case len(s.Allow) == 0:
			return nil, fmt.Errorf("egress: secret %s may go nowhere: give it an allow", s.Name)
		}
		for _, o := range out {
			if o.Name == s.Name || strings.Contains(o.Placeholder, s.Placeholder) || strings.Contains(s.Placeholder, o.Placeholder) {
				return nil, fmt.Errorf("egress: secrets %s and %s: names and placeholders must be distinct, and no placeholder within another", o.Name, s.Name)
			}
		}
		rules, err := ParseRules(s.Allow)
		if err != nil {
			return nil, fmt.Errorf("egress: secret %s: %w", s.Name, err)
		}
		for _, p := range s.Paths {
			if !strings.HasPrefix(p, "/") {
				return nil, fmt.Errorf("egress: secret %s: path %q must start with /", s.Name, p)
			}
		}
		s.rules = rules
		s.Methods = slices.Clone(s.Methods)
		for i, m := range s.Methods {
			s.Methods[i] = strings.ToUpper(m)
		}
		out = append(out, s)
	}
	return out, nil
}

// goesTo reports whether the secret may go to host:port at all.
func (s *Secret) goesTo(host string, port uint16) bool {
	return slices.ContainsFunc(s.rules, func(r Rule) bool { return r.Match(host, port) })
}

// may says why the secret may not go in a request of method to host:port
// for p, or "" when it may.
func (s *Secret) may(host string, port uint16, method, p string, rawPath string) string {
	if !s.goesTo(host, port) {
		return "it may not go to " + hostPort(host, port)
	}
	if len(s.Methods) > 0 && !slices.Contains(s.Methods, method) {
		return "it may not go with " + method
	}
	if len(s.Paths) == 0 {
		return ""
	}
	clean := path.Clean(p)
	if strings.HasSuffix(p, "/") && clean != "/" {
		clean += "/"
	}
	if clean != p || strings.Contains(strings.ToLower(rawPath), "%2f") || strings.Contains(strings.ToLower(rawPath), "%5c") {
		return fmt.Sprintf("the path %q is not in its plain form (., .. or // segments, or an encoded separator)", p)
	}
	for _, prefix := range s.Paths {
		if p == strings.TrimSuffix(prefix, "/") || strings.HasPrefix(p, strings.TrimSuffix(prefix, "/")+"/") {
			return ""
		}
	}
	return fmt.Sprintf("it may not go to the path %s", p)
}

// where describes the destinations the secret may go to.
func (s *Secret) where() string {
	w := strings.Join(s.Allow, ", ")
	if len(s.Methods) > 0 {
		w += " with " + strings.Join(s.Methods, ", ")
	}
	if len(s.Paths) > 0 {
		w += " under " + strings.Join(s.Paths, ", ")
	}
	return w
}

// injection is what inject put into a request: the secrets' names, and
// their values, to mask in the response and in errors.
type injection struct {
	names  []string
	values []string
}

// inject puts into req, bound for host:port, the values of the secrets
// whose placeholders its headers carry, where Secret says it may; it
// refuses req (an answer, and nothing changed) when a placeholder is in
// its URL or bound where its secret may not go, or a value cannot be read.
func (p *Proxy) inject(req *http.Request, host string, port uint16) (injection, *answer) {
	var inj injection
	if len(p.o.secrets) == 0 {
		return inj, nil
	}
	for i := range p.o.secrets {
		s := &p.o.secrets[i]
		if strings.Contains(req.RequestURI, s.Placeholder) || strings.Contains(req.URL.Path, s.Placeholder) || strings.Contains(req.URL.RawQuery, s.Placeholder) {
			return inj, secretRefused(s, host, port, req.Method, "its placeholder is in the request's URL; sandboxd puts secrets in headers only "+
				"(Authorization and others, and a URL's user:password@, which is sent as Basic authorization): send it in a header")
		}
	}
	value := func(s *Secret) (string, *answer) {
		v, err := s.Value()
		switch {
		case err != nil:
			return "", &answer{status: http.StatusServiceUnavailable, reason: "secret " + s.Name + " not available",
				body: fmt.Sprintf("sandboxd egress: the secret %s is not available: %v\n", s.Name, err)}
		case v == "" || !headerValue(v):
			return "", &answer{status: http.StatusServiceUnavailable, reason: "secret " + s.Name + " not usable",
				body: fmt.Sprintf("sandboxd egress: the secret %s is empty or holds a character a header cannot\n", s.Name)}
		}
		if !slices.Contains(inj.names, s.Name) {
			inj.names, inj.values = append(inj.names, s.Name), append(inj.values, v)
		}
		return v, nil
	}
	// replace puts the value of every secret whose placeholder is in text
	// in its place, or refuses.
	replace := func(text string) (string, *answer) {
		for i := range p.o.secrets {
			s := &p.o.secrets[i]
			if !strings.Contains(text, s.Placeholder) {
				continue
			}
			if why := s.may(host, port, req.Method, req.URL.Path, req.URL.RawPath); why != "" {
				return "", secretRefused(s, host, port, req.Method, why)
			}
			v, ans := value(s)
			if ans != nil {
				return "", ans
			}
			text = strings.ReplaceAll(text, s.Placeholder, v)
		}
		return text, nil
	}
	for name, vals := range req.Header {
		for i, v := range vals {
			out, ans := replace(v)
			if ans != nil {
				return injection{}, ans
			}
			if enc, ok := strings.CutPrefix(out, "Basic "); ok && name == "Authorization" {
				if raw, err := base64.StdEncoding.DecodeString(strings.TrimSpace(enc)); err == nil {
					dec, ans := replace(string(raw))
					if ans != nil {
						return injection{}, ans
					}
					if dec != string(raw) {
						out = "Basic " + base64.StdEncoding.EncodeToString([]byte(dec))
					}
				}
			}
			vals[i] = out
		}
	}
	return inj, nil
}

// secretRefused is the refusal of a request that would send a secret, or
// its placeholder, where it may not go.
func secretRefused(s *Secret, host string, port uint16, method, why string) *answer {
	return &answer{status: http.StatusForbidden, reason: "secret " + s.Name + ": " + why,
		phrase: blockedPhrase + ": the secret " + s.Name + " may not be sent here",
		body: fmt.Sprintf("sandboxd egress: %s %s refused: it carries the placeholder of the secret %s, and %s.\n"+
			"The secret may go only to %s. sandboxd refuses the request rather than send the secret, or its placeholder, elsewhere;\n"+
			"to send it here, the operator widens the secret's allow (or methods, paths) in the daemon's configuration.\n",
			method, hostPort(host, port), s.Name, why, s.where())}
}

func headerValue(v string) bool {
	for i := 0; i < len(v); i++ {
		if c := v[i]; (c < 0x20 && c != '\t') || c == 0x7f {
			return false
		}
	}
	return true
}

// redact replaces the values in text with "[redacted]".
func (inj injection) redact(text string) string {
	for _, v := range inj.values {
		text = strings.ReplaceAll(text, v, "[redacted]")
	}
	return text
}

// mask hides the values where the response holds them as written: its
// headers, and its body as it is read, each byte of a value an asterisk,
// so that no length changes.
func (inj injection) mask(resp *http.Response) {
	if len(inj.values) == 0 {
		return
	}
	for _, vals := range resp.Header {
		for i, v := range vals {
			for _, s := range inj.values {
				v = strings.ReplaceAll(v, s, strings.Repeat("*", len(s)))
			}
			vals[i] = v
		}
	}
	m := &masker{r: resp.Body}
	for _, v := range inj.values {
		m.values = append(m.values, []byte(v))
		m.keep = max(m.keep, len(v)-1)
	}
	resp.Body = m
}

// masker reads r with every occurrence of values masked. It holds back
// the last keep bytes read until more come, so that a value split between
// two reads is masked whole.
type masker struct {
	r      io.ReadCloser
	values [][]byte
	keep   int
	buf    []byte
	start  int
	err    error
}

func (m *masker) Read(p []byte) (int, error) {
	for {
		ready := len(m.buf) - m.start
		if m.err == nil {
			ready -= m.keep
		}
		if ready > 0 {
			n := copy(p, m.buf[m.start:m.start+ready])
			m.start += n
			return n, nil
		}
		if m.err != nil {
			return 0, m.err
		}
		m.buf = append(m.buf[:0], m.buf[m.start:]...)
		m.start = 0
		if cap(m.buf)-len(m.buf) < 16<<10 {
			m.buf = slices.Grow(m.buf, 32<<10)
		}
		n, err := m.r.Read(m.buf[len(m.buf):cap(m.buf)])
		m.buf = m.buf[:len(m.buf)+n]
		m.err = err
		for _, v := range m.values {
			for i := 0; ; {
				j := bytes.Index(m.buf[i:], v)
				if j < 0 {
					break
				}
				for k := range v {
					m.buf[i+j+k] = '*'
				}
				i += j + len(v)
			}
		}
	}
}

func (m *masker) Close() error { return m.r.Close() }
