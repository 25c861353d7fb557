package apiv1

import _ "embed" // OpenAPI

// OpenAPI is the OpenAPI 3.0 document of the operator API (openapi.json,
// written by proto/generate.sh from the services of api.proto): every
// method at POST {basePath}/{group}/{method} with its request and response
// schemas in protojson names, the X-Better-Compute header, bearer
// authentication and the error body. Its servers entry is "/api"; the API
// serves it at {basePath}/openapi.json with its own basePath.
//
//go:embed openapi.json
var OpenAPI []byte
