package main

// deploy/kubernetes: every manifest decodes strictly into the fields this test knows (a typo in
// a field name fails), the configuration in the ConfigMap passes the gateway's own `validate`,
// and the pieces fit together: the sidecar reads the mounted file, probes and Prometheus reach
// the admin port, the Service reaches the proxy port, the grace period outlasts
// shutdown_delay + drain_timeout.
//
// The manifests are decoded into small structs of the fields they use rather than k8s.io/api's
// types: those would add about half a minute of compilation to every fresh CI run.

import (
	"bytes"
	"errors"
	"io"
	"net"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/policy"
)

const kubernetesDir = "../../deploy/kubernetes"

type k8sMeta struct {
	Name        string            `yaml:"name"`
	Namespace   string            `yaml:"namespace"`
	Labels      map[string]string `yaml:"labels"`
	Annotations map[string]string `yaml:"annotations"`
}

type k8sHead struct {
	APIVersion string  `yaml:"apiVersion"`
	Kind       string  `yaml:"kind"`
	Metadata   k8sMeta `yaml:"metadata"`
}

type k8sConfigMap struct {
	k8sHead `yaml:",inline"`
	Data    map[string]string `yaml:"data"`
}

type k8sPort struct {
	Name          string `yaml:"name"`
	ContainerPort int    `yaml:"containerPort"`
	Protocol      string `yaml:"protocol"`
}

type k8sProbe struct {
	HTTPGet *struct {
		Path string `yaml:"path"`
		Port any    `yaml:"port"` // a number or a port name
	} `yaml:"httpGet"`
	InitialDelaySeconds int `yaml:"initialDelaySeconds"`
	PeriodSeconds       int `yaml:"periodSeconds"`
	TimeoutSeconds      int `yaml:"timeoutSeconds"`
	FailureThreshold    int `yaml:"failureThreshold"`
	SuccessThreshold    int `yaml:"successThreshold"`
}

type k8sContainer struct {
	Name  string    `yaml:"name"`
	Image string    `yaml:"image"`
	Args  []string  `yaml:"args"`
	Ports []k8sPort `yaml:"ports"`
	Env   []struct {
		Name  string `yaml:"name"`
		Value string `yaml:"value"`
	} `yaml:"env"`
	ReadinessProbe *k8sProbe `yaml:"readinessProbe"`
	LivenessProbe  *k8sProbe `yaml:"livenessProbe"`
	StartupProbe   *k8sProbe `yaml:"startupProbe"`
	Lifecycle      *struct {
		PreStop *struct {
			Sleep *struct {
				Seconds int `yaml:"seconds"`
			} `yaml:"sleep"`
		} `yaml:"preStop"`
	} `yaml:"lifecycle"`
	Resources struct {
		Requests map[string]string `yaml:"requests"`
		Limits   map[string]string `yaml:"limits"`
	} `yaml:"resources"`
	SecurityContext *struct {
		RunAsNonRoot             bool `yaml:"runAsNonRoot"`
		ReadOnlyRootFilesystem   bool `yaml:"readOnlyRootFilesystem"`
		AllowPrivilegeEscalation bool `yaml:"allowPrivilegeEscalation"`
		Capabilities             struct {
			Drop []string `yaml:"drop"`
		} `yaml:"capabilities"`
	} `yaml:"securityContext"`
	VolumeMounts []struct {
		Name      string `yaml:"name"`
		MountPath string `yaml:"mountPath"`
		SubPath   string `yaml:"subPath"`
		ReadOnly  bool   `yaml:"readOnly"`
	} `yaml:"volumeMounts"`
}

type k8sDeployment struct {
	k8sHead `yaml:",inline"`
	Spec    struct {
		Replicas int `yaml:"replicas"`
		Selector struct {
			MatchLabels map[string]string `yaml:"matchLabels"`
		} `yaml:"selector"`
		Template struct {
			Metadata k8sMeta `yaml:"metadata"`
			Spec     struct {
				TerminationGracePeriodSeconds *int           `yaml:"terminationGracePeriodSeconds"`
				Containers                    []k8sContainer `yaml:"containers"`
				Volumes                       []struct {
					Name      string `yaml:"name"`
					ConfigMap *struct {
						Name string `yaml:"name"`
					} `yaml:"configMap"`
				} `yaml:"volumes"`
			} `yaml:"spec"`
		} `yaml:"template"`
	} `yaml:"spec"`
}

type k8sService struct {
	k8sHead `yaml:",inline"`
	Spec    struct {
		ClusterIP string            `yaml:"clusterIP"`
		Type      string            `yaml:"type"`
		Selector  map[string]string `yaml:"selector"`
		Ports     []struct {
			Name       string `yaml:"name"`
			Port       int    `yaml:"port"`
			TargetPort any    `yaml:"targetPort"`
			Protocol   string `yaml:"protocol"`
		} `yaml:"ports"`
	} `yaml:"spec"`
}

type k8sServiceMonitor struct {
	k8sHead `yaml:",inline"`
	Spec    struct {
		Selector struct {
			MatchLabels map[string]string `yaml:"matchLabels"`
		} `yaml:"selector"`
		Endpoints []struct {
			Port     string `yaml:"port"`
			Path     string `yaml:"path"`
			Interval string `yaml:"interval"`
		} `yaml:"endpoints"`
	} `yaml:"spec"`
}

type k8sNetworkPolicy struct {
	k8sHead `yaml:",inline"`
	Spec    struct {
		PodSelector struct {
			MatchLabels map[string]string `yaml:"matchLabels"`
		} `yaml:"podSelector"`
		PolicyTypes []string `yaml:"policyTypes"`
		Ingress     []struct {
			From []struct {
				NamespaceSelector *struct {
					MatchLabels map[string]string `yaml:"matchLabels"`
				} `yaml:"namespaceSelector"`
				PodSelector *struct {
					MatchLabels map[string]string `yaml:"matchLabels"`
				} `yaml:"podSelector"`
			} `yaml:"from"`
			Ports []struct {
				Port     any    `yaml:"port"`
				Protocol string `yaml:"protocol"`
			} `yaml:"ports"`
		} `yaml:"ingress"`
	} `yaml:"spec"`
}

// manifests holds every object of deploy/kubernetes by kind.
type manifests struct {
	configMaps      []k8sConfigMap
	deployments     []k8sDeployment
	services        []k8sService
	serviceMonitors []k8sServiceMonitor
	networkPolicies []k8sNetworkPolicy
}

// kinds maps apiVersion/kind to the decoder of that object.
var kinds = map[string]func(m *manifests, d *yaml.Decoder) error{
	"v1/ConfigMap":                            func(m *manifests, d *yaml.Decoder) error { return decodeInto(d, &m.configMaps) },
	"apps/v1/Deployment":                      func(m *manifests, d *yaml.Decoder) error { return decodeInto(d, &m.deployments) },
	"v1/Service":                              func(m *manifests, d *yaml.Decoder) error { return decodeInto(d, &m.services) },
	"networking.k8s.io/v1/NetworkPolicy":      func(m *manifests, d *yaml.Decoder) error { return decodeInto(d, &m.networkPolicies) },
	"monitoring.coreos.com/v1/ServiceMonitor": func(m *manifests, d *yaml.Decoder) error { return decodeInto(d, &m.serviceMonitors) },
}

func decodeInto[T any](d *yaml.Decoder, list *[]T) error {
	var v T
	if err := d.Decode(&v); err != nil {
		return err
	}
	*list = append(*list, v)
	return nil
}

func loadManifests(t *testing.T) manifests {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(kubernetesDir, "*.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if len(files) == 0 {
		t.Fatalf("no manifests in %s", kubernetesDir)
	}
	var m manifests
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		all := yaml.NewDecoder(bytes.NewReader(data))
		for i := 0; ; i++ {
			var doc yaml.Node
			err := all.Decode(&doc)
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				t.Fatalf("%s: document %d: %v", f, i, err)
			}
			raw, err := yaml.Marshal(&doc)
			if err != nil {
				t.Fatal(err)
			}
			var head k8sHead
			if err := yaml.Unmarshal(raw, &head); err != nil {
				t.Fatalf("%s: document %d: %v", f, i, err)
			}
			decode, ok := kinds[head.APIVersion+"/"+head.Kind]
			if !ok {
				t.Errorf("%s: document %d: %s %s is not a kind this test knows: add it to kinds", f, i, head.APIVersion, head.Kind)
				continue
			}
			if head.Metadata.Name == "" {
				t.Errorf("%s: document %d: %s without metadata.name", f, i, head.Kind)
			}
			strict := yaml.NewDecoder(bytes.NewReader(raw))
			strict.KnownFields(true)
			if err := decode(&m, strict); err != nil {
				t.Errorf("%s: %s %s: %v (a misspelled field, or one this test should learn)", f, head.Kind, head.Metadata.Name, err)
			}
		}
	}
	return m
}

// portNumber resolves a probe's or Service's port (a number or a container port's name).
func portNumber(c k8sContainer, p any) (int, bool) {
	switch v := p.(type) {
	case int:
		return v, true
	case string:
		for _, cp := range c.Ports {
			if cp.Name == v {
				return cp.ContainerPort, true
			}
		}
	}
	return 0, false
}

func listenPort(t *testing.T, what, addr string) int {
	t.Helper()
	_, p, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatalf("%s %q: %v", what, addr, err)
	}
	n, err := strconv.Atoi(p)
	if err != nil {
		t.Fatalf("%s %q: %v", what, addr, err)
	}
	return n
}

func selects(selector, labels map[string]string) bool {
	if len(selector) == 0 {
		return false
	}
	for k, v := range selector {
		if labels[k] != v {
			return false
		}
	}
	return true
}

// TestKubernetesManifests decodes every manifest and checks that they fit the gateway.
func TestKubernetesManifests(t *testing.T) {
	m := loadManifests(t)
	if len(m.deployments) != 1 || len(m.configMaps) == 0 || len(m.services) == 0 || len(m.serviceMonitors) == 0 {
		t.Fatalf("want one Deployment, a ConfigMap, a Service and a ServiceMonitor; got %d, %d, %d, %d",
			len(m.deployments), len(m.configMaps), len(m.services), len(m.serviceMonitors))
	}
	d := m.deployments[0]
	pod := d.Spec.Template
	if !selects(d.Spec.Selector.MatchLabels, pod.Metadata.Labels) {
		t.Errorf("Deployment %s: selector %v does not select its pods' labels %v", d.Metadata.Name, d.Spec.Selector.MatchLabels, pod.Metadata.Labels)
	}

	// The sidecar: `serve --config FILE`, FILE from a mounted ConfigMap.
	var gw *k8sContainer
	var configPath string
	for i, c := range pod.Spec.Containers {
		for j, a := range c.Args {
			if (a == "--config" || a == "-c") && j+1 < len(c.Args) && len(c.Args) > 0 && c.Args[0] == "serve" {
				gw, configPath = &pod.Spec.Containers[i], c.Args[j+1]
			}
		}
	}
	if gw == nil {
		t.Fatalf("no container runs `serve --config FILE`")
	}
	var configText string
	for _, vm := range gw.VolumeMounts {
		if path.Dir(configPath) != path.Clean(vm.MountPath) {
			continue
		}
		if vm.SubPath != "" {
			t.Errorf("%s: the config is mounted with subPath, which Kubernetes never updates: hot reload would not work", gw.Name)
		}
		for _, v := range pod.Spec.Volumes {
			if v.Name != vm.Name || v.ConfigMap == nil {
				continue
			}
			for _, cm := range m.configMaps {
				if cm.Metadata.Name == v.ConfigMap.Name {
					configText = cm.Data[path.Base(configPath)]
				}
			}
		}
	}
	if configText == "" {
		t.Fatalf("%s reads %s, but no mounted ConfigMap holds %s", gw.Name, configPath, path.Base(configPath))
	}

	// The gateway's own validator, through the binary, with the container's environment.
	f := filepath.Join(t.TempDir(), path.Base(configPath))
	if err := os.WriteFile(f, []byte(configText), 0o600); err != nil {
		t.Fatal(err)
	}
	env := os.Environ()
	for _, e := range gw.Env {
		env = append(env, e.Name+"="+e.Value)
	}
	cmd := execValidate(f, env)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("the ConfigMap's configuration does not validate: %v\n%s", err, out)
	}
	getenv := func(k string) string {
		for _, e := range gw.Env {
			if e.Name == k {
				return e.Value
			}
		}
		return ""
	}
	cfg, err := policy.Parse([]byte(configText), policy.LoadOptions{Getenv: getenv})
	if err != nil {
		t.Fatal(err)
	}
	proxyPort, adminPort := listenPort(t, "listen", cfg.Listen), listenPort(t, "admin_listen", cfg.AdminListen)
	if host, _, _ := net.SplitHostPort(cfg.AdminListen); host == "127.0.0.1" || host == "localhost" {
		t.Errorf("admin_listen %s is loopback: the kubelet's probes and Prometheus could not reach it", cfg.AdminListen)
	}
	hasPort := func(n int) bool {
		for _, p := range gw.Ports {
			if p.ContainerPort == n {
				return true
			}
		}
		return false
	}
	if !hasPort(proxyPort) || !hasPort(adminPort) {
		t.Errorf("%s declares ports %v, want the proxy's %d and the admin's %d", gw.Name, gw.Ports, proxyPort, adminPort)
	}

	// Probes on the admin port.
	for _, p := range []struct {
		name  string
		probe *k8sProbe
		path  string
	}{{"readinessProbe", gw.ReadinessProbe, "/readyz"}, {"livenessProbe", gw.LivenessProbe, "/healthz"}} {
		if p.probe == nil || p.probe.HTTPGet == nil {
			t.Errorf("%s: no HTTP %s", gw.Name, p.name)
			continue
		}
		if p.probe.HTTPGet.Path != p.path {
			t.Errorf("%s.path = %s, want %s", p.name, p.probe.HTTPGet.Path, p.path)
		}
		if n, ok := portNumber(*gw, p.probe.HTTPGet.Port); !ok || n != adminPort {
			t.Errorf("%s.port = %v, want the admin port %d", p.name, p.probe.HTTPGet.Port, adminPort)
		}
	}

	// Shutdown: the grace period outlasts the delay and the drain.
	if cfg.Server.ShutdownDelay <= 0 {
		t.Errorf("server.shutdown_delay is %v: without it, clients meet refused connections while the endpoints update", cfg.Server.ShutdownDelay)
	}
	grace := 30 * time.Second // Kubernetes' default
	if g := pod.Spec.TerminationGracePeriodSeconds; g != nil {
		grace = time.Duration(*g) * time.Second
	}
	if need := cfg.Server.ShutdownDelay + cfg.Server.DrainTimeout; grace <= need {
		t.Errorf("terminationGracePeriodSeconds %v, want more than shutdown_delay + drain_timeout = %v", grace, need)
	}
	for _, c := range pod.Spec.Containers {
		if c.Name == gw.Name {
			continue
		}
		if c.Lifecycle == nil || c.Lifecycle.PreStop == nil || c.Lifecycle.PreStop.Sleep == nil ||
			time.Duration(c.Lifecycle.PreStop.Sleep.Seconds)*time.Second < cfg.Server.ShutdownDelay {
			t.Errorf("container %s: no preStop sleep of at least shutdown_delay (%v): it would stop serving before the gateway", c.Name, cfg.Server.ShutdownDelay)
		}
	}

	// Resources.
	for _, r := range []string{"cpu", "memory"} {
		if gw.Resources.Requests[r] == "" {
			t.Errorf("%s: no resources.requests.%s", gw.Name, r)
		}
	}
	if gw.Resources.Limits["memory"] == "" {
		t.Errorf("%s: no resources.limits.memory (the gateway sizes its Go memory limit from it)", gw.Name)
	}

	// Services: the application's reaches the proxy port, never the admin port; the
	// ServiceMonitor's reaches the admin port.
	var appService bool
	byName := map[string]k8sService{}
	for _, s := range m.services {
		byName[s.Metadata.Name] = s
		if !selects(s.Spec.Selector, pod.Metadata.Labels) {
			t.Errorf("Service %s selects %v, not the Deployment's pods %v", s.Metadata.Name, s.Spec.Selector, pod.Metadata.Labels)
		}
		for _, p := range s.Spec.Ports {
			n, ok := portNumber(*gw, p.TargetPort)
			if !ok {
				t.Errorf("Service %s port %s: targetPort %v is no port of %s", s.Metadata.Name, p.Name, p.TargetPort, gw.Name)
			}
			if n == adminPort && s.Spec.ClusterIP != "None" {
				t.Errorf("Service %s exposes the admin port %d behind a cluster IP: /metrics, /healthz and /readyz are unauthenticated", s.Metadata.Name, n)
			}
			if n == proxyPort {
				appService = true
			}
		}
	}
	if !appService {
		t.Errorf("no Service reaches the proxy port %d", proxyPort)
	}
	for _, sm := range m.serviceMonitors {
		var matched int
		for _, s := range m.services {
			if !selects(sm.Spec.Selector.MatchLabels, s.Metadata.Labels) {
				continue
			}
			matched++
			for _, e := range sm.Spec.Endpoints {
				var target any
				for _, p := range s.Spec.Ports {
					if p.Name == e.Port {
						target = p.TargetPort
					}
				}
				if n, ok := portNumber(*gw, target); !ok || n != adminPort {
					t.Errorf("ServiceMonitor %s endpoint %q on Service %s does not reach the admin port %d", sm.Metadata.Name, e.Port, s.Metadata.Name, adminPort)
				}
				if e.Path != "" && e.Path != "/metrics" {
					t.Errorf("ServiceMonitor %s scrapes %s, want /metrics", sm.Metadata.Name, e.Path)
				}
			}
		}
		if matched == 0 {
			t.Errorf("ServiceMonitor %s selects no Service (selector %v)", sm.Metadata.Name, sm.Spec.Selector.MatchLabels)
		}
	}
	for _, np := range m.networkPolicies {
		if !selects(np.Spec.PodSelector.MatchLabels, pod.Metadata.Labels) {
			t.Errorf("NetworkPolicy %s does not select the Deployment's pods", np.Metadata.Name)
		}
	}
	if t.Failed() {
		return
	}
	t.Logf("%d ConfigMaps, %d Deployments, %d Services, %d ServiceMonitors, %d NetworkPolicies; config %s validates",
		len(m.configMaps), len(m.deployments), len(m.services), len(m.serviceMonitors), len(m.networkPolicies), configPath)
}

// execValidate is `ratelimit-proxy validate --config f` with the given environment.
func execValidate(f string, env []string) *exec.Cmd {
	cmd := exec.Command(binary, "validate", "--config", f)
	cmd.Env = append(env, "GORACE="+strings.TrimSpace(os.Getenv("GORACE")+" atexit_sleep_ms=0"))
	return cmd
}
