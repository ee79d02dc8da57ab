package e2e

// deploy/envoy holds ratelimit-proxy as Envoy's rate limit service and the four ways Envoy-based
// gateways call it: a plain Envoy bootstrap, an Istio EnvoyFilter, an Envoy Gateway
// EnvoyPatchPolicy and a Contour ExtensionService. This test checks what this machine can: every
// file parses; the service's configuration passes the gateway's own validation with the rules
// the pod would mount; and every caller's RLS cluster reaches the Service's gRPC port, which is
// the port rls.listen serves, in a domain the rules define.

import (
	"bytes"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/policy"
)

const envoyDeployDir = "../../deploy/envoy"

// yamlDocs decodes every document of a deploy/envoy file.
func yamlDocs(t *testing.T, name string) []map[string]any {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(envoyDeployDir, name))
	if err != nil {
		t.Fatal(err)
	}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var out []map[string]any
	for {
		var doc map[string]any
		if err := dec.Decode(&doc); errors.Is(err, io.EOF) {
			return out
		} else if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		out = append(out, doc)
	}
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

func find(docs []map[string]any, kind, name string) map[string]any {
	for _, d := range docs {
		if d["kind"] == kind && dig(d, "metadata", "name") == name {
			return d
		}
	}
	return nil
}

// rlsService is what ratelimit-proxy.yaml serves.
type rlsService struct {
	host    string // the Service's cluster DNS name
	name    string
	ns      string
	port    int
	domains map[string]bool
}

func loadRLSService(t *testing.T) rlsService {
	t.Helper()
	docs := yamlDocs(t, "ratelimit-proxy.yaml")
	svc := find(docs, "Service", "ratelimit-proxy")
	if svc == nil {
		t.Fatal("ratelimit-proxy.yaml: no Service ratelimit-proxy")
	}
	s := rlsService{name: "ratelimit-proxy", ns: dig(svc, "metadata", "namespace").(string), domains: map[string]bool{}}
	s.host = s.name + "." + s.ns + ".svc.cluster.local"
	ports, _ := dig(svc, "spec", "ports").([]any)
	for _, p := range ports {
		if dig(p, "name") == "grpc-rls" {
			s.port = dig(p, "port").(int)
			if dig(p, "appProtocol") != "kubernetes.io/h2c" {
				t.Errorf("Service port grpc-rls: appProtocol %v, want kubernetes.io/h2c", dig(p, "appProtocol"))
			}
		}
	}
	if s.port == 0 {
		t.Fatal("Service ratelimit-proxy: no port grpc-rls")
	}

	// The Deployment's container port and gRPC probe are that port.
	dep := find(docs, "Deployment", "ratelimit-proxy")
	c := dig(dep, "spec", "template", "spec", "containers", 0)
	var containerPort int
	for _, p := range dig(c, "ports").([]any) {
		if dig(p, "name") == "grpc-rls" {
			containerPort = dig(p, "containerPort").(int)
		}
	}
	if probe := dig(c, "readinessProbe", "grpc", "port"); probe != containerPort {
		t.Errorf("readiness probe port %v, want the grpc-rls port %d", probe, containerPort)
	}

	// config.yaml validates with the rules the pod mounts, and rls.listen is the container port.
	dir := t.TempDir()
	rules := find(docs, "ConfigMap", "ratelimit-rules")
	rulesDir := filepath.Join(dir, "rules")
	if err := os.Mkdir(rulesDir, 0o700); err != nil {
		t.Fatal(err)
	}
	for name, content := range dig(rules, "data").(map[string]any) {
		if err := os.WriteFile(filepath.Join(rulesDir, name), []byte(content.(string)), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	text := dig(find(docs, "ConfigMap", "ratelimit-proxy-rls"), "data", "config.yaml").(string)
	if !strings.Contains(text, "config_dir: /etc/ratelimit-proxy/rules") {
		t.Error("config.yaml does not read the rules where the Deployment mounts them")
	}
	text = strings.ReplaceAll(text, "/etc/ratelimit-proxy/rules", rulesDir)
	cfg, err := policy.Parse([]byte(text), policy.LoadOptions{Getenv: func(string) string { return "" }})
	if err != nil {
		t.Fatalf("config.yaml: %v", err)
	}
	set, err := policy.Compile(cfg, policy.CompileOptions{Getenv: func(string) string { return "" }})
	if err != nil {
		t.Fatalf("config.yaml does not validate: %v", err)
	}
	_, port, _ := net.SplitHostPort(cfg.RLS.Listen)
	if port != strconv.Itoa(containerPort) || containerPort != s.port {
		t.Errorf("rls.listen port %s, container port %d, Service port %d: want one port", port, containerPort, s.port)
	}
	for _, d := range set.RLS().Domains() {
		s.domains[d] = true
	}
	return s
}

func TestEnvoyDeployFilesReachTheService(t *testing.T) {
	s := loadRLSService(t)
	wantDomain := func(file string, d any) {
		t.Helper()
		if name, _ := d.(string); !s.domains[name] {
			t.Errorf("%s: domain %v is not one of the rules' domains %v", file, d, s.domains)
		}
	}
	wantSocket := func(file string, cluster any) {
		t.Helper()
		addr := dig(cluster, "load_assignment", "endpoints", 0, "lb_endpoints", 0, "endpoint", "address", "socket_address")
		if dig(addr, "address") != s.host || dig(addr, "port_value") != s.port {
			t.Errorf("%s: the RLS cluster reaches %v:%v, want %s:%d", file, dig(addr, "address"), dig(addr, "port_value"), s.host, s.port)
		}
		if dig(cluster, "typed_extension_protocol_options", "envoy.extensions.upstreams.http.v3.HttpProtocolOptions", "explicit_http_config", "http2_protocol_options") == nil {
			t.Errorf("%s: the RLS cluster does not speak HTTP/2 (gRPC needs it)", file)
		}
	}

	t.Run("envoy bootstrap", func(t *testing.T) {
		boot := yamlDocs(t, "envoy.yaml")[0]
		filters := dig(boot, "static_resources", "listeners", 0, "filter_chains", 0, "filters", 0, "typed_config", "http_filters").([]any)
		rl := dig(filters, 0, "typed_config")
		wantDomain("envoy.yaml", dig(rl, "domain"))
		name := dig(rl, "rate_limit_service", "grpc_service", "envoy_grpc", "cluster_name")
		var cluster any
		for _, c := range dig(boot, "static_resources", "clusters").([]any) {
			if dig(c, "name") == name {
				cluster = c
			}
		}
		if cluster == nil {
			t.Fatalf("envoy.yaml: no cluster %v", name)
		}
		wantSocket("envoy.yaml", cluster)
		if dig(cluster, "health_checks", 0, "grpc_health_check", "service_name") != "envoy.service.ratelimit.v3.RateLimitService" {
			t.Error("envoy.yaml: the RLS cluster's health check does not ask the rate limit service")
		}
	})

	t.Run("istio", func(t *testing.T) {
		docs := yamlDocs(t, "istio-envoyfilter.yaml")
		rl := dig(find(docs, "EnvoyFilter", "ratelimit-proxy-filter"), "spec", "configPatches", 0, "patch", "value", "typed_config")
		wantDomain("istio-envoyfilter.yaml", dig(rl, "domain"))
		want := "outbound|" + strconv.Itoa(s.port) + "||" + s.host
		if got := dig(rl, "rate_limit_service", "grpc_service", "envoy_grpc", "cluster_name"); got != want {
			t.Errorf("istio-envoyfilter.yaml: cluster %v, want %s", got, want)
		}
	})

	t.Run("envoy gateway", func(t *testing.T) {
		patches := dig(find(yamlDocs(t, "envoy-gateway.yaml"), "EnvoyPatchPolicy", "ratelimit-proxy"), "spec", "jsonPatches").([]any)
		var name, cluster any
		for _, p := range patches {
			v := dig(p, "operation", "value")
			switch dig(p, "type") {
			case "type.googleapis.com/envoy.config.listener.v3.Listener":
				wantDomain("envoy-gateway.yaml", dig(v, "typed_config", "domain"))
				name = dig(v, "typed_config", "rate_limit_service", "grpc_service", "envoy_grpc", "cluster_name")
			case "type.googleapis.com/envoy.config.cluster.v3.Cluster":
				cluster = v
			}
		}
		if cluster == nil || dig(cluster, "name") != name {
			t.Fatalf("envoy-gateway.yaml: the filter's cluster %v is not the one added", name)
		}
		wantSocket("envoy-gateway.yaml", cluster)
	})

	t.Run("contour", func(t *testing.T) {
		docs := yamlDocs(t, "contour.yaml")
		ext := find(docs, "ExtensionService", "ratelimit-proxy")
		if dig(ext, "spec", "protocol") != "h2c" {
			t.Errorf("contour.yaml: ExtensionService protocol %v, want h2c", dig(ext, "spec", "protocol"))
		}
		if dig(ext, "metadata", "namespace") != s.ns || dig(ext, "spec", "services", 0, "name") != s.name || dig(ext, "spec", "services", 0, "port") != s.port {
			t.Errorf("contour.yaml: ExtensionService reaches %v/%v:%v, want %s/%s:%d", dig(ext, "metadata", "namespace"),
				dig(ext, "spec", "services", 0, "name"), dig(ext, "spec", "services", 0, "port"), s.ns, s.name, s.port)
		}
		var contourCfg map[string]any
		if err := yaml.Unmarshal([]byte(dig(find(docs, "ConfigMap", "contour"), "data", "contour.yaml").(string)), &contourCfg); err != nil {
			t.Fatal(err)
		}
		if got := dig(contourCfg, "rateLimitService", "extensionService"); got != s.ns+"/ratelimit-proxy" {
			t.Errorf("contour.yaml: rateLimitService.extensionService %v, want %s/ratelimit-proxy", got, s.ns)
		}
		wantDomain("contour.yaml", dig(contourCfg, "rateLimitService", "domain"))
	})
}
