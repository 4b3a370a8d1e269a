package runner

import (
	"crypto/rand"
	"encoding/json"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"

	"github.com/sandboxd/sandboxd/egress"
	"github.com/sandboxd/sandboxd/policy"
	"github.com/sandboxd/sandboxd/sources"
	"github.com/sandboxd/sandboxd/workspace"
)

// Secret is a credential of the operator's that sessions' commands use
// without holding it: a session gets a placeholder in the variable Name,
// and its egress proxy puts the value in place of the placeholder in the
// requests to the secret's destinations, and refuses it anywhere else
// (egress.Secret says exactly where). Its JSON is an element of the
// daemon's configuration's "secrets".
type Secret struct {
	// Name is the variable a session's commands find its placeholder in
	// ("GITHUB_TOKEN"): letters, digits and '_', not starting with a digit.
	Name string `json:"name"`
	// Env and File say where the daemon reads the value: its environment
	// variable, or a file on its host (exactly one). It is read for each
	// request that needs it.
	sources.Secret
	// Allow are the destinations it may be sent to: HOST:PORT rules and
	// presets, each within egress.allow.
	Allow []string `json:"allow"`
	// Methods, when set, are the request methods it may be sent with.
	Methods []string `json:"methods,omitempty"`
	// Paths, when set, are the path prefixes of the requests it may be
	// sent in ("/repos/acme/").
	Paths []string `json:"paths,omitempty"`
	// GitUsername, when set, makes git in a session answer for the
	// secret's HTTPS destinations with this user and the placeholder as
	// password ("x-access-token" for GitHub, "oauth2" for GitLab), so that
	// git clone, fetch and push there work with the value the session
	// never sees.
	GitUsername string `json:"gitUsername,omitempty"`
	// Tenants, when set, are the tenants whose sessions get it; default
	// every tenant's.
	Tenants []string `json:"tenants,omitempty"`
}

// reservedVars are variables a secret's placeholder may not take: the
// proxy's, the trust's, git's configuration, and those that choose which
// programs run.
var reservedVars = []string{"HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "ALL_PROXY", "SSL_CERT_FILE", "SSL_CERT_DIR", "CURL_CA_BUNDLE",
	"GIT_SSL_CAINFO", "REQUESTS_CA_BUNDLE", "PIP_CERT", "NODE_EXTRA_CA_CERTS", "PATH", "HOME", "SHELL", "LD_PRELOAD", "LD_LIBRARY_PATH"}

// Validate checks the secret under the operator's egress policy: its
// name, where it is read from, and every destination it names, which must
// be one sessions may reach.
func (s Secret) Validate(op egress.Policy) error {
	if err := s.Secret.Validate(); err != nil {
		return fmt.Errorf("secret %q: %s", s.Name, err.Reason)
	}
	return s.validateUse(op)
}

// validateUse checks what the secret's Secret does not say: its name, and
// where it may be sent, each destination within op.
func (s Secret) validateUse(op egress.Policy) error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("secret %q: %s", s.Name, fmt.Sprintf(format, args...))
	}
	if !validVarName(s.Name) {
		return bad("its name is the variable that holds its placeholder: letters, digits and '_', not starting with a digit")
	}
	up := strings.ToUpper(s.Name)
	if slices.Contains(reservedVars, up) || strings.HasPrefix(up, "GIT_") || strings.HasPrefix(up, "SANDBOXD_") {
		return bad("%s is a variable sandboxd or a program it runs reads for itself: name the secret otherwise", s.Name)
	}
	if len(s.Allow) == 0 {
		return bad("allow names no destination: a secret goes only where allow says")
	}
	if _, err := op.Narrow(s.Allow); err != nil {
		return bad("allow: %v (a secret for a destination sessions cannot reach would never be sent)", err)
	}
	for _, m := range s.Methods {
		if m == "" || strings.Trim(strings.ToUpper(m), "ABCDEFGHIJKLMNOPQRSTUVWXYZ") != "" {
			return bad("method %q is not an HTTP method", m)
		}
	}
	for _, p := range s.Paths {
		if !strings.HasPrefix(p, "/") {
			return bad("path %q must start with /", p)
		}
	}
	if strings.ContainsAny(s.GitUsername, ":@/'\"\\\n\r\t ") {
		return bad("gitUsername %q cannot hold ':', '@', '/', quotes, backslashes or spaces", s.GitUsername)
	}
	return nil
}

func validVarName(n string) bool {
	if n == "" || ('0' <= n[0] && n[0] <= '9') {
		return false
	}
	return strings.Trim(n, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_") == ""
}

// validateSecrets checks the operator's secrets: each valid, names
// distinct.
func validateSecrets(secrets []Secret, op egress.Policy) error {
	for i, s := range secrets {
		if err := s.Validate(op); err != nil {
			return err
		}
		for _, o := range secrets[:i] {
			if o.Name == s.Name {
				return fmt.Errorf("secret %q is declared twice", s.Name)
			}
		}
	}
	return nil
}

// sessionSecret is a secret as one session has it: with its placeholder,
// and for a tenant's own (TenantSecret) its value, or tenant set and no
// value where the session was taken over without it.
type sessionSecret struct {
	Secret
	placeholder string
	tenant      bool
	value       string
}

// TenantSecret is a secret of the tenant's own, brought with a session's
// settings (Settings.SecretValues): a credential the operator does not
// hold, such as a tenant's registry token, used as the operator's secrets
// are — the session's commands get a placeholder in Name, and its egress
// proxy puts Value in for the secret's destinations only, and refuses the
// placeholder anywhere else. The operator bounds it: a tenant brings at
// most its MaxSecrets (CreateRequest; none by default), each Allow rule
// within what the session may reach.
//
// The value lives in the daemon's memory for the session's life and is
// written nowhere: its JSON has no value (so neither the session's record
// nor the API's answers hold it), and its String and LogValue hide it. So a
// session taken over by another replica, or adopted after a restart,
// keeps the secret's placeholder and destinations but not its value: its
// proxy then refuses requests carrying the placeholder, saying so.
type TenantSecret struct {
	Name  string `json:"name"`
	Value string `json:"value,omitempty"`
	// Allow, Methods, Paths and GitUsername are as Secret's.
	Allow       []string `json:"allow"`
	Methods     []string `json:"methods,omitempty"`
	Paths       []string `json:"paths,omitempty"`
	GitUsername string   `json:"gitUsername,omitempty"`
}

// maxSecretValue bounds a tenant secret's value, as sources.Secret.Read
// bounds a file's.
const maxSecretValue = 64 << 10

// MarshalJSON writes the secret without its value.
func (s TenantSecret) MarshalJSON() ([]byte, error) {
	type noValue TenantSecret
	v := noValue(s)
	v.Value = ""
	return json.Marshal(v)
}

// String names the secret, never its value.
func (s TenantSecret) String() string { return "tenant secret " + s.Name }

// LogValue is the secret as a log line may show it: its name.
func (s TenantSecret) LogValue() slog.Value { return slog.StringValue(s.String()) }

// tenantSecrets adds the tenant's own secrets to the operator's a session
// has: at most max of them, each valid, its value one a header can hold,
// its destinations within the session's egress p, its name no other's.
func tenantSecrets(have []sessionSecret, asked []TenantSecret, max int, p egress.Policy) ([]sessionSecret, error) {
	if len(asked) == 0 {
		return have, nil
	}
	if len(asked) > max {
		return nil, &policy.DeniedError{Setting: "secretValues", Value: strconv.Itoa(len(asked)),
			Limit: fmt.Sprintf("the operator allows this tenant's sessions %d secrets of their own (maxSecrets in the tenant's entry of the configuration)", max)}
	}
	out := slices.Clone(have)
	for _, t := range asked {
		s := Secret{Name: t.Name, Allow: t.Allow, Methods: t.Methods, Paths: t.Paths, GitUsername: t.GitUsername}
		if err := s.validateUse(p); err != nil {
			return nil, &SettingError{Setting: "secretValues", Reason: err.Error()}
		}
		switch {
		case t.Value == "" || len(t.Value) > maxSecretValue:
			return nil, &SettingError{Setting: "secretValues", Reason: fmt.Sprintf("secret %q: its value must be 1 to %d bytes", t.Name, maxSecretValue)}
		case strings.ContainsFunc(t.Value, func(r rune) bool { return r < ' ' || r == 0x7f }):
			return nil, &SettingError{Setting: "secretValues", Reason: fmt.Sprintf("secret %q: its value holds a control character, which no header can", t.Name)}
		}
		for _, o := range out {
			if o.Name == t.Name {
				return nil, &SettingError{Setting: "secretValues", Reason: fmt.Sprintf("secret %q is the session's already (its own twice, or one of the operator's: leave that out of secrets)", t.Name)}
			}
		}
		out = append(out, sessionSecret{Secret: s, placeholder: "sbxph_" + strings.ToLower(rand.Text()), tenant: true, value: t.Value})
	}
	return out, nil
}

// sessionSecrets chooses the secrets a session of tenant gets: those the
// operator gives the tenant, or of those the ones asked names (nil asks
// for all), each with a placeholder of the session's own — the one kept
// in kept, when the session is taken over with its placeholders.
func (m *Manager) sessionSecrets(tenant string, asked []string, kept map[string]string) ([]sessionSecret, error) {
	var avail []Secret
	for _, s := range m.o.secrets {
		if len(s.Tenants) == 0 || slices.Contains(s.Tenants, tenant) {
			avail = append(avail, s)
		}
	}
	names := make([]string, len(avail))
	for i, s := range avail {
		names[i] = s.Name
	}
	for _, a := range asked {
		if !slices.Contains(names, a) {
			return nil, &policy.DeniedError{Setting: "secrets", Value: a,
				Limit: fmt.Sprintf("a session may name only the operator's secrets its tenant may have (%s)", orNothing(names))}
		}
	}
	var out []sessionSecret
	for _, s := range avail {
		if asked != nil && !slices.Contains(asked, s.Name) {
			continue
		}
		ph := kept[s.Name]
		if ph == "" {
			ph = "sbxph_" + strings.ToLower(rand.Text())
		}
		out = append(out, sessionSecret{Secret: s, placeholder: ph})
	}
	return out, nil
}

func orNothing(names []string) string {
	if len(names) == 0 {
		return "none"
	}
	return strings.Join(names, ", ")
}

// secretVars are what a session's commands hold of its secrets: each
// placeholder in its variable, and git's configuration (GIT_CONFIG_COUNT
// and its kin, which git reads from the environment) of a credential
// helper for each HTTPS destination of a secret with a GitUsername, which
// answers with that user and the placeholder.
func secretVars(secrets []sessionSecret) map[string]string {
	if len(secrets) == 0 {
		return nil
	}
	vars := map[string]string{}
	n := 0
	for _, s := range secrets {
		vars[s.Name] = s.placeholder
		if s.GitUsername == "" {
			continue
		}
		rules, _ := egress.ParseRules(s.Allow)
		for _, r := range rules {
			u := "https://" + r.Host
			if strings.Contains(r.Host, ":") {
				u = "https://[" + r.Host + "]"
			}
			if r.Port != 443 {
				u += ":" + strconv.Itoa(int(r.Port))
			}
			vars[fmt.Sprintf("GIT_CONFIG_KEY_%d", n)] = "credential." + u + ".helper"
			vars[fmt.Sprintf("GIT_CONFIG_VALUE_%d", n)] = fmt.Sprintf(`!f() { test "$1" = get && printf 'username=%s\npassword=%s\n'; }; f`, s.GitUsername, s.placeholder)
			n++
		}
	}
	if n > 0 {
		vars["GIT_CONFIG_COUNT"] = strconv.Itoa(n)
	}
	return vars
}

// keptTenantSecrets adds to have the tenant's own secrets of a session
// taken over: their placeholders as the record keeps them, their values
// gone (see TenantSecret).
func keptTenantSecrets(have []sessionSecret, asked []TenantSecret, kept map[string]string) []sessionSecret {
	for _, t := range asked {
		ph := kept[t.Name]
		if ph == "" {
			ph = "sbxph_" + strings.ToLower(rand.Text())
		}
		have = append(have, sessionSecret{Secret: Secret{Name: t.Name, Allow: t.Allow, Methods: t.Methods, Paths: t.Paths, GitUsername: t.GitUsername},
			placeholder: ph, tenant: true})
	}
	return have
}

// egressSecrets are the session's secrets as its proxy takes them, each
// read through the source gateway's code (sources.Secret.Read) when a
// request needs it.
func egressSecrets(secrets []sessionSecret) []egress.Secret {
	out := make([]egress.Secret, len(secrets))
	for i, s := range secrets {
		src := s.Secret.Secret
		value := func() (string, error) { return src.Read(nil) }
		if s.tenant {
			v, name := s.value, s.Name
			value = func() (string, error) {
				if v == "" {
					return "", fmt.Errorf("%w: the tenant's secret %s was given to the daemon that created the session, and a tenant's secret values are kept nowhere: start a new session with it", workspace.ErrUnavailable, name)
				}
				return v, nil
			}
		}
		out[i] = egress.Secret{Name: s.Name, Placeholder: s.placeholder, Allow: s.Allow, Methods: s.Methods, Paths: s.Paths, Value: value}
	}
	return out
}
