package dynamolocal_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/testkit/dynamolocal"
)

// These tests need no Java, but one: the real DynamoDB Local is exercised by the store, relay
// and end-to-end tests that use this package. Start and Stop run a stand-in script here, except
// in TestStartedInstanceDiesWithItsOwner, which needs the real one's process.

func TestEndpointIsReturnedAsIs(t *testing.T) {
	for _, ci := range []string{"", "true"} {
		t.Setenv("CI", ci)
		t.Setenv("DYNAMODB_ENDPOINT", "http://127.0.0.1:1/some/path")
		got, err := dynamolocal.Endpoint()
		if err != nil || got != "http://127.0.0.1:1/some/path" {
			t.Errorf("CI=%q: Endpoint() got %q, %v; want the variable as is", ci, got, err)
		}
		inst, err := dynamolocal.Find(context.Background())
		if err != nil || inst.Endpoint != "http://127.0.0.1:1/some/path" {
			t.Fatalf("CI=%q: Find got %+v, %v; want the variable as is", ci, inst, err)
		}
		// Nothing was started, so there is nothing to stop (and no script is needed).
		if err := inst.Stop(); err != nil || inst.PID() != 0 {
			t.Errorf("CI=%q: Stop of a running instance got %v, pid %d; want nil, 0", ci, err, inst.PID())
		}
	}
}

func TestCIWithoutEndpointIsAnError(t *testing.T) {
	t.Setenv("CI", "true")
	t.Setenv("DYNAMODB_ENDPOINT", "")
	calls := fakeScript(t, `echo "$1" >>"$CALLS"; exit 99`)
	inst, err := dynamolocal.Find(context.Background())
	if err == nil {
		t.Fatalf("Find under CI=true without DYNAMODB_ENDPOINT: got %+v, want an error", inst)
	}
	for _, want := range []string{"DYNAMODB_ENDPOINT is not set in CI", "scripts/dynamodb-local.sh start"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
	if err := inst.Stop(); err != nil {
		t.Errorf("Stop of the nil instance: %v", err)
	}
	if _, serr := os.Stat(calls); !os.IsNotExist(serr) {
		t.Errorf("the script was run under CI=true (%v): CI must never start its own", serr)
	}
	rec := unavailable(err)
	if rec.fatal == "" || rec.skip != "" || !strings.Contains(rec.fatal, "DYNAMODB_ENDPOINT is not set in CI") {
		t.Errorf("Unavailable under CI=true: got fatal %q, skip %q; want a failure, never a skip", rec.fatal, rec.skip)
	}
}

func TestUnavailableSkipsOutsideCI(t *testing.T) {
	t.Setenv("CI", "")
	t.Setenv("DYNAMODB_ENDPOINT", "")
	_, err := dynamolocal.Endpoint()
	if err == nil || !strings.Contains(err.Error(), "run make test") {
		t.Fatalf("Endpoint() without the variable: got %v, want an error that says to run make test", err)
	}
	rec := unavailable(err)
	if rec.skip == "" || rec.fatal != "" {
		t.Errorf("Unavailable outside CI: got fatal %q, skip %q; want a skip", rec.fatal, rec.skip)
	}
}

// TestFindStartsAndStopsItsOwn runs Find outside CI without DYNAMODB_ENDPOINT against a stand-in
// script that records its calls: Find starts one in a fresh state directory and returns the URL
// the script prints; Stop stops that one and removes the directory.
func TestFindStartsAndStopsItsOwn(t *testing.T) {
	t.Setenv("CI", "")
	t.Setenv("DYNAMODB_ENDPOINT", "")
	calls := fakeScript(t, `echo "$1 $DYNAMODB_LOCAL_STATE_DIR" >>"$CALLS"
if [ "$1" = start ]; then echo 4242 >"$DYNAMODB_LOCAL_STATE_DIR/dynamodb-local.pid"; echo "  http://127.0.0.1:4242 "; fi`)
	inst, err := dynamolocal.Find(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if inst.Endpoint != "http://127.0.0.1:4242" || inst.PID() != 4242 {
		t.Errorf("got endpoint %q, pid %d; want http://127.0.0.1:4242, 4242", inst.Endpoint, inst.PID())
	}
	lines := readLines(t, calls)
	if len(lines) != 2 || lines[0] != "stop "+stateDir(lines[0]) || lines[1] != "start "+stateDir(lines[0]) {
		t.Fatalf("script calls got %q, want a stop of any leftover, then a start, in one state directory", lines)
	}
	dir := stateDir(lines[0])
	if _, err := os.Stat(dir); err != nil {
		t.Fatalf("state directory while running: %v", err)
	}
	if err := inst.Stop(); err != nil {
		t.Fatal(err)
	}
	if err := inst.Stop(); err != nil {
		t.Fatalf("second Stop: %v", err)
	}
	if lines := readLines(t, calls); len(lines) != 3 || lines[2] != "stop "+dir {
		t.Errorf("script calls got %q, want one more: stop %s", lines, dir)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("state directory after Stop: got %v, want it removed", err)
	}
}

// TestLazyFindsOnceAndStopsAtTheEnd: many tests (concurrently, too) share the one instance the
// first Get started, and Stop stops it once.
func TestLazyFindsOnceAndStopsAtTheEnd(t *testing.T) {
	t.Setenv("CI", "")
	t.Setenv("DYNAMODB_ENDPOINT", "")
	calls := fakeScript(t, `echo "$1" >>"$CALLS"; if [ "$1" = start ]; then echo http://127.0.0.1:4243; fi`)
	var (
		l  dynamolocal.Lazy
		wg sync.WaitGroup
	)
	for range 4 {
		wg.Go(func() {
			inst, err := l.Get()
			if err != nil || inst.Endpoint != "http://127.0.0.1:4243" {
				t.Errorf("Get got %+v, %v; want http://127.0.0.1:4243", inst, err)
			}
		})
	}
	wg.Wait()
	l.Stop()
	l.Stop()
	if got := strings.Join(readLines(t, calls), ","); got != "stop,start,stop" {
		t.Errorf("script calls got %s, want stop,start,stop (one start, one stop)", got)
	}
}

func TestStartFailureSaysWhyAndCanBeStopped(t *testing.T) {
	calls := fakeScript(t, `echo "$1" >>"$CALLS"
if [ "$1" = start ]; then echo "dynamodb-local: java not found; install a JRE" >&2; exit 1; fi`)
	dir := filepath.Join(t.TempDir(), "state")
	inst, err := dynamolocal.Start(context.Background(), dir)
	if err == nil || !strings.Contains(err.Error(), "scripts/dynamodb-local.sh start") || !strings.Contains(err.Error(), "java not found; install a JRE") {
		t.Fatalf("got %v, want an error naming the script and carrying its message", err)
	}
	if inst == nil {
		t.Fatal("a failed start returned no instance to stop")
	}
	if err := inst.Stop(); err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(readLines(t, calls), ","); got != "stop,start,stop" {
		t.Errorf("script calls got %s, want stop,start,stop", got)
	}
	// Start's state directory belongs to the caller (the bench keeps its log there).
	if _, err := os.Stat(dir); err != nil {
		t.Errorf("state directory after Stop: %v, want it kept", err)
	}
}

func TestScriptIsFoundFromAPackageDirectory(t *testing.T) {
	p, err := dynamolocal.Script()
	if err != nil {
		t.Fatal(err)
	}
	want, _ := filepath.Abs(filepath.Join("..", "..", "..", "scripts", "dynamodb-local.sh"))
	if p != want {
		t.Errorf("got %s, want %s", p, want)
	}
	t.Chdir(t.TempDir())
	if p, err := dynamolocal.Script(); err == nil || !strings.Contains(err.Error(), "not found") {
		t.Errorf("outside the repository: got %q, %v; want a not-found error", p, err)
	}
}

// TestEnvHidesTheMachinesCredentials: with a developer's real-looking credentials, profile and
// files in the environment, the variables of Env (applied as a child process gets them, last
// value wins) make the SDK's default chain resolve only the dummy credentials and region.
func TestEnvHidesTheMachinesCredentials(t *testing.T) {
	home := t.TempDir()
	creds := filepath.Join(home, "credentials")
	if err := os.WriteFile(creds, []byte("[default]\naws_access_key_id = AKIAREALDEFAULT\naws_secret_access_key = realdefault\n[work]\naws_access_key_id = AKIAREALWORK\naws_secret_access_key = realwork\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfgFile := filepath.Join(home, "config")
	if err := os.WriteFile(cfgFile, []byte("[default]\nregion = eu-west-3\n[profile work]\nregion = eu-west-3\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	machine := map[string]string{
		"HOME": home, "AWS_ACCESS_KEY_ID": "AKIAREALENV", "AWS_SECRET_ACCESS_KEY": "realenvsecret",
		"AWS_SESSION_TOKEN": "realenvtoken", "AWS_PROFILE": "work", "AWS_REGION": "eu-west-3",
		"AWS_DEFAULT_REGION": "eu-west-3", "AWS_CONFIG_FILE": cfgFile, "AWS_SHARED_CREDENTIALS_FILE": creds,
		"AWS_ENDPOINT_URL": "https://real.example", "AWS_ENDPOINT_URL_DYNAMODB": "https://real.example",
	}
	for k, v := range machine {
		t.Setenv(k, v)
	}
	seen := map[string]bool{}
	for _, kv := range dynamolocal.Env() {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || !strings.HasPrefix(k, "AWS_") {
			t.Errorf("Env entry %q: want AWS_NAME=value", kv)
		}
		for _, real := range machine {
			if v != "" && strings.Contains(v, real) {
				t.Errorf("Env entry %q carries the machine's %q", kv, real)
			}
		}
		seen[k] = true
		t.Setenv(k, v)
	}
	for k := range machine {
		if k != "HOME" && !seen[k] {
			t.Errorf("Env does not override %s", k)
		}
	}
	cfg, err := config.LoadDefaultConfig(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	got, err := cfg.Credentials.Retrieve(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if got.AccessKeyID != "AKIDLOCAL" || got.SecretAccessKey != "secret" || got.SessionToken != "" || cfg.Region != "us-east-1" {
		t.Errorf("resolved %s/%s/%q in %s; want AKIDLOCAL/secret/\"\" in us-east-1", got.AccessKeyID, got.SecretAccessKey, got.SessionToken, cfg.Region)
	}
	if cfg.BaseEndpoint != nil {
		t.Errorf("resolved endpoint override %q, want none", *cfg.BaseEndpoint)
	}
}

// TestNewClientSignsWithTheDummyCredentials sends a real request over a socket and checks who
// signed it, for which region, and that the caller's options apply (retries off).
func TestNewClientSignsWithTheDummyCredentials(t *testing.T) {
	t.Setenv("AWS_ACCESS_KEY_ID", "AKIAREALENV")
	t.Setenv("AWS_SECRET_ACCESS_KEY", "realenvsecret")
	var (
		mu    sync.Mutex
		auths []string
	)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		auths = append(auths, r.Header.Get("Authorization"))
		mu.Unlock()
		w.WriteHeader(http.StatusInternalServerError) // retryable: only RetryMaxAttempts stops a retry
		fmt.Fprint(w, `{"__type":"com.amazonaws.dynamodb.v20120810#InternalServerError","message":"boom"}`)
	}))
	t.Cleanup(srv.Close)
	c, err := dynamolocal.NewClient(context.Background(), srv.URL, func(o *dynamodb.Options) { o.RetryMaxAttempts = 1 })
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.DescribeTable(context.Background(), &dynamodb.DescribeTableInput{TableName: aws.String("t")}); err == nil {
		t.Fatal("DescribeTable got no error from a server that answers 500")
	}
	mu.Lock()
	defer mu.Unlock()
	if len(auths) != 1 {
		t.Fatalf("got %d requests, want 1 (retries off)", len(auths))
	}
	if !strings.Contains(auths[0], "Credential=AKIDLOCAL/") || !strings.Contains(auths[0], "/us-east-1/dynamodb/aws4_request") {
		t.Errorf("Authorization %q: want it signed by AKIDLOCAL for us-east-1", auths[0])
	}
}

// fakeScript puts a stand-in scripts/dynamodb-local.sh with the given body in a temporary
// directory, makes it the working directory, and returns the file the body may log calls to
// (as $CALLS).
func fakeScript(t *testing.T, body string) string {
	t.Helper()
	root := t.TempDir()
	if err := os.MkdirAll(filepath.Join(root, "scripts"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "scripts", "dynamodb-local.sh"), []byte("#!/bin/sh\n"+body+"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	calls := filepath.Join(root, "calls")
	t.Setenv("CALLS", calls)
	t.Chdir(root)
	return calls
}

func readLines(t *testing.T, path string) []string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return strings.Split(strings.TrimSpace(string(b)), "\n")
}

// stateDir is the directory in a "verb DIR" call line.
func stateDir(line string) string {
	_, dir, _ := strings.Cut(line, " ")
	return dir
}

// recorder is a TB that records how a test would have ended. Like testing.T, its Fatalf and
// Skipf end the goroutine, so unavailable runs Unavailable on a goroutine of its own.
type recorder struct{ fatal, skip string }

func (r *recorder) Helper()                      {}
func (r *recorder) Fatalf(f string, args ...any) { r.fatal = fmt.Sprintf(f, args...); runtime.Goexit() }
func (r *recorder) Skipf(f string, args ...any)  { r.skip = fmt.Sprintf(f, args...); runtime.Goexit() }

func unavailable(err error) *recorder {
	r := &recorder{}
	done := make(chan struct{})
	go func() {
		defer close(done)
		dynamolocal.Unavailable(r, err)
	}()
	<-done
	return r
}

// TestStartedInstanceDiesWithItsOwner runs the real script and Java: a child process (this test
// binary again) starts DynamoDB Local and exits without stopping it, as a test that panics does;
// the instance must be gone within seconds, not left running.
func TestStartedInstanceDiesWithItsOwner(t *testing.T) {
	if dir := os.Getenv("DYNAMOLOCAL_OWNER_CHILD"); dir != "" {
		inst, err := dynamolocal.Start(context.Background(), dir)
		if err != nil {
			fmt.Println("error:", err)
			os.Exit(1)
		}
		fmt.Println("pid:", inst.PID())
		os.Exit(0) // no Stop
	}
	if _, err := exec.LookPath("java"); err != nil {
		if dynamolocal.InCI() {
			t.Fatalf("java: %v", err)
		}
		t.Skipf("java not found: %v", err)
	}
	dir := t.TempDir()
	script, err := dynamolocal.Script()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { // whatever happens, nothing left behind
		cmd := exec.Command(script, "stop")
		cmd.Env = append(os.Environ(), "DYNAMODB_LOCAL_STATE_DIR="+dir)
		_ = cmd.Run()
	})
	cmd := exec.Command(os.Args[0], "-test.run=^TestStartedInstanceDiesWithItsOwner$")
	cmd.Env = append(os.Environ(), "DYNAMOLOCAL_OWNER_CHILD="+dir)
	out, err := cmd.Output()
	var pid int
	if _, serr := fmt.Sscanf(string(out), "pid: %d", &pid); err != nil || serr != nil || pid == 0 {
		t.Fatalf("child: %v, output %q", err, out)
	}
	for deadline := time.Now().Add(20 * time.Second); syscall.Kill(pid, 0) == nil; time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("DynamoDB Local (pid %d) still running 20s after the process that started it exited", pid)
		}
	}
}
