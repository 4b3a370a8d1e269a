package sources

import (
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/url"
	"os"
	"regexp"
	"slices"
	"strings"

	"github.com/sandboxd/sandboxd/workspace"
)

// HTTPDecl declares an API-backed ("http") source: the API's base URL,
// the request shapes the agent may send, and the credential the daemon adds.
//
// The agent never holds the credential: it is read from the daemon's
// environment or a file on the daemon's host when a request is sent, added
// to the request by the Gateway, and redacted from every response.
type HTTPDecl struct {
	// URL is the API's base: an absolute http or https URL with a host and
	// no user, query or fragment ("https://api.example.com/v2"). Every
	// request goes to this scheme, host and port, under this path.
	URL string `json:"url,omitempty"`
	// Requests are the request shapes the agent may send (at least one).
	Requests []RequestShape `json:"requests,omitempty"`
	// Credential, when set, is added to every request.
	Credential *Credential `json:"credential,omitempty"`
	// MaxResponseBytes bounds a response's body (after decompression);
	// a larger one is refused. Default DefaultMaxResponseBytes.
	MaxResponseBytes int64 `json:"maxResponseBytes,omitempty"`
	// TimeoutMs bounds a request, redirects and the body included.
	// Default DefaultHTTPTimeout.
	TimeoutMs int64 `json:"timeoutMs,omitempty"`
}

// RequestShape is one request an HTTP source allows, and what in it the
// agent may vary.
type RequestShape struct {
	// Method is GET, HEAD, POST, PUT, PATCH or DELETE.
	Method string `json:"method"`
	// Path is the path under the source's URL, starting with "/": literal
	// segments, "{name}" for one segment the agent chooses, and a final
	// "{name...}" for one or more ("/items/{id}", "/files/{path...}"). A
	// chosen segment is never empty, "." or "..", and never holds an
	// encoded '/' or '\'.
	Path string `json:"path"`
	// Query are the names of the query parameters the agent may set; any
	// other is refused.
	Query []string `json:"query,omitempty"`
	// Headers are request headers the agent may set besides Accept (and
	// Content-Type, with Body). The credential's header and the headers
	// of the connection (Host, Cookie, Content-Length, …) are never
	// allowed.
	Headers []string `json:"headers,omitempty"`
	// Body allows a request body, of at most DefaultMaxRequestBytes.
	Body bool `json:"body,omitempty"`
	// Description tells the agent what the request is for.
	Description string `json:"description,omitempty"`
}

// Credential says where the daemon finds the secret it adds to a source's
// requests, as the header Header with the value Prefix + secret.
type Credential struct {
	// Header is the header that carries it ("Authorization").
	Header string `json:"header"`
	// Prefix comes before the secret ("Bearer ").
	Prefix string `json:"prefix,omitempty"`
	Secret
}

// Secret says where the daemon reads a secret: exactly one of Env and
// File. It is read each time it is needed, so it can be rotated, and a
// trailing newline is dropped. The configuration holds where, never the
// secret, and no error says what it holds. The source gateway's
// credentials are Secrets, and so are the egress broker's (package runner).
type Secret struct {
	// Env names the daemon's environment variable that holds the secret.
	Env string `json:"env,omitempty"`
	// File is an absolute path on the daemon's host of a file that holds it.
	File string `json:"file,omitempty"`
}

// Validate checks that exactly one of Env and File is set, File an
// absolute path; the error names the field ("file").
func (s Secret) Validate() *DeclError {
	switch {
	case (s.Env == "") == (s.File == ""):
		return &DeclError{Reason: "set exactly one of env and file (the secret itself is never in the configuration)"}
	case s.File != "" && !strings.HasPrefix(s.File, "/"):
		return &DeclError{Field: "file", Reason: fmt.Sprintf("%q must be an absolute path", s.File)}
	}
	return nil
}

// Read reads the secret now: the environment variable through lookupEnv
// (nil: os.LookupEnv), or the file (at most 64 KiB). It fails wrapping
// workspace.ErrUnavailable with where it looked — never what it found —
// when the variable is unset or empty, the file cannot be read or is
// empty, or the secret holds a character a header cannot.
func (s Secret) Read(lookupEnv func(string) (string, bool)) (string, error) {
	unavailable := func(where string) error { return fmt.Errorf("%w: %s", workspace.ErrUnavailable, where) }
	var v string
	if s.Env != "" {
		if lookupEnv == nil {
			lookupEnv = os.LookupEnv
		}
		val, ok := lookupEnv(s.Env)
		if !ok || val == "" {
			return "", unavailable("the daemon's environment variable " + s.Env + " is unset or empty")
		}
		v = val
	} else {
		f, err := os.Open(s.File)
		if err != nil {
			return "", unavailable("cannot open " + s.File)
		}
		data, err := io.ReadAll(io.LimitReader(f, 64<<10))
		f.Close()
		if err != nil {
			return "", unavailable("cannot read " + s.File)
		}
		v = strings.TrimRight(string(data), "\r\n")
		if v == "" {
			return "", unavailable(s.File + " is empty")
		}
	}
	if !validHeaderValue(v) {
		return "", unavailable("the secret holds a character a header cannot")
	}
	return v, nil
}

// Limits of HTTP sources.
const (
	DefaultMaxResponseBytes = 4 << 20
	DefaultHTTPTimeout      = 30_000 // milliseconds
	DefaultMaxRequestBytes  = 1 << 20
	// MaxRedirects is the most redirects a request follows; each must
	// itself be a declared request of the source.
	MaxRedirects = 5
	// DescriptorFile is the Source Request descriptor's name in an http
	// source's snapshot.
	DescriptorFile = "requests.json"
)

var (
	methods   = []string{"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE"}
	segmentRE = regexp.MustCompile(`^[A-Za-z0-9._~!$&'()*+,;=:@-]+$`)
	wildRE    = regexp.MustCompile(`^\{([A-Za-z_][A-Za-z0-9_]*)(\.\.\.)?\}$`)
	// connectionHeaders are never the agent's to set, even when declared.
	connectionHeaders = []string{"Host", "Cookie", "Content-Length", "Transfer-Encoding", "Connection",
		"Proxy-Authorization", "Proxy-Connection", "Te", "Trailer", "Upgrade", "Keep-Alive", "Forwarded",
		"X-Forwarded-For", "X-Forwarded-Host", "X-Forwarded-Proto", "Expect"}
)

// validate checks an http declaration; the error's Field is relative
// ("url", "requests[0].path") and the caller prefixes it.
func (h HTTPDecl) validate() *DeclError {
	bad := func(f, format string, args ...any) *DeclError {
		return &DeclError{Field: f, Reason: fmt.Sprintf(format, args...)}
	}
	base, err := url.Parse(h.URL)
	switch {
	case err != nil || h.URL == "":
		return bad("url", "%q is not a URL", h.URL)
	case base.Scheme != "http" && base.Scheme != "https":
		return bad("url", "%q: the scheme must be http or https", h.URL)
	case base.Host == "" || base.Hostname() == "":
		return bad("url", "%q has no host", h.URL)
	case base.User != nil || base.RawQuery != "" || base.ForceQuery || base.Fragment != "":
		return bad("url", "%q: a source's URL has no user, query or fragment", h.URL)
	}
	if len(h.Requests) == 0 {
		return bad("requests", "an http source declares at least one request")
	}
	credHeader := ""
	if c := h.Credential; c != nil {
		credHeader = http.CanonicalHeaderKey(c.Header)
		switch {
		case !validHeaderName(c.Header):
			return bad("credential.header", "%q is not a header name", c.Header)
		case slices.Contains(connectionHeaders, credHeader):
			return bad("credential.header", "%s is a header of the connection", credHeader)
		case !validHeaderValue(c.Prefix):
			return bad("credential.prefix", "%q cannot be in a header", c.Prefix)
		}
		if err := c.Secret.Validate(); err != nil {
			return bad(strings.TrimSuffix("credential."+err.Field, "."), "%s", err.Reason)
		}
	}
	if h.MaxResponseBytes < 0 {
		return bad("maxResponseBytes", "must not be negative")
	}
	if h.TimeoutMs < 0 {
		return bad("timeoutMs", "must not be negative")
	}
	for i, r := range h.Requests {
		f := func(s string) string { return fmt.Sprintf("requests[%d].%s", i, s) }
		if !slices.Contains(methods, r.Method) {
			return bad(f("method"), "%q is not one of %s", r.Method, strings.Join(methods, ", "))
		}
		if _, err := parsePattern(r.Path); err != nil {
			return bad(f("path"), "%q: %v", r.Path, err)
		}
		for _, q := range r.Query {
			if q == "" || strings.ContainsAny(q, "&=#") || !utf8Printable(q) {
				return bad(f("query"), "%q is not a query parameter name", q)
			}
		}
		for _, hd := range r.Headers {
			canon := http.CanonicalHeaderKey(hd)
			switch {
			case !validHeaderName(hd):
				return bad(f("headers"), "%q is not a header name", hd)
			case canon == credHeader:
				return bad(f("headers"), "%s carries the credential: the agent never sets it", canon)
			case slices.Contains(connectionHeaders, canon):
				return bad(f("headers"), "%s is a header of the connection: the agent never sets it", canon)
			}
		}
		for j, o := range h.Requests[:i] {
			if o.Method == r.Method && o.Path == r.Path {
				return bad(f("path"), "%s %s is already requests[%d]", r.Method, r.Path, j)
			}
		}
	}
	return nil
}

// validHeaderName reports whether s is an RFC 9110 token.
func validHeaderName(s string) bool {
	return s != "" && strings.Trim(s, "!#$%&'*+-.^_`|~0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz") == ""
}

// validHeaderValue reports whether s may be a header's value: no control
// characters but tab.
func validHeaderValue(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; (c < 0x20 && c != '\t') || c == 0x7f {
			return false
		}
	}
	return true
}

func utf8Printable(s string) bool {
	for _, r := range s {
		if r < 0x20 || r == 0x7f || r == 0xfffd {
			return false
		}
	}
	return true
}

// segment is one segment of a path pattern: a literal, or a wildcard
// (rest: it takes all the remaining segments).
type segment struct {
	lit, wild string
	rest      bool
}

// parsePattern reads "/items/{id}" into segments; "/" is no segment.
func parsePattern(p string) ([]segment, error) {
	if !strings.HasPrefix(p, "/") {
		return nil, fmt.Errorf("must start with /")
	}
	if p == "/" {
		return nil, nil
	}
	parts := strings.Split(p[1:], "/")
	segs := make([]segment, 0, len(parts))
	seen := map[string]bool{}
	for i, part := range parts {
		if m := wildRE.FindStringSubmatch(part); m != nil {
			if seen[m[1]] {
				return nil, fmt.Errorf("{%s} appears twice", m[1])
			}
			seen[m[1]] = true
			rest := m[2] != ""
			if rest && i != len(parts)-1 {
				return nil, fmt.Errorf("{%s...} must be the last segment", m[1])
			}
			segs = append(segs, segment{wild: m[1], rest: rest})
			continue
		}
		if !segmentRE.MatchString(part) || part == "." || part == ".." {
			return nil, fmt.Errorf("segment %q is not a literal path segment or {name}", part)
		}
		segs = append(segs, segment{lit: part})
	}
	return segs, nil
}

// Descriptor is the Source Request descriptor of an http source: what
// materialize_sources writes to .sandboxd/sources/<name>/requests.json so
// the agent knows what it may ask. It never holds the credential.
type Descriptor struct {
	Source   string             `json:"source"`
	Kind     Kind               `json:"kind"`
	URL      string             `json:"url"`
	Requests []DescribedRequest `json:"requests"`
	Limits   DescriptorLimits   `json:"limits"`
	Auth     string             `json:"credential,omitempty"`
	Usage    string             `json:"usage"`
}

// DescribedRequest is one request shape as the agent sees it.
type DescribedRequest struct {
	Method string `json:"method"`
	// URL is the source's URL joined with the path pattern.
	URL         string `json:"url"`
	Vary        Vary   `json:"vary"`
	Description string `json:"description,omitempty"`
	// Example is a curl command line that sends it, with the parts the
	// agent chooses in capitals.
	Example string `json:"example"`
}

// RequestDescriptor is the Source Request descriptor of one request shape,
// complete in itself: requests/NN-METHOD-PATH.json in the snapshot.
type RequestDescriptor struct {
	Source string `json:"source"`
	DescribedRequest
	Limits DescriptorLimits `json:"limits"`
	Auth   string           `json:"credential,omitempty"`
}

// Vary is what the agent may choose in a request.
type Vary struct {
	Path    []string `json:"path"`
	Query   []string `json:"query"`
	Headers []string `json:"headers"`
	Body    bool     `json:"body"`
}

// DescriptorLimits are an http source's limits.
type DescriptorLimits struct {
	MaxResponseBytes int64 `json:"maxResponseBytes"`
	MaxRequestBytes  int64 `json:"maxRequestBytes"`
	TimeoutMs        int64 `json:"timeoutMs"`
	MaxRedirects     int   `json:"maxRedirects"`
}

func (h HTTPDecl) maxResponse() int64 {
	if h.MaxResponseBytes > 0 {
		return h.MaxResponseBytes
	}
	return DefaultMaxResponseBytes
}

func (h HTTPDecl) timeoutMs() int64 {
	if h.TimeoutMs > 0 {
		return h.TimeoutMs
	}
	return DefaultHTTPTimeout
}

// allowedHeaders are the request headers a shape lets the agent set.
func (r RequestShape) allowedHeaders() []string {
	hs := []string{"Accept"}
	if r.Body {
		hs = append(hs, "Content-Type")
	}
	for _, h := range r.Headers {
		if c := http.CanonicalHeaderKey(h); !slices.Contains(hs, c) {
			hs = append(hs, c)
		}
	}
	return hs
}

// Describe returns the descriptor of an http source.
func (d Decl) Describe() Descriptor {
	base := strings.TrimSuffix(d.URL, "/")
	desc := Descriptor{Source: d.Name, Kind: d.Kind, URL: d.URL,
		Limits: DescriptorLimits{MaxResponseBytes: d.maxResponse(), MaxRequestBytes: DefaultMaxRequestBytes,
			TimeoutMs: d.timeoutMs(), MaxRedirects: MaxRedirects},
		Usage: "Send a declared request with the shell tool's curl (the sandbox has no network; sandboxd sends it): " +
			"curl [-s] [-i] [-f] [-L] [-X METHOD] [-H 'Name: value'] [-d DATA | -d @file] [-G] URL. " +
			"Anything not declared here is refused.",
	}
	if c := d.Credential; c != nil {
		desc.Auth = "sandboxd adds the " + http.CanonicalHeaderKey(c.Header) + " header to every request; its value is never visible in the workspace"
	}
	for _, r := range d.Requests {
		v := Vary{Query: nonNil(r.Query), Headers: r.allowedHeaders(), Body: r.Body, Path: []string{}}
		segs, _ := parsePattern(r.Path)
		for _, s := range segs {
			if s.wild != "" {
				v.Path = append(v.Path, s.wild)
			}
		}
		desc.Requests = append(desc.Requests, DescribedRequest{Method: r.Method, URL: base + r.Path, Vary: v,
			Description: r.Description, Example: example(r, base)})
	}
	return desc
}

// example is a curl command line for a request shape.
func example(r RequestShape, base string) string {
	u := base + wildInRE.ReplaceAllStringFunc(r.Path, func(w string) string {
		return strings.ToUpper(wildInRE.FindStringSubmatch(w)[1])
	})
	if len(r.Query) > 0 {
		u += "?" + url.QueryEscape(r.Query[0]) + "=VALUE"
	}
	cmd := "curl -s"
	switch r.Method {
	case "GET":
	case "HEAD":
		cmd += " -I"
	default:
		cmd += " -X " + r.Method
	}
	if r.Body {
		cmd += " -H 'Content-Type: application/json' -d @body.json"
	}
	return cmd + " '" + u + "'"
}

// descriptorName is the file of request i's descriptor in the snapshot.
func descriptorName(i int, r RequestShape) string {
	slug := strings.Trim(nonAlnum.ReplaceAllString(strings.ToLower(r.Path), "-"), "-")
	if slug == "" {
		slug = "root"
	}
	return fmt.Sprintf("requests/%02d-%s-%s.json", i+1, strings.ToLower(r.Method), slug)
}

var (
	nonAlnum = regexp.MustCompile(`[^a-z0-9]+`)
	wildInRE = regexp.MustCompile(`\{([A-Za-z_][A-Za-z0-9_]*)(?:\.\.\.)?\}`)
)

func nonNil(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}

// loadHTTP is an http source's snapshot: the overview, requests.json, and
// one Source Request descriptor per request shape under requests/.
func (t *tree) loadHTTP(d Decl) error {
	desc := d.Describe()
	files := map[string]any{DescriptorFile: desc}
	for i, r := range desc.Requests {
		files[descriptorName(i, d.Requests[i])] = RequestDescriptor{Source: desc.Source, DescribedRequest: r, Limits: desc.Limits, Auth: desc.Auth}
	}
	for _, name := range slices.Sorted(maps.Keys(files)) {
		data, err := json.MarshalIndent(files[name], "", "  ")
		if err != nil {
			return err
		}
		if err := t.add(name, &entry{data: append(data, '\n')}); err != nil {
			return err
		}
	}
	return nil
}
