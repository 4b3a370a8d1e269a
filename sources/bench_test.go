package sources_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/sandboxd/sandboxd/sources"
)

// BenchmarkGateway measures what the gateway adds to a request on
// loopback — matching, the credential, the bounded read, redaction, the
// audit — against the same request sent with a plain http.Client.
func BenchmarkGateway(b *testing.B) {
	body := strings.Repeat(`{"id":42,"name":"item"}`, 200) // 4.6 kB
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, body) }))
	defer srv.Close()
	url := srv.URL + "/v1/items/42?fields=name"
	b.Run("plain-client", func(b *testing.B) {
		for b.Loop() {
			req, _ := http.NewRequest("GET", url, nil)
			req.Header.Set("Authorization", "Bearer "+secret)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				b.Fatal(err)
			}
			io.ReadAll(resp.Body)
			resp.Body.Close()
		}
	})
	b.Run("gateway", func(b *testing.B) {
		d := itemsSource(srv.URL)
		d.MaxResponseBytes = 1 << 20
		g, err := sources.NewGateway(sources.Decls{d},
			sources.WithLookupEnv(func(string) (string, bool) { return secret, true }),
			sources.WithAudit(func(sources.AuditRecord) {}))
		if err != nil {
			b.Fatal(err)
		}
		for b.Loop() {
			if _, err := g.Do(context.Background(), sources.HTTPRequest{Method: "GET", URL: url}); err != nil {
				b.Fatal(err)
			}
		}
	})
}
