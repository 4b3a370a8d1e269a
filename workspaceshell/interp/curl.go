package interp

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/sandboxd/sandboxd/sources"
	"github.com/sandboxd/sandboxd/workspace"
)

// SourceClient sends the requests of the workspace's API-backed sources
// (a *sources.Gateway, in the daemon). The shell has a curl command only
// when Env.Sources is set; curl never opens a connection itself.
type SourceClient interface {
	Do(ctx context.Context, req sources.HTTPRequest) (*sources.HTTPResponse, error)
}

var _ SourceClient = (*sources.Gateway)(nil)

// curlFlags are the options of the controlled curl: enough to send a
// declared request and show its answer, nothing that writes a file, reads
// a config, or picks a proxy, a certificate or a connection.
var curlFlags = flagSpec[curlOptions]{
	bools:  "sSifLGI",
	values: "XHdm",
	long: map[string]string{
		"request": "X=", "header": "H=", "data": "d=", "data-ascii": "d=", "data-raw": "data-raw=",
		"data-binary": "data-binary=", "data-urlencode": "data-urlencode=", "get": "G", "head": "I",
		"silent": "s", "show-error": "S", "include": "i", "fail": "f", "location": "L",
		"max-time": "m=", "url": "url=", "compressed": "compressed",
	},
	set: map[string]setter[curlOptions]{
		"X": withVal(func(o *curlOptions, v string) { o.method = v }),
		"H": func(_ *call, o *curlOptions, _, v string) error {
			name, val, found := strings.Cut(v, ":")
			if !found {
				name, _, found = strings.Cut(v, ";")
				if !found {
					return usagef("(2) header %q: want \"Name: value\"", v)
				}
			}
			name = strings.TrimSpace(name)
			if name == "" || strings.ContainsAny(name, " \t") {
				return usagef("(2) header %q: want \"Name: value\"", v)
			}
			if val = strings.TrimSpace(val); val != "" || !found {
				o.req.Header.Add(name, val)
			}
			return nil
		},
		"d": curlData, "data-raw": curlData, "data-binary": curlData,
		"data-urlencode": withVal(func(o *curlOptions, v string) {
			if name, val, found := strings.Cut(v, "="); found {
				o.data = append(o.data, name+"="+url.QueryEscape(val))
			} else {
				o.data = append(o.data, url.QueryEscape(v))
			}
		}),
		"G": on(func(o *curlOptions) { o.get = true }),
		"I": on(func(o *curlOptions) { o.head = true }),
		"i": on(func(o *curlOptions) { o.include = true }),
		"f": on(func(o *curlOptions) { o.fail = true }),
		"L": on(func(o *curlOptions) { o.req.FollowRedirects = true }),
		"m": func(_ *call, o *curlOptions, _, v string) error {
			secs, err := strconv.ParseFloat(v, 64)
			if err != nil || secs <= 0 {
				return usagef("(2) --max-time %q: want a positive number of seconds", v)
			}
			o.req.MaxTime = time.Duration(secs * float64(time.Second))
			return nil
		},
		"url": withVal(func(o *curlOptions, v string) { o.urls = append(o.urls, v) }),
	},
}

// curlOptions are curl's options: the request they make, and how to show
// its answer.
type curlOptions struct {
	req                      sources.HTTPRequest
	method                   string
	data                     []string // -d and friends, in order
	get, head, include, fail bool
	urls                     []string // --url's, after the operands
}

// curlData reads -d, --data-raw or --data-binary: "@FILE" (but for
// --data-raw) is the file's contents, -d's without its line breaks.
func curlData(c *call, o *curlOptions, name, v string) error {
	if name != "data-raw" && strings.HasPrefix(v, "@") {
		b, err := c.readInput(v[1:])
		if err != nil {
			return failed(v[1:], err, 26) // curl: read error
		}
		v = string(b)
		if name == "d" {
			v = strings.NewReplacer("\r", "", "\n", "").Replace(v)
		}
	}
	o.data = append(o.data, v)
	return nil
}

// cmdCurl sends one request through Env.Sources. Refusals by the source's
// declarations stop the line (a *RefusedError); failures exit as curl's
// do: 3 a malformed URL, 22 an HTTP error with -f, 28 a timeout, 63 a
// response over the source's limit, 7 another failure of the request.
// Unlike curl, -s does not hide these messages: there is no progress meter
// to hide, and an agent needs to know why.
func cmdCurl(c *call) int {
	o := curlOptions{req: sources.HTTPRequest{Header: http.Header{}, Session: c.r.env.Session.ID, Run: c.r.env.Session.RunID}}
	ops, st, ok := parseFlags(c, &curlFlags, &o)
	if !ok {
		return st
	}
	ops = append(ops, o.urls...)
	req, method, data, get, head, include, fail := o.req, o.method, o.data, o.get, o.head, o.include, o.fail
	if len(ops) != 1 {
		return c.usage("(2) want exactly one URL (got %d); the declared requests are in %s", len(ops), agentPath(c, sources.SnapshotDir)+"/<source>/"+sources.DescriptorFile)
	}
	req.URL = ops[0]
	if u, err := url.Parse(req.URL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		c.errorf("(3) URL rejected: %q is not an http:// or https:// URL", req.URL)
		return 3
	}
	body := strings.Join(data, "&")
	switch {
	case get && body != "":
		sep := "?"
		if strings.Contains(req.URL, "?") {
			sep = "&"
		}
		req.URL += sep + body
		body = ""
	case body != "" && req.Header.Get("Content-Type") == "":
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	}
	req.Body = []byte(body)
	switch {
	case method != "":
		req.Method = method
	case head:
		req.Method = "HEAD"
	case body != "":
		req.Method = "POST"
	default:
		req.Method = "GET"
	}
	if strings.ToUpper(req.Method) != req.Method {
		return c.usage("(2) -X %q: methods are upper case", req.Method)
	}

	resp, err := c.r.env.Sources.Do(c.ctx, req)
	var refusal *sources.RefusedError
	switch {
	case err == nil:
	case c.ctx.Err() != nil:
		return 1 // the line is over; Run says why
	case errors.As(err, &refusal) && !errors.Is(err, workspace.ErrFileTooLarge):
		return c.r.refuse("curl "+req.Method+" "+req.URL, refusal.Reason+declaredHint(c, refusal))
	case errors.Is(err, workspace.ErrFileTooLarge):
		c.errorf("(63) %s %s: %s", req.Method, req.URL, refusal.Reason)
		return 63
	case errors.Is(err, workspace.ErrTimeout):
		c.errorf("(28) %v", err)
		return 28
	default:
		c.errorf("(7) %v", err)
		return 7
	}
	if include || head {
		c.printf("%s %d %s\r\n", resp.Proto, resp.Status, resp.StatusText)
		for _, name := range slices.Sorted(maps.Keys(resp.Header)) {
			for _, v := range resp.Header[name] {
				c.printf("%s: %s\r\n", name, v)
			}
		}
		c.print("\r\n")
	}
	if fail && resp.Status >= 400 {
		c.errorf("(22) The requested URL returned error: %d", resp.Status)
		return 22
	}
	if !head {
		c.write(resp.Body)
	}
	return 0
}

// declaredHint points at the source's descriptor.
func declaredHint(c *call, e *sources.RefusedError) string {
	if e.Source == "" {
		return "; the API-backed sources and their requests are described in " + agentPath(c, sources.SnapshotDir) + "/<source>/" + sources.DescriptorFile + " (run materialize_sources first)"
	}
	return fmt.Sprintf("; source %s declares %s (see %s)", e.Source, strings.Join(e.Declared, ", "),
		agentPath(c, sources.SnapshotPath(e.Source))+"/"+sources.DescriptorFile)
}

// agentPath is a workspace name as the agent sees it.
func agentPath(c *call, name string) string { return c.r.root + "/" + name }
