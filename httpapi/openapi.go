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
