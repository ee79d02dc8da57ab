package deploy_test

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/policy"

	// The typed_config types the files name: protojson resolves "@type" through the registry.
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ratelimit/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
)

// validator is what protoc-gen-validate generates for every Envoy message.
type validator interface{ ValidateAll() error }

// decodeEnvoy decodes JSON into m as Envoy would (unknown fields and unresolvable "@type"s
// are errors) and validates it, with every typed_config it holds.
func decodeEnvoy(j []byte, m proto.Message) error {
	if err := protojson.Unmarshal(j, m); err != nil {
		return err
	}
	return validateTree(m)
}

// validateTree runs m's ValidateAll and that of every message packed in an Any below it, which
// ValidateAll does not open.
func validateTree(m proto.Message) error {
	var errs []error
	if v, ok := m.(validator); ok {
		errs = append(errs, v.ValidateAll())
	}
	walkAnys(m.ProtoReflect(), func(a *anypb.Any) {
		inner, err := a.UnmarshalNew()
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", a.GetTypeUrl(), err))
			return
		}
		if err := validateTree(inner); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", a.GetTypeUrl(), err))
		}
	})
	return errors.Join(errs...)
}

// walkAnys calls f for every Any directly below m (not inside another Any).
func walkAnys(m protoreflect.Message, f func(*anypb.Any)) {
	m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		visit := func(v protoreflect.Value) {
			msg := v.Message()
			if a, ok := msg.Interface().(*anypb.Any); ok {
				f(a)
				return
			}
			walkAnys(msg, f)
		}
		switch {
		case fd.IsList() && fd.Message() != nil:
			for i := range v.List().Len() {
				visit(v.List().Get(i))
			}
		case fd.IsMap() && fd.MapValue().Message() != nil:
			v.Map().Range(func(_ protoreflect.MapKey, mv protoreflect.Value) bool {
				visit(mv)
				return true
			})
		case fd.Message() != nil && !fd.IsList() && !fd.IsMap():
			visit(v)
		}
		return true
	})
}

// TestEnvoyBootstrapValid decodes the Envoy bootstraps (deploy/envoy/envoy.yaml, and
// deploy/envoy/local/envoy.yaml of docs/envoy.md's "Trying it locally") into Envoy's Bootstrap
// and validates them; then, since a per-client limit is only as good as the client address it keys on, every
// connection manager whose routes send a remote_address descriptor must say where that address
// comes from (use_remote_address at the edge, xff_num_trusted_hops behind trusted proxies).
func TestEnvoyBootstrapValid(t *testing.T) {
	for _, d := range readDocs(t, "deploy/envoy/envoy.yaml", "deploy/envoy/local/envoy.yaml") {
		var b bootstrapv3.Bootstrap
		if err := decodeEnvoy(d.json, &b); err != nil {
			t.Fatalf("%s: %v", d.file, err)
		}
		for _, l := range b.GetStaticResources().GetListeners() {
			for _, fc := range l.GetFilterChains() {
				for _, f := range fc.GetFilters() {
					var hcm hcmv3.HttpConnectionManager
					if f.GetTypedConfig().MessageIs(&hcm) {
						if err := f.GetTypedConfig().UnmarshalTo(&hcm); err != nil {
							t.Fatal(err)
						}
						if err := clientAddressTrusted(&hcm); err != nil {
							t.Errorf("%s: listener %s: %v", d.file, l.GetName(), err)
						}
					}
				}
			}
		}
	}
}

func clientAddressTrusted(hcm *hcmv3.HttpConnectionManager) error {
	uses := false
	check := func(rls []*routev3.RateLimit) {
		for _, rl := range rls {
			for _, a := range rl.GetActions() {
				uses = uses || a.GetRemoteAddress() != nil
			}
		}
	}
	for _, vh := range hcm.GetRouteConfig().GetVirtualHosts() {
		check(vh.GetRateLimits())
		for _, r := range vh.GetRoutes() {
			check(r.GetRoute().GetRateLimits())
		}
	}
	if uses && !hcm.GetUseRemoteAddress().GetValue() && hcm.GetXffNumTrustedHops() == 0 && len(hcm.GetOriginalIpDetectionExtensions()) == 0 {
		return errors.New("a remote_address descriptor with neither use_remote_address nor xff_num_trusted_hops: the client's own X-Forwarded-For picks its address (a fresh bucket per request)")
	}
	return nil
}

// istioPatchTypes maps an EnvoyFilter's applyTo to the Envoy message its patch value is.
var istioPatchTypes = map[string]func() proto.Message{
	"HTTP_FILTER":    func() proto.Message { return &hcmv3.HttpFilter{} },
	"VIRTUAL_HOST":   func() proto.Message { return &routev3.VirtualHost{} },
	"HTTP_ROUTE":     func() proto.Message { return &routev3.Route{} },
	"CLUSTER":        func() proto.Message { return &clusterv3.Cluster{} },
	"LISTENER":       func() proto.Message { return &listenerv3.Listener{} },
	"NETWORK_FILTER": func() proto.Message { return &listenerv3.Filter{} },
}

// TestIstioEnvoyFilterPatchesValid decodes every patch value of the Istio EnvoyFilters into the
// Envoy message its applyTo names and validates it; a MERGE value is a part of that message, so
// only the fields it sets are validated.
func TestIstioEnvoyFilterPatchesValid(t *testing.T) {
	for _, d := range readDocs(t, "deploy/envoy/istio-envoyfilter.yaml") {
		patches, _ := dig(d.obj, "spec", "configPatches").([]any)
		if len(patches) == 0 {
			t.Errorf("%s: no configPatches", d)
		}
		for i, p := range patches {
			applyTo := str(dig(p, "applyTo"))
			newMsg, ok := istioPatchTypes[applyTo]
			if !ok {
				t.Errorf("%s: patch %d: applyTo %q is not one this check knows", d, i, applyTo)
				continue
			}
			m := newMsg()
			if err := protojson.Unmarshal(toJSON(t, dig(p, "patch", "value")), m); err != nil {
				t.Errorf("%s: patch %d (%s): %v", d, i, applyTo, err)
				continue
			}
			var err error
			if str(dig(p, "patch", "operation")) == "MERGE" {
				err = validateSetFields(m)
			} else {
				err = validateTree(m)
			}
			if err != nil {
				t.Errorf("%s: patch %d (%s): %v", d, i, applyTo, err)
			}
		}
	}
}

// validateSetFields validates every message value m sets, not m itself (whose required fields a
// merge leaves to the message it merges into).
func validateSetFields(m proto.Message) error {
	var errs []error
	m.ProtoReflect().Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		switch {
		case fd.IsList() && fd.Message() != nil:
			for i := range v.List().Len() {
				errs = append(errs, validateTree(v.List().Get(i).Message().Interface()))
			}
		case fd.Message() != nil && !fd.IsMap():
			errs = append(errs, validateTree(v.Message().Interface()))
		}
		return true
	})
	return errors.Join(errs...)
}

// TestEnvoyGatewayPatchesValid: each JSON patch of the EnvoyPatchPolicy names a path that exists
// in the resource type it patches, and its value decodes into the message at that path and
// validates.
func TestEnvoyGatewayPatchesValid(t *testing.T) {
	for _, d := range readDocs(t, "deploy/envoy/envoy-gateway.yaml") {
		if d.kind() != "EnvoyPatchPolicy" {
			continue
		}
		patches, _ := dig(d.obj, "spec", "jsonPatches").([]any)
		if len(patches) == 0 {
			t.Errorf("%s: no jsonPatches", d)
		}
		for i, p := range patches {
			typeURL, ptr := str(dig(p, "type")), str(dig(p, "operation", "path"))
			where := fmt.Sprintf("%s: patch %d (%s %q)", d, i, typeURL, ptr)
			res, err := newAny(typeURL)
			if err != nil {
				t.Errorf("%s: %v", where, err)
				continue
			}
			md, list, err := atPointer(res.ProtoReflect().Descriptor(), ptr)
			if err != nil {
				t.Errorf("%s: %v", where, err)
				continue
			}
			values := []any{dig(p, "operation", "value")}
			if list {
				values, _ = values[0].([]any)
				if len(values) == 0 {
					t.Errorf("%s: the path names a list; the value is no list or an empty one", where)
				}
			}
			for _, v := range values {
				m := res.ProtoReflect().New().Interface()
				if md != nil {
					m = newMessage(t, md)
				}
				if err := decodeEnvoy(toJSON(t, v), m); err != nil {
					t.Errorf("%s: %v", where, err)
				}
			}
		}
	}
}

// newAny returns a new message of the type an Any's type URL names.
func newAny(typeURL string) (proto.Message, error) {
	a := &anypb.Any{TypeUrl: typeURL}
	return a.UnmarshalNew()
}

func newMessage(t *testing.T, md protoreflect.MessageDescriptor) proto.Message {
	t.Helper()
	m, err := newAny("type.googleapis.com/" + string(md.FullName()))
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// atPointer follows a JSON pointer of an Envoy Gateway patch through message descriptors and
// returns the type of the value it names (nil: the resource itself) and whether the pointer
// ends at a repeated field (the value is then the whole list). An Any below a listener's
// filters is Envoy Gateway's HTTP connection manager, the only network filter of its HTTP
// listeners.
func atPointer(md protoreflect.MessageDescriptor, ptr string) (protoreflect.MessageDescriptor, bool, error) {
	if ptr == "" {
		return nil, false, nil
	}
	segs := strings.Split(strings.TrimPrefix(ptr, "/"), "/")
	var field protoreflect.FieldDescriptor
	for i := 0; i < len(segs); i++ {
		field = md.Fields().ByName(protoreflect.Name(segs[i]))
		if field == nil {
			field = md.Fields().ByJSONName(segs[i])
		}
		if field == nil {
			return nil, false, fmt.Errorf("%s has no field %q", md.FullName(), segs[i])
		}
		if field.Message() == nil {
			return nil, false, fmt.Errorf("%s.%s is no message", md.FullName(), segs[i])
		}
		md = field.Message()
		if field.IsList() {
			if i+1 == len(segs) {
				return md, true, nil
			}
			if _, err := strconv.Atoi(segs[i+1]); err != nil && segs[i+1] != "-" {
				return nil, false, fmt.Errorf("%s: index %q", field.FullName(), segs[i+1])
			}
			i++
		}
		if md.FullName() == "google.protobuf.Any" {
			if field.Name() != "typed_config" || i < 2 || segs[i-2] != "filters" {
				return nil, false, fmt.Errorf("%s: an Any whose type this check cannot tell", ptr)
			}
			md = (&hcmv3.HttpConnectionManager{}).ProtoReflect().Descriptor()
		}
	}
	return md, false, nil
}

// failOpenComment matches what a comment says about failing open or closed.
var failOpenComment = regexp.MustCompile(`(?i)fail(s|ing)?[ -](open|closed)`)

// TestEnvoyFailureModeComments: a comment just above failure_mode_deny (Envoy) or failOpen
// (Contour) that says "fail open" or "fail closed" says what the value does.
func TestEnvoyFailureModeComments(t *testing.T) {
	for _, name := range append(glob(t, "deploy/envoy/*.yaml"), glob(t, "deploy/envoy/local/*.yaml")...) {
		f, err := os.Open(filepath.Join(root(), name))
		if err != nil {
			t.Fatal(err)
		}
		var comment []string
		sc := bufio.NewScanner(f)
		for n := 1; sc.Scan(); n++ {
			line := strings.TrimSpace(sc.Text())
			if strings.HasPrefix(line, "#") {
				comment = append(comment, line)
				continue
			}
			open := ""
			switch line {
			case "failure_mode_deny: false", "failOpen: true":
				open = "open"
			case "failure_mode_deny: true", "failOpen: false":
				open = "closed"
			}
			if open != "" {
				if m := failOpenComment.FindStringSubmatch(strings.Join(comment, " ")); m != nil && !strings.EqualFold(m[2], open) {
					t.Errorf("%s:%d: %q fails %s, but the comment above says %q", name, n, line, open, m[0])
				}
			}
			comment = nil
		}
		f.Close()
		if err := sc.Err(); err != nil {
			t.Fatal(err)
		}
	}
}

// ruleDomain is the domain line of an envoyproxy/ratelimit rule file.
var ruleDomain = regexp.MustCompile(`(?m)^domain:\s*(\S+)`)

// TestEnvoyGatewayRedisReplacesTheirs: deploy/envoy/envoy-gateway-redis.yaml, decoded strictly,
// is the rate limit service envoy-gateway.yaml's EnvoyPatchPolicy calls (its cluster's address is
// this Service's, its domain one of the mounted rule files), on the Redis that Envoy Gateway's own
// rate limit service is given in its global rate limit task, with a configuration the gateway's
// loader accepts.
func TestEnvoyGatewayRedisReplacesTheirs(t *testing.T) {
	const file = "deploy/envoy/envoy-gateway-redis.yaml"
	o := decodeDocs(t, readDocs(t, file))
	if len(o.deployments) != 1 || len(o.services) != 1 {
		t.Fatalf("%s: %d Deployments and %d Services, want one of each", file, len(o.deployments), len(o.services))
	}
	gw := gatewayContainer(t, o.deployments[0].Spec.Template.Spec)
	checkConfig(t, o, gw, nil)

	ns := o.deployments[0].Namespace
	var cfg *policy.Config
	domains := map[string]bool{}
	for _, m := range o.configMaps {
		if text, ok := m.Data["config.yaml"]; ok {
			c, err := policy.Parse([]byte(text), policy.LoadOptions{Getenv: func(string) string { return "" }})
			if err != nil {
				t.Fatalf("%s: %v", m.Name, err)
			}
			cfg = c
			continue
		}
		for name, rules := range m.Data {
			if d := ruleDomain.FindStringSubmatch(rules); d != nil {
				domains[d[1]] = true
			} else {
				t.Errorf("%s/%s: no domain", m.Name, name)
			}
		}
	}
	if cfg == nil || cfg.Store.Backend != "redis" || cfg.Store.Redis == nil {
		t.Fatalf("%s: want store.backend redis, got %+v", file, cfg)
	}
	const theirRedis = "redis://redis.redis-system.svc.cluster.local:6379/0"
	if cfg.Store.Redis.URL != theirRedis {
		t.Errorf("store.redis.url %q, want Envoy Gateway's Redis %q", cfg.Store.Redis.URL, theirRedis)
	}

	svc := o.services[0]
	want := fmt.Sprintf("%s.%s.svc.cluster.local", svc.Name, ns)
	var cluster, domain any
	for _, p := range dig(readDocs(t, "deploy/envoy/envoy-gateway.yaml")[0].obj, "spec", "jsonPatches").([]any) {
		switch str(dig(p, "type")) {
		case "type.googleapis.com/envoy.config.cluster.v3.Cluster":
			cluster = dig(p, "operation", "value", "load_assignment", "endpoints", 0, "lb_endpoints", 0, "endpoint", "address", "socket_address")
		case "type.googleapis.com/envoy.config.listener.v3.Listener":
			domain = dig(p, "operation", "value", "typed_config", "domain")
		}
	}
	if got := str(dig(cluster, "address")); got != want {
		t.Errorf("envoy-gateway.yaml's cluster calls %q; %s's Service is %q", got, file, want)
	}
	port, _ := dig(cluster, "port_value").(int)
	if len(svc.Spec.Ports) != 1 || int(svc.Spec.Ports[0].Port) != port {
		t.Errorf("envoy-gateway.yaml's cluster calls port %d; the Service has %+v", port, svc.Spec.Ports)
	}
	if !domains[str(domain)] {
		t.Errorf("envoy-gateway.yaml's filter names domain %q; the rule files have %v", domain, domains)
	}
}
