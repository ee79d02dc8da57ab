package deploy_test

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/santhosh-tekuri/jsonschema/v6"
	"go.yaml.in/yaml/v3"
)

// crdGroups are the API groups whose resources deploy/ holds, with the vendored CRD files
// (testdata/crds, see its README for versions and sources) that define their kinds.
var crdGroups = map[string][]string{
	"networking.istio.io":       {"istio-1.30.3-envoyfilters.yaml"},
	"gateway.envoyproxy.io":     {"envoy-gateway-v1.9.0-envoypatchpolicies.yaml"},
	"projectcontour.io":         {"contour-v1.33.6-extensionservices.yaml", "contour-v1.33.6-httpproxies.yaml"},
	"gateway.networking.k8s.io": nil, // referenced by name only, never defined here
}

// crdSchema is the schema of one kind at one version, compiled.
type crdSchema struct {
	schema *jsonschema.Schema
	source string
}

// loadCRDs compiles the openAPIV3Schema of every version of every vendored CRD, keyed by
// apiVersion/kind. Objects are closed (additionalProperties: false) unless the CRD keeps
// unknown fields, as the API server's strict field validation (kubectl's default) treats them.
func loadCRDs(t *testing.T) map[string]crdSchema {
	t.Helper()
	out := map[string]crdSchema{}
	c := jsonschema.NewCompiler()
	c.DefaultDraft(jsonschema.Draft4) // OpenAPI v3.0's schema objects are draft 4's
	for _, files := range crdGroups {
		for _, f := range files {
			data, err := os.ReadFile(filepath.Join("testdata", "crds", f))
			if err != nil {
				t.Fatal(err)
			}
			var crd struct {
				Spec struct {
					Group    string
					Names    struct{ Kind string }
					Versions []struct {
						Name   string
						Served bool
						Schema struct {
							OpenAPIV3Schema map[string]any `yaml:"openAPIV3Schema"`
						}
					}
				}
			}
			if err := yaml.Unmarshal(data, &crd); err != nil {
				t.Fatalf("%s: %v", f, err)
			}
			for _, v := range crd.Spec.Versions {
				if !v.Served || v.Schema.OpenAPIV3Schema == nil {
					continue
				}
				key := crd.Spec.Group + "/" + v.Name + "/" + crd.Spec.Names.Kind
				url := "mem:///" + f + "/" + v.Name
				// The API server defines apiVersion, kind and metadata for every kind; some CRDs
				// (Istio's) leave them out of their schema.
				root := v.Schema.OpenAPIV3Schema
				props, _ := root["properties"].(map[string]any)
				for k, typ := range map[string]string{"apiVersion": "string", "kind": "string", "metadata": "object"} {
					if _, ok := props[k]; !ok && props != nil {
						props[k] = map[string]any{"type": typ}
					}
				}
				doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(toJSON(t, closeObjects(root))))
				if err != nil {
					t.Fatal(err)
				}
				if err := c.AddResource(url, doc); err != nil {
					t.Fatal(err)
				}
				s, err := c.Compile(url)
				if err != nil {
					t.Fatalf("%s: %s: %v", f, v.Name, err)
				}
				out[key] = crdSchema{s, f}
			}
		}
	}
	return out
}

// closeObjects returns the schema with additionalProperties: false on every object schema that
// lists its properties and neither keeps unknown fields nor says what else it allows.
func closeObjects(v any) any {
	switch s := v.(type) {
	case map[string]any:
		out := make(map[string]any, len(s)+1)
		for k, e := range s {
			if k == "properties" || k == "patternProperties" || k == "definitions" {
				props := map[string]any{}
				for pk, pv := range e.(map[string]any) {
					props[pk] = closeObjects(pv)
				}
				out[k] = props
				continue
			}
			out[k] = closeObjects(e)
		}
		_, hasProps := s["properties"]
		_, hasAdditional := s["additionalProperties"]
		if hasProps && !hasAdditional && s["x-kubernetes-preserve-unknown-fields"] != true {
			out["additionalProperties"] = false
		}
		return out
	case []any:
		out := make([]any, len(s))
		for i, e := range s {
			out[i] = closeObjects(e)
		}
		return out
	}
	return v
}

// TestDeployResourcesMatchCRDs validates every resource of deploy/ whose API group is Istio's,
// Envoy Gateway's or Contour's against that project's published CRD schema. The CRDs' CEL rules
// (x-kubernetes-validations) are not evaluated: TestEnvoyGatewayPatchesValid and
// TestIstioEnvoyFilterPatchesValid check what those resources carry for Envoy.
func TestDeployResourcesMatchCRDs(t *testing.T) {
	schemas := loadCRDs(t)
	checked := 0
	for _, d := range readDocs(t, glob(t, "deploy/*/*.yaml")...) {
		group, version, ok := strings.Cut(d.apiVersion(), "/")
		if !ok {
			continue // the core group
		}
		if _, known := crdGroups[group]; !known {
			continue // Kubernetes' own (k8s_test.go) or a project outside this check's scope
		}
		s, ok := schemas[group+"/"+version+"/"+d.kind()]
		if !ok {
			t.Errorf("%s: no vendored CRD serves %s %s", d, d.apiVersion(), d.kind())
			continue
		}
		inst, err := jsonschema.UnmarshalJSON(bytes.NewReader(d.json))
		if err != nil {
			t.Fatal(err)
		}
		if err := s.schema.Validate(inst); err != nil {
			t.Errorf("%s against %s: %v", d, s.source, err)
		}
		checked++
	}
	if checked < 4 {
		t.Errorf("checked %d resources against CRDs, want at least the 4 of deploy/envoy", checked)
	}
}

// TestCRDCheckCatches: the check refuses a misspelled field, an unknown enum value and a
// missing required field (proof that the closed schemas bite).
func TestCRDCheckCatches(t *testing.T) {
	schemas := loadCRDs(t)
	for _, tc := range []struct {
		key, yaml, want string
	}{
		{"gateway.envoyproxy.io/v1alpha1/EnvoyPatchPolicy", "apiVersion: gateway.envoyproxy.io/v1alpha1\nkind: EnvoyPatchPolicy\nmetadata: {name: x}\nspec:\n  targetRefs: [{group: gateway.networking.k8s.io, kind: Gateway, name: eg}]\n  type: JSONPatch\n", "targetRef"},
		{"networking.istio.io/v1alpha3/EnvoyFilter", "apiVersion: networking.istio.io/v1alpha3\nkind: EnvoyFilter\nmetadata: {name: x}\nspec:\n  configPatches: [{applyTo: HTTP_FILTR}]\n", "applyTo"},
		{"projectcontour.io/v1alpha1/ExtensionService", "apiVersion: projectcontour.io/v1alpha1\nkind: ExtensionService\nmetadata: {name: x}\nspec:\n  protocl: h2c\n  services: [{name: a, port: 8081}]\n", "protocl"}, //nolint:misspell // the misspelt field is the case
	} {
		var v any
		if err := yaml.Unmarshal([]byte(tc.yaml), &v); err != nil {
			t.Fatal(err)
		}
		inst, err := jsonschema.UnmarshalJSON(bytes.NewReader(toJSON(t, v)))
		if err != nil {
			t.Fatal(err)
		}
		s, ok := schemas[tc.key]
		if !ok {
			t.Fatalf("no schema %s", tc.key)
		}
		err = s.schema.Validate(inst)
		if err == nil || !strings.Contains(fmt.Sprint(err), tc.want) {
			t.Errorf("%s: got %v, want an error naming %q", tc.key, err, tc.want)
		}
	}
}
