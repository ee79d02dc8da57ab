package e2e

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// chromiumPath finds Debian's chromium, or ends the test: Fatal in CI (scripts/test.sh
// installs it), a reported Skip elsewhere.
func chromiumPath(t *testing.T) string {
	t.Helper()
	for _, name := range []string{"chromium", "chromium-browser"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	if os.Getenv("CI") == "true" {
		t.Fatal("chromium is not installed (scripts/test.sh installs Debian's chromium)")
	}
	t.Skip("chromium is not installed: apt-get install chromium to run the console page in a real browser")
	return ""
}

// headless loads url in a fresh headless chromium and returns the DOM after load and the page's
// console messages (chromium logs each as a line with :CONSOLE). With screenshot set it also
// writes a PNG of the page there.
func headless(t *testing.T, chromium, url, screenshot string) (dom string, console []string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	args := []string{"--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
		"--disable-background-networking", "--disable-component-update", "--disable-sync",
		"--user-data-dir=" + t.TempDir(), "--enable-logging=stderr", "--v=0", "--window-size=1280,1500"}
	run := func(extra ...string) (string, string) {
		cmd := exec.CommandContext(ctx, chromium, append(append([]string{}, args...), append(extra, url)...)...)
		var out, errb strings.Builder
		cmd.Stdout, cmd.Stderr = &out, &errb
		if err := cmd.Run(); err != nil {
			t.Fatalf("chromium %v: %v\n%s", extra, err, errb.String())
		}
		return out.String(), errb.String()
	}
	dom, logs := run("--dump-dom")
	for _, l := range strings.Split(logs, "\n") {
		if strings.Contains(l, ":CONSOLE") {
			console = append(console, l)
		}
	}
	if screenshot != "" {
		run("--hide-scrollbars", "--screenshot="+screenshot)
	}
	return dom, console
}

// TestConsolePageInChromium loads the console's page in a real headless browser: it loads
// without console messages, shows every policy's name and a chart that is not flat after
// traffic, and a reset made through the API. The console check is first shown to catch a page
// that logs an error. UPDATE_SCREENSHOT=1 rewrites docs/images/console.png.
func TestConsolePageInChromium(t *testing.T) {
	chromium := chromiumPath(t)

	// The checker: a page with a script error must show console lines.
	bad := filepath.Join(t.TempDir(), "bad.html")
	if err := os.WriteFile(bad, []byte(`<!doctype html><p>x</p><script>console.error("broken"); nope();</script>`), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, console := headless(t, chromium, "file://"+bad, ""); len(console) == 0 {
		t.Fatal("the console check saw nothing on a page that logs an error: it cannot be trusted")
	}

	up := newUpstream(t, nil)
	g := startGateway(t, up.URL, adminPolicies, "ADMIN_TOKEN="+adminToken, "PSEUDO_SECRET="+adminPseudoKey)
	var keys []string
	for i := range 30 {
		for j := range 8 {
			keys = append(keys, fmt.Sprintf("%spage-%d", adminKeyPrefix, (i*j)%11))
		}
	}
	sendAll(t, g.proxy+"/x", keys)
	code, body := adminCall(t, http.MethodPost, g.admin+"/v1/keys/per-key/reset", adminToken,
		map[string]string{"key": adminKeyPrefix + "page-0", "reason": "seen-in-the-page"})
	if code != http.StatusOK {
		t.Fatalf("reset: %d %s", code, body)
	}
	code, body = adminCall(t, http.MethodPost, g.admin+"/v1/exemptions", adminToken, map[string]any{
		"policy": "per-key", "key": adminKeyPrefix + "page-3", "unlimited": true, "expires_in": "2h", "reason": "launch"})
	if code != http.StatusCreated {
		t.Fatalf("exempt: %d %s", code, body)
	}

	shot := filepath.Join(t.TempDir(), "console.png")
	if os.Getenv("UPDATE_SCREENSHOT") == "1" {
		shot = filepath.Join("..", "..", "docs", "images", "console.png")
	}
	dom, console := headless(t, chromium, g.admin+"/", shot)
	if len(console) > 0 {
		t.Errorf("console messages while loading the page:\n%s", strings.Join(console, "\n"))
	}
	for _, s := range []string{"per-ip", "per-key", "seen-in-the-page", "launch"} {
		if !strings.Contains(dom, s) {
			t.Errorf("the page lacks %q", s)
		}
	}
	// A chart that is not flat: some point of an allowed line above the baseline (y < 125).
	re := regexp.MustCompile(`class="allowed" points="([^"]*)"`)
	peaks := 0
	for _, m := range re.FindAllStringSubmatch(dom, -1) {
		for _, pt := range strings.Fields(m[1]) {
			_, y, _ := strings.Cut(pt, ",")
			if v, err := strconv.ParseFloat(y, 64); err == nil && v < 125 {
				peaks++
				break
			}
		}
	}
	if peaks < 2 {
		t.Errorf("%d of the 2 policies' charts show traffic, want both", peaks)
	}
	if st, err := os.Stat(shot); err != nil || st.Size() < 10_000 {
		t.Errorf("screenshot %s: %v (want a PNG of the page)", shot, err)
	}
	if strings.Contains(dom, adminKeyPrefix) || strings.Contains(dom, adminToken) {
		t.Error("a raw API key or the token is on the page")
	}
}

// TestConsolePageRebindingInChromium is DNS rebinding in a real browser: chromium resolves
// rebind.example to 127.0.0.1 (--host-resolver-rules, what a re-pointed DNS name does) and loads
// the console by that name. The page an attacker would read shows none of the console: the
// listener answers 421. The same browser loading the listener by its address sees the page, so
// the refusal is the Host's.
func TestConsolePageRebindingInChromium(t *testing.T) {
	chromium := chromiumPath(t)
	up := newUpstream(t, nil)
	g := startGateway(t, up.URL, adminPolicies, "ADMIN_TOKEN="+adminToken, "PSEUDO_SECRET="+adminPseudoKey)
	sendAll(t, g.proxy+"/x", []string{adminKeyPrefix + "rebind"})
	port := g.admin[strings.LastIndex(g.admin, ":")+1:]
	rebound := headlessArgs(t, chromium, "http://rebind.example:"+port+"/", "--host-resolver-rules=MAP rebind.example 127.0.0.1")
	if strings.Contains(rebound, "per-ip") || strings.Contains(rebound, "<svg") || !strings.Contains(rebound, "admin.hosts") {
		t.Errorf("the console loaded by a rebound name shows the console or no 421 problem:\n%s", rebound)
	}
	own := headlessArgs(t, chromium, g.admin+"/", "--host-resolver-rules=MAP rebind.example 127.0.0.1")
	if !strings.Contains(own, "per-ip") {
		t.Errorf("the console loaded by its address lacks the page:\n%s", own)
	}
}

// headlessArgs loads url in a fresh headless chromium with extra flags and returns the DOM.
func headlessArgs(t *testing.T, chromium, url string, extra ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	args := append([]string{"--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
		"--disable-background-networking", "--disable-component-update", "--disable-sync",
		"--user-data-dir=" + t.TempDir(), "--dump-dom"}, extra...)
	cmd := exec.CommandContext(ctx, chromium, append(args, url)...)
	var out, errb strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		t.Fatalf("chromium: %v\n%s", err, errb.String())
	}
	return out.String()
}
