package deploy_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	"go.yaml.in/yaml/v3"
	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// k8sExample is one set of manifests applied together (`kubectl apply -f`).
type k8sExample struct {
	name  string
	files []string
}

func k8sExamples(t *testing.T) []k8sExample {
	return []k8sExample{
		{"deploy/kubernetes", glob(t, "deploy/kubernetes/*.yaml")},
		{"deploy/kubernetes/grpc", glob(t, "deploy/kubernetes/grpc/*.yaml")},
		{"deploy/envoy/ratelimit-proxy.yaml", []string{"deploy/envoy/ratelimit-proxy.yaml"}},
		{"deploy/envoy/envoy-gateway-redis.yaml", []string{"deploy/envoy/envoy-gateway-redis.yaml"}},
	}
}

// objects are an example's objects, decoded into k8s.io/api's types.
type objects struct {
	deployments     []*appsv1.Deployment
	services        []*corev1.Service
	configMaps      map[string]*corev1.ConfigMap // by namespace/name
	secrets         map[string]bool              // Secrets, and those cert-manager Certificates keep
	serviceAccounts map[string]bool
	netpols         []*networkingv1.NetworkPolicy
	pdbs            []*policyv1.PodDisruptionBudget
	hpas            []*autoscalingv2.HorizontalPodAutoscaler
	serviceMonitors []*monitoringv1.ServiceMonitor
	rules           []*monitoringv1.PrometheusRule
}

func nsName(ns, name string) string { return ns + "/" + name }

// strict decodes a document's JSON into v, refusing fields v's type does not have (as
// `kubectl apply`'s strict field validation does).
func strict(d doc, v any) error {
	dec := json.NewDecoder(bytes.NewReader(d.json))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("%s: %w", d, err)
	}
	return nil
}

// crdKinds are custom resources an example may hold; crd_test.go checks the ones whose schema
// is vendored.
var crdKinds = map[string]bool{
	"cert-manager.io/v1/Certificate": true,
}

func decodeExample(t *testing.T, ex k8sExample) objects {
	t.Helper()
	return decodeDocs(t, readDocs(t, ex.files...))
}

// decodeDocs decodes documents strictly into their Kubernetes (or Prometheus Operator) types.
func decodeDocs(t *testing.T, docs []doc) objects {
	t.Helper()
	o := objects{configMaps: map[string]*corev1.ConfigMap{}, secrets: map[string]bool{}, serviceAccounts: map[string]bool{}}
	for _, d := range docs {
		ns := str(dig(d.obj, "metadata", "namespace"))
		var err error
		switch gvk := d.apiVersion() + "/" + d.kind(); gvk {
		case "v1/Namespace":
			err = strict(d, &corev1.Namespace{})
		case "v1/ServiceAccount":
			var sa corev1.ServiceAccount
			err = strict(d, &sa)
			o.serviceAccounts[nsName(ns, sa.Name)] = true
		case "v1/ConfigMap":
			var cm corev1.ConfigMap
			err = strict(d, &cm)
			o.configMaps[nsName(ns, cm.Name)] = &cm
		case "v1/Secret":
			var s corev1.Secret
			err = strict(d, &s)
			o.secrets[nsName(ns, s.Name)] = true
		case "v1/Service":
			var s corev1.Service
			err = strict(d, &s)
			o.services = append(o.services, &s)
		case "apps/v1/Deployment":
			var dep appsv1.Deployment
			err = strict(d, &dep)
			o.deployments = append(o.deployments, &dep)
		case "networking.k8s.io/v1/NetworkPolicy":
			var np networkingv1.NetworkPolicy
			err = strict(d, &np)
			o.netpols = append(o.netpols, &np)
		case "policy/v1/PodDisruptionBudget":
			var pdb policyv1.PodDisruptionBudget
			err = strict(d, &pdb)
			o.pdbs = append(o.pdbs, &pdb)
		case "autoscaling/v2/HorizontalPodAutoscaler":
			var hpa autoscalingv2.HorizontalPodAutoscaler
			err = strict(d, &hpa)
			o.hpas = append(o.hpas, &hpa)
		case "monitoring.coreos.com/v1/ServiceMonitor":
			var sm monitoringv1.ServiceMonitor
			err = strict(d, &sm)
			o.serviceMonitors = append(o.serviceMonitors, &sm)
		case "monitoring.coreos.com/v1/PrometheusRule":
			var pr monitoringv1.PrometheusRule
			err = strict(d, &pr)
			o.rules = append(o.rules, &pr)
		default:
			if !crdKinds[gvk] {
				t.Errorf("%s: kind %s is not one this check knows", d, gvk)
			}
			if gvk == "cert-manager.io/v1/Certificate" {
				o.secrets[nsName(ns, str(dig(d.obj, "spec", "secretName")))] = true
			}
		}
		if err != nil {
			t.Error(err)
		}
	}
	return o
}

// TestKubernetesManifestsAdmitted decodes every example strictly and applies the admission
// rules that bite a sidecar: a kubelet that cannot verify a non-root user, a reference to an
// object the example does not define, a reloaded file mounted with subPath, the admin port on
// a Service, a port no NetworkPolicy rule restricts.
func TestKubernetesManifestsAdmitted(t *testing.T) {
	imageUser := dockerfileUser(t)
	images := map[string][]string{} // the gateway's image, by example
	for _, ex := range k8sExamples(t) {
		t.Run(ex.name, func(t *testing.T) {
			o := decodeExample(t, ex)
			if len(o.deployments) == 0 {
				t.Fatal("no Deployment")
			}
			for _, dep := range o.deployments {
				for _, err := range checkDeployment(t, dep, o, imageUser) {
					t.Errorf("Deployment %s: %v", dep.Name, err)
				}
				for _, c := range dep.Spec.Template.Spec.Containers {
					if isGatewayImage(c.Image) {
						images[c.Image] = append(images[c.Image], ex.name)
					}
				}
			}
		})
	}
	if want := "ratelimit-proxy:" + chartMeta(t).AppVersion; len(images) != 1 || images[want] == nil {
		t.Errorf("the examples run the gateway from %v; want one image, the chart's %s (what make image builds)", images, want)
	}
}

// isGatewayImage says whether image is built from this repository's Dockerfile.
func isGatewayImage(image string) bool {
	repo, _, _ := strings.Cut(path.Base(image), ":")
	return repo == "ratelimit-proxy"
}

// checkDeployment returns every rule dep breaks.
func checkDeployment(t *testing.T, dep *appsv1.Deployment, o objects, imageUser int64) []error {
	t.Helper()
	var errs []error
	fail := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	ns := dep.Namespace
	pod := dep.Spec.Template.Spec
	podLabels := labels.Set(dep.Spec.Template.Labels)
	if sel, err := metav1.LabelSelectorAsSelector(dep.Spec.Selector); err != nil || !sel.Matches(podLabels) {
		fail("selector %v does not select its own pods %v (%v)", dep.Spec.Selector, podLabels, err)
	}

	if sa := pod.ServiceAccountName; sa != "" && sa != "default" && !o.serviceAccounts[nsName(ns, sa)] {
		fail("serviceAccountName %q: no such ServiceAccount in the example (the ReplicaSet's pods are refused)", sa)
	}
	volumes := map[string]corev1.Volume{}
	for _, v := range pod.Volumes {
		volumes[v.Name] = v
		for _, ref := range volumeRefs(v) {
			if ref.secret && !o.secrets[nsName(ns, ref.name)] {
				fail("volume %s: no Secret %q in the example (the pod never starts)", v.Name, ref.name)
			}
			if !ref.secret && o.configMaps[nsName(ns, ref.name)] == nil {
				fail("volume %s: no ConfigMap %q in the example (the pod never starts)", v.Name, ref.name)
			}
		}
	}

	for _, c := range slices.Concat(pod.InitContainers, pod.Containers) {
		nonRoot, user := effectiveUser(pod.SecurityContext, c.SecurityContext)
		switch {
		case nonRoot && user == nil:
			// The kubelet then reads the image's USER and refuses a name ("image has
			// non-numeric user, cannot verify user is non-root"): a number in the manifest
			// holds whatever the image says.
			fail("container %s: runAsNonRoot with no runAsUser: the kubelet verifies only a numeric user; set runAsUser", c.Name)
		case nonRoot && *user == 0:
			fail("container %s: runAsNonRoot with runAsUser 0", c.Name)
		case isGatewayImage(c.Image) && user != nil && *user != imageUser:
			fail("container %s: runAsUser %d, but the Dockerfile's USER is %d", c.Name, *user, imageUser)
		}
		for _, e := range c.EnvFrom {
			if e.ConfigMapRef != nil && !ptrTrue(e.ConfigMapRef.Optional) && o.configMaps[nsName(ns, e.ConfigMapRef.Name)] == nil {
				fail("container %s: envFrom ConfigMap %q is not in the example", c.Name, e.ConfigMapRef.Name)
			}
			if e.SecretRef != nil && !ptrTrue(e.SecretRef.Optional) && !o.secrets[nsName(ns, e.SecretRef.Name)] {
				fail("container %s: envFrom Secret %q is not in the example", c.Name, e.SecretRef.Name)
			}
		}
		for _, e := range c.Env {
			if r := e.ValueFrom; r != nil && r.ConfigMapKeyRef != nil && !ptrTrue(r.ConfigMapKeyRef.Optional) && o.configMaps[nsName(ns, r.ConfigMapKeyRef.Name)] == nil {
				fail("container %s: env %s: ConfigMap %q is not in the example", c.Name, e.Name, r.ConfigMapKeyRef.Name)
			}
			if r := e.ValueFrom; r != nil && r.SecretKeyRef != nil && !ptrTrue(r.SecretKeyRef.Optional) && !o.secrets[nsName(ns, r.SecretKeyRef.Name)] {
				fail("container %s: env %s: Secret %q is not in the example", c.Name, e.Name, r.SecretKeyRef.Name)
			}
		}
		for _, m := range c.VolumeMounts {
			v, ok := volumes[m.Name]
			if !ok {
				fail("container %s: mounts volume %s, which the pod does not define", c.Name, m.Name)
				continue
			}
			if (m.SubPath != "" || m.SubPathExpr != "") && len(volumeRefs(v)) > 0 {
				fail("container %s: %s is mounted with subPath, which Kubernetes never updates: no reload or certificate renewal reaches it", c.Name, m.MountPath)
			}
		}
	}

	gw, ports, err := gatewayPorts(pod, o, ns, parseDockerfile(t, filepath.Join(root(), "Dockerfile")).env())
	if err != nil {
		fail("%v", err)
		return errs
	}
	for _, svc := range o.services {
		if svc.Namespace != ns || len(svc.Spec.Selector) == 0 || !labels.SelectorFromSet(svc.Spec.Selector).Matches(podLabels) {
			continue
		}
		for _, sp := range svc.Spec.Ports {
			n, ok := targetPort(gw, sp)
			if !ok {
				fail("Service %s port %s: targetPort %s is no port of container %s", svc.Name, sp.Name, sp.TargetPort.String(), gw.Name)
			}
			if n == ports.admin && svc.Spec.ClusterIP != corev1.ClusterIPNone {
				fail("Service %s exposes the admin port %d (unauthenticated /metrics, /healthz, /readyz; docs/operations.md: never expose admin_listen); only a headless Service for Prometheus may name it", svc.Name, n)
			}
		}
	}
	for _, p := range ports.list() {
		errs = append(errs, checkIngress(p, gw, podLabels, ns, o.netpols)...)
	}
	return errs
}

func ptrTrue(b *bool) bool { return b != nil && *b }

type volumeRef struct {
	name   string
	secret bool
}

// volumeRefs lists the ConfigMaps and Secrets a volume reads (whose files Kubernetes updates).
func volumeRefs(v corev1.Volume) []volumeRef {
	var refs []volumeRef
	if v.ConfigMap != nil && !ptrTrue(v.ConfigMap.Optional) {
		refs = append(refs, volumeRef{v.ConfigMap.Name, false})
	}
	if v.Secret != nil && !ptrTrue(v.Secret.Optional) {
		refs = append(refs, volumeRef{v.Secret.SecretName, true})
	}
	if v.Projected != nil {
		for _, s := range v.Projected.Sources {
			if s.ConfigMap != nil && !ptrTrue(s.ConfigMap.Optional) {
				refs = append(refs, volumeRef{s.ConfigMap.Name, false})
			}
			if s.Secret != nil && !ptrTrue(s.Secret.Optional) {
				refs = append(refs, volumeRef{s.Secret.Name, true})
			}
		}
	}
	return refs
}

// effectiveUser is the container's runAsNonRoot and runAsUser, the pod's where it sets none.
func effectiveUser(pod *corev1.PodSecurityContext, c *corev1.SecurityContext) (bool, *int64) {
	var nonRoot *bool
	var user *int64
	if pod != nil {
		nonRoot, user = pod.RunAsNonRoot, pod.RunAsUser
	}
	if c != nil && c.RunAsNonRoot != nil {
		nonRoot = c.RunAsNonRoot
	}
	if c != nil && c.RunAsUser != nil {
		user = c.RunAsUser
	}
	return ptrTrue(nonRoot), user
}

// dockerfileUser is the numeric user the image runs as, or -1 when its last USER is a name.
func dockerfileUser(t *testing.T) int64 {
	t.Helper()
	uid, _, _ := strings.Cut(parseDockerfile(t, filepath.Join(root(), "Dockerfile")).user(), ":")
	n, err := strconv.ParseInt(uid, 10, 64)
	if err != nil {
		return -1
	}
	return n
}

// TestDockerfileUserNumeric: the image's user is a non-zero number, with a numeric group, so
// that runAsNonRoot can be verified on any cluster.
func TestDockerfileUserNumeric(t *testing.T) {
	if u := dockerfileUser(t); u <= 0 {
		t.Errorf("the Dockerfile's last USER is not a non-zero number (got %d): a kubelet with runAsNonRoot refuses a named user (\"image has non-numeric user\")", u)
	}
}

// gwPorts are the ports the gateway's configuration listens on (0 when it does not).
type gwPorts struct{ listen, admin, rls int }

func (p gwPorts) list() []namedPort {
	var l []namedPort
	for _, np := range []namedPort{{"listen", p.listen}, {"admin_listen", p.admin}, {"rls.listen", p.rls}} {
		if np.port != 0 {
			l = append(l, np)
		}
	}
	return l
}

type namedPort struct {
	what string
	port int
}

var configArg = regexp.MustCompile(`^--?config(=.*)?$`)

// gatewayPorts finds the container that runs the gateway, reads its configuration from the
// ConfigMap its mount holds, and returns the ports that configuration listens on.
func gatewayPorts(pod corev1.PodSpec, o objects, ns string, imageEnv []string) (corev1.Container, gwPorts, error) {
	for _, c := range pod.Containers {
		if !isGatewayImage(c.Image) {
			continue
		}
		file := ""
		for i, a := range c.Args {
			if m := configArg.FindStringSubmatch(a); m != nil {
				if m[1] != "" {
					file = m[1][1:]
				} else if i+1 < len(c.Args) {
					file = c.Args[i+1]
				}
			}
		}
		if file == "" {
			return c, gwPorts{}, fmt.Errorf("container %s: no --config argument", c.Name)
		}
		text, err := mountedFile(pod, c, o, ns, file)
		if err != nil {
			return c, gwPorts{}, fmt.Errorf("container %s: %w", c.Name, err)
		}
		var cfg struct {
			Listen      string `yaml:"listen"`
			AdminListen string `yaml:"admin_listen"`
			RLS         struct {
				Listen string `yaml:"listen"`
			} `yaml:"rls"`
		}
		if err := yaml.Unmarshal([]byte(text), &cfg); err != nil {
			return c, gwPorts{}, fmt.Errorf("%s: %w", file, err)
		}
		var p gwPorts
		for _, f := range []struct {
			addr string
			port *int
		}{{cfg.Listen, &p.listen}, {cfg.AdminListen, &p.admin}, {cfg.RLS.Listen, &p.rls}} {
			if f.addr == "" {
				continue
			}
			_, port, err := net.SplitHostPort(f.addr)
			if err == nil {
				*f.port, err = strconv.Atoi(port)
			}
			if err != nil {
				return c, p, fmt.Errorf("%s: address %q: %w", file, f.addr, err)
			}
		}
		// The image's environment, then the container's, override the file (as the gateway
		// reads RATELIMIT_* over its configuration).
		env := imageEnv
		for _, e := range c.Env {
			env = append(env, e.Name+"="+e.Value)
		}
		p = applyEnv(p, env)
		if p.admin == 0 {
			return c, p, fmt.Errorf("%s: no admin_listen (probes and Prometheus need it)", file)
		}
		return c, p, nil
	}
	return corev1.Container{}, gwPorts{}, fmt.Errorf("no container runs the gateway's image")
}

// applyEnv overrides the ports with RATELIMIT_LISTEN, RATELIMIT_ADMIN_LISTEN and
// RATELIMIT_RLS_LISTEN from env (K=V, later ones winning).
func applyEnv(p gwPorts, env []string) gwPorts {
	for _, e := range env {
		k, v, _ := strings.Cut(e, "=")
		var port *int
		switch k {
		case "RATELIMIT_LISTEN":
			port = &p.listen
		case "RATELIMIT_ADMIN_LISTEN":
			port = &p.admin
		case "RATELIMIT_RLS_LISTEN":
			port = &p.rls
		default:
			continue
		}
		if _, s, err := net.SplitHostPort(v); err == nil {
			if n, err := strconv.Atoi(s); err == nil {
				*port = n
			}
		}
	}
	return p
}

// mountedFile returns what container c reads at file: the key of the ConfigMap mounted there.
func mountedFile(pod corev1.PodSpec, c corev1.Container, o objects, ns, file string) (string, error) {
	for _, m := range c.VolumeMounts {
		key := ""
		switch {
		case m.SubPath != "" && m.MountPath == file:
			key = m.SubPath
		case m.SubPath == "" && path.Dir(file) == path.Clean(m.MountPath):
			key = path.Base(file)
		default:
			continue
		}
		for _, v := range pod.Volumes {
			if v.Name == m.Name && v.ConfigMap != nil {
				cm := o.configMaps[nsName(ns, v.ConfigMap.Name)]
				if cm == nil {
					return "", fmt.Errorf("%s: ConfigMap %s is not in the example", file, v.ConfigMap.Name)
				}
				text, ok := cm.Data[key]
				if !ok {
					return "", fmt.Errorf("%s: ConfigMap %s has no key %s", file, cm.Name, key)
				}
				return text, nil
			}
		}
	}
	return "", fmt.Errorf("%s is in no mounted ConfigMap", file)
}

// targetPort resolves a Service port to the container's port number.
func targetPort(c corev1.Container, sp corev1.ServicePort) (int, bool) {
	tp := sp.TargetPort
	if tp.Type == intstr.Int && tp.IntVal == 0 {
		tp = intstr.FromInt32(sp.Port)
	}
	for _, cp := range c.Ports {
		if (tp.Type == intstr.String && cp.Name == tp.StrVal) || (tp.Type == intstr.Int && cp.ContainerPort == tp.IntVal) {
			return int(cp.ContainerPort), true
		}
	}
	return 0, tp.Type == intstr.Int // a number need not be declared
}

// checkIngress: some NetworkPolicy selecting the pod admits the port, and the admin and RLS
// ports only from named peers (the first serves unauthenticated metrics, the second spends
// any client's budget).
func checkIngress(p namedPort, c corev1.Container, podLabels labels.Set, ns string, netpols []*networkingv1.NetworkPolicy) []error {
	selected, admitted := false, false
	var errs []error
	for _, np := range netpols {
		sel, err := metav1.LabelSelectorAsSelector(&np.Spec.PodSelector)
		if err != nil {
			errs = append(errs, fmt.Errorf("NetworkPolicy %s: %w", np.Name, err))
			continue
		}
		ingress := slices.Contains(np.Spec.PolicyTypes, networkingv1.PolicyTypeIngress) || len(np.Spec.PolicyTypes) == 0
		if np.Namespace != ns || !ingress || !sel.Matches(podLabels) {
			continue
		}
		selected = true
		for _, rule := range np.Spec.Ingress {
			if !rulePorts(rule.Ports, c, p.port) {
				continue
			}
			admitted = true
			if p.what != "listen" && len(rule.From) == 0 {
				errs = append(errs, fmt.Errorf("NetworkPolicy %s admits %s (port %d) from every pod: name its callers", np.Name, p.what, p.port))
			}
		}
	}
	switch {
	case !selected:
		errs = append(errs, fmt.Errorf("no NetworkPolicy selects the pods: %s (port %d) is open to every pod", p.what, p.port))
	case !admitted:
		errs = append(errs, fmt.Errorf("no NetworkPolicy rule admits %s (port %d): it is unreachable", p.what, p.port))
	}
	return errs
}

func rulePorts(ports []networkingv1.NetworkPolicyPort, c corev1.Container, port int) bool {
	if len(ports) == 0 {
		return true
	}
	for _, np := range ports {
		switch {
		case np.Port == nil:
			return true
		case np.Port.Type == intstr.Int && int(np.Port.IntVal) == port:
			return true
		case np.Port.Type == intstr.String:
			for _, cp := range c.Ports {
				if cp.Name == np.Port.StrVal && int(cp.ContainerPort) == port {
					return true
				}
			}
		}
	}
	return false
}
