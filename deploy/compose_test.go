package deploy_test

import (
	"net"
	"net/url"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/compose-spec/compose-go/v2/cli"
	"github.com/compose-spec/compose-go/v2/types"
	"github.com/moby/buildkit/frontend/dockerfile/instructions"
	"go.yaml.in/yaml/v3"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/policy"
)

// loadCompose is `docker compose -f FILE... config`: the files loaded, merged in order,
// validated against the compose specification, interpolated and normalised by the compose-spec
// library, with no profile enabled.
func loadCompose(t *testing.T, files ...string) *types.Project {
	t.Helper()
	dir, err := filepath.Abs(filepath.Dir(files[0]))
	if err != nil {
		t.Fatal(err)
	}
	opts, err := cli.NewProjectOptions(files, cli.WithWorkingDirectory(dir), cli.WithDiscardEnvFile)
	if err != nil {
		t.Fatal(err)
	}
	p, err := opts.LoadProject(t.Context())
	if err != nil {
		t.Fatalf("docker compose config: %v", err)
	}
	return p
}

// composeSessions are the documented ways to run the compose session: the files given to
// `docker compose -f`, the store backend the gateway then runs and the service it uses.
var composeSessions = []struct {
	files            []string
	backend, service string
}{
	{[]string{"docker-compose.yaml"}, "dynamodb", "dynamodb"},
	{[]string{"docker-compose.yaml", "docker-compose.redis.yaml"}, "redis", "redis"},
}

// TestComposeConfig: docker-compose.yaml, alone and with docker-compose.redis.yaml, is a valid
// compose project whose pieces fit: every bind-mounted file exists, the gateway runs the chart's
// image and a configuration the gateway's loader accepts with the service's environment,
// publishes the ports that configuration listens on (the admin port on loopback only), reaches
// the upstream and its store (DynamoDB Local, or Redis) by their service names, and no store
// service runs that the gateway does not use; Prometheus scrapes the admin port by a name the
// admin listener answers; Grafana provisions deploy/grafana's dashboard.
func TestComposeConfig(t *testing.T) {
	var first *policy.Config
	for _, sess := range composeSessions {
		t.Run(strings.Join(sess.files, "+"), func(t *testing.T) {
			cfg := composeSession(t, sess.files, sess.backend, sess.service)
			// Every session runs the same demo: only the store differs.
			if first == nil {
				first = cfg
			} else if !reflect.DeepEqual(cfg.Policies, first.Policies) || !reflect.DeepEqual(cfg.Identity, first.Identity) {
				t.Errorf("the policies or identity differ from %s's", composeSessions[0].files[0])
			}
		})
	}
}

// composeSession checks one session and returns its gateway's configuration.
func composeSession(t *testing.T, files []string, backend, storeService string) *policy.Config {
	absRoot, err := filepath.Abs(root())
	if err != nil {
		t.Fatal(err)
	}
	var paths []string
	for _, f := range files {
		paths = append(paths, filepath.Join(absRoot, f))
	}
	p := loadCompose(t, paths...)
	stages := map[string]bool{}
	for _, s := range parseDockerfile(t, filepath.Join(absRoot, "Dockerfile")).stages {
		stages[s.Name] = true
	}
	for _, want := range []string{"gateway", "upstream", storeService, "prometheus", "grafana"} {
		if _, ok := p.Services[want]; !ok {
			t.Errorf("no service %s", want)
		}
	}
	for _, other := range []string{"dynamodb", "redis"} {
		if _, ok := p.Services[other]; ok && other != storeService {
			t.Errorf("service %s runs, but the gateway's store is %s", other, storeService)
		}
	}
	for name, s := range p.Services {
		for _, v := range s.Volumes {
			if v.Type != types.VolumeTypeBind {
				continue
			}
			if _, err := os.Stat(v.Source); err != nil {
				t.Errorf("service %s mounts %s: %v", name, v.Source, err)
			}
			if !v.ReadOnly {
				t.Errorf("service %s mounts %s writable", name, v.Source)
			}
		}
		if b := s.Build; b != nil {
			if b.Context != absRoot {
				t.Errorf("service %s builds in %s, not the repository", name, b.Context)
			}
			if b.Target != "" && !stages[b.Target] {
				t.Errorf("service %s builds target %s: no such Dockerfile stage", name, b.Target)
			}
		}
	}

	gw := p.Services["gateway"]
	if want := "ratelimit-proxy:" + chartMeta(t).AppVersion; gw.Image != want {
		t.Errorf("gateway image %s, want the chart's %s", gw.Image, want)
	}
	cfgPath := ""
	for i, a := range gw.Command {
		if a == "--config" && i+1 < len(gw.Command) {
			cfgPath = gw.Command[i+1]
		}
	}
	var host string
	for _, v := range gw.Volumes {
		if v.Target == filepath.Dir(cfgPath) {
			host = filepath.Join(v.Source, filepath.Base(cfgPath))
		}
	}
	if host == "" {
		t.Fatalf("the gateway's --config %q is in no mounted directory", cfgPath)
	}
	text, err := os.ReadFile(host)
	if err != nil {
		t.Fatal(err)
	}
	getenv := func(k string) string {
		if v := gw.Environment[k]; v != nil {
			return *v
		}
		return ""
	}
	cfg, err := policy.Parse(text, policy.LoadOptions{Getenv: getenv})
	if err == nil {
		err = cfg.Validate(getenv)
	}
	if err != nil {
		t.Fatalf("%s: %v", host, err)
	}
	published := map[uint32]types.ServicePortConfig{}
	for _, port := range gw.Ports {
		published[port.Target] = port
	}
	for _, l := range []struct{ what, addr string }{{"listen", cfg.Listen}, {"admin_listen", cfg.AdminListen}} {
		h, port, err := net.SplitHostPort(l.addr)
		if err != nil {
			t.Fatalf("%s %q: %v", l.what, l.addr, err)
		}
		if h != "" {
			t.Errorf("%s %q: a container's loopback is unreachable from the others", l.what, l.addr)
		}
		n, _ := strconv.Atoi(port)
		pc, ok := published[uint32(n)]
		switch {
		case !ok:
			t.Errorf("%s %s: not published", l.what, l.addr)
		case pc.HostIP != "127.0.0.1":
			t.Errorf("%s %s is published on %q; keep it on the host's loopback", l.what, l.addr, pc.HostIP)
		}
	}
	_, adminPort, _ := net.SplitHostPort(cfg.AdminListen)

	up, err := url.Parse(cfg.Upstream)
	if err != nil {
		t.Fatal(err)
	}
	upstream, ok := p.Services[up.Hostname()]
	if !ok {
		t.Errorf("upstream %s: no such service", cfg.Upstream)
	} else if up.Port() == "" || !slices.ContainsFunc(entrypoint(t, absRoot, upstream), func(a string) bool { return strings.HasSuffix(a, ":"+up.Port()) }) {
		t.Errorf("upstream %s: the service %s does not listen on port %q (%v)", cfg.Upstream, up.Hostname(), up.Port(), entrypoint(t, absRoot, upstream))
	}
	if cfg.Store.Backend != backend {
		t.Errorf("the gateway's store is %q, want %q", cfg.Store.Backend, backend)
	}
	switch cfg.Store.Backend {
	case "dynamodb":
		d := cfg.Store.DynamoDB
		ep, err := url.Parse(d.Endpoint)
		if err != nil {
			t.Fatal(err)
		}
		if ep.Hostname() != storeService || ep.Port() != "8000" || !d.CreateTable {
			t.Errorf("store endpoint %s: want DynamoDB Local's service %s on 8000 with create_table (got create_table %v)", d.Endpoint, storeService, d.CreateTable)
		}
	case "redis":
		u, err := url.Parse(cfg.Store.Redis.URL)
		if err != nil {
			t.Fatal(err)
		}
		img := p.Services[u.Hostname()].Image
		if u.Hostname() != storeService || u.Port() != "6379" || !(strings.HasPrefix(img, "redis:") || strings.HasPrefix(img, "valkey/valkey:")) {
			t.Errorf("store URL %s: want the Redis service %s (image %q) on 6379", cfg.Store.Redis.URL, storeService, img)
		}
	}
	if !slices.Contains(gw.GetDependencies(), storeService) {
		t.Errorf("the gateway depends on %v, not on its store %s", gw.GetDependencies(), storeService)
	}

	// Prometheus scrapes the admin port by the service's name, which admin.hosts must list (else
	// the admin listener answers 421).
	var prom struct {
		ScrapeConfigs []struct {
			StaticConfigs []struct {
				Targets []string `yaml:"targets"`
			} `yaml:"static_configs"`
		} `yaml:"scrape_configs"`
	}
	readMounted(t, p.Services["prometheus"], "/etc/prometheus/prometheus.yml", &prom)
	var targets []string
	for _, sc := range prom.ScrapeConfigs {
		for _, st := range sc.StaticConfigs {
			targets = append(targets, st.Targets...)
		}
	}
	if want := "gateway:" + adminPort; !slices.Equal(targets, []string{want}) {
		t.Errorf("Prometheus scrapes %v, want [%s]", targets, want)
	}
	if !slices.Contains(cfg.Admin.Hosts, "gateway") {
		t.Errorf("admin.hosts %v: the admin listener answers 421 to Prometheus' Host gateway", cfg.Admin.Hosts)
	}

	// Grafana: the datasource is the Prometheus service, the dashboard deploy/grafana's.
	var ds struct {
		Datasources []struct {
			Type string `yaml:"type"`
			URL  string `yaml:"url"`
		} `yaml:"datasources"`
	}
	graf := p.Services["grafana"]
	readMounted(t, graf, "/etc/grafana/provisioning/datasources/ratelimit-proxy.yaml", &ds)
	if len(ds.Datasources) != 1 || ds.Datasources[0].Type != "prometheus" || ds.Datasources[0].URL != "http://prometheus:9090" {
		t.Errorf("Grafana's datasources %+v, want the prometheus service", ds.Datasources)
	}
	var dash struct {
		Providers []struct {
			Options struct {
				Path string `yaml:"path"`
			} `yaml:"options"`
		} `yaml:"providers"`
	}
	readMounted(t, graf, "/etc/grafana/provisioning/dashboards/ratelimit-proxy.yaml", &dash)
	found := false
	for _, v := range graf.Volumes {
		if len(dash.Providers) == 1 && filepath.Dir(v.Target) == dash.Providers[0].Options.Path {
			found = v.Source == filepath.Join(absRoot, "deploy", "grafana", "ratelimit-proxy.json")
		}
	}
	if !found {
		t.Errorf("Grafana's dashboard provider (%+v) loads no deploy/grafana/ratelimit-proxy.json", dash.Providers)
	}
	return cfg
}

// readMounted decodes the YAML file that service s mounts at target.
func readMounted(t *testing.T, s types.ServiceConfig, target string, v any) {
	t.Helper()
	for _, m := range s.Volumes {
		if m.Target == target {
			data, err := os.ReadFile(m.Source)
			if err != nil {
				t.Fatal(err)
			}
			if err := yaml.Unmarshal(data, v); err != nil {
				t.Fatalf("%s: %v", m.Source, err)
			}
			return
		}
	}
	t.Fatalf("service %s mounts nothing at %s", s.Name, target)
}

// entrypoint is the command a service built from the Dockerfile runs: its target stage's
// ENTRYPOINT.
func entrypoint(t *testing.T, absRoot string, s types.ServiceConfig) []string {
	t.Helper()
	if s.Build == nil {
		return nil
	}
	d := parseDockerfile(t, filepath.Join(absRoot, "Dockerfile"))
	for _, st := range d.stages {
		if st.Name == s.Build.Target || (s.Build.Target == "" && st.Name == d.final().Name) {
			for _, c := range st.Commands {
				if e, ok := c.(*instructions.EntrypointCommand); ok {
					return e.CmdLine
				}
			}
		}
	}
	return nil
}
