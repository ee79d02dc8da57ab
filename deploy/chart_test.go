package deploy_test

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"math/big"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"
	"helm.sh/helm/v4/pkg/chart/common"
	chartutil "helm.sh/helm/v4/pkg/chart/common/util"
	"helm.sh/helm/v4/pkg/chart/v2/lint"
	"helm.sh/helm/v4/pkg/chart/v2/lint/support"
	"helm.sh/helm/v4/pkg/chart/v2/loader"
	"helm.sh/helm/v4/pkg/engine"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/strategicpatch"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/policy"
)

const chartDir = "deploy/helm/ratelimit-proxy"

// chartCase is one documented way to install the chart: its defaults, or a values file of
// examples/.
type chartCase struct {
	name      string
	values    string // relative to the repository; "" for the defaults
	release   string
	namespace string
}

func chartCases(t *testing.T) []chartCase {
	cases := []chartCase{{name: "defaults", release: "ratelimit-proxy", namespace: "default"}}
	for _, f := range glob(t, chartDir+"/examples/*.yaml") {
		c := chartCase{name: filepath.Base(f), values: f, release: "ratelimit-proxy", namespace: "ratelimit"}
		switch c.name {
		case "sidecar.yaml":
			c.release, c.namespace = "orders", "default"
		case "istio-redis.yaml": // beside Istio's sample, whose Service it takes over
			c.release, c.namespace = "ratelimit", "default"
		}
		cases = append(cases, c)
	}
	return cases
}

func (c chartCase) vals(t *testing.T) map[string]any {
	t.Helper()
	if c.values == "" {
		return map[string]any{}
	}
	v, err := common.ReadValuesFile(filepath.Join(root(), c.values))
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// renderChart renders the chart as `helm template` does, returning its documents (NOTES.txt
// aside) in a stable order.
func renderChart(t *testing.T, c chartCase, vals map[string]any) []doc {
	t.Helper()
	ch, err := loader.Load(filepath.Join(root(), chartDir))
	if err != nil {
		t.Fatal(err)
	}
	rv, err := chartutil.ToRenderValues(ch, vals, common.ReleaseOptions{Name: c.release, Namespace: c.namespace, IsInstall: true}, nil)
	if err != nil {
		t.Fatalf("%s: %v", c.name, err)
	}
	out, err := engine.Render(ch, rv)
	if err != nil {
		t.Fatalf("%s: %v", c.name, err)
	}
	names := make([]string, 0, len(out))
	for n := range out {
		names = append(names, n)
	}
	sort.Strings(names)
	var docs []doc
	for _, n := range names {
		if strings.HasSuffix(n, "NOTES.txt") || strings.TrimSpace(out[n]) == "" {
			continue
		}
		dec := yaml.NewDecoder(strings.NewReader(out[n]))
		for i := 0; ; i++ {
			var obj map[string]any
			err := dec.Decode(&obj)
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				t.Fatalf("%s: %s: document %d: %v\n%s", c.name, n, i, err, out[n])
			}
			if obj == nil {
				continue
			}
			docs = append(docs, doc{file: c.name + ":" + strings.TrimPrefix(n, "ratelimit-proxy/"), index: i, obj: obj, json: toJSON(t, obj)})
		}
	}
	return docs
}

// TestChartShape renders the chart with its defaults and with every example of examples/,
// decodes every object strictly into its Kubernetes (or Prometheus Operator) type, and holds
// each rendering to the rules the plain manifests keep (numeric non-root user, references
// that exist, no subPath, no admin port on a Service, a NetworkPolicy for every port), plus the
// chart's: a restricted security context, the image tag from appVersion, selectors of the PDB,
// HPA, spread and ServiceMonitor that find the pods, and a configuration that the gateway's
// own loader accepts.
func TestChartShape(t *testing.T) {
	imageUser := dockerfileUser(t)
	meta := chartMeta(t)
	for _, c := range chartCases(t) {
		t.Run(c.name, func(t *testing.T) {
			vals := c.vals(t)
			docs := renderChart(t, c, vals)
			o := decodeDocs(t, docs)
			// Secrets are the user's, by reference: those the values name exist.
			for _, name := range []any{dig(vals, "store", "redis", "passwordSecret", "name"), dig(vals, "tls", "secretName")} {
				if name, _ := name.(string); name != "" {
					o.secrets[nsName(c.namespace, name)] = true
				}
			}
			// So is a ConfigMap of rule files the values name, kept in deploy/envoy.
			if name := str(dig(vals, "rls", "rulesConfigMap")); name != "" {
				cm := userConfigMap(t, name)
				if cm.Namespace != c.namespace {
					t.Errorf("ConfigMap %s in namespace %q, the release in %q", name, cm.Namespace, c.namespace)
				}
				o.configMaps[nsName(cm.Namespace, cm.Name)] = cm
			}
			for _, d := range docs {
				if ns := str(dig(d.obj, "metadata", "namespace")); ns != c.namespace && !(d.kind() == "ConfigMap" && strings.HasSuffix(str(dig(d.obj, "metadata", "name")), "-dashboard")) {
					t.Errorf("%s: namespace %q, want the release's %q", d, ns, c.namespace)
				}
			}
			sidecar := str(vals["mode"]) == "sidecar"
			var dep *appsv1.Deployment
			if sidecar {
				if len(o.deployments) != 0 {
					t.Fatalf("sidecar mode renders %d Deployments", len(o.deployments))
				}
				dep = patchedWorkload(t, o, vals)
			} else {
				if len(o.deployments) != 1 {
					t.Fatalf("%d Deployments, want 1", len(o.deployments))
				}
				dep = o.deployments[0]
			}
			for _, err := range checkDeployment(t, dep, o, imageUser) {
				t.Errorf("Deployment %s: %v", dep.Name, err)
			}
			pod := dep.Spec.Template.Spec
			gw := gatewayContainer(t, pod)
			if want := "ratelimit-proxy:" + meta.AppVersion; c.values == "" && gw.Image != want {
				t.Errorf("image %s, want %s (the repository and the chart's appVersion)", gw.Image, want)
			}
			checkRestricted(t, pod, gw, sidecar)
			checkConfig(t, o, gw, vals)
			checkSelectors(t, dep, o)
			checkMonitoring(t, o, vals)
			if !sidecar {
				checkSpread(t, dep, o)
			}
		})
	}
}

// chartMeta is Chart.yaml.
func chartMeta(t *testing.T) struct{ Version, AppVersion string } {
	t.Helper()
	var m struct {
		Version    string `yaml:"version"`
		AppVersion string `yaml:"appVersion"`
	}
	data, err := os.ReadFile(filepath.Join(root(), chartDir, "Chart.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(data, &m); err != nil {
		t.Fatal(err)
	}
	return struct{ Version, AppVersion string }{m.Version, m.AppVersion}
}

func gatewayContainer(t *testing.T, pod corev1.PodSpec) corev1.Container {
	t.Helper()
	for _, c := range pod.Containers {
		if isGatewayImage(c.Image) {
			return c
		}
	}
	t.Fatal("no container runs the gateway's image")
	return corev1.Container{}
}

// sidecarApp is the workload a sidecar patch is applied to in the test: an application alone,
// its pods labelled as sidecar.podSelector says.
func sidecarApp(t *testing.T, vals map[string]any) []byte {
	t.Helper()
	podLabels := dig(vals, "sidecar", "podSelector")
	return toJSON(t, map[string]any{"apiVersion": "apps/v1", "kind": "Deployment", "metadata": map[string]any{"name": "app"},
		"spec": map[string]any{"selector": map[string]any{"matchLabels": podLabels}, "template": map[string]any{
			"metadata": map[string]any{"labels": podLabels},
			"spec":     map[string]any{"terminationGracePeriodSeconds": 45, "containers": []any{map[string]any{"name": "app", "image": "example/app:1.4"}}},
		}}})
}

// patchedWorkload applies the sidecar patch (the ConfigMap NAME-sidecar's patch.yaml) to an
// application's Deployment as `kubectl patch` does (a strategic merge).
func patchedWorkload(t *testing.T, o objects, vals map[string]any) *appsv1.Deployment {
	t.Helper()
	return applySidecarPatch(t, o, str(dig(vals, "fullnameOverride")), sidecarApp(t, vals))
}

func applySidecarPatch(t *testing.T, o objects, name string, workload []byte) *appsv1.Deployment {
	t.Helper()
	var cm *corev1.ConfigMap
	for _, m := range o.configMaps {
		if m.Name == name+"-sidecar" {
			cm = m
		}
	}
	if cm == nil {
		t.Fatalf("no ConfigMap %s-sidecar with the patch", name)
	}
	var patch any
	if err := yaml.Unmarshal([]byte(cm.Data["patch.yaml"]), &patch); err != nil {
		t.Fatalf("patch.yaml: %v", err)
	}
	out, err := strategicpatch.StrategicMergePatch(workload, toJSON(t, patch), appsv1.Deployment{})
	if err != nil {
		t.Fatalf("kubectl patch: %v", err)
	}
	var dep appsv1.Deployment
	dec := json.NewDecoder(bytes.NewReader(out))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&dep); err != nil {
		t.Fatalf("the patched Deployment: %v", err)
	}
	dep.Namespace = "default"
	for _, cm := range o.configMaps {
		dep.Namespace = cm.Namespace
		break
	}
	return &dep
}

// checkRestricted: the Pod Security Standard "restricted" for the gateway's container.
func checkRestricted(t *testing.T, pod corev1.PodSpec, c corev1.Container, sidecar bool) {
	t.Helper()
	sc := c.SecurityContext
	if sc == nil {
		t.Fatal("the gateway's container has no securityContext")
	}
	nonRoot, user := effectiveUser(pod.SecurityContext, sc)
	if !nonRoot || user == nil || *user == 0 {
		t.Errorf("not a numeric non-root user: runAsNonRoot %v, runAsUser %v", nonRoot, user)
	}
	if !ptrTrue(sc.ReadOnlyRootFilesystem) {
		t.Error("the root filesystem is writable")
	}
	if sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
		t.Error("allowPrivilegeEscalation is not false")
	}
	if sc.Capabilities == nil || !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) || len(sc.Capabilities.Add) != 0 {
		t.Errorf("capabilities %+v, want all dropped and none added", sc.Capabilities)
	}
	seccomp := sc.SeccompProfile
	if seccomp == nil && pod.SecurityContext != nil {
		seccomp = pod.SecurityContext.SeccompProfile
	}
	if seccomp == nil || seccomp.Type != corev1.SeccompProfileTypeRuntimeDefault {
		t.Errorf("seccomp profile %+v, want RuntimeDefault", seccomp)
	}
	if sidecar && sc.SeccompProfile == nil {
		t.Error("a sidecar's seccomp profile must be its own: the workload's pod sets its own securityContext")
	}
}

// userConfigMap is the ConfigMap of deploy/envoy named name (strictly decoded): the rule files
// an example mounts with rls.rulesConfigMap, kept by the user beside the chart.
func userConfigMap(t *testing.T, name string) *corev1.ConfigMap {
	t.Helper()
	for _, d := range readDocs(t, glob(t, "deploy/envoy/*.yaml")...) {
		if d.apiVersion() != "v1" || d.kind() != "ConfigMap" {
			continue
		}
		var cm corev1.ConfigMap
		dec := json.NewDecoder(bytes.NewReader(d.json))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&cm); err != nil {
			t.Fatalf("%s: %v", d, err)
		}
		if cm.Name == name {
			return &cm
		}
	}
	t.Fatalf("rls.rulesConfigMap %s: no such ConfigMap in deploy/envoy", name)
	return nil
}

// checkConfig: the ConfigMap's configuration parses and validates with the gateway's own
// loader (with the files the pod's volumes hold), its ports are the container's, and no secret
// value is in it.
func checkConfig(t *testing.T, o objects, gw corev1.Container, vals map[string]any) {
	t.Helper()
	var cfgMap *corev1.ConfigMap
	rulesMap := str(dig(vals, "rls", "rulesConfigMap"))
	for _, m := range o.configMaps {
		if _, ok := m.Data["config.yaml"]; ok && m.Name != rulesMap {
			cfgMap = m
		}
	}
	if cfgMap == nil {
		t.Fatal("no ConfigMap with config.yaml")
	}
	text := cfgMap.Data["config.yaml"]
	dir := t.TempDir()
	// The files the config names, where the test puts them.
	replacer := []string{}
	for _, m := range o.configMaps {
		if !strings.HasSuffix(m.Name, "-rules") && m.Name != rulesMap {
			continue
		}
		rules := filepath.Join(dir, "rules")
		if err := os.MkdirAll(rules, 0o755); err != nil {
			t.Fatal(err)
		}
		for k, v := range m.Data {
			if err := os.WriteFile(filepath.Join(rules, k), []byte(v), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		replacer = append(replacer, "/etc/ratelimit-proxy/rules", rules)
	}
	if strings.Contains(text, "/etc/ratelimit-proxy/tls/") {
		writeTestCert(t, filepath.Join(dir, "tls"))
		replacer = append(replacer, "/etc/ratelimit-proxy/tls", filepath.Join(dir, "tls"))
	}
	if len(replacer) > 0 {
		text = strings.NewReplacer(replacer...).Replace(text)
	}
	env := map[string]string{}
	for _, e := range gw.Env {
		if e.ValueFrom != nil {
			env[e.Name] = "from-a-secret" // a Secret's value, by reference
		} else {
			env[e.Name] = e.Value
		}
	}
	getenv := func(k string) string { return env[k] }
	cfg, err := policy.Parse([]byte(text), policy.LoadOptions{Getenv: getenv})
	if err == nil {
		err = cfg.Validate(getenv)
	}
	if err != nil {
		t.Fatalf("the rendered configuration does not load:\n%v\n%s", err, text)
	}
	ports := map[string]int32{}
	for _, p := range gw.Ports {
		ports[p.Name] = p.ContainerPort
	}
	listen := cfg.Listen
	if cfg.Upstream == "" {
		listen = "" // RLS alone: no proxy
	}
	for _, f := range []struct{ name, addr string }{{"http", listen}, {"metrics", cfg.AdminListen}, {"grpc-rls", rlsListen(cfg)}} {
		_, port, _ := strings.Cut(f.addr, ":")
		if (port == "") != (ports[f.name] == 0) || (port != "" && port != itoa(ports[f.name])) {
			t.Errorf("config listens on %q; the container's port %s is %d", f.addr, f.name, ports[f.name])
		}
	}
	if want := str(dig(vals, "telemetry", "otlp", "endpoint")); cfg.Telemetry.OTLP.Endpoint != want {
		t.Errorf("telemetry.otlp.endpoint %q in the values, %q in the configuration", want, cfg.Telemetry.OTLP.Endpoint)
	}
	if secret := str(dig(vals, "store", "redis", "passwordSecret", "name")); secret != "" {
		name := str(dig(vals, "store", "redis", "password_env"))
		found := false
		for _, e := range gw.Env {
			if e.Name == name && e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil && e.ValueFrom.SecretKeyRef.Name == secret {
				found = true
			}
		}
		if !found {
			t.Errorf("store.redis.passwordSecret %s: no variable %s from it in the container (%+v)", secret, name, gw.Env)
		}
		if strings.Contains(text, "passwordSecret") {
			t.Error("the chart's own key passwordSecret is in the configuration")
		}
	}
}

func rlsListen(cfg *policy.Config) string {
	if cfg.RLS == nil {
		return ""
	}
	return cfg.RLS.Listen
}

func itoa(n int32) string { return big.NewInt(int64(n)).String() }

// checkSelectors: the PDB, the HPA and the Services find the gateway's pods.
func checkSelectors(t *testing.T, dep *appsv1.Deployment, o objects) {
	t.Helper()
	podLabels := labels.Set(dep.Spec.Template.Labels)
	for _, pdb := range o.pdbs {
		sel, err := metav1.LabelSelectorAsSelector(pdb.Spec.Selector)
		if err != nil || !sel.Matches(podLabels) {
			t.Errorf("PodDisruptionBudget %s selects %v, not the pods %v", pdb.Name, pdb.Spec.Selector, podLabels)
		}
	}
	for _, hpa := range o.hpas {
		ref := hpa.Spec.ScaleTargetRef
		if ref.Kind != "Deployment" || ref.Name != dep.Name || ref.APIVersion != "apps/v1" {
			t.Errorf("HorizontalPodAutoscaler %s scales %+v, not Deployment %s", hpa.Name, ref, dep.Name)
		}
		if dep.Spec.Replicas != nil {
			t.Errorf("with an HPA the Deployment sets replicas (%d): each upgrade resets the HPA's count", *dep.Spec.Replicas)
		}
	}
	for _, svc := range o.services {
		if !labels.SelectorFromSet(svc.Spec.Selector).Matches(podLabels) {
			t.Errorf("Service %s selects %v, not the pods %v", svc.Name, svc.Spec.Selector, podLabels)
		}
	}
}

// checkSpread: the replicas spread over zones, and the constraint selects them.
func checkSpread(t *testing.T, dep *appsv1.Deployment, o objects) {
	t.Helper()
	found := false
	for _, c := range dep.Spec.Template.Spec.TopologySpreadConstraints {
		if c.TopologyKey != "topology.kubernetes.io/zone" {
			continue
		}
		found = true
		sel, err := metav1.LabelSelectorAsSelector(c.LabelSelector)
		if err != nil || !sel.Matches(labels.Set(dep.Spec.Template.Labels)) {
			t.Errorf("topology spread selects %v, not the pods", c.LabelSelector)
		}
	}
	if !found {
		t.Error("no topology spread by zone")
	}
	if len(o.pdbs) != 1 {
		t.Errorf("%d PodDisruptionBudgets, want 1", len(o.pdbs))
	}
}

// checkMonitoring: a ServiceMonitor reaches the metrics port through a headless Service; the
// alerts name metrics the gateway exports; the dashboard is deploy/grafana's.
func checkMonitoring(t *testing.T, o objects, vals map[string]any) {
	t.Helper()
	if want := dig(vals, "metrics", "serviceMonitor", "enabled") == true; want != (len(o.serviceMonitors) == 1) {
		t.Errorf("serviceMonitor.enabled %v, %d ServiceMonitors", want, len(o.serviceMonitors))
	}
	for _, sm := range o.serviceMonitors {
		sel, err := metav1.LabelSelectorAsSelector(&sm.Spec.Selector)
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, svc := range o.services {
			if !sel.Matches(labels.Set(svc.Labels)) {
				continue
			}
			n++
			if svc.Spec.ClusterIP != corev1.ClusterIPNone {
				t.Errorf("ServiceMonitor %s scrapes Service %s, which has a cluster IP", sm.Name, svc.Name)
			}
			for _, ep := range sm.Spec.Endpoints {
				if !slices.ContainsFunc(svc.Spec.Ports, func(p corev1.ServicePort) bool { return p.Name == ep.Port }) {
					t.Errorf("ServiceMonitor %s: Service %s has no port %s", sm.Name, svc.Name, ep.Port)
				}
			}
		}
		if n != 1 {
			t.Errorf("ServiceMonitor %s selects %d Services, want the metrics one", sm.Name, n)
		}
	}
	if want := dig(vals, "metrics", "prometheusRule", "enabled") == true; want != (len(o.rules) == 1) {
		t.Errorf("prometheusRule.enabled %v, %d PrometheusRules", want, len(o.rules))
	}
	metricsDoc, err := os.ReadFile(filepath.Join(root(), "docs", "operations.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, pr := range o.rules {
		var alerts []string
		for _, g := range pr.Spec.Groups {
			for _, r := range g.Rules {
				alerts = append(alerts, r.Alert)
				for _, m := range metricName.FindAllString(r.Expr.String(), -1) {
					if !bytes.Contains(metricsDoc, []byte("`"+m+"`")) {
						t.Errorf("alert %s: %s is no metric of docs/operations.md", r.Alert, m)
					}
				}
			}
		}
		for _, want := range []string{"RateLimitStoreErrors", "RateLimitFailOpen", "RateLimitReloadFailed", "RateLimitShedding", "RateLimitLimitedShareJump"} {
			if !slices.Contains(alerts, want) {
				t.Errorf("PrometheusRule %s: no alert %s", pr.Name, want)
			}
		}
	}
	want, err := os.ReadFile(filepath.Join(root(), "deploy", "grafana", "ratelimit-proxy.json"))
	if err != nil {
		t.Fatal(err)
	}
	for _, cm := range o.configMaps {
		if got, ok := cm.Data["ratelimit-proxy.json"]; ok && strings.TrimSpace(got) != strings.TrimSpace(string(want)) {
			t.Errorf("ConfigMap %s: the dashboard differs from deploy/grafana/ratelimit-proxy.json (copy it to %s/files/)", cm.Name, chartDir)
		}
	}
}

// TestChartLint is `helm lint` (the Go API) with the defaults and every example: no error
// and no warning.
func TestChartLint(t *testing.T) {
	for _, c := range chartCases(t) {
		t.Run(c.name, func(t *testing.T) {
			res := lint.RunAll(filepath.Join(root(), chartDir), c.vals(t), c.namespace)
			for _, m := range res.Messages {
				if m.Severity >= support.WarningSev {
					t.Error(m.Error())
				} else {
					t.Log(m.Error())
				}
			}
		})
	}
}

// TestChartRefusesIncompleteValues: values that would deploy something broken fail to render
// with the name of the value to set.
func TestChartRefusesIncompleteValues(t *testing.T) {
	for _, tc := range []struct {
		name string
		vals string
		want string
	}{
		{"rls without callers", "rls: {enabled: true}", "networkPolicy.rlsFrom"},
		{"sidecar without its workload", "mode: sidecar", "sidecar.podSelector"},
		{"nothing served", "proxy: {enabled: false}", "proxy.enabled or rls.enabled"},
		{"two sources of rule files", "rls: {enabled: true, rulesConfigMap: ratelimit-config, rules: {a.yaml: 'domain: a'}}\nnetworkPolicy: {rlsFrom: [{podSelector: {}}]}", "rls.rules or rls.rulesConfigMap"},
		{"password secret without its variable", "store: {backend: redis, redis: {url: 'redis://r:6379', passwordSecret: {name: redis}}}", "store.redis.password_env"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			vals, err := common.ReadValues([]byte(tc.vals))
			if err != nil {
				t.Fatal(err)
			}
			ch, err := loader.Load(filepath.Join(root(), chartDir))
			if err != nil {
				t.Fatal(err)
			}
			rv, err := chartutil.ToRenderValues(ch, vals, common.ReleaseOptions{Name: "x", Namespace: "default", IsInstall: true}, nil)
			if err != nil {
				t.Fatal(err)
			}
			_, err = engine.Render(ch, rv)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("got %v, want an error naming %s", err, tc.want)
			}
		})
	}
}

// writeTestCert writes a self-signed tls.crt and tls.key into dir.
func writeTestCert(t *testing.T, dir string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test"}, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), DNSNames: []string{"test"}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for name, b := range map[string]*pem.Block{"tls.crt": {Type: "CERTIFICATE", Bytes: der}, "tls.key": {Type: "EC PRIVATE KEY", Bytes: kder}} {
		if err := os.WriteFile(filepath.Join(dir, name), pem.EncodeToMemory(b), 0o600); err != nil {
			t.Fatal(err)
		}
	}
}

var metricName = regexp.MustCompile(`\bratelimit_[a-z_]+`)

// TestManifestsMatchChart: each set of plain manifests of deploy/kubernetes/ is what the chart
// renders with its example, so the two cannot drift: the same configuration, the Deployment
// equal to the application's with the chart's sidecar patch applied, the same NetworkPolicy,
// metrics Service and ServiceMonitor.
func TestManifestsMatchChart(t *testing.T) {
	for _, m := range []struct{ dir, example, release string }{
		{"deploy/kubernetes", "sidecar.yaml", "orders"},                // HTTP
		{"deploy/kubernetes/grpc", "grpc-sidecar.yaml", "orders-grpc"}, // gRPC over TLS
	} {
		t.Run(m.example, func(t *testing.T) {
			c := chartCase{name: m.example, values: chartDir + "/examples/" + m.example, release: m.release, namespace: ""}
			manifestsMatchChart(t, c, m.dir)
		})
	}
}

func manifestsMatchChart(t *testing.T, c chartCase, dir string) {
	t.Helper()
	vals := c.vals(t)
	chart := decodeDocs(t, renderChart(t, c, vals))
	raw := decodeExample(t, k8sExample{dir, glob(t, dir+"/*.yaml")})
	name := str(vals["fullnameOverride"])

	// The configuration, as the gateway reads it.
	parsed := func(o objects, what string) any {
		t.Helper()
		cm := o.configMaps[nsName("", name)]
		if cm == nil {
			t.Fatalf("%s: no ConfigMap %s", what, name)
		}
		var v any
		if err := yaml.Unmarshal([]byte(cm.Data["config.yaml"]), &v); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		return v
	}
	sameJSON(t, "ConfigMap "+name+" config.yaml", parsed(raw, dir), parsed(chart, "the chart"))

	// The Deployment: the application alone, patched.
	if len(raw.deployments) != 1 {
		t.Fatalf("%s: %d Deployments", dir, len(raw.deployments))
	}
	want := raw.deployments[0]
	app := want.DeepCopy()
	app.Spec.Template.Spec.Containers = slices.DeleteFunc(app.Spec.Template.Spec.Containers, func(c corev1.Container) bool { return isGatewayImage(c.Image) })
	app.Spec.Template.Spec.Volumes = slices.DeleteFunc(app.Spec.Template.Spec.Volumes, func(v corev1.Volume) bool { return strings.HasPrefix(v.Name, "ratelimit-proxy-") })
	got := applySidecarPatch(t, chart, name, toJSON(t, app))
	got.Namespace = want.Namespace
	for _, d := range []*appsv1.Deployment{want, got} { // kubectl patch puts new containers first
		spec := &d.Spec.Template.Spec
		slices.SortFunc(spec.Containers, func(a, b corev1.Container) int { return strings.Compare(a.Name, b.Name) })
		slices.SortFunc(spec.Volumes, func(a, b corev1.Volume) int { return strings.Compare(a.Name, b.Name) })
	}
	sameJSON(t, "Deployment "+want.Name, want, got)

	pick := func(o objects, what string) (np, svc, sm any) {
		t.Helper()
		for _, n := range o.netpols {
			if n.Name == name {
				np = n.Spec
			}
		}
		for _, s := range o.services {
			if s.Name == name+"-metrics" {
				svc = []any{s.Labels["app.kubernetes.io/component"], s.Spec}
			}
		}
		for _, m := range o.serviceMonitors {
			if m.Name == name {
				sm = m.Spec
			}
		}
		if np == nil || svc == nil || sm == nil {
			t.Fatalf("%s: a NetworkPolicy %s (%v), a Service %s-metrics (%v) and a ServiceMonitor %s (%v) expected", what, name, np != nil, name, svc != nil, name, sm != nil)
		}
		return np, svc, sm
	}
	rnp, rsvc, rsm := pick(raw, dir)
	cnp, csvc, csm := pick(chart, "the chart")
	sameJSON(t, "NetworkPolicy "+name, rnp, cnp)
	sameJSON(t, "Service "+name+"-metrics", rsvc, csvc)
	sameJSON(t, "ServiceMonitor "+name, rsm, csm)
}

// sameJSON fails when want and got differ as JSON, showing both.
func sameJSON(t *testing.T, what string, want, got any) {
	t.Helper()
	w, g := toJSON(t, want), toJSON(t, got)
	if !bytes.Equal(w, g) {
		t.Errorf("%s: the manifests and the chart differ:\n manifests: %s\n chart:     %s", what, w, g)
	}
}

// TestDeployDocShowsNotes: the notes docs/deploy.md shows after a `helm install` (a block after
// `<!-- notes: EXAMPLE RELEASE NAMESPACE -->`) are what the chart prints for them, and the page
// links every example of examples/.
func TestDeployDocShowsNotes(t *testing.T) {
	const page = "docs/deploy.md"
	data, err := os.ReadFile(filepath.Join(root(), page))
	if err != nil {
		t.Fatal(err)
	}
	text := string(data)
	for _, f := range glob(t, chartDir+"/examples/*.yaml") {
		if !strings.Contains(text, "(../"+f+")") {
			t.Errorf("%s links no %s: every example is documented", page, f)
		}
	}
	m := regexp.MustCompile("(?s)<!-- notes: (\\S+) (\\S+) (\\S+) -->\n```\n(.*?)```").FindAllStringSubmatch(text, -1)
	if len(m) == 0 {
		t.Fatalf("%s shows no notes", page)
	}
	for _, n := range m {
		c := chartCase{name: n[1], values: chartDir + "/examples/" + n[1], release: n[2], namespace: n[3]}
		ch, err := loader.Load(filepath.Join(root(), chartDir))
		if err != nil {
			t.Fatal(err)
		}
		rv, err := chartutil.ToRenderValues(ch, c.vals(t), common.ReleaseOptions{Name: c.release, Namespace: c.namespace, IsInstall: true}, nil)
		if err != nil {
			t.Fatal(err)
		}
		out, err := engine.Render(ch, rv)
		if err != nil {
			t.Fatal(err)
		}
		if got := strings.TrimSpace(out["ratelimit-proxy/templates/NOTES.txt"]); got != strings.TrimSpace(n[4]) {
			t.Errorf("%s: the notes of %s differ; the chart prints:\n%s", page, n[1], got)
		}
	}
}

// TestIstioRedisTakesTheSamplesPlace: examples/istio-redis.yaml renders the Service the
// EnvoyFilter of Istio's rate limit sample calls (ratelimit in default, gRPC on 8081, the
// cluster outbound|8081||ratelimit.default.svc.cluster.local) in front of the gateway's pods,
// and mounts the sample's ConfigMap ratelimit-config, so that filter and those rules stay as they are.
func TestIstioRedisTakesTheSamplesPlace(t *testing.T) {
	c := chartCase{name: "istio-redis.yaml", values: chartDir + "/examples/istio-redis.yaml", release: "ratelimit", namespace: "default"}
	o := decodeDocs(t, renderChart(t, c, c.vals(t)))
	if len(o.deployments) != 1 {
		t.Fatalf("%d Deployments, want 1", len(o.deployments))
	}
	pods := o.deployments[0].Spec.Template.Labels
	found := false
	for _, svc := range o.services {
		if svc.Name != "ratelimit" || svc.Namespace != "default" || svc.Spec.ClusterIP == corev1.ClusterIPNone {
			continue
		}
		for k, v := range svc.Spec.Selector {
			if pods[k] != v {
				t.Errorf("Service ratelimit selects %s=%s, the pods carry %q", k, v, pods[k])
			}
		}
		for _, p := range svc.Spec.Ports {
			if p.Port == 8081 && strings.HasPrefix(p.Name, "grpc") {
				found = true
			}
		}
	}
	if !found {
		t.Error("no Service ratelimit.default with a gRPC port 8081: the sample's EnvoyFilter would call nothing")
	}
	mounted := false
	for _, v := range o.deployments[0].Spec.Template.Spec.Volumes {
		if v.ConfigMap != nil && v.ConfigMap.Name == "ratelimit-config" {
			mounted = true
		}
	}
	if !mounted {
		t.Error("the sample's ConfigMap ratelimit-config is not mounted")
	}
}

// TestDeployDocCommandsRender: every helm command of docs/deploy.md's sh blocks renders as
// written (the chart's path, its -f files, its release and namespace, as `helm install
// --dry-run=client` would), and each kubectl command that names an object of the chart
// (port-forward service/NAME, rollout status deployment/NAME, get configmap NAME) names one the
// helm command before it renders. No cluster runs here: this is what keeps the page's commands
// true up to the cluster.
func TestDeployDocCommandsRender(t *testing.T) {
	const page = "docs/deploy.md"
	data, err := os.ReadFile(filepath.Join(root(), page))
	if err != nil {
		t.Fatal(err)
	}
	errs, helms, refs := checkDeployDocCommands(t, string(data))
	for _, err := range errs {
		t.Errorf("%s: %v", page, err)
	}
	if helms < 4 || refs < 3 {
		t.Errorf("%s: %d helm commands and %d kubectl references to the chart's objects found in its sh blocks; the page shows more", page, helms, refs)
	}
}

// shLines returns the lines of the page's sh blocks.
func shLines(text string) []string {
	var lines []string
	in := false
	for l := range strings.SplitSeq(text, "\n") {
		switch {
		case strings.HasPrefix(l, "```"):
			in = !in && strings.TrimPrefix(l, "```") == "sh"
		case in:
			lines = append(lines, strings.TrimSpace(l))
		}
	}
	return lines
}

// checkDeployDocCommands checks the helm and kubectl commands of a page's sh blocks, returning
// the problems, how many helm commands it rendered and how many kubectl references it checked.
func checkDeployDocCommands(t *testing.T, text string) (errs []error, helms, refs int) {
	t.Helper()
	var names map[string]bool // "Kind/name" of the last helm command's objects
	for _, l := range shLines(text) {
		words := strings.Fields(strings.TrimSuffix(l, "&"))
		if len(words) < 2 {
			continue
		}
		switch words[0] {
		case "helm":
			helms++
			n, err := renderHelmCommand(t, words)
			if err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", l, err))
				continue
			}
			names = n
		case "kubectl":
			for _, ref := range kubectlRefs(words) {
				if names == nil {
					continue // objects of kubectl's own (kubectl create deployment web)
				}
				refs++
				if !names[ref] {
					errs = append(errs, fmt.Errorf("%s: the helm command before it renders no %s", l, ref))
				}
			}
		}
	}
	return errs, helms, refs
}

// kubectlRefs are the chart's objects a kubectl command names, as Kind/name.
func kubectlRefs(words []string) []string {
	var refs []string
	for i, w := range words {
		w = strings.Trim(w, `"'$(`)
		switch {
		case strings.HasPrefix(w, "service/"):
			refs = append(refs, "Service/"+strings.TrimPrefix(w, "service/"))
		case strings.HasPrefix(w, "deployment/"):
			refs = append(refs, "Deployment/"+strings.TrimPrefix(w, "deployment/"))
		case w == "configmap" && i > 0 && strings.Trim(words[i-1], `"'$(`) == "get" && i+1 < len(words):
			refs = append(refs, "ConfigMap/"+words[i+1])
		}
	}
	return refs
}

// renderHelmCommand renders `helm install|upgrade|template RELEASE CHART [-f FILE]... [-n NS]
// [--create-namespace]` or `helm lint CHART [-f FILE]...` with the Go packages helm is built
// from, returning the Kind/name of every object.
func renderHelmCommand(t *testing.T, words []string) (map[string]bool, error) {
	t.Helper()
	verb, args := words[1], words[2:]
	c := chartCase{name: strings.Join(words, " "), release: "", namespace: "default"}
	switch verb {
	case "install", "upgrade", "template":
		if len(args) == 0 || strings.HasPrefix(args[0], "-") {
			return nil, errors.New("no release name")
		}
		c.release, args = args[0], args[1:]
	case "lint":
		c.release = "lint"
	default:
		return nil, fmt.Errorf("helm %s: not a command this test knows", verb)
	}
	if len(args) == 0 || args[0] != chartDir {
		return nil, fmt.Errorf("the chart is %s, not %v", chartDir, args)
	}
	var files []string
	for i := 1; i < len(args); i++ {
		switch args[i] {
		case "-f", "--values", "-n", "--namespace":
			if i+1 == len(args) {
				return nil, fmt.Errorf("%s without its value", args[i])
			}
			if args[i] == "-n" || args[i] == "--namespace" {
				c.namespace = args[i+1]
			} else {
				files = append(files, args[i+1])
			}
			i++
		case "--create-namespace":
		default:
			return nil, fmt.Errorf("flag %s: not one this test knows", args[i])
		}
	}
	vals := map[string]any{}
	for _, f := range files {
		v, err := common.ReadValuesFile(filepath.Join(root(), f))
		if err != nil {
			return nil, err
		}
		vals = chartutil.CoalesceTables(v, vals) // a later -f wins
	}
	ch, err := loader.Load(filepath.Join(root(), chartDir))
	if err != nil {
		return nil, err
	}
	rv, err := chartutil.ToRenderValues(ch, vals, common.ReleaseOptions{Name: c.release, Namespace: c.namespace, IsInstall: verb != "upgrade", IsUpgrade: verb == "upgrade"}, nil)
	if err != nil {
		return nil, err
	}
	out, err := engine.Render(ch, rv)
	if err != nil {
		return nil, err
	}
	names := map[string]bool{}
	for n, text := range out {
		if strings.HasSuffix(n, "NOTES.txt") {
			continue
		}
		dec := yaml.NewDecoder(strings.NewReader(text))
		for {
			var obj map[string]any
			if err := dec.Decode(&obj); errors.Is(err, io.EOF) {
				break
			} else if err != nil {
				return nil, fmt.Errorf("%s: %w", n, err)
			}
			if obj != nil {
				names[str(obj["kind"])+"/"+str(dig(obj, "metadata", "name"))] = true
			}
		}
	}
	return names, nil
}

// TestRLSManifestMatchesChart: deploy/envoy/ratelimit-proxy.yaml (the rate limit service as
// plain manifests, beside Envoy's, Istio's, Envoy Gateway's and Contour's files) is what the
// chart renders with examples/rls.yaml where the two can drift: the configuration as the
// gateway reads it, the rule files, the container's image, arguments, ports and mounts, the
// grace period, the ServiceAccount's annotations and the NetworkPolicy's rules. (Names, labels
// and probes are each file's own: the plain file keeps the Envoy callers' selectors.)
func TestRLSManifestMatchesChart(t *testing.T) {
	const file = "deploy/envoy/ratelimit-proxy.yaml"
	c := chartCase{name: "rls.yaml", values: chartDir + "/examples/rls.yaml", release: "ratelimit-proxy", namespace: "ratelimit"}
	chartDocs, rawDocs := renderChart(t, c, c.vals(t)), readDocs(t, file)
	chart, raw := decodeDocs(t, chartDocs), decodeDocs(t, rawDocs)
	if len(raw.deployments) != 1 || len(chart.deployments) != 1 {
		t.Fatalf("%d and %d Deployments, want 1 each", len(raw.deployments), len(chart.deployments))
	}
	rawPod, chartPod := raw.deployments[0].Spec.Template.Spec, chart.deployments[0].Spec.Template.Spec
	rawGW, chartGW := gatewayContainer(t, rawPod), gatewayContainer(t, chartPod)

	// The configuration and the rule files of the ConfigMaps the pod mounts, by mount path.
	mounted := func(o objects, pod corev1.PodSpec, gw corev1.Container) map[string]map[string]any {
		t.Helper()
		out := map[string]map[string]any{}
		for _, m := range gw.VolumeMounts {
			for _, v := range pod.Volumes {
				if v.Name != m.Name || v.ConfigMap == nil {
					continue
				}
				cm := o.configMaps[nsName(c.namespace, v.ConfigMap.Name)]
				if cm == nil {
					t.Fatalf("no ConfigMap %s", v.ConfigMap.Name)
				}
				files := map[string]any{}
				for k, text := range cm.Data {
					if k == "config.yaml" {
						cfg, err := policy.Parse([]byte(text), policy.LoadOptions{Getenv: func(string) string { return "" }})
						if err != nil {
							t.Fatalf("%s: %v", cm.Name, err)
						}
						files[k] = cfg
						continue
					}
					var v any
					if err := yaml.Unmarshal([]byte(text), &v); err != nil {
						t.Fatalf("%s %s: %v", cm.Name, k, err)
					}
					files[k] = v
				}
				out[m.MountPath] = files
			}
		}
		return out
	}
	sameJSON(t, "the mounted configuration and rule files", mounted(raw, rawPod, rawGW), mounted(chart, chartPod, chartGW))

	type container struct {
		Image, Args, Ports, Mounts, Grace, Resources any
	}
	pick := func(pod corev1.PodSpec, gw corev1.Container) container {
		paths := []string{}
		for _, m := range gw.VolumeMounts {
			paths = append(paths, m.MountPath)
		}
		sort.Strings(paths)
		return container{gw.Image, gw.Args, gw.Ports, paths, pod.TerminationGracePeriodSeconds, gw.Resources}
	}
	rawPorts := pick(rawPod, rawGW)
	for i := range rawGW.Ports { // the chart states the protocol, which is TCP by default
		if rawGW.Ports[i].Protocol == "" {
			rawGW.Ports[i].Protocol = corev1.ProtocolTCP
		}
	}
	rawPorts.Ports = rawGW.Ports
	sameJSON(t, "the gateway's container", rawPorts, pick(chartPod, chartGW))

	annotations := func(docs []doc, pod corev1.PodSpec) any {
		t.Helper()
		for _, d := range docs {
			if d.kind() == "ServiceAccount" && str(dig(d.obj, "metadata", "name")) == pod.ServiceAccountName {
				return dig(d.obj, "metadata", "annotations")
			}
		}
		t.Fatalf("no ServiceAccount %s", pod.ServiceAccountName)
		return nil
	}
	sameJSON(t, "the ServiceAccount's annotations", annotations(rawDocs, rawPod), annotations(chartDocs, chartPod))

	if len(raw.netpols) != 1 || len(chart.netpols) != 1 {
		t.Fatalf("%d and %d NetworkPolicies, want 1 each", len(raw.netpols), len(chart.netpols))
	}
	sameJSON(t, "the NetworkPolicy's rules", raw.netpols[0].Spec.Ingress, chart.netpols[0].Spec.Ingress)
}
