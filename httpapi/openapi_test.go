package httpapi

import (
	"encoding/json"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// TestOpenAPICoversRoutes: every route the server serves is in the
// document, and the document describes no route the server lacks.
func TestOpenAPICoversRoutes(t *testing.T) {
	var doc struct {
		OpenAPI string                                `json:"openapi"`
		Paths   map[string]map[string]json.RawMessage `json:"paths"`
	}
	if err := json.Unmarshal(openAPI, &doc); err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(doc.OpenAPI, "3.") {
		t.Fatalf("openapi %q", doc.OpenAPI)
	}
	wildcard := regexp.MustCompile(`\{(\w+)\.\.\.\}`)
	served := map[string]bool{}
	for _, r := range (&Server{}).routes() {
		p := wildcard.ReplaceAllString(r.pattern, "{$1}")
		op := strings.ToLower(r.method)
		served[p+" "+op] = true
		if _, ok := doc.Paths[p][op]; !ok {
			t.Errorf("route %s %s is not in openapi.json", r.method, r.pattern)
		}
	}
	for p, ops := range doc.Paths {
		for op := range ops {
			if op == "parameters" {
				continue
			}
			if !served[p+" "+op] {
				t.Errorf("openapi.json describes %s %s, which is not served", strings.ToUpper(op), p)
			}
		}
	}
	if !slices.Contains([]string{"3.0.3", "3.1.0"}, doc.OpenAPI) {
		t.Errorf("openapi version %s", doc.OpenAPI)
	}
}
