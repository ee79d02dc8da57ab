package deploy_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/moby/buildkit/frontend/dockerfile/instructions"
	"github.com/moby/buildkit/frontend/dockerfile/parser"
)

// dockerfile is the repository's Dockerfile, parsed by BuildKit's own parser (what `docker
// build` reads).
type dockerfile struct {
	stages []instructions.Stage
}

func parseDockerfile(t *testing.T, file string) dockerfile {
	t.Helper()
	f, err := os.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	res, err := parser.Parse(f)
	if err != nil {
		t.Fatalf("%s: %v", file, err)
	}
	for _, w := range res.Warnings {
		t.Errorf("%s: %s", file, w.Short)
	}
	stages, _, err := instructions.Parse(res.AST, nil)
	if err != nil {
		t.Fatalf("%s: %v", file, err)
	}
	if len(stages) == 0 {
		t.Fatalf("%s: no stage", file)
	}
	return dockerfile{stages}
}

// final is the stage the image is made of.
func (d dockerfile) final() instructions.Stage { return d.stages[len(d.stages)-1] }

// env is the environment the image's process starts with (its final stage's ENV), K=V.
func (d dockerfile) env() []string {
	var env []string
	for _, c := range d.final().Commands {
		if e, ok := c.(*instructions.EnvCommand); ok {
			for _, kv := range e.Env {
				env = append(env, kv.Key+"="+kv.Value)
			}
		}
	}
	return env
}

// user is the final stage's last USER ("" when none).
func (d dockerfile) user() string {
	user := ""
	for _, c := range d.final().Commands {
		if u, ok := c.(*instructions.UserCommand); ok {
			user = u.User
		}
	}
	return user
}

// TestImageEnvLeavesConfigAlone: the image sets no RATELIMIT_* variable. Each overrides the
// configuration file a ConfigMap or the chart mounts: with RATELIMIT_LISTEN=:8080 in the
// image, the gRPC example listened on 8080 while its Service and NetworkPolicy said 8443, and
// the chart's port values moved nothing. (TestKubernetesManifestsAdmitted reads the ports with
// the image's environment applied, as the gateway does.)
func TestImageEnvLeavesConfigAlone(t *testing.T) {
	for _, e := range parseDockerfile(t, filepath.Join(root(), "Dockerfile")).env() {
		if strings.HasPrefix(e, "RATELIMIT_") {
			t.Errorf("the Dockerfile sets %s: it overrides every mounted configuration file", e)
		}
	}
}

// TestImageEnvCheckCatches: the previous Dockerfile, which set the listeners by ENV, is caught.
func TestImageEnvCheckCatches(t *testing.T) {
	old := filepath.Join(t.TempDir(), "Dockerfile")
	if err := os.WriteFile(old, []byte("FROM scratch\nENV RATELIMIT_LISTEN=:8080 RATELIMIT_ADMIN_LISTEN=:9090\nUSER 65532:65532\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	d := parseDockerfile(t, old)
	p := gwPorts{listen: 8443, admin: 9090}
	if got := applyEnv(p, d.env()); got.listen != 8080 {
		t.Errorf("the image's RATELIMIT_LISTEN=:8080 was not applied to the ports: %+v", got)
	}
	if d.user() != "65532:65532" {
		t.Errorf("USER: got %q", d.user())
	}
}

// TestDockerfileBuildStage runs the build stage's commands as `docker build` would (no engine
// runs here): in a copy of the build context, with the stage's WORKDIR, ARG defaults and ENV,
// its RUN lines through sh -c with their absolute paths moved under a scratch root. Then every
// file the final stage copies exists (from the context or from the build stage), the binary
// runs, and the image's default configuration validates and listens off loopback.
func TestDockerfileBuildStage(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	d := parseDockerfile(t, filepath.Join(root(), "Dockerfile"))
	if len(d.stages) < 2 {
		t.Fatalf("%d stages, want a build stage and the image", len(d.stages))
	}
	build := d.stages[0]
	if build.Name == "" {
		t.Fatal("the build stage has no name (FROM ... AS build)")
	}
	if want := "golang:" + goModVersion(t); build.BaseName != want {
		t.Errorf("the build stage's image is %s; go.mod asks for %s (another Go would download a toolchain)", build.BaseName, want)
	}
	scratch := t.TempDir()
	rooted := func(p string) string { return filepath.Join(scratch, p) }
	absRoot, err := filepath.Abs(root())
	if err != nil {
		t.Fatal(err)
	}
	env := append(os.Environ(), "GOFLAGS=-mod=readonly")
	vars := map[string]string{}
	workdir := "/"
	for _, c := range build.Commands {
		switch c := c.(type) {
		case *instructions.WorkdirCommand:
			workdir = c.Path
		case *instructions.ArgCommand:
			for _, a := range c.Args {
				if a.Value != nil {
					vars[a.Key] = *a.Value
				}
			}
		case *instructions.EnvCommand:
			for _, kv := range c.Env {
				vars[kv.Key] = kv.Value
			}
		case *instructions.CopyCommand:
			for _, src := range c.SourcePaths {
				if _, err := os.Stat(filepath.Join(absRoot, src)); err != nil {
					t.Errorf("build stage: COPY %s: %v", src, err)
				}
			}
		case *instructions.RunCommand:
			if !c.PrependShell || len(c.CmdLine) != 1 {
				t.Fatalf("build stage: RUN %v: only the shell form is run here", c.CmdLine)
			}
			line := moveAbsolute(c.CmdLine[0], scratch)
			cmd := exec.CommandContext(t.Context(), "sh", "-c", line)
			cmd.Dir = absRoot // WORKDIR holds a copy of the context
			cmd.Env = env
			for k, v := range vars {
				cmd.Env = append(cmd.Env, k+"="+v)
			}
			if out, err := cmd.CombinedOutput(); err != nil {
				t.Fatalf("build stage: RUN %s (in %s): %v\n%s", c.CmdLine[0], workdir, err, out)
			}
		}
	}

	// Every later stage's COPY finds its files: in the context, or in the build stage's output.
	image := d.final()
	var bin string
	for _, st := range d.stages[1:] {
		for _, c := range st.Commands {
			cp, ok := c.(*instructions.CopyCommand)
			if !ok {
				continue
			}
			for _, src := range cp.SourcePaths {
				var p string
				switch cp.From {
				case build.Name:
					p = rooted(src)
					if st.Name == image.Name {
						bin = p
					}
				case "":
					p = filepath.Join(absRoot, src)
				default:
					t.Errorf("stage %s: COPY --from=%s: no such stage", st.Name, cp.From)
					continue
				}
				if _, err := os.Stat(p); err != nil {
					t.Errorf("stage %s: COPY %s: %v", st.Name, src, err)
				}
			}
		}
	}
	if bin == "" {
		t.Fatal("the image copies nothing from the build stage")
	}
	out, err := exec.CommandContext(t.Context(), bin, "--version").CombinedOutput()
	if err != nil {
		t.Fatalf("%s --version: %v\n%s", bin, err, out)
	}

	// The default configuration: where CMD points, as COPY put it there.
	cfg := imageFile(t, image, absRoot, imageCmdConfig(t, image))
	out, err = exec.CommandContext(t.Context(), bin, "validate", "--config", cfg).CombinedOutput()
	if err != nil {
		t.Fatalf("the image's configuration does not validate: %v\n%s", err, out)
	}
	text, err := os.ReadFile(cfg)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range regexp.MustCompile(`(?m)^(listen|admin_listen):\s*"?([^"\s#]*)`).FindAllStringSubmatch(string(text), -1) {
		if strings.HasPrefix(m[2], "127.") || strings.HasPrefix(m[2], "localhost") {
			t.Errorf("the image's configuration: %s %s is unreachable from outside the container", m[1], m[2])
		}
	}
}

var absPath = regexp.MustCompile(`(^|[\s="])(/[a-z][^\s"]*)`)

// moveAbsolute moves the absolute paths of a RUN line under scratch (what the build's
// container would write at /out writes at scratch/out).
func moveAbsolute(line, scratch string) string {
	return absPath.ReplaceAllString(line, "${1}"+scratch+"${2}")
}

// imageCmdConfig is the --config argument of the image's CMD.
func imageCmdConfig(t *testing.T, s instructions.Stage) string {
	t.Helper()
	for _, c := range s.Commands {
		if cmd, ok := c.(*instructions.CmdCommand); ok {
			for i, a := range cmd.CmdLine {
				if a == "--config" && i+1 < len(cmd.CmdLine) {
					return cmd.CmdLine[i+1]
				}
			}
		}
	}
	t.Fatal("the image's CMD has no --config")
	return ""
}

// imageFile is the file of the build context that the stage copies to dest.
func imageFile(t *testing.T, s instructions.Stage, buildContext, dest string) string {
	t.Helper()
	for _, c := range s.Commands {
		if cp, ok := c.(*instructions.CopyCommand); ok && cp.From == "" && cp.DestPath == dest && len(cp.SourcePaths) == 1 {
			return filepath.Join(buildContext, cp.SourcePaths[0])
		}
	}
	t.Fatalf("the image copies nothing to %s", dest)
	return ""
}

// goModVersion is go.mod's go line.
func goModVersion(t *testing.T) string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(root(), "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^go (\S+)`).FindSubmatch(data)
	if m == nil {
		t.Fatal("go.mod has no go line")
	}
	return string(m[1])
}

// TestMakeImageTag: `make image` tags the image the chart runs by default.
func TestMakeImageTag(t *testing.T) {
	cmd := exec.CommandContext(t.Context(), "make", "-s", "-n", "image")
	cmd.Dir = root()
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("make -n image: %v\n%s", err, out)
	}
	if want := "docker build -t ratelimit-proxy:" + chartMeta(t).AppVersion + " "; !strings.Contains(string(out), want) {
		t.Errorf("make image runs %q; want %q…", out, want)
	}
}
