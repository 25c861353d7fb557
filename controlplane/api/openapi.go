package api

import (
	"encoding/json"
	"fmt"
	"net/http"

	apiv1 "github.com/better-compute/better-compute/proto/api/v1"
)

// OpenAPIPath is the route, under basePath, of the API's OpenAPI 3.0
// document (apiv1.OpenAPI). It is served to anyone with GET: it holds no
// secrets.
const OpenAPIPath = "/openapi.json"

// openAPIDocument is apiv1.OpenAPI with its servers entry set to basePath,
// so that its paths resolve to where this server serves them. The
// document is generated and checked by tests: one that does not parse is
// a build mistake, and New panics on it.
func openAPIDocument(basePath string) []byte {
	var doc map[string]json.RawMessage
	if err := json.Unmarshal(apiv1.OpenAPI, &doc); err != nil {
		panic(fmt.Sprintf("api: embedded openapi.json: %v", err))
	}
	servers, err := json.Marshal([]map[string]string{{"url": basePath, "description": "basePath (host.api.basePath)"}})
	if err != nil {
		panic(fmt.Sprintf("api: openapi.json servers: %v", err))
	}
	doc["servers"] = servers
	b, err := json.MarshalIndent(doc, "", "  ")
	if err != nil {
		panic(fmt.Sprintf("api: encode openapi.json: %v", err))
	}
	return append(b, '\n')
}

// serveOpenAPI answers GET {basePath}/openapi.json, without
// authentication.
func (s *Server) serveOpenAPI(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-cache")
	_, _ = w.Write(s.openAPI)
}
