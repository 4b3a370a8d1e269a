package httpapi

import (
	_ "embed"
	"net/http"
)

// openAPI is the API's OpenAPI document; a test checks that it names every
// route the server serves.
//
//go:embed openapi.json
var openAPI []byte

func serveOpenAPI(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	w.Write(openAPI)
}

// configSchema serves the configuration's JSON Schema (WithConfigSchema).
func (s *Server) configSchema(w http.ResponseWriter, _ *http.Request) {
	if s.o.schema == nil {
		writeError(w, http.StatusNotFound, "NotFound", "this server has no configuration schema")
		return
	}
	w.Header().Set("Content-Type", "application/schema+json")
	w.Write(s.o.schema)
}
