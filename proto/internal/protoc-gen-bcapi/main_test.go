package main

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/protobuf/compiler/protogen"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/descriptorpb"
	"google.golang.org/protobuf/types/pluginpb"
)

// plugin compiles api.proto-like source (beside the real options.proto)
// with protoc and returns the plugin request protoc-gen-bcapi would get.
func plugin(t *testing.T, src string) *protogen.Plugin {
	t.Helper()
	protoc, err := exec.LookPath("protoc")
	if err != nil {
		t.Fatalf("protoc is needed (apt-get install protobuf-compiler libprotobuf-dev): %v", err)
	}
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "api/v1"), 0o755); err != nil {
		t.Fatal(err)
	}
	opts, err := os.ReadFile("../../api/v1/options.proto")
	if err != nil {
		t.Fatal(err)
	}
	for name, body := range map[string]string{"api/v1/options.proto": string(opts), "api/v1/api.proto": src} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	set := filepath.Join(dir, "set.pb")
	args := []string{"-I", dir, "--include_imports", "--include_source_info", "--descriptor_set_out=" + set, "api/v1/api.proto"}
	for _, inc := range []string{"/usr/include", "/usr/local/include"} {
		if _, err := os.Stat(filepath.Join(inc, "google/protobuf/descriptor.proto")); err == nil {
			args = append([]string{"-I", inc}, args...)
			break
		}
	}
	if out, err := exec.Command(protoc, args...).CombinedOutput(); err != nil {
		t.Fatalf("protoc: %v\n%s", err, out)
	}
	b, err := os.ReadFile(set)
	if err != nil {
		t.Fatal(err)
	}
	var fds descriptorpb.FileDescriptorSet
	if err := proto.Unmarshal(b, &fds); err != nil {
		t.Fatal(err)
	}
	gen, err := protogen.Options{}.New(&pluginpb.CodeGeneratorRequest{FileToGenerate: []string{"api/v1/api.proto"}, ProtoFile: fds.File})
	if err != nil {
		t.Fatal(err)
	}
	return gen
}

const head = `syntax = "proto3";
package bettercompute.api.v1;
import "api/v1/options.proto";
option go_package = "example.com/x/api/v1;apiv1";
// Error is the error body.
message Error { string code = 1; string message = 2; string field = 3; }
// Thing is a thing.
message Thing {
  // id names it.
  string id = 1;
  repeated string tags = 2;
  map<string, int64> counts = 3;
}
message GetThingRequest { string id = 1; }
`

// TestCollect: names, access and the errors that make generate.sh fail.
func TestCollect(t *testing.T) {
	gen := plugin(t, head+`
service ThingPartsService {
  // Get returns one thing.
  rpc Get(GetThingRequest) returns (Thing) { option (access) = {role: "viewer"}; }
  rpc SetOwner(GetThingRequest) returns (Thing) { option (access) = {role: "admin", mutating: true}; }
}
`)
	methods, err := collect(gen)
	if err != nil {
		t.Fatal(err)
	}
	if len(methods) != 2 || methods[0].Name != "thingParts.get" || methods[0].Role != "viewer" || methods[0].Mutating ||
		methods[1].Name != "thingParts.setOwner" || methods[1].GoName != "ThingPartsSetOwner" || methods[1].Role != "admin" || !methods[1].Mutating {
		t.Fatalf("collect: %+v", methods)
	}
	doc, err := openAPI(gen, methods)
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		Paths      map[string]map[string]map[string]any
		Components struct{ Schemas map[string]map[string]any }
	}
	if err := json.Unmarshal(doc, &d); err != nil {
		t.Fatal(err)
	}
	if d.Paths["/thingParts/setOwner"]["post"]["x-better-compute-mutating"] != true || d.Paths["/thingParts/get"]["post"]["description"] != "Get returns one thing.\n\nRole viewer or above." {
		t.Fatalf("paths: %v", d.Paths)
	}
	props, _ := d.Components.Schemas["Thing"]["properties"].(map[string]any)
	counts, _ := props["counts"].(map[string]any)
	if counts["type"] != "object" || counts["additionalProperties"].(map[string]any)["type"] != "string" || props["tags"].(map[string]any)["type"] != "array" {
		t.Fatalf("schema Thing: %v", props)
	}

	for _, tc := range []struct{ name, src, want string }{
		{"no access", `service ThingsService { rpc Get(GetThingRequest) returns (Thing); }`, "missing option (access)"},
		{"unknown role", `service ThingsService { rpc Get(GetThingRequest) returns (Thing) { option (access) = {role: "root"}; } }`, `access role "root" is not one of viewer, operator, admin`},
		{"bad service name", `service Things { rpc Get(GetThingRequest) returns (Thing) { option (access) = {role: "viewer"}; } }`, "the name must be <Group>Service"},
		{"streaming", `service ThingsService { rpc Get(GetThingRequest) returns (stream Thing) { option (access) = {role: "viewer"}; } }`, "streaming is not served"},
	} {
		_, err := collect(plugin(t, head+tc.src))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: got %v, want %q", tc.name, err, tc.want)
		}
	}
}
