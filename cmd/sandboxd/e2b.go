package main

import (
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

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
	// sandbox port's host, PORT-SANDBOXID.DOMAIN (default none). Without a
	// port of its own, the ports listener's port is added to it unless
	// that is 443.
	Domain string `json:"domain"`
	// Ports serves the sandboxes' ports on the hosts E2B's SDK builds
	// (Sandbox.get_host), for the tenants it names.
	Ports e2bPorts `json:"ports"`
}

// e2bPorts is the listener of the sandboxes' ports.
type e2bPorts struct {
	// Listen is its address ("" serves no ports); the names
	// *.DOMAIN must lead to it (a DNS wildcard).
	Listen string `json:"listen"`
	// CertFile and KeyFile are the PEM certificate (with its chain) and key
	// of *.DOMAIN it serves HTTPS with, as E2B's SDK speaks it; without
	// them it speaks plain HTTP (behind a proxy that ends TLS).
	CertFile string `json:"certFile"`
	KeyFile  string `json:"keyFile"`
	// Tenants may reach their sandboxes' ports ("*": every tenant); a
	// tenant it does not name is refused (403).
	Tenants []string `json:"tenants"`
	// MaxConnections caps the requests to its sandboxes' ports one tenant
	// has open at once, an upgraded connection (WebSocket) counting until
	// it closes (default 256, -1 no cap); one past it is 429.
	MaxConnections int `json:"maxConnections"`
}

// validate checks the ports' keys against the tenants there are.
func (p e2bPorts) validate(domain string, tenants map[string]int) error {
	switch {
	case p.Listen == "" && (p.CertFile != "" || p.KeyFile != "" || len(p.Tenants) > 0):
		return &configError{Path: "e2b.ports.listen", Reason: "ports has no listener: give it an address (\"listen\": \":443\")"}
	case p.MaxConnections < -1:
		return &configError{Path: "e2b.ports.maxConnections", Reason: fmt.Sprintf("%d: want the requests a tenant may have open at once, at least 1 (-1 for no cap, 0 or left out for 256)", p.MaxConnections)}
	case p.Listen == "":
		return nil
	case domain == "":
		return &configError{Path: "e2b.domain", Reason: "ports need the domain whose names *.DOMAIN lead to e2b.ports.listen (\"domain\": \"sandboxes.example.com\")"}
	case (p.CertFile == "") != (p.KeyFile == ""):
		return &configError{Path: "e2b.ports.certFile", Reason: "give both certFile and keyFile (HTTPS), or neither (plain HTTP)"}
	}
	for i, t := range p.Tenants {
		if _, ok := tenants[t]; !ok && t != "*" {
			return &configError{Path: fmt.Sprintf("e2b.ports.tenants[%d]", i), Reason: fmt.Sprintf("%q is no tenant of the configuration (\"*\" names every tenant)", t)}
		}
	}
	return nil
}

// listenPorts opens the ports' listener, with TLS when the configuration
// has a certificate, and returns it with the domain create answers: the
// configured one, with the listener's port when it has none and the port
// is not 443.
func (p e2bPorts) listen(domain string) (net.Listener, string, error) {
	ln, err := net.Listen("tcp", p.Listen)
	if err != nil {
		return nil, "", fmt.Errorf("e2b.ports.listen: %w (choose another address)", err)
	}
	if _, _, err := net.SplitHostPort(domain); err != nil {
		if port := ln.Addr().(*net.TCPAddr).Port; port != 443 {
			domain = net.JoinHostPort(domain, strconv.Itoa(port))
		}
	}
	if p.CertFile == "" {
		return ln, domain, nil
	}
	cert, err := tls.LoadX509KeyPair(p.CertFile, p.KeyFile)
	if err != nil {
		ln.Close()
		return nil, "", fmt.Errorf("e2b.ports: the certificate of *.%s: %w", domain, err)
	}
	return tls.NewListener(ln, &tls.Config{Certificates: []tls.Certificate{cert}, NextProtos: []string{"h2", "http/1.1"}, MinVersion: tls.VersionTLS12}), domain, nil
}

// maxConnections is MaxConnections as e2b.WithPortConnections takes it.
func (p e2bPorts) maxConnections() int {
	switch p.MaxConnections {
	case 0:
		return e2b.DefaultPortConnections
	case -1:
		return 0
	}
	return p.MaxConnections
}

// allows says whether tenant may reach its sandboxes' ports.
func (p e2bPorts) allows(tenant string) bool {
	return slices.Contains(p.Tenants, "*") || slices.Contains(p.Tenants, tenant)
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
// E2B API key is a tenant's bearer token of api. With e2b.ports it
// returns too the server of the sandboxes' ports, listening, for the
// caller to Serve and shut down.
func e2bHandler(m *runner.Manager, api *httpapi.Server, cfg e2bConfig, logger *slog.Logger) (http.Handler, *portsServer, error) {
	domain := cfg.Domain
	var ports *portsServer
	if cfg.Ports.Listen != "" {
		ln, d, err := cfg.Ports.listen(domain)
		if err != nil {
			return nil, nil, err
		}
		domain, ports = d, &portsServer{ln: ln}
	}
	opts := []e2b.Option{e2b.WithLogger(logger), e2b.WithDomain(domain), e2b.WithPorts(cfg.Ports.allows), e2b.WithPortConnections(cfg.Ports.maxConnections()), e2b.WithAuth(func(key string) (e2b.Tenant, bool) {
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
		if ports != nil {
			ports.ln.Close()
		}
		return nil, nil, err
	}
	if ports != nil {
		ports.srv = &http.Server{Handler: srv.Ports(), ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 2 * time.Minute,
			ErrorLog: slog.NewLogLogger(logger.Handler(), slog.LevelDebug)}
		logger.Info("e2b: sandboxes' ports", "address", ports.ln.Addr().String(), "hosts", "PORT-SANDBOXID."+domain, "tls", cfg.Ports.CertFile != "", "tenants", cfg.Ports.Tenants)
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
	}), ports, nil
}

// portsServer is the listener of the sandboxes' ports and its server.
type portsServer struct {
	ln  net.Listener
	srv *http.Server
}

// serve serves until shutdown; it returns at once for a nil p.
func (p *portsServer) serve() error {
	if p == nil {
		return nil
	}
	if err := p.srv.Serve(p.ln); !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// shutdown ends the listener and closes its connections: a port's
// connection (a WebSocket) may last as long as its sandbox, which is
// ending.
func (p *portsServer) shutdown() {
	if p != nil {
		p.srv.Close()
	}
}
