package api

import (
	_ "embed" // openapi.yaml

	"sigs.k8s.io/yaml"
)

// openAPIYAML is the OpenAPI 3 document of the broker's HTTP API, written
// by hand beside the types it describes; TestOperatorOpenAPI checks it
// against the routes the server registers and their real answers.
//
//go:embed openapi.yaml
var openAPIYAML []byte

// openAPIJSON is openAPIYAML in JSON, as the broker serves it.
var openAPIJSON = func() []byte {
	j, err := yaml.YAMLToJSON(openAPIYAML)
	if err != nil {
		panic("broker/api/openapi.yaml: " + err.Error())
	}
	return j
}()

// OpenAPI returns the OpenAPI 3 document of the broker's HTTP API (v2 and
// v1) in JSON; the caller must not modify it.
func OpenAPI() []byte { return openAPIJSON }
