package main

import (
	"log/slog"
	"net/http"
	"strings"

	"github.com/sandboxd/sandboxd/e2b"
	"github.com/sandboxd/sandboxd/httpapi"
	"github.com/sandboxd/sandboxd/runner"
)

// e2bConfig configures the E2B-compatible API (package e2b).
type e2bConfig struct {
	// Enabled serves it (--e2b sets it too).
	Enabled bool `json:"enabled"`
	// Templates are the E2B template names sandboxes may be created from,
	// each an image (a definition's name or a reference) and optionally a
	// template of snapshots.templates to fill the workspace (default:
	// "base", the dev image).
	Templates map[string]e2bTemplate `json:"templates"`
	// Domain is the domain create answers, from which E2B's SDK builds a
	// sandbox port's host (default none).
	Domain string `json:"domain"`
}

// e2bTemplate is one E2B template.
type e2bTemplate struct {
	// Image is the sandbox's image.
	Image string `json:"image"`
	// Template names a template of snapshots.templates whose tree the
	// workspace starts with.
	Template string `json:"template"`
}

// e2bPrefix is where the E2B control plane is mounted.
const e2bPrefix = "/e2b"

// e2bHandler serves api and, beside it, E2B's API over m: the control
// plane under e2bPrefix, envd on every request naming its sandbox. An
// E2B API key is a tenant's bearer token of api.
func e2bHandler(m *runner.Manager, api *httpapi.Server, cfg e2bConfig, logger *slog.Logger) (http.Handler, error) {
	opts := []e2b.Option{e2b.WithLogger(logger), e2b.WithDomain(cfg.Domain), e2b.WithAuth(func(key string) (e2b.Tenant, bool) {
		t, ok := api.Tenant(key)
		return e2b.Tenant{Name: t.Name, MaxSessions: t.MaxSessions, Egress: t.Egress}, ok
	})}
	if len(cfg.Templates) > 0 {
		tpls := map[string]e2b.Template{}
		for name, t := range cfg.Templates {
			tpls[name] = e2b.Template{Image: t.Image, Template: t.Template}
		}
		opts = append(opts, e2b.WithTemplates(tpls))
	}
	srv, err := e2b.New(m, opts...)
	if err != nil {
		return nil, err
	}
	// Behind the API's drain: refused with it, waited for by WaitIdle.
	ctl, envd := api.Gate(http.StripPrefix(e2bPrefix, srv.Control())), api.Gate(srv.Envd())
	// The prefix first: the SDK names the sandbox (E2b-Sandbox-Id) on
	// control-plane calls too (connect).
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case r.URL.Path == e2bPrefix || strings.HasPrefix(r.URL.Path, e2bPrefix+"/"):
			ctl.ServeHTTP(w, r)
		case e2b.IsEnvd(r):
			envd.ServeHTTP(w, r)
		default:
			api.ServeHTTP(w, r)
		}
	}), nil
}
