package api_test

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"

	"github.com/better-compute/better-compute/controlplane/api"
	"github.com/better-compute/better-compute/controlplane/store/sqlite/sqlitetest"
	apiv1 "github.com/better-compute/better-compute/proto/api/v1"
)

// TestOpenAPIServed loads the document a server with a non-default
// basePath serves, without a token, validates it as OpenAPI 3 and checks
// that every registered method is described at its real path with its
// access and its messages.
func TestOpenAPIServed(t *testing.T) {
	t.Parallel()
	const basePath = "/v9/api"
	srv := api.New(api.Config{BasePath: basePath}, sqlitetest.Open(t), nil)
	r := httptest.NewRequest(http.MethodGet, basePath+api.OpenAPIPath, nil)
	w := httptest.NewRecorder()
	srv.Handler().ServeHTTP(w, r)
	if w.Code != http.StatusOK || !strings.HasPrefix(w.Header().Get("Content-Type"), "application/json") {
		t.Fatalf("GET %s: %d %s %q", api.OpenAPIPath, w.Code, w.Header().Get("Content-Type"), w.Body.String())
	}
	body := w.Body.Bytes()

	doc, err := openapi3.NewLoader().LoadFromData(body)
	if err != nil {
		t.Fatalf("load the served document: %v", err)
	}
	if err := doc.Validate(context.Background()); err != nil {
		t.Fatalf("the served document is not valid OpenAPI 3: %v", err)
	}
	if !strings.HasPrefix(doc.OpenAPI, "3.") {
		t.Fatalf("openapi = %q, want 3.x", doc.OpenAPI)
	}
	if len(doc.Servers) != 1 || doc.Servers[0].URL != basePath {
		t.Fatalf("servers = %v, want the one basePath %s", doc.Servers, basePath)
	}
	if doc.Components.SecuritySchemes["bearer"] == nil || doc.Components.SecuritySchemes["bearer"].Value.Scheme != "bearer" {
		t.Fatal("no bearer security scheme")
	}

	// The document's paths against the server's own table, and against
	// api.proto's (apiv1.Methods), both ways.
	names, mutating := api.MethodsForTest(srv)
	if len(names) != len(apiv1.Methods) {
		t.Fatalf("%d methods registered, api.proto declares %d", len(names), len(apiv1.Methods))
	}
	described := map[string]bool{}
	for _, name := range names {
		group, method, _ := strings.Cut(name, ".")
		path := "/" + group + "/" + method
		item := doc.Paths.Value(path)
		if item == nil || item.Post == nil {
			t.Errorf("%s: no POST %s in the document", name, path)
			continue
		}
		described[path] = true
		op := item.Post
		if op.OperationID != name {
			t.Errorf("%s: operationId %q", name, op.OperationID)
		}
		if op.Extensions["x-better-compute-mutating"] != mutating[name] {
			t.Errorf("%s: x-better-compute-mutating %v, the server audits it: %v", name, op.Extensions["x-better-compute-mutating"], mutating[name])
		}
		if len(op.Parameters) != 1 || op.Parameters[0].Value.Name != api.HeaderCSRF || !op.Parameters[0].Value.Required {
			t.Errorf("%s: the %s header is not a required parameter", name, api.HeaderCSRF)
		}
		if op.RequestBody == nil || op.RequestBody.Value.Content.Get("application/json") == nil {
			t.Errorf("%s: no JSON request body", name)
		}
		if op.Responses.Status(200) == nil || op.Responses.Default() == nil {
			t.Errorf("%s: responses lack 200 or the error default", name)
		}
	}
	for path, item := range doc.Paths.Map() {
		if item.Post != nil && !described[path] {
			t.Errorf("the document describes POST %s, which the server does not serve", path)
		}
	}

	// Field names are protojson's, and the error body is the server's.
	node := doc.Components.Schemas["Node"]
	if node == nil || node.Value.Properties["lastSeenTime"] == nil || node.Value.Properties["last_seen_time"] != nil {
		t.Fatalf("schema Node: want protojson names (lastSeenTime), got %v", node)
	}
	errSchema := doc.Components.Schemas["Error"]
	for _, f := range []string{"code", "message", "field"} {
		if errSchema == nil || errSchema.Value.Properties[f] == nil {
			t.Fatalf("schema Error lacks %q", f)
		}
	}
}

// TestOpenAPIValidatorRejects shows the validation above can fail: the
// embedded document with one operation's responses removed is refused.
func TestOpenAPIValidatorRejects(t *testing.T) {
	t.Parallel()
	var doc map[string]any
	if err := json.Unmarshal(apiv1.OpenAPI, &doc); err != nil {
		t.Fatal(err)
	}
	delete(doc["paths"].(map[string]any)["/nodes/get"].(map[string]any)["post"].(map[string]any), "responses")
	b, err := json.Marshal(doc)
	if err != nil {
		t.Fatal(err)
	}
	loaded, err := openapi3.NewLoader().LoadFromData(b)
	if err == nil {
		err = loaded.Validate(context.Background())
	}
	if err == nil {
		t.Fatal("a document with an operation without responses validated")
	}
	if !bytes.Contains(apiv1.OpenAPI, []byte(`"/nodes/get"`)) {
		t.Fatal("the embedded document lacks /nodes/get")
	}
}
