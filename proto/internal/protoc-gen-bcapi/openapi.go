package main

import (
	"encoding/json"
	"fmt"
	"strings"

	"google.golang.org/protobuf/compiler/protogen"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// defaultBasePath is the servers entry of the checked-in document; the
// API serves it with its own basePath instead.
const defaultBasePath = "/api"

// errorMessage is the message every failed call answers with.
const errorMessage = apiPackage + ".Error"

// obj is a JSON object; encoding/json writes its keys sorted, so the
// document is the same on every run.
type obj = map[string]any

// openAPI returns the OpenAPI 3.0 document of methods: one POST path per
// method, the schemas of their messages under protojson names, the CSRF
// header, bearer authentication and the error body.
func openAPI(gen *protogen.Plugin, methods []apiMethod) ([]byte, error) {
	s := &schemas{out: obj{}}
	paths := obj{}
	tags := []any{}
	seenTag := map[string]bool{}
	for _, m := range methods {
		if !seenTag[m.Group] {
			seenTag[m.Group] = true
			tag := obj{"name": m.Group}
			if d := description(string(m.Service.Comments.Leading)); d != "" {
				tag["description"] = d
			}
			tags = append(tags, tag)
		}
		req, err := s.ref(m.RPC.Input.Desc)
		if err != nil {
			return nil, err
		}
		resp, err := s.ref(m.RPC.Output.Desc)
		if err != nil {
			return nil, err
		}
		access := "Role " + m.Role + " or above."
		if m.Mutating {
			access += " Mutating: every call, allowed or refused, is audited."
		}
		op := obj{
			"operationId":               m.Name,
			"tags":                      []any{m.Group},
			"summary":                   m.Name,
			"description":               strings.TrimSpace(description(string(m.RPC.Comments.Leading)) + "\n\n" + access),
			"x-better-compute-role":     m.Role,
			"x-better-compute-mutating": m.Mutating,
			"parameters":                []any{obj{"$ref": "#/components/parameters/XBetterCompute"}},
			"requestBody": obj{
				"description": "The request in protojson form; an empty body is an empty request. Unknown fields are refused.",
				"content":     obj{"application/json": obj{"schema": req}},
			},
			"responses": obj{
				"200": obj{
					"description": "The response in protojson form (fields at their zero value are left out).",
					"content":     obj{"application/json": obj{"schema": resp}},
				},
				"default": obj{"$ref": "#/components/responses/Error"},
			},
		}
		paths["/"+m.Group+"/"+m.Method] = obj{"post": op}
	}
	paths["/openapi.json"] = obj{"get": obj{
		"operationId": "openapi",
		"summary":     "This document",
		"description": "Served without authentication; it holds no secrets.",
		"security":    []any{},
		"responses": obj{"200": obj{
			"description": "The OpenAPI document, its servers entry set to the API's basePath.",
			"content":     obj{"application/json": obj{"schema": obj{"type": "object"}}},
		}},
	}}
	errRef, err := s.refByName(gen, errorMessage)
	if err != nil {
		return nil, err
	}
	file := methods[0].RPC.Input.Location.SourceFile
	info := obj{"title": "Better Compute operator API", "version": "v1"}
	for _, f := range gen.Files {
		if f.Desc.Path() == file {
			info["description"] = description(f.Desc.SourceLocations().ByPath(protoreflect.SourcePath{12}).LeadingComments)
		}
	}
	doc := obj{
		"openapi": "3.0.3",
		"info":    info,
		"servers": []any{obj{"url": defaultBasePath, "description": "basePath (host.api.basePath)"}},
		"tags":    tags,
		"paths":   paths,
		"security": []any{
			obj{"bearer": []any{}},
		},
		"components": obj{
			"securitySchemes": obj{"bearer": obj{
				"type":        "http",
				"scheme":      "bearer",
				"description": "An API token (bcat_...) from tokens.create or the data directory's admin token.",
			}},
			"parameters": obj{"XBetterCompute": obj{
				"name":        "X-Better-Compute",
				"in":          "header",
				"required":    true,
				"description": "Must be 1 on every call: a browser cannot send it across origins without a CORS preflight.",
				"schema":      obj{"type": "string", "enum": []any{"1"}},
			}},
			"responses": obj{"Error": obj{
				"description": "A failed call, with a stable code: 400 INVALID_ARGUMENT, 401 UNAUTHENTICATED, 403 PERMISSION_DENIED, 404 NOT_FOUND, 405 METHOD_NOT_ALLOWED, 409 CONFLICT, 503 UNAVAILABLE, 500 INTERNAL.",
				"content":     obj{"application/json": obj{"schema": errRef}},
			}},
			"schemas": s.out,
		},
	}
	b, err := json.MarshalIndent(doc, "", "  ")
	if err != nil {
		return nil, fmt.Errorf("encode: %w", err)
	}
	return append(b, '\n'), nil
}

// description is a proto comment as one paragraph-preserving string.
func description(c string) string {
	return strings.Join(commentLines(protogen.Comments(c)), "\n")
}

// schemas collects components/schemas: one per message of the API package
// reached from a method, named by its name inside the package.
type schemas struct {
	out obj
}

// refByName is the reference to the message with full name name.
func (s *schemas) refByName(gen *protogen.Plugin, name string) (obj, error) {
	for _, f := range gen.Files {
		if d := f.Desc.Messages().ByName(protoreflect.FullName(name).Name()); d != nil && string(d.FullName()) == name {
			return s.ref(d)
		}
	}
	return nil, fmt.Errorf("message %s not found", name)
}

// ref returns the schema of a message-typed value: inline for the
// well-known types protojson writes as scalars, else a $ref to its
// component, which it adds (with every message it reaches) on first use.
func (s *schemas) ref(m protoreflect.MessageDescriptor) (obj, error) {
	if wk, ok, err := wellKnown(m); ok || err != nil {
		return wk, err
	}
	pkg := string(m.ParentFile().Package())
	if pkg != apiPackage {
		return nil, fmt.Errorf("message %s: only %s and well-known types are supported", m.FullName(), apiPackage)
	}
	name := strings.TrimPrefix(string(m.FullName()), pkg+".")
	ref := obj{"$ref": "#/components/schemas/" + name}
	if _, done := s.out[name]; done {
		return ref, nil
	}
	schema := obj{"type": "object"}
	s.out[name] = schema // before the fields: a message may reach itself
	if d := description(m.ParentFile().SourceLocations().ByDescriptor(m).LeadingComments); d != "" {
		schema["description"] = d
	}
	props := obj{}
	fields := m.Fields()
	for i := range fields.Len() {
		f := fields.Get(i)
		fs, err := s.field(f)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", f.FullName(), err)
		}
		if d := description(f.ParentFile().SourceLocations().ByDescriptor(f).LeadingComments); d != "" {
			if _, isRef := fs["$ref"]; isRef {
				fs = obj{"allOf": []any{fs}} // OpenAPI 3.0 ignores siblings of $ref
			}
			fs["description"] = d
		}
		props[f.JSONName()] = fs
	}
	schema["properties"] = props
	schema["additionalProperties"] = false
	return ref, nil
}

// field is the schema of one field's JSON value.
func (s *schemas) field(f protoreflect.FieldDescriptor) (obj, error) {
	if f.IsMap() {
		v, err := s.single(f.MapValue())
		if err != nil {
			return nil, err
		}
		return obj{"type": "object", "additionalProperties": v}, nil
	}
	v, err := s.single(f)
	if err != nil {
		return nil, err
	}
	if f.IsList() {
		return obj{"type": "array", "items": v}, nil
	}
	return v, nil
}

// single is the schema of one value of f's type, as protojson writes it.
func (s *schemas) single(f protoreflect.FieldDescriptor) (obj, error) {
	switch f.Kind() {
	case protoreflect.BoolKind:
		return obj{"type": "boolean"}, nil
	case protoreflect.Int32Kind, protoreflect.Sint32Kind, protoreflect.Sfixed32Kind:
		return obj{"type": "integer", "format": "int32"}, nil
	case protoreflect.Uint32Kind, protoreflect.Fixed32Kind:
		return obj{"type": "integer", "format": "int64", "minimum": 0, "maximum": 4294967295}, nil
	case protoreflect.Int64Kind, protoreflect.Sint64Kind, protoreflect.Sfixed64Kind:
		return obj{"type": "string", "format": "int64", "pattern": `^-?[0-9]+$`,
			"description": "A 64-bit integer as a decimal string (a JSON number is accepted too)."}, nil
	case protoreflect.Uint64Kind, protoreflect.Fixed64Kind:
		return obj{"type": "string", "format": "uint64", "pattern": `^[0-9]+$`,
			"description": "An unsigned 64-bit integer as a decimal string (a JSON number is accepted too)."}, nil
	case protoreflect.FloatKind:
		return obj{"type": "number", "format": "float"}, nil
	case protoreflect.DoubleKind:
		return obj{"type": "number", "format": "double"}, nil
	case protoreflect.StringKind:
		return obj{"type": "string"}, nil
	case protoreflect.BytesKind:
		return obj{"type": "string", "format": "byte"}, nil
	case protoreflect.EnumKind:
		vals := f.Enum().Values()
		names := make([]any, vals.Len())
		for i := range vals.Len() {
			names[i] = string(vals.Get(i).Name())
		}
		return obj{"type": "string", "enum": names}, nil
	case protoreflect.MessageKind:
		return s.ref(f.Message())
	}
	return nil, fmt.Errorf("field kind %v is not supported", f.Kind())
}

// wellKnown is the inline schema of a well-known type protojson writes in a
// special form; ok is false for other messages, and an unsupported
// well-known type is an error so that nothing is described wrongly.
func wellKnown(m protoreflect.MessageDescriptor) (schema obj, ok bool, err error) {
	if m.ParentFile().Package() != "google.protobuf" {
		return nil, false, nil
	}
	switch m.FullName() {
	case "google.protobuf.Timestamp":
		return obj{"type": "string", "format": "date-time", "description": "An RFC 3339 time in UTC (2026-01-02T15:04:05Z)."}, true, nil
	case "google.protobuf.Duration":
		return obj{"type": "string", "pattern": `^-?[0-9]+(\.[0-9]{1,9})?s$`, "description": `A duration in seconds with an "s" suffix ("1.5s", "3600s").`}, true, nil
	case "google.protobuf.Struct":
		return obj{"type": "object", "additionalProperties": true}, true, nil
	case "google.protobuf.Value":
		return obj{"description": "Any JSON value."}, true, nil
	}
	return nil, false, fmt.Errorf("well-known type %s is not supported", m.FullName())
}
