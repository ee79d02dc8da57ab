package e2e

// deploy/kubernetes holds one complete example per directory: the HTTP sidecar at its top, the
// gRPC one (TLS from a Secret, h2c to the service) in grpc/. For each: every manifest decodes
// strictly into the fields this test knows (a typo in a field name fails), the configuration in
// the ConfigMap passes the gateway's own `validate` with the files the pod's volumes would hold,
// and the pieces fit together: the sidecar reads the mounted file, the TLS files are in the
// mounted Secret, probes and Prometheus reach the admin port, the Service reaches the proxy port
// with an appProtocol that says what it speaks, the grace period outlasts
// shutdown_delay + drain_timeout. Across examples: no two objects share a name and no selector of
// one picks the other's pods or Services, so applying both is safe.
//
// The manifests are decoded into small structs of the fields they use rather than k8s.io/api's
// types: those would add about half a minute of compilation to every run of this package's
// end-to-end tests. The strict decoding into k8s.io/api's types and the admission rules (a
// numeric runAsUser, references defined, no admin port on a Service, NetworkPolicies) are
// deploy/k8s_test.go's, a package of its own.

import (
	"bytes"
	"errors"
	"io"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"slices"
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

// k8sHeader is a probe's httpHeaders entry.
type k8sHeader struct {
	Name string `yaml:"name"`
}

type k8sProbe struct {
	HTTPGet *struct {
		Path string `yaml:"path"`
		Port any    `yaml:"port"` // a number or a port name
		// Host and a Host header would change what the probe names; unset, the kubelet
		// connects to the pod's IP and names it, which the admin listener answers.
		Host        string      `yaml:"host"`
		HTTPHeaders []k8sHeader `yaml:"httpHeaders"`
	} `yaml:"httpGet"`
	InitialDelaySeconds int `yaml:"initialDelaySeconds"`
	PeriodSeconds       int `yaml:"periodSeconds"`
	TimeoutSeconds      int `yaml:"timeoutSeconds"`
	FailureThreshold    int `yaml:"failureThreshold"`
	SuccessThreshold    int `yaml:"successThreshold"`
}

type k8sContainer struct {
	Name            string    `yaml:"name"`
	Image           string    `yaml:"image"`
	ImagePullPolicy string    `yaml:"imagePullPolicy"`
	Args            []string  `yaml:"args"`
	Ports           []k8sPort `yaml:"ports"`
	Env             []struct {
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
		RunAsUser                *int `yaml:"runAsUser"`
		RunAsGroup               *int `yaml:"runAsGroup"`
		ReadOnlyRootFilesystem   bool `yaml:"readOnlyRootFilesystem"`
		AllowPrivilegeEscalation bool `yaml:"allowPrivilegeEscalation"`
		Capabilities             struct {
			Drop []string `yaml:"drop"`
		} `yaml:"capabilities"`
		SeccompProfile struct {
			Type string `yaml:"type"`
		} `yaml:"seccompProfile"`
	} `yaml:"securityContext"`
	VolumeMounts []struct {
		Name      string `yaml:"name"`
		MountPath string `yaml:"mountPath"`
		SubPath   string `yaml:"subPath"`
		ReadOnly  bool   `yaml:"readOnly"`
	} `yaml:"volumeMounts"`
}

type k8sVolume struct {
	Name      string `yaml:"name"`
	ConfigMap *struct {
		Name string `yaml:"name"`
	} `yaml:"configMap"`
	Secret *struct {
		SecretName string `yaml:"secretName"`
	} `yaml:"secret"`
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
				Volumes                       []k8sVolume    `yaml:"volumes"`
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
			Name        string `yaml:"name"`
			Port        int    `yaml:"port"`
			TargetPort  any    `yaml:"targetPort"`
			Protocol    string `yaml:"protocol"`
			AppProtocol string `yaml:"appProtocol"`
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

// k8sCertificate is cert-manager's: it keeps a kubernetes.io/tls Secret (tls.crt, tls.key,
// ca.crt) issued and renewed.
type k8sCertificate struct {
	k8sHead `yaml:",inline"`
	Spec    struct {
		SecretName string `yaml:"secretName"`
		IssuerRef  struct {
			Kind  string `yaml:"kind"`
			Name  string `yaml:"name"`
			Group string `yaml:"group"`
		} `yaml:"issuerRef"`
		CommonName  string   `yaml:"commonName"`
		DNSNames    []string `yaml:"dnsNames"`
		Duration    string   `yaml:"duration"`
		RenewBefore string   `yaml:"renewBefore"`
		PrivateKey  struct {
			Algorithm      string `yaml:"algorithm"`
			Size           int    `yaml:"size"`
			RotationPolicy string `yaml:"rotationPolicy"`
		} `yaml:"privateKey"`
	} `yaml:"spec"`
}

// manifests holds every object of one example by kind.
type manifests struct {
	configMaps      []k8sConfigMap
	deployments     []k8sDeployment
	services        []k8sService
	serviceMonitors []k8sServiceMonitor
	networkPolicies []k8sNetworkPolicy
	certificates    []k8sCertificate
	names           []string // kind/name of every object, in file order
}

// kinds maps apiVersion/kind to the decoder of that object.
var kinds = map[string]func(m *manifests, d *yaml.Decoder) error{
	"v1/ConfigMap":                            func(m *manifests, d *yaml.Decoder) error { return decodeInto(d, &m.configMaps) },
	"apps/v1/Deployment":                      func(m *manifests, d *yaml.Decoder) error { return decodeInto(d, &m.deployments) },
	"v1/Service":                              func(m *manifests, d *yaml.Decoder) error { return decodeInto(d, &m.services) },
	"networking.k8s.io/v1/NetworkPolicy":      func(m *manifests, d *yaml.Decoder) error { return decodeInto(d, &m.networkPolicies) },
	"monitoring.coreos.com/v1/ServiceMonitor": func(m *manifests, d *yaml.Decoder) error { return decodeInto(d, &m.serviceMonitors) },
	"cert-manager.io/v1/Certificate":          func(m *manifests, d *yaml.Decoder) error { return decodeInto(d, &m.certificates) },
}

func decodeInto[T any](d *yaml.Decoder, list *[]T) error {
	var v T
	if err := d.Decode(&v); err != nil {
		return err
	}
	*list = append(*list, v)
	return nil
}

func loadManifests(t *testing.T, dir string) manifests {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dir, "*.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if len(files) == 0 {
		t.Fatalf("no manifests in %s", dir)
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
			m.names = append(m.names, head.Kind+"/"+head.Metadata.Name)
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

// kubernetesExamples are the directories of deploy/kubernetes that hold one complete example
// each, applied with `kubectl apply -f DIR` (which does not descend into subdirectories).
var kubernetesExamples = []struct{ name, dir string }{
	{"http", kubernetesDir},
	{"grpc", kubernetesDir + "/grpc"},
}

// k8sExample is one example, decoded, with its gateway container found and the files of that
// container's volumes laid out on disk.
type k8sExample struct {
	m          manifests
	d          k8sDeployment
	gw         k8sContainer
	configPath string         // the file the gateway reads, inside the container
	cfg        *policy.Config // that file, parsed with the container's environment
	// root is a directory laid out like the container's mounts: root+mountPath holds the
	// volume's files (a ConfigMap's data; a Secret's tls.crt, tls.key and ca.crt, issued by the
	// test's CA for 127.0.0.1). rootConfig is the config file there and env the container's
	// environment (K=V), both with every mount path moved under root.
	root       string
	rootConfig string
	env        []string
}

// volume returns the pod's volume of that name, or nil.
func (ex *k8sExample) volume(name string) *k8sVolume {
	for i, v := range ex.d.Spec.Template.Spec.Volumes {
		if v.Name == name {
			return &ex.d.Spec.Template.Spec.Volumes[i]
		}
	}
	return nil
}

// volumeHolding returns the volume the gateway mounts at file's directory, or nil.
func (ex *k8sExample) volumeHolding(file string) *k8sVolume {
	for _, vm := range ex.gw.VolumeMounts {
		if vm.SubPath == "" && path.Clean(vm.MountPath) == path.Dir(file) {
			return ex.volume(vm.Name)
		}
	}
	return nil
}

// loadExample decodes the example in dir, finds the container that runs `serve --config FILE`
// and lays out its volumes under a temporary root; ca signs the certificates of its Secrets.
func loadExample(t *testing.T, dir string, ca *testCA) *k8sExample {
	t.Helper()
	ex := &k8sExample{m: loadManifests(t, dir), root: t.TempDir()}
	m := ex.m
	if len(m.deployments) != 1 || len(m.configMaps) == 0 || len(m.services) == 0 || len(m.serviceMonitors) == 0 {
		t.Fatalf("want one Deployment, a ConfigMap, a Service and a ServiceMonitor; got %d, %d, %d, %d",
			len(m.deployments), len(m.configMaps), len(m.services), len(m.serviceMonitors))
	}
	ex.d = m.deployments[0]
	var found bool
	for _, c := range ex.d.Spec.Template.Spec.Containers {
		for j, a := range c.Args {
			if (a == "--config" || a == "-c") && j+1 < len(c.Args) && c.Args[0] == "serve" {
				ex.gw, ex.configPath, found = c, c.Args[j+1], true
			}
		}
	}
	if !found {
		t.Fatalf("no container runs `serve --config FILE`")
	}

	// The volumes, as the kubelet would mount them.
	var from []string
	var tlsCert, tlsKey []byte
	for _, vm := range ex.gw.VolumeMounts {
		if vm.SubPath != "" {
			t.Errorf("%s: %s is mounted with subPath, which Kubernetes never updates: neither a reload nor a certificate rotation would reach the gateway", ex.gw.Name, vm.MountPath)
			continue
		}
		v := ex.volume(vm.Name)
		if v == nil {
			t.Errorf("%s mounts the volume %s, which the pod does not have", ex.gw.Name, vm.Name)
			continue
		}
		files := map[string][]byte{}
		switch {
		case v.ConfigMap != nil:
			var cm *k8sConfigMap
			for i := range m.configMaps {
				if m.configMaps[i].Metadata.Name == v.ConfigMap.Name {
					cm = &m.configMaps[i]
				}
			}
			if cm == nil {
				t.Errorf("volume %s: the ConfigMap %s is not in %s", v.Name, v.ConfigMap.Name, dir)
				continue
			}
			for k, data := range cm.Data {
				files[k] = []byte(data)
			}
		case v.Secret != nil:
			if tlsCert == nil {
				tlsCert, tlsKey = ca.issue(t, 1, false)
			}
			files = map[string][]byte{"tls.crt": tlsCert, "tls.key": tlsKey, "ca.crt": ca.pem}
		}
		d := filepath.Join(ex.root, filepath.FromSlash(path.Clean(vm.MountPath)))
		if err := os.MkdirAll(d, 0o700); err != nil {
			t.Fatal(err)
		}
		for name, data := range files {
			if err := os.WriteFile(filepath.Join(d, name), data, 0o600); err != nil {
				t.Fatal(err)
			}
		}
		from = append(from, path.Clean(vm.MountPath))
	}
	// Longest first, so that a mount path that begins another is not taken for it.
	slices.SortFunc(from, func(a, b string) int { return len(b) - len(a) })
	var pairs []string
	for _, p := range from {
		pairs = append(pairs, p, filepath.Join(ex.root, filepath.FromSlash(p)))
	}
	rooted := strings.NewReplacer(pairs...)

	ex.rootConfig = filepath.Join(ex.root, filepath.FromSlash(ex.configPath))
	raw, err := os.ReadFile(ex.rootConfig)
	if v := ex.volumeHolding(ex.configPath); err != nil || v == nil || v.ConfigMap == nil {
		t.Fatalf("%s reads %s, but no ConfigMap mounted at %s holds %s", ex.gw.Name, ex.configPath, path.Dir(ex.configPath), path.Base(ex.configPath))
	}
	if err := os.WriteFile(ex.rootConfig, []byte(rooted.Replace(string(raw))), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, e := range ex.gw.Env {
		ex.env = append(ex.env, e.Name+"="+rooted.Replace(e.Value))
	}
	getenv := func(k string) string {
		for _, e := range ex.gw.Env {
			if e.Name == k {
				return e.Value
			}
		}
		return ""
	}
	ex.cfg, err = policy.Parse(raw, policy.LoadOptions{Getenv: getenv})
	if err != nil {
		t.Fatalf("the ConfigMap's configuration: %v", err)
	}
	return ex
}

// TestKubernetesManifests decodes every example's manifests and checks that they fit the gateway.
func TestKubernetesManifests(t *testing.T) {
	ca := newTestCA(t, "test CA")
	for _, e := range kubernetesExamples {
		t.Run(e.name, func(t *testing.T) {
			checkExample(t, loadExample(t, e.dir, ca))
		})
	}
}

// ianaSvcName is what Kubernetes accepts as a container port's name (at most 15 characters,
// at least one letter, no "--").
var ianaSvcName = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]*[a-z0-9])?$`)

func checkExample(t *testing.T, ex *k8sExample) {
	m, d, gw, cfg := ex.m, ex.d, ex.gw, ex.cfg
	pod := d.Spec.Template
	if !selects(d.Spec.Selector.MatchLabels, pod.Metadata.Labels) {
		t.Errorf("Deployment %s: selector %v does not select its pods' labels %v", d.Metadata.Name, d.Spec.Selector.MatchLabels, pod.Metadata.Labels)
	}

	// The gateway's own validator, through the binary, with the container's environment and
	// the files its volumes hold.
	if out, err := execValidate(ex.rootConfig, append(os.Environ(), ex.env...)).CombinedOutput(); err != nil {
		t.Errorf("the ConfigMap's configuration does not validate with the files the pod mounts: %v\n%s", err, out)
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
	for _, c := range pod.Spec.Containers {
		for _, p := range c.Ports {
			if p.Name != "" && (len(p.Name) > 15 || !ianaSvcName.MatchString(p.Name) || strings.Contains(p.Name, "--") || !strings.ContainsAny(p.Name, "abcdefghijklmnopqrstuvwxyz")) {
				t.Errorf("container %s: port name %q is no IANA service name (lower-case letters, digits and single dashes, at most 15): the API server refuses it", c.Name, p.Name)
			}
		}
	}

	// TLS: the files the config names are in a mounted Secret (validate above proved that they
	// are the keys such a Secret holds); a cert-manager Certificate in the example fills it.
	tlsOn := cfg.TLS != nil && cfg.TLS.CertFile != ""
	var tlsSecrets []string
	if tlsOn {
		for _, f := range [][2]string{{"tls.cert_file", cfg.TLS.CertFile}, {"tls.key_file", cfg.TLS.KeyFile}, {"tls.client_ca_file", cfg.TLS.ClientCAFile}} {
			if f[1] == "" {
				continue
			}
			v := ex.volumeHolding(f[1])
			if v == nil || v.Secret == nil {
				t.Errorf("%s %s is not in a Secret that %s mounts", f[0], f[1], gw.Name)
				continue
			}
			if !slices.Contains(tlsSecrets, v.Secret.SecretName) {
				tlsSecrets = append(tlsSecrets, v.Secret.SecretName)
			}
		}
	}
	for _, s := range tlsSecrets {
		issued := len(m.certificates) == 0 // no cert-manager here: the Secret is made by hand
		for _, c := range m.certificates {
			issued = issued || c.Spec.SecretName == s
		}
		if !issued {
			t.Errorf("the Secret %s that the gateway's TLS files come from is issued by none of the Certificates", s)
		}
	}
	for _, c := range m.certificates {
		if !slices.Contains(tlsSecrets, c.Spec.SecretName) {
			t.Errorf("Certificate %s fills the Secret %s, from which the gateway reads no TLS file", c.Metadata.Name, c.Spec.SecretName)
		}
		if c.Spec.IssuerRef.Name == "" {
			t.Errorf("Certificate %s has no issuerRef.name", c.Metadata.Name)
		}
	}

	// Probes on the admin port.
	for _, p := range []struct {
		name  string
		probe *k8sProbe
		path  string
	}{{"readinessProbe", gw.ReadinessProbe, "/readyz"}, {"livenessProbe", gw.LivenessProbe, "/healthz"}, {"startupProbe", gw.StartupProbe, "/healthz"}} {
		if p.probe == nil || p.probe.HTTPGet == nil {
			t.Errorf("%s: no HTTP %s", gw.Name, p.name)
			continue
		}
		if p.probe.HTTPGet.Path != p.path {
			t.Errorf("%s.path = %s, want %s", p.name, p.probe.HTTPGet.Path, p.path)
		}
		if p.probe.HTTPGet.Host != "" || slices.ContainsFunc(p.probe.HTTPGet.HTTPHeaders, func(h k8sHeader) bool { return strings.EqualFold(h.Name, "Host") }) {
			t.Errorf("%s names a host: the admin listener answers only the address connected to, loopback and admin.hosts (421 otherwise)", p.name)
		}
		if n, ok := portNumber(gw, p.probe.HTTPGet.Port); !ok || n != adminPort {
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

	// Resources and a locked-down container.
	for _, r := range []string{"cpu", "memory"} {
		if gw.Resources.Requests[r] == "" {
			t.Errorf("%s: no resources.requests.%s", gw.Name, r)
		}
	}
	if gw.Resources.Limits["memory"] == "" {
		t.Errorf("%s: no resources.limits.memory (the gateway sizes its Go memory limit from it)", gw.Name)
	}
	if sc := gw.SecurityContext; sc == nil || !sc.RunAsNonRoot || !sc.ReadOnlyRootFilesystem || sc.AllowPrivilegeEscalation || !slices.Contains(sc.Capabilities.Drop, "ALL") {
		t.Errorf("%s: want securityContext runAsNonRoot, readOnlyRootFilesystem, allowPrivilegeEscalation: false and capabilities.drop [ALL]", gw.Name)
	}

	// Services: the application's reaches the proxy port, never the admin port, and says in
	// appProtocol what the port speaks (meshes and load balancers read it); the
	// ServiceMonitor's reaches the admin port.
	var appServices []string
	for _, s := range m.services {
		if !selects(s.Spec.Selector, pod.Metadata.Labels) {
			t.Errorf("Service %s selects %v, not the Deployment's pods %v", s.Metadata.Name, s.Spec.Selector, pod.Metadata.Labels)
		}
		for _, p := range s.Spec.Ports {
			n, ok := portNumber(gw, p.TargetPort)
			if !ok {
				t.Errorf("Service %s port %s: targetPort %v is no port of %s", s.Metadata.Name, p.Name, p.TargetPort, gw.Name)
			}
			if n == adminPort && s.Spec.ClusterIP != "None" {
				t.Errorf("Service %s exposes the admin port %d behind a cluster IP: /metrics, /healthz and /readyz are unauthenticated", s.Metadata.Name, n)
			}
			if n != proxyPort {
				continue
			}
			appServices = append(appServices, s.Metadata.Name)
			switch {
			case tlsOn && p.AppProtocol != "https":
				t.Errorf("Service %s port %s: appProtocol %q, want https: the gateway terminates TLS on it", s.Metadata.Name, p.Name, p.AppProtocol)
			case !tlsOn && (p.AppProtocol == "https" || p.AppProtocol == "tls"):
				t.Errorf("Service %s port %s: appProtocol %q, but the gateway's port speaks cleartext (no tls block)", s.Metadata.Name, p.Name, p.AppProtocol)
			case !tlsOn && p.AppProtocol == "" && cfg.UpstreamProtocol == "h2c":
				t.Errorf("Service %s port %s: no appProtocol, but its clients speak HTTP/2 (upstream_protocol: h2c): say kubernetes.io/h2c", s.Metadata.Name, p.Name)
			}
		}
	}
	if len(appServices) == 0 {
		t.Errorf("no Service reaches the proxy port %d", proxyPort)
	}
	for _, c := range m.certificates {
		for _, s := range appServices {
			if !slices.Contains(c.Spec.DNSNames, s) {
				t.Errorf("Certificate %s: dnsNames %v lack the Service name %s that clients dial", c.Metadata.Name, c.Spec.DNSNames, s)
			}
		}
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
				if n, ok := portNumber(gw, target); !ok || n != adminPort {
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
		var open bool
		for _, in := range np.Spec.Ingress {
			for _, p := range in.Ports {
				if n, ok := portNumber(gw, p.Port); ok && n == proxyPort {
					open = true
				}
			}
		}
		if !open {
			t.Errorf("NetworkPolicy %s lets nothing reach the proxy port %d", np.Metadata.Name, proxyPort)
		}
	}
	if t.Failed() {
		return
	}
	t.Logf("%d ConfigMaps, %d Deployments, %d Services, %d ServiceMonitors, %d NetworkPolicies, %d Certificates; config %s validates",
		len(m.configMaps), len(m.deployments), len(m.services), len(m.serviceMonitors), len(m.networkPolicies), len(m.certificates), ex.configPath)
}

// TestKubernetesExamplesApart: every directory of deploy/kubernetes with manifests is an
// example checked above, and the examples can live in one namespace: no object of one has the
// kind and name of another's (applying one would overwrite the other), and no selector of one
// picks the other's pods or Services.
func TestKubernetesExamplesApart(t *testing.T) {
	var dirs []string
	err := filepath.WalkDir(kubernetesDir, func(p string, e fs.DirEntry, err error) error {
		if err == nil && !e.IsDir() && strings.HasSuffix(p, ".yaml") && !slices.Contains(dirs, filepath.Dir(p)) {
			dirs = append(dirs, filepath.Dir(p))
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range dirs {
		if !slices.ContainsFunc(kubernetesExamples, func(e struct{ name, dir string }) bool { return filepath.Clean(e.dir) == d }) {
			t.Errorf("%s holds manifests but is not in kubernetesExamples: it would go unchecked", d)
		}
	}

	all := make([]manifests, len(kubernetesExamples))
	owner := map[string]string{}
	for i, e := range kubernetesExamples {
		all[i] = loadManifests(t, e.dir)
		for _, n := range all[i].names {
			if o, dup := owner[n]; dup {
				t.Errorf("%s is in both the %s and the %s example: applying one would overwrite the other's", n, o, e.name)
			}
			owner[n] = e.name
		}
	}
	for i, a := range all {
		var selectors []map[string]string
		for _, d := range a.deployments {
			selectors = append(selectors, d.Spec.Selector.MatchLabels)
		}
		for _, s := range a.services {
			selectors = append(selectors, s.Spec.Selector)
		}
		for _, np := range a.networkPolicies {
			selectors = append(selectors, np.Spec.PodSelector.MatchLabels)
		}
		for j, b := range all {
			if i == j {
				continue
			}
			for _, d := range b.deployments {
				for _, sel := range selectors {
					if selects(sel, d.Spec.Template.Metadata.Labels) {
						t.Errorf("the %s example's selector %v picks the %s example's pods", kubernetesExamples[i].name, sel, kubernetesExamples[j].name)
					}
				}
			}
			for _, sm := range a.serviceMonitors {
				for _, s := range b.services {
					if selects(sm.Spec.Selector.MatchLabels, s.Metadata.Labels) {
						t.Errorf("the %s example's ServiceMonitor %s picks the %s example's Service %s: its pods would be scraped twice", kubernetesExamples[i].name, sm.Metadata.Name, kubernetesExamples[j].name, s.Metadata.Name)
					}
				}
			}
		}
	}
}

// execValidate is `ratelimit-proxy validate --config f` with the given environment.
func execValidate(f string, env []string) *exec.Cmd {
	cmd := exec.Command(binary, "validate", "--config", f)
	cmd.Env = append(env, "GORACE="+strings.TrimSpace(os.Getenv("GORACE")+" atexit_sleep_ms=0"))
	return cmd
}
