// Command protoc-gen-bcapi is the protoc plugin that turns the operator
// API's services (proto/api/v1/api.proto) into the three things that must
// agree with them:
//
//   - proto/api/v1/methods.bcapi.go: apiv1.Methods, the method table the
//     API server registers its handlers by (name "group.method", role,
//     mutating, request and response types);
//   - controlplane/pkg/client/methods.bcapi.go: one typed function per method
//     on client.Client (SitesCreate, NodesGet, ...);
//   - proto/api/v1/openapi.json: an OpenAPI 3.0 document of every method at
//     POST {basePath}/{group}/{method}, served at {basePath}/openapi.json.
//
// Naming: service XService with rpc Y is the method "x.y" (the service name
// without "Service" and the rpc name, each with a lower-case first letter).
// Every rpc must carry the (bettercompute.api.v1.access) option.
//
// Output paths are relative to the repository root: proto/generate.sh runs
// it as --bcapi_out=DIR over proto/api/v1/*.proto and compares DIR with the
// checkout. Existing OpenAPI generators were not used: they derive paths
// from google.api.http annotations (gnostic's protoc-gen-openapi) or write
// OpenAPI 2 with gRPC paths (grpc-gateway's protoc-gen-openapiv2).
package main

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"unicode"
	"unicode/utf8"

	"google.golang.org/protobuf/compiler/protogen"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/dynamicpb"
	"google.golang.org/protobuf/types/pluginpb"
)

// apiPackage is the proto package whose services are the operator API.
const apiPackage = "bettercompute.api.v1"

// accessOption is the full name of the method option holding role and
// mutating (proto/api/v1/options.proto).
const accessOption = apiPackage + ".access"

// Output files, relative to the repository root.
const (
	methodsFile = "proto/api/v1/methods.bcapi.go"
	clientFile  = "controlplane/pkg/client/methods.bcapi.go"
	openAPIFile = "proto/api/v1/openapi.json"
)

// roles are the roles an access option may name, least first.
var roles = []string{"viewer", "operator", "admin"}

// apiMethod is one rpc of the API's services.
type apiMethod struct {
	Name     string // "group.method"
	Group    string // "sites"
	Method   string // "create"
	GoName   string // "SitesCreate"
	Role     string
	Mutating bool
	Service  *protogen.Service
	RPC      *protogen.Method
}

func main() {
	protogen.Options{}.Run(func(gen *protogen.Plugin) error {
		gen.SupportedFeatures = uint64(pluginpb.CodeGeneratorResponse_FEATURE_PROTO3_OPTIONAL)
		methods, err := collect(gen)
		if err != nil {
			return err
		}
		genMethods(gen, methods)
		genClient(gen, methods)
		doc, err := openAPI(gen, methods)
		if err != nil {
			return fmt.Errorf("openapi.json: %w", err)
		}
		gen.NewGeneratedFile(openAPIFile, "").Write(doc)
		return nil
	})
}

// collect lists the rpcs of every service of the API package, in
// declaration order, with their names and access.
func collect(gen *protogen.Plugin) ([]apiMethod, error) {
	access, err := accessType(gen)
	if err != nil {
		return nil, err
	}
	var out []apiMethod
	seen := map[string]bool{}
	for _, f := range gen.Files {
		if !f.Generate || string(f.Desc.Package()) != apiPackage {
			continue
		}
		for _, svc := range f.Services {
			base, ok := strings.CutSuffix(string(svc.Desc.Name()), "Service")
			if !ok || base == "" {
				return nil, fmt.Errorf("%s: service %s: the name must be <Group>Service", f.Desc.Path(), svc.Desc.Name())
			}
			for _, rpc := range svc.Methods {
				if rpc.Desc.IsStreamingClient() || rpc.Desc.IsStreamingServer() {
					return nil, fmt.Errorf("%s: %s: streaming is not served", f.Desc.Path(), rpc.Desc.FullName())
				}
				role, mutating, err := readAccess(rpc, access)
				if err != nil {
					return nil, fmt.Errorf("%s: %s: %w", f.Desc.Path(), rpc.Desc.FullName(), err)
				}
				m := apiMethod{Group: lowerFirst(base), Method: lowerFirst(string(rpc.Desc.Name())),
					GoName: base + string(rpc.Desc.Name()), Role: role, Mutating: mutating, Service: svc, RPC: rpc}
				m.Name = m.Group + "." + m.Method
				if seen[m.Name] {
					return nil, fmt.Errorf("%s: method %s declared twice", f.Desc.Path(), m.Name)
				}
				seen[m.Name] = true
				out = append(out, m)
			}
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no service in package %s", apiPackage)
	}
	return out, nil
}

// accessType is the access extension as a dynamic type, built from the
// descriptors protoc sent: the plugin must not depend on the generated Go it
// is about to regenerate.
func accessType(gen *protogen.Plugin) (protoreflect.ExtensionType, error) {
	for _, f := range gen.Files {
		exts := f.Desc.Extensions()
		for i := range exts.Len() {
			if string(exts.Get(i).FullName()) == accessOption {
				return dynamicpb.NewExtensionType(exts.Get(i)), nil
			}
		}
	}
	return nil, fmt.Errorf("extension %s not found (import api/v1/options.proto)", accessOption)
}

// readAccess returns an rpc's access option; an rpc without one, or with a
// role outside roles, is an error. The option arrives among the options'
// unknown fields (this plugin links no generated code of the API): it is
// decoded from there with the extension's descriptor.
func readAccess(rpc *protogen.Method, xt protoreflect.ExtensionType) (role string, mutating bool, err error) {
	var acc protoreflect.Message
	if opts := rpc.Desc.Options(); opts != nil {
		num := xt.TypeDescriptor().Number()
		b := opts.ProtoReflect().GetUnknown()
		for len(b) > 0 {
			n, typ, tagLen := protowire.ConsumeTag(b)
			if tagLen < 0 {
				return "", false, fmt.Errorf("decode options: %w", protowire.ParseError(tagLen))
			}
			valLen := protowire.ConsumeFieldValue(n, typ, b[tagLen:])
			if valLen < 0 {
				return "", false, fmt.Errorf("decode options: %w", protowire.ParseError(valLen))
			}
			if n == num && typ == protowire.BytesType {
				v, _ := protowire.ConsumeBytes(b[tagLen:])
				if acc == nil {
					acc = dynamicpb.NewMessage(xt.TypeDescriptor().Message())
				}
				// Repeated occurrences merge, as the proto wire format says.
				if err := (proto.UnmarshalOptions{Merge: true}).Unmarshal(v, acc.Interface()); err != nil {
					return "", false, fmt.Errorf("decode option (access): %w", err)
				}
			}
			b = b[tagLen+valLen:]
		}
	}
	if acc == nil {
		return "", false, errors.New("missing option (access) = {role: ..., mutating: ...}")
	}
	fields := acc.Descriptor().Fields()
	role = acc.Get(fields.ByName("role")).String()
	mutating = acc.Get(fields.ByName("mutating")).Bool()
	if !slices.Contains(roles, role) {
		return "", false, fmt.Errorf("access role %q is not one of %s", role, strings.Join(roles, ", "))
	}
	return role, mutating, nil
}

// lowerFirst lower-cases the first letter: "JoinTokens" is "joinTokens".
func lowerFirst(s string) string {
	r, n := utf8.DecodeRuneInString(s)
	return string(unicode.ToLower(r)) + s[n:]
}

const header = "// Code generated by protoc-gen-bcapi from proto/api/v1. DO NOT EDIT.\n// Regenerate with proto/generate.sh.\n\n"

// genMethods writes apiv1.Methods.
func genMethods(gen *protogen.Plugin, methods []apiMethod) {
	pkg := methods[0].RPC.Input.GoIdent.GoImportPath
	g := gen.NewGeneratedFile(methodsFile, pkg)
	g.P(header + "package apiv1")
	g.P()
	g.P("// Method is one operator API method as api.proto declares it.")
	g.P("type Method struct {")
	g.P(`// Name is "group.method", served at POST {basePath}/group/method.`)
	g.P("Name string")
	g.P("// Role is the least role allowed: viewer, operator or admin.")
	g.P("Role string")
	g.P("// Mutating is true for a method that changes state: every call of it,")
	g.P("// allowed or refused, is audited.")
	g.P("Mutating bool")
	g.P("// Request and Response are typed nil pointers of the method's messages.")
	g.P("Request, Response ", protogen.GoIdent{GoName: "Message", GoImportPath: "google.golang.org/protobuf/proto"})
	g.P("}")
	g.P()
	g.P("// Methods lists every method of the API's services, in api.proto's order.")
	g.P("var Methods = []Method{")
	for _, m := range methods {
		g.P(fmt.Sprintf("{Name: %q, Role: %q, Mutating: %v, Request: (*", m.Name, m.Role, m.Mutating),
			m.RPC.Input.GoIdent, ")(nil), Response: (*", m.RPC.Output.GoIdent, ")(nil)},")
	}
	g.P("}")
}

// genClient writes one typed function per method on client.Client. The
// file is written as text (not through protogen's imports) so that the
// API package keeps its usual name, apiv1.
func genClient(gen *protogen.Plugin, methods []apiMethod) {
	g := gen.NewGeneratedFile(clientFile, "")
	g.P(header + "package client")
	g.P()
	g.P("import (")
	g.P(`"context"`)
	g.P()
	g.P("apiv1 ", methods[0].RPC.Input.GoIdent.GoImportPath)
	g.P(")")
	for _, m := range methods {
		in, out := "apiv1."+m.RPC.Input.GoIdent.GoName, "apiv1."+m.RPC.Output.GoIdent.GoName
		g.P()
		audited := ""
		if m.Mutating {
			audited = "; audited"
		}
		g.P(fmt.Sprintf("// %s calls %s (role %s%s).", m.GoName, m.Name, m.Role, audited))
		for _, line := range commentLines(m.RPC.Comments.Leading) {
			g.P("// ", line)
		}
		g.P("func (c *Client) ", m.GoName, "(ctx context.Context, req *", in, ") (*", out, ", error) {")
		g.P("resp := new(", out, ")")
		g.P(fmt.Sprintf("if err := c.Call(ctx, %q, req, resp); err != nil {", m.Name))
		g.P("return nil, err")
		g.P("}")
		g.P("return resp, nil")
		g.P("}")
	}
}

// commentLines splits a proto comment into lines without the space after
// "//", dropping blank lines at either end.
func commentLines(c protogen.Comments) []string {
	s := strings.TrimSpace(string(c))
	if s == "" {
		return nil
	}
	lines := strings.Split(s, "\n")
	for i, l := range lines {
		lines[i] = strings.TrimPrefix(strings.TrimRight(l, " "), " ")
	}
	return lines
}
