// Package deploy_test checks the deployment files of deploy/ the way the systems that run them
// would, offline: Kubernetes manifests decoded strictly into k8s.io/api's types plus the
// admission rules that stop a sidecar from starting (k8s_test.go); the Envoy bootstrap and every
// Envoy fragment decoded into go-control-plane's types and validated with their own
// ValidateAll (envoy_test.go); the Istio, Envoy Gateway and Contour resources checked against
// those projects' published CRD schemas, vendored under testdata/crds (crd_test.go).
//
// The checks live in a package of their own, apart from cmd/ratelimit-proxy's end-to-end tests,
// so that only `go test ./deploy/` compiles k8s.io/api and Envoy's configuration types.
package deploy_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"testing"

	"go.yaml.in/yaml/v3"
)

// root is the repository, seen from this package; DEPLOY_CHECK_ROOT points the checks at
// another checkout (to run today's checks against an older tree's files).
func root() string {
	if r := os.Getenv("DEPLOY_CHECK_ROOT"); r != "" {
		return r
	}
	return ".."
}

// doc is one YAML document of a file.
type doc struct {
	file  string         // relative to the repository
	index int            // 0-based position in the file
	obj   map[string]any // as decoded
	json  []byte         // the same, as JSON
}

func (d doc) String() string {
	return fmt.Sprintf("%s#%d %s/%s", d.file, d.index, str(d.obj["kind"]), str(dig(d.obj, "metadata", "name")))
}

func (d doc) apiVersion() string { return str(d.obj["apiVersion"]) }
func (d doc) kind() string       { return str(d.obj["kind"]) }

// readDocs decodes every non-empty document of the files, which are relative to the repository.
func readDocs(t *testing.T, files ...string) []doc {
	t.Helper()
	var out []doc
	for _, f := range files {
		data, err := os.ReadFile(filepath.Join(root(), f))
		if err != nil {
			t.Fatal(err)
		}
		dec := yaml.NewDecoder(bytes.NewReader(data))
		for i := 0; ; i++ {
			var obj map[string]any
			err := dec.Decode(&obj)
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				t.Fatalf("%s: document %d: %v", f, i, err)
			}
			if obj == nil {
				continue
			}
			j, err := json.Marshal(obj)
			if err != nil {
				t.Fatalf("%s: document %d: %v", f, i, err)
			}
			out = append(out, doc{file: f, index: i, obj: obj, json: j})
		}
	}
	return out
}

// glob lists the files matching pattern, relative to the repository.
func glob(t *testing.T, pattern string) []string {
	t.Helper()
	m, err := filepath.Glob(filepath.Join(root(), pattern))
	if err != nil {
		t.Fatal(err)
	}
	if len(m) == 0 {
		t.Fatalf("no file matches %s", pattern)
	}
	for i, f := range m {
		if m[i], err = filepath.Rel(root(), f); err != nil {
			t.Fatal(err)
		}
	}
	return m
}

// dig follows keys (string) and indexes (int) into decoded YAML; nil when a step is missing.
func dig(v any, path ...any) any {
	for _, p := range path {
		switch k := p.(type) {
		case string:
			m, ok := v.(map[string]any)
			if !ok {
				return nil
			}
			v = m[k]
		case int:
			l, ok := v.([]any)
			if !ok || k >= len(l) {
				return nil
			}
			v = l[k]
		}
	}
	return v
}

func str(v any) string {
	s, _ := v.(string)
	return s
}

// toJSON re-encodes a decoded YAML value as JSON.
func toJSON(t *testing.T, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
