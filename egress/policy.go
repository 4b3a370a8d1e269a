// Package egress is a session's way out: an HTTP forward proxy the daemon
// runs for each session whose operator allows egress, which dials a
// destination only when the session's policy lists it.
//
// The session's container stays on NetworkMode none: it has a loopback
// interface and nothing else. The in-container agent listens on the
// container's loopback (agent.Client.Accept) and carries each connection a
// program makes there over its stream to the daemon, where a Proxy reads
// the program's request — plain HTTP with an absolute URL, or CONNECT for
// TLS — and judges it:
//
//   - the destination's host and port must match a Rule of the session's
//     Policy (host patterns with ports, "proxy.golang.org:443",
//     "*.pythonhosted.org:443", or the names of Presets);
//   - every address the name resolves to that is private, loopback,
//     link-local or otherwise not public (Refused) is skipped unless the
//     operator lists it (Policy.AllowPrivate), and the address that passed
//     is the one dialled, so a name that answers differently a moment later
//     (DNS rebinding) changes nothing;
//   - a refusal is an HTTP 403 whose body names the host and the setting
//     that would allow it.
//
// Every destination connection is reported (Record: session, tenant, the
// call its program named in the proxy's URL (CallEnv), host, port, bytes
// each way, duration, outcome, the secrets put in), and a session holds at
// most Policy.MaxConnections connections at once and moves at most
// Policy.MaxBytes bytes in all. A program that ignores the proxy has no
// network at all.
//
// The proxy is also the session's credential broker. A session holds
// placeholders, never the values of its secrets (Secret): the proxy puts a
// value in place of its placeholder only in a request bound for the
// secret's destinations, in the headers such tokens go in, and refuses
// with a 403 a request it sees carrying a placeholder anywhere else. To
// see HTTPS requests it terminates their TLS with certificates of an
// authority the session trusts (TLS: a function that issues them, so that
// the authority's key stays with whoever made it), for the destinations
// secrets may go to only (or all, Policy.InspectAll), and makes its own
// verified TLS connection onwards; every other CONNECT is a tunnel, end to
// end. The rules may change while the proxy serves (SetAllow), and the
// open connections they no longer allow are cut.
//
// Like its connections, everything the proxy needs that is not a policy —
// names looked up, certificates issued, secrets read — comes to it as a
// function or a value of the standard library's types: it imports nothing
// of the program that runs it.
package egress

import (
	"cmp"
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"
	"net/netip"
	"net/url"
	"slices"
	"strconv"
	"strings"
)

// Rule is one allowed destination: a host pattern and a port. The host is
// a DNS name ("proxy.golang.org"), a wildcard for the names below a domain
// ("*.pythonhosted.org": "files.pythonhosted.org", not "pythonhosted.org"
// itself), or an IP address. Names are matched case-insensitively, without
// a trailing dot.
type Rule struct {
	Host string
	Port uint16
}

// ParseRule reads "HOST:PORT" ("[::1]:443" for an IPv6 address).
func ParseRule(s string) (Rule, error) {
	i := strings.LastIndexByte(s, ':')
	if i < 0 {
		return Rule{}, fmt.Errorf("egress rule %q: want HOST:PORT (\"proxy.golang.org:443\", \"*.pythonhosted.org:443\") or a preset (%s)", s, strings.Join(PresetNames(), ", "))
	}
	host, portText := s[:i], s[i+1:]
	port, err := strconv.ParseUint(portText, 10, 16)
	if err != nil || port == 0 {
		return Rule{}, fmt.Errorf("egress rule %q: the port %q is not a number from 1 to 65535", s, portText)
	}
	host = canonicalHost(host)
	if strings.HasPrefix(host, "[") && strings.HasSuffix(host, "]") {
		a, err := netip.ParseAddr(host[1 : len(host)-1])
		if err != nil || !a.Is6() {
			return Rule{}, fmt.Errorf("egress rule %q: %q is not an IPv6 address", s, host)
		}
		return Rule{Host: a.String(), Port: uint16(port)}, nil
	}
	if a, err := netip.ParseAddr(host); err == nil && a.Is4() {
		return Rule{Host: a.String(), Port: uint16(port)}, nil
	}
	if !validPattern(host) {
		return Rule{}, fmt.Errorf("egress rule %q: %q is not a host name, a *.domain wildcard or an IP address", s, host)
	}
	return Rule{Host: host, Port: uint16(port)}, nil
}

// canonicalHost lowers a host's case and drops its trailing dot.
func canonicalHost(h string) string { return strings.TrimSuffix(strings.ToLower(h), ".") }

// validPattern accepts a DNS name, or "*." and a name of two labels or more.
func validPattern(h string) bool {
	if rest, ok := strings.CutPrefix(h, "*."); ok {
		return strings.Contains(rest, ".") && validName(rest)
	}
	return validName(h)
}

func validName(h string) bool {
	if h == "" || len(h) > 253 {
		return false
	}
	for _, label := range strings.Split(h, ".") {
		if label == "" || len(label) > 63 || label[0] == '-' || label[len(label)-1] == '-' {
			return false
		}
		for _, r := range label {
			if !('a' <= r && r <= 'z' || '0' <= r && r <= '9' || r == '-' || r == '_') {
				return false
			}
		}
	}
	return true
}

func (r Rule) String() string {
	host := r.Host
	if strings.Contains(host, ":") {
		host = "[" + host + "]"
	}
	return host + ":" + strconv.Itoa(int(r.Port))
}

// Match reports whether the rule allows host (as a client names it) and
// port.
func (r Rule) Match(host string, port uint16) bool {
	if port != r.Port {
		return false
	}
	host = canonicalHost(strings.TrimSuffix(strings.TrimPrefix(host, "["), "]"))
	if a, err := netip.ParseAddr(host); err == nil {
		host = a.Unmap().String()
	}
	if suffix, ok := strings.CutPrefix(r.Host, "*"); ok {
		return strings.HasSuffix(host, suffix) && len(host) > len(suffix)
	}
	return host == r.Host
}

// Within reports whether every destination r allows, o allows too.
func (r Rule) Within(o Rule) bool {
	if r.Port != o.Port {
		return false
	}
	if suffix, ok := strings.CutPrefix(r.Host, "*"); ok {
		osuffix, owild := strings.CutPrefix(o.Host, "*")
		return owild && strings.HasSuffix(suffix, osuffix)
	}
	return o.Match(r.Host, r.Port)
}

// Presets are the named rule sets an operator enables by name (in
// Policy.Allow, or sandboxd mcp --egress NAME).
var Presets = map[string][]string{
	// The Go module proxy and checksum database (GOPROXY, GOSUMDB's defaults).
	"go": {"proxy.golang.org:443", "sum.golang.org:443"},
	// PyPI: its index and the files it serves.
	"pypi": {"pypi.org:443", "files.pythonhosted.org:443"},
	// The npm registry.
	"npm": {"registry.npmjs.org:443"},
	// Debian's mirror network and security archive, for apt.
	"debian": {"deb.debian.org:80", "deb.debian.org:443", "security.debian.org:80", "security.debian.org:443"},
	// GitHub: clones over HTTPS, its API, archives and raw files.
	"github": {"github.com:443", "api.github.com:443", "codeload.github.com:443", "objects.githubusercontent.com:443", "raw.githubusercontent.com:443"},
}

// PresetNames lists the presets, sorted.
func PresetNames() []string {
	names := make([]string, 0, len(Presets))
	for n := range Presets {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

// ParseRules reads entries, each a rule ("HOST:PORT") or a preset's name,
// into rules, presets expanded and repeats dropped.
func ParseRules(entries []string) ([]Rule, error) {
	var rules []Rule
	for _, e := range entries {
		texts, preset := Presets[strings.ToLower(e)]
		if !preset {
			texts = []string{e}
		}
		for _, text := range texts {
			r, err := ParseRule(text)
			if err != nil {
				return nil, err
			}
			if !slices.Contains(rules, r) {
				rules = append(rules, r)
			}
		}
	}
	return rules, nil
}

// Policy is the operator's word on a session's egress. The zero Policy
// allows nothing: no egress, the default.
type Policy struct {
	// Allow lists what sessions may reach: "HOST:PORT" rules and the names
	// of presets (go, pypi, npm, debian, github). Empty: no egress.
	Allow []string `json:"allow,omitempty"`
	// AllowPrivate lists the private, loopback and link-local addresses
	// (CIDR prefixes or single addresses) that the rules may reach; every
	// other such address is refused after resolution, whatever the name.
	AllowPrivate []string `json:"allowPrivate,omitempty"`
	// MaxConnections caps a session's connections served at once; more
	// wait. Zero is DefaultMaxConnections.
	MaxConnections int `json:"maxConnections,omitempty"`
	// MaxBytes caps the bytes a session moves through the proxy, both
	// ways together, over its life; a connection that passes it is cut.
	// Zero is DefaultMaxBytes.
	MaxBytes int64 `json:"maxBytes,omitempty"`
	// InspectAll makes the proxy terminate and inspect the TLS of every
	// HTTPS destination, not only of those a secret may go to (package
	// documentation of TLS); default false: every other destination is a
	// tunnel, end to end.
	InspectAll bool `json:"inspectAll,omitempty"`
}

// Defaults of a Policy's caps.
const (
	DefaultMaxConnections = 32
	DefaultMaxBytes       = 4 << 30
)

// On reports whether the policy allows any egress.
func (p Policy) On() bool { return len(p.Allow) > 0 }

// Validate checks every rule, preset name and private prefix, and the caps.
func (p Policy) Validate() error {
	if _, err := ParseRules(p.Allow); err != nil {
		return err
	}
	if _, err := parsePrefixes(p.AllowPrivate); err != nil {
		return err
	}
	if p.MaxConnections < 0 || p.MaxBytes < 0 {
		return errors.New("egress caps must not be negative")
	}
	return nil
}

func parsePrefixes(entries []string) ([]netip.Prefix, error) {
	var out []netip.Prefix
	for _, e := range entries {
		p, err := netip.ParsePrefix(e)
		if err != nil {
			a, aerr := netip.ParseAddr(e)
			if aerr != nil {
				return nil, fmt.Errorf("egress allowPrivate %q: want an address or a CIDR prefix (\"10.0.0.0/8\")", e)
			}
			p = netip.PrefixFrom(a.Unmap(), a.Unmap().BitLen())
		}
		out = append(out, p.Masked())
	}
	return out, nil
}

// Narrow returns the policy a session gets when it asks for asked (rules
// and presets) under p: asked replaces p's Allow, and each of its rules
// must lie within one of p's (a NarrowError names the first that does
// not). p's private addresses and caps stay.
func (p Policy) Narrow(asked []string) (Policy, error) {
	mine, err := ParseRules(p.Allow)
	if err != nil {
		return Policy{}, err
	}
	theirs, err := ParseRules(asked)
	if err != nil {
		return Policy{}, err
	}
	for _, r := range theirs {
		if !slices.ContainsFunc(mine, r.Within) {
			allowed := make([]string, len(mine))
			for i, m := range mine {
				allowed[i] = m.String()
			}
			return Policy{}, &NarrowError{Rule: r.String(), Allowed: allowed}
		}
	}
	p.Allow = slices.Clone(asked)
	return p, nil
}

// NarrowError is a rule a session asked for beyond the operator's.
type NarrowError struct {
	Rule    string
	Allowed []string // the operator's rules, presets expanded
}

func (e *NarrowError) Error() string {
	return fmt.Sprintf("egress %s is not within the operator's egress.allow (%s)", e.Rule, cmp.Or(strings.Join(e.Allowed, ", "), "no egress"))
}

// ListenAddr is where the proxy listens in a session's container: its
// loopback, which is all the network a container on NetworkMode none has.
const ListenAddr = "127.0.0.1:3128"

// Env is what a command's environment needs to use the proxy at addr:
// HTTP_PROXY and HTTPS_PROXY (which Go, pip, git, curl and npm read) and
// their lower-case forms (which apt and wget read, and curl prefers for
// http), and NO_PROXY for the container's own loopback.
func Env(addr string) map[string]string {
	u := "http://" + addr
	noProxy := "localhost,127.0.0.1,::1"
	return map[string]string{
		"HTTP_PROXY": u, "HTTPS_PROXY": u, "http_proxy": u, "https_proxy": u,
		"NO_PROXY": noProxy, "no_proxy": noProxy,
	}
}

// callUser is the password of the user that names a call in the proxy's
// URL (CallEnv): git asks for a password when the URL has a user without
// one.
const callUser = "egress"

// CallEnv is Env for the commands of one call: the proxy's URL names the
// call as its user, which the programs send as Proxy-Authorization, so
// that the proxy attributes the call's connections to it (Record.Call).
// GIT_HTTP_PROXY_AUTHMETHOD makes git send it at once rather than wait
// for a challenge the proxy never makes. call is letters, digits, '.',
// '_' and '-'; another is not named.
func CallEnv(addr, call string) map[string]string {
	env := Env(addr)
	if !validCall(call) {
		return env
	}
	u := (&url.URL{Scheme: "http", User: url.UserPassword(call, callUser), Host: addr}).String()
	for _, k := range []string{"HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"} {
		env[k] = u
	}
	env["GIT_HTTP_PROXY_AUTHMETHOD"] = "basic"
	return env
}

func validCall(call string) bool {
	if call == "" || len(call) > 64 {
		return false
	}
	for _, r := range call {
		if !('a' <= r && r <= 'z' || 'A' <= r && r <= 'Z' || '0' <= r && r <= '9' || r == '.' || r == '_' || r == '-') {
			return false
		}
	}
	return true
}

// callOf is the call a request names in its Proxy-Authorization (CallEnv),
// or "".
func callOf(req *http.Request) string {
	v := req.Header.Get("Proxy-Authorization")
	enc, ok := strings.CutPrefix(v, "Basic ")
	if !ok {
		return ""
	}
	raw, err := base64.StdEncoding.DecodeString(strings.TrimSpace(enc))
	if err != nil {
		return ""
	}
	user, _, _ := strings.Cut(string(raw), ":")
	if !validCall(user) {
		return ""
	}
	return user
}
