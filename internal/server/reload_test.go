package server

import (
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/policy"
)

const baseConfig = "upstream: http://127.0.0.1:3000\n"

func policyYAML(name string, burst int) string {
	return "policies:\n  - name: " + name + "\n    key: ip\n    algorithm: token_bucket\n    rate: 1/s\n    burst: " +
		strconv.Itoa(burst) + "\n"
}

func newTestReloader(t *testing.T, content string) (*Reloader, string, *prometheus.Registry, *observer.ObservedLogs) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	core, logs := observer.New(zap.InfoLevel)
	reg := prometheus.NewRegistry()
	noEnv := func(string) string { return "" }
	r, _, err := NewReloader(path, policy.LoadOptions{Getenv: noEnv}, policy.CompileOptions{Getenv: noEnv}, zap.New(core), reg)
	if err != nil {
		t.Fatalf("NewReloader: %v", err)
	}
	return r, path, reg, logs
}

func reloads(t *testing.T, r *Reloader, result string) float64 {
	t.Helper()
	return testutil.ToFloat64(r.reloads.WithLabelValues(result))
}

func TestReloaderSwapsOnlyValidChanges(t *testing.T) {
	r, path, _, logs := newTestReloader(t, baseConfig+policyYAML("first", 5))
	first := r.Set()

	// A watcher event that changed nothing: nothing happens (no swap, nothing counted).
	if err := r.reload(false); err != nil {
		t.Fatalf("reload of an unchanged file: %v", err)
	}
	if r.Set() != first || reloads(t, r, "success") != 0 {
		t.Fatalf("an unchanged file was reloaded (success count %v)", reloads(t, r, "success"))
	}

	// Invalid content: an error naming the field, counted, and the running set stays.
	os.WriteFile(path, []byte(baseConfig+"policies:\n  - name: bad\n    key: ip\n    algorithm: token_bucket\n    rate: 10/x\n    burst: 5\n"), 0o600)
	err := r.Reload()
	if err == nil || !strings.Contains(err.Error(), `policies[0].rate: "10/x"`) {
		t.Fatalf("invalid reload error got %v, want one naming policies[0].rate", err)
	}
	if r.Set() != first {
		t.Fatal("an invalid file replaced the running policies")
	}
	if got := reloads(t, r, "error"); got != 1 {
		t.Errorf("error reloads got %v, want 1", got)
	}

	// Valid new content: swapped in.
	os.WriteFile(path, []byte(baseConfig+policyYAML("second", 7)), 0o600)
	if err := r.Reload(); err != nil {
		t.Fatalf("valid reload: %v", err)
	}
	if got := r.Set().Policies()[0].Name; got != "second" {
		t.Errorf("policy after reload got %q, want second", got)
	}
	if got := reloads(t, r, "success"); got != 1 {
		t.Errorf("success reloads got %v, want 1", got)
	}

	// A change to a restart-only field is applied to policies but reported, not silently taken.
	os.WriteFile(path, []byte("upstream: http://127.0.0.1:4000\nlisten: 127.0.0.1:8081\ngrpc_upstream_timeout: 5m\n"+policyYAML("third", 7)), 0o600)
	if err := r.Reload(); err != nil {
		t.Fatalf("reload with a changed upstream: %v", err)
	}
	var warned []string
	for _, e := range logs.FilterMessageSnippet("needs a restart").All() {
		warned = append(warned, e.ContextMap()["field"].(string))
	}
	if got := strings.Join(warned, ","); got != "listen,upstream,grpc_upstream_timeout" {
		t.Errorf("restart warnings got %q, want listen,upstream,grpc_upstream_timeout", got)
	}
}

func TestNewReloaderRefusesAnInvalidFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "config.yaml")
	os.WriteFile(path, []byte("policies: []\n"), 0o600)
	noEnv := func(string) string { return "" }
	_, _, err := NewReloader(path, policy.LoadOptions{Getenv: noEnv}, policy.CompileOptions{Getenv: noEnv}, zap.NewNop(), nil)
	if err == nil || !strings.Contains(err.Error(), "upstream") {
		t.Fatalf("got %v, want an error naming upstream", err)
	}
}

// rsaKeys are generated once: three 2048-bit keys cost a noticeable part of a second under -race.
var rsaKeys = sync.OnceValues(func() ([3]*rsa.PrivateKey, error) {
	var ks [3]*rsa.PrivateKey
	for i := range ks {
		k, err := rsa.GenerateKey(rand.Reader, 2048)
		if err != nil {
			return ks, err
		}
		ks[i] = k
	}
	return ks, nil
})

func testKeys(t *testing.T) [3]*rsa.PrivateKey {
	t.Helper()
	ks, err := rsaKeys()
	if err != nil {
		t.Fatal(err)
	}
	return ks
}

func publicKeyPEM(t *testing.T, k *rsa.PrivateKey) []byte {
	t.Helper()
	der, err := x509.MarshalPKIXPublicKey(&k.PublicKey)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der})
}

func writeRSAPublicKey(t *testing.T, path string, k *rsa.PrivateKey) {
	t.Helper()
	if err := os.WriteFile(path, publicKeyPEM(t, k), 0o600); err != nil {
		t.Fatal(err)
	}
}

// replaceFile replaces path with data atomically (a temporary file renamed over it).
func replaceFile(t *testing.T, path string, data []byte) {
	t.Helper()
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
}

// jwtConfig is a config whose only policy is keyed by the user of an RS256 token verified with
// the key in keyPath.
func jwtConfig(keyPath string) string {
	return baseConfig + "identity: {jwt: {rs256_public_key_file: " + keyPath + "}}\n" +
		"policies:\n  - {name: per-user, key: user, algorithm: token_bucket, rate: 1/s, burst: 5}\n"
}

func newJWTReloader(t *testing.T, cfgPath string) (*Reloader, *observer.ObservedLogs) {
	t.Helper()
	core, logs := observer.New(zap.InfoLevel)
	noEnv := func(string) string { return "" }
	r, _, err := NewReloader(cfgPath, policy.LoadOptions{Getenv: noEnv}, policy.CompileOptions{Getenv: noEnv}, zap.New(core), prometheus.NewRegistry())
	if err != nil {
		t.Fatalf("NewReloader: %v", err)
	}
	return r, logs
}

func newRequestWithBearer(t *testing.T, tok string) *http.Request {
	t.Helper()
	req := httptest.NewRequest(http.MethodGet, "http://proxy/", nil)
	req.Header.Set("Authorization", "Bearer "+tok)
	return req
}

// accepts reports whether set verifies a token signed with k.
func accepts(t *testing.T, set *policy.Set, k *rsa.PrivateKey) bool {
	t.Helper()
	tok, err := jwt.NewWithClaims(jwt.SigningMethodRS256,
		jwt.MapClaims{"sub": "alice", "exp": time.Now().Add(time.Hour).Unix()}).SignedString(k)
	if err != nil {
		t.Fatal(err)
	}
	err = set.Plan(newRequestWithBearer(t, tok), &policy.Plan{})
	if err != nil && !errors.Is(err, policy.ErrUnauthorized) {
		t.Fatalf("Plan: got %v, want nil or ErrUnauthorized", err)
	}
	return err == nil
}

// Rotating the JWT signing key: the operator replaces rs256_public_key_file (a mounted Secret)
// and sends SIGHUP. The YAML did not change, and the new key must be in force all the same.
func TestReloadPicksUpRotatedJWTKeyFile(t *testing.T) {
	ks, keyPath, r := newKeyFileReloader(t)

	writeRSAPublicKey(t, keyPath, ks[1]) // the rotation
	if err := r.Reload(); err != nil {   // what SIGHUP does
		t.Fatalf("Reload: %v", err)
	}
	if !accepts(t, r.Set(), ks[1]) {
		t.Error("token signed with the rotated key after a reload: got 401, want it accepted")
	}
	if accepts(t, r.Set(), ks[0]) {
		t.Error("token signed with the replaced key after a reload: got accepted, want 401")
	}
}

// A watcher event must see a change of the key file alone. The key path is relative, which
// policy resolves against the working directory: the change check must read the same file.
func TestReloadOnEventSeesKeyFileOnlyChangeAtRelativePath(t *testing.T) {
	ks := testKeys(t)
	dir := t.TempDir()
	t.Chdir(dir)
	if err := os.Mkdir("keys", 0o700); err != nil {
		t.Fatal(err)
	}
	writeRSAPublicKey(t, filepath.Join("keys", "jwt.pub.pem"), ks[0])
	cfgPath := filepath.Join(dir, "conf", "config.yaml")
	if err := os.Mkdir(filepath.Dir(cfgPath), 0o700); err != nil {
		t.Fatal(err)
	}
	writeFile(t, cfgPath, jwtConfig("keys/jwt.pub.pem"))
	r, logs := newJWTReloader(t, cfgPath)

	wantDirs := []string{filepath.Join(dir, "conf"), filepath.Join(dir, "keys")}
	if got := r.watchDirs(); !slices.Equal(got, wantDirs) {
		t.Errorf("watched dirs got %q, want %q", got, wantDirs)
	}

	writeRSAPublicKey(t, filepath.Join("keys", "jwt.pub.pem"), ks[1])
	if err := r.reload(false); err != nil {
		t.Fatalf("reload: %v", err)
	}
	if !accepts(t, r.Set(), ks[1]) {
		t.Error("rotated key after an event reload: got 401, want it accepted")
	}
	if got := reloads(t, r, "success"); got != 1 {
		t.Errorf("success reloads got %v, want 1", got)
	}
	entries := logs.FilterMessage("config reloaded").All()
	if len(entries) != 1 {
		t.Fatalf("got %d \"config reloaded\" log lines, want 1", len(entries))
	}
	if got := fmt.Sprint(entries[0].ContextMap()["changed"]); got != "[identity.jwt.rs256_public_key_file]" {
		t.Errorf("logged changed inputs got %s, want [identity.jwt.rs256_public_key_file]", got)
	}

	// Nothing changed since: the next event reloads nothing.
	set := r.Set()
	if err := r.reload(false); err != nil {
		t.Fatalf("reload: %v", err)
	}
	if got := reloads(t, r, "success"); r.Set() != set || got != 1 {
		t.Errorf("event with nothing changed: got a swap or a count (success reloads %v), want neither", got)
	}
}

// A key file that is unreadable or not a key fails the reload like any bad field: the error
// names the field and the file, it is counted, and the running set (with the old key) stays.
func TestReloadKeepsPoliciesWhenKeyFileBroken(t *testing.T) {
	ks, keyPath, r := newKeyFileReloader(t)
	first := r.Set()

	for i, tc := range []struct {
		name   string
		break_ func()
		want   string
	}{
		{"not a key", func() { writeFile(t, keyPath, "-----BEGIN PUBLIC KEY-----\nbm90IGEga2V5\n-----END PUBLIC KEY-----\n") }, "must hold a PEM RSA public key"},
		{"missing", func() {
			if err := os.Remove(keyPath); err != nil {
				t.Fatal(err)
			}
		}, "cannot read"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.break_()
			for _, force := range []bool{false, true} { // a watcher event, then SIGHUP
				err := r.reload(force)
				want := `identity.jwt.rs256_public_key_file: "` + keyPath + `": ` + tc.want
				if err == nil || !strings.Contains(err.Error(), want) {
					t.Fatalf("reload (force %v) error got %v, want one containing %s", force, err, want)
				}
			}
			if r.Set() != first || !accepts(t, r.Set(), ks[0]) {
				t.Error("a broken key file replaced the running policies")
			}
			if got, want := reloads(t, r, "error"), float64(2*(i+1)); got != want {
				t.Errorf("error reloads got %v, want %v", got, want)
			}
			if got := reloads(t, r, "success"); got != 0 {
				t.Errorf("success reloads got %v, want 0", got)
			}
		})
	}
}

// startWatch starts watching (StartWatch: watched when it returns), runs the watch until the
// test ends and returns the hup channel it listens to.
func startWatch(t *testing.T, r *Reloader) chan<- os.Signal {
	t.Helper()
	wt, err := r.StartWatch()
	if err != nil {
		t.Fatalf("StartWatch: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	hup := make(chan os.Signal)
	done := make(chan struct{})
	go func() { defer close(done); wt.Run(ctx, hup) }()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	return hup
}

// eventually calls poke and then checks cond until cond holds, failing the test after a deadline.
// poke repeats the change that cond waits for (a repeat of identical content reloads nothing),
// so that cond does not hang on one lost event. It repeats at three times the debounce:
// each event restarts the debounce, and quicker pokes would hold it off.
func eventually(t *testing.T, what string, poke func(), cond func() bool) {
	t.Helper()
	deadline := time.NewTimer(10 * time.Second)
	defer deadline.Stop()
	const every = 6
	tick := time.NewTicker(debounce / 2)
	defer tick.Stop()
	for i := 0; ; i++ {
		if i%every == 0 {
			poke()
		}
		select {
		case <-deadline.C:
			t.Fatalf("%s: not seen within 10s", what)
		case <-tick.C:
		}
		if cond() {
			return
		}
	}
}

// A SIGHUP with nothing changed still recompiles: a new set is swapped in, counted and logged as
// changing nothing, and it builds the same bucket keys and limits, so no count is lost.
// TestStartWatchMissesNoChange: a change made after the first read and before the watch
// started (a ConfigMap updated while the pod starts) is applied by StartWatch itself, and one
// made right after StartWatch returns (the gateway reports ready then) is seen by the first
// event, with no repeated pokes. An unchanged file reloads nothing.
func TestStartWatchMissesNoChange(t *testing.T) {
	r, path, _, _ := newTestReloader(t, baseConfig+policyYAML("per-ip", 5))
	first := r.Set()
	burst := func() int64 {
		var p policy.Plan
		if err := r.Set().Plan(httptest.NewRequest(http.MethodGet, "http://proxy/", nil), &p); err != nil || len(p.Charges) != 1 {
			t.Fatalf("plan: %v, %d charges", err, len(p.Charges))
		}
		return p.Charges[0].Limit.Burst
	}
	write := func(b int) {
		if err := os.WriteFile(path, []byte(baseConfig+policyYAML("per-ip", b)), 0o600); err != nil {
			t.Fatal(err)
		}
	}

	unchanged, err := r.StartWatch()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	unchanged.Run(ctx, nil) // closes the watch
	if r.Set() != first || reloads(t, r, "success") != 0 {
		t.Fatalf("StartWatch with unchanged files: set replaced %v, %v successful reloads; want neither", r.Set() != first, reloads(t, r, "success"))
	}

	write(7) // before the watch
	wt, err := r.StartWatch()
	if err != nil {
		t.Fatal(err)
	}
	if got := burst(); got != 7 {
		t.Fatalf("burst right after StartWatch got %d, want 7 (the change made before it)", got)
	}
	ctx, cancel = context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); wt.Run(ctx, nil) }()
	defer func() { cancel(); <-done }()

	write(9) // once, right after: no poke again
	deadline := time.Now().Add(10 * time.Second)
	for burst() != 9 {
		if time.Now().After(deadline) {
			t.Fatalf("a change made right after StartWatch was not applied within 10s (burst %d)", burst())
		}
		time.Sleep(debounce / 2) // polling with a deadline
	}
}

func TestWatchSIGHUPRecompilesUnchangedFiles(t *testing.T) {
	r, _, _, logs := newTestReloader(t, baseConfig+policyYAML("per-ip", 5))
	first := r.Set()
	hup := startWatch(t, r)

	hup <- syscall.SIGHUP // unbuffered: received once this returns
	eventually(t, "SIGHUP reload", func() {}, func() bool { return reloads(t, r, "success") == 1 })

	if r.Set() == first {
		t.Error("SIGHUP with unchanged files: got the same set, want a recompiled one")
	}
	if n := logs.FilterMessage("config reloaded; nothing changed since the last reload").Len(); n != 1 {
		t.Errorf("got %d \"nothing changed\" log lines, want 1", n)
	}
	var before, after policy.Plan
	req := httptest.NewRequest(http.MethodGet, "http://proxy/", nil)
	if err := first.Plan(req, &before); err != nil {
		t.Fatal(err)
	}
	if err := r.Set().Plan(req, &after); err != nil {
		t.Fatal(err)
	}
	if len(before.Charges) != 1 || !slices.Equal(before.Charges, after.Charges) {
		t.Errorf("charges after a no-op reload got %+v, want %+v (one charge)", after.Charges, before.Charges)
	}
	if got := reloads(t, r, "error"); got != 0 {
		t.Errorf("error reloads got %v, want 0", got)
	}
}

// The watcher follows the key file: a rotation in a directory other than the config's reloads,
// and after the config moves the key to a Kubernetes-style Secret mount, a `..data` symlink swap
// there reloads too.
func TestWatchReloadsOnKeyFileChange(t *testing.T) {
	ks := testKeys(t)
	cfgPath := filepath.Join(t.TempDir(), "config.yaml")
	keyPath := filepath.Join(t.TempDir(), "jwt.pub.pem")
	writeRSAPublicKey(t, keyPath, ks[0])
	writeFile(t, cfgPath, jwtConfig(keyPath))
	r, _ := newJWTReloader(t, cfgPath)
	startWatch(t, r)

	// Replaced by rename, as a deployment tool does: written in place, the watcher may read a
	// half-written file, which is (rightly) an error reload, and this test counts none.
	eventually(t, "key file rotation",
		func() { replaceFile(t, keyPath, publicKeyPEM(t, ks[1])) },
		func() bool { return accepts(t, r.Set(), ks[1]) })

	// A Secret mount: jwt.pub.pem -> ..data/jwt.pub.pem, ..data -> ..<timestamp>.
	mount := t.TempDir()
	n := 0
	publish := func(k *rsa.PrivateKey) {
		t.Helper()
		n++
		ts := fmt.Sprintf("..2025_%03d", n)
		if err := os.Mkdir(filepath.Join(mount, ts), 0o700); err != nil {
			t.Fatal(err)
		}
		writeRSAPublicKey(t, filepath.Join(mount, ts, "jwt.pub.pem"), k)
		tmp := filepath.Join(mount, "..data_tmp")
		if err := os.Symlink(ts, tmp); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, filepath.Join(mount, "..data")); err != nil {
			t.Fatal(err)
		}
	}
	publish(ks[1])
	if err := os.Symlink(filepath.Join("..data", "jwt.pub.pem"), filepath.Join(mount, "jwt.pub.pem")); err != nil {
		t.Fatal(err)
	}
	eventually(t, "config pointing at the mounted key",
		func() { replaceFile(t, cfgPath, []byte(jwtConfig(filepath.Join(mount, "jwt.pub.pem")))) },
		func() bool { return slices.Contains(r.watchDirs(), mount) })

	eventually(t, "Secret symlink swap",
		func() { publish(ks[2]) },
		func() bool { return accepts(t, r.Set(), ks[2]) })
	if accepts(t, r.Set(), ks[1]) {
		t.Error("token of the replaced key after the swap: got accepted, want 401")
	}
	if got := reloads(t, r, "error"); got != 0 {
		t.Errorf("error reloads got %v, want 0", got)
	}
}

// newKeyFileReloader writes the first of testKeys as an RS256 key file beside a config that
// names it, and returns the keys, the key file and a Reloader of that config.
func newKeyFileReloader(t *testing.T) ([3]*rsa.PrivateKey, string, *Reloader) {
	t.Helper()
	ks := testKeys(t)
	dir := t.TempDir()
	keyPath := filepath.Join(dir, "jwt.pub.pem")
	writeRSAPublicKey(t, keyPath, ks[0])
	cfgPath := filepath.Join(dir, "config.yaml")
	writeFile(t, cfgPath, jwtConfig(keyPath))
	r, _ := newJWTReloader(t, cfgPath)
	return ks, keyPath, r
}
