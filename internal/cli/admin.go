package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/console"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/policy"
)

// defaultTokenEnv is the variable the admin commands read the token from when neither
// --token-env nor the config's admin.token_env names one.
const defaultTokenEnv = "RATELIMIT_ADMIN_TOKEN"

// adminClient is what the admin subcommands share: where the API is, the token, the output.
type adminClient struct {
	configPath *string
	getenv     func(string) string
	stdout     io.Writer
	base       string // --admin
	tokenEnv   string // --token-env
	asJSON     bool
	http       *http.Client
}

// newAdminCmd is `admin policies|get|reset|top|exempt|exemptions|unexempt`: a client of the
// admin API (internal/console) of a running gateway.
func newAdminCmd(configPath *string, getenv func(string) string, stdout, stderr io.Writer) *cobra.Command {
	c := &adminClient{configPath: configPath, getenv: getenv, stdout: stdout, http: &http.Client{Timeout: 10 * time.Second}}
	cmd := &cobra.Command{
		Use:   "admin",
		Short: "Inspect and reset keys, list heavy hitters and grant exemptions on a running gateway",
		Long: "Talks to the admin API of a running gateway (docs/operations.md, \"The operators' console\"). " +
			"--admin defaults to http:// and the config's admin_listen (with --config), else http://127.0.0.1:9090. " +
			"Writes send the token held by the variable that --token-env names (default: the config's admin.token_env, " +
			"else " + defaultTokenEnv + ").",
		Args: cobra.NoArgs,
	}
	pf := cmd.PersistentFlags()
	pf.StringVar(&c.base, "admin", "", "admin API base URL (default from the config's admin_listen)")
	pf.StringVar(&c.tokenEnv, "token-env", "", "environment variable holding the admin token")
	pf.BoolVar(&c.asJSON, "json", false, "print the API's JSON instead of a table")

	cmd.AddCommand(&cobra.Command{
		Use: "policies", Short: "List the policies with their limits", Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return c.policies(cmd.Context()) },
	})
	var pseudonym, reason, domain string
	var entries []string
	get := &cobra.Command{
		Use: "get POLICY [KEY]", Short: "Show a key's state without charging it", Args: cobra.RangeArgs(1, 2),
		RunE: func(cmd *cobra.Command, args []string) error {
			return c.get(cmd.Context(), args[0], argKey(args), pseudonym, domain, entries)
		},
	}
	get.Flags().StringVar(&pseudonym, "pseudonym", "", "the key's pseudonym (as the access log shows it) instead of the key")
	get.Flags().StringVar(&domain, "domain", "", "an rls descriptor's domain (POLICY: the rule's label or name, or rls)")
	get.Flags().StringArrayVar(&entries, "entry", nil, "an rls descriptor's entry key=value (repeat, in order)")
	cmd.AddCommand(get)
	reset := &cobra.Command{
		Use: "reset POLICY [KEY]", Short: "Make a key full again", Args: cobra.RangeArgs(1, 2),
		RunE: func(cmd *cobra.Command, args []string) error {
			body := map[string]any{"key": argKey(args), "pseudonym": pseudonym, "reason": reason, "domain": domain}
			if len(entries) > 0 {
				body["entries"] = entries
			}
			return c.write(cmd.Context(), http.MethodPost, "/v1/keys/"+url.PathEscape(args[0])+"/reset", body)
		},
	}
	reset.Flags().StringVar(&pseudonym, "pseudonym", "", "the key's pseudonym instead of the key")
	reset.Flags().StringVar(&reason, "reason", "", "why (written to the audit log)")
	reset.Flags().StringVar(&domain, "domain", "", "an rls descriptor's domain (POLICY: the rule's label or name, or rls)")
	reset.Flags().StringArrayVar(&entries, "entry", nil, "an rls descriptor's entry key=value (repeat, in order)")
	cmd.AddCommand(reset)

	var n int
	var replicas []string
	top := &cobra.Command{
		Use: "top POLICY", Short: "List a policy's heaviest keys lately (merged over --replica URLs)", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error { return c.top(cmd.Context(), args[0], n, replicas) },
	}
	top.Flags().IntVarP(&n, "n", "n", 20, "how many keys")
	top.Flags().StringArrayVar(&replicas, "replica", nil, "admin URL of a replica to merge (repeat for each; default: --admin)")
	cmd.AddCommand(top)

	var ex struct {
		rate, window, expiresIn, until string
		burst, limit                   int64
		unlimited                      bool
	}
	exempt := &cobra.Command{
		Use: "exempt POLICY [KEY]", Short: "Give a key a temporary limit (or none) until it expires", Args: cobra.RangeArgs(1, 2),
		RunE: func(cmd *cobra.Command, args []string) error {
			body := map[string]any{"policy": args[0], "key": argKey(args), "pseudonym": pseudonym, "reason": reason, "domain": domain}
			if len(entries) > 0 {
				body["entries"] = entries
			}
			if ex.unlimited {
				body["unlimited"] = true
			} else {
				if err := c.exemptLimitGiven(cmd.Context(), args[0], domain, ex.rate, ex.burst, ex.limit); err != nil {
					return err
				}
				body["limit"] = map[string]any{"rate": ex.rate, "burst": ex.burst, "limit": ex.limit, "window": ex.window}
			}
			if ex.until != "" {
				body["expires_at"] = ex.until
			} else {
				body["expires_in"] = ex.expiresIn
			}
			return c.write(cmd.Context(), http.MethodPost, "/v1/exemptions", body)
		},
	}
	ef := exempt.Flags()
	ef.StringVar(&pseudonym, "pseudonym", "", "the key's pseudonym instead of the key")
	ef.StringVar(&reason, "reason", "", "why (written to the audit log)")
	ef.StringVar(&domain, "domain", "", "an rls descriptor's domain (POLICY: the rule's label or name, or rls)")
	ef.StringArrayVar(&entries, "entry", nil, "an rls descriptor's entry key=value (repeat, in order)")
	ef.StringVar(&ex.rate, "rate", "", "replacement rate of a token or leaky bucket (e.g. 20/s)")
	ef.Int64Var(&ex.burst, "burst", 0, "replacement burst of a token or leaky bucket")
	ef.Int64Var(&ex.limit, "limit", 0, "replacement limit of a window, quota or concurrency policy")
	ef.StringVar(&ex.window, "window", "", "replacement window of a window policy (default the policy's)")
	ef.BoolVar(&ex.unlimited, "unlimited", false, "no limit at all for the key")
	ef.StringVar(&ex.expiresIn, "for", "1h", "how long the exemption lasts")
	ef.StringVar(&ex.until, "until", "", "when the exemption ends (RFC 3339), instead of --for")
	cmd.AddCommand(exempt)
	cmd.AddCommand(&cobra.Command{
		Use: "exemptions", Short: "List the active exemptions", Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return c.exemptions(cmd.Context()) },
	})
	cmd.AddCommand(&cobra.Command{
		Use: "unexempt ID", Short: "End an exemption now", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return c.write(cmd.Context(), http.MethodDelete, "/v1/exemptions/"+url.PathEscape(args[0]), nil)
		},
	})
	cmd.SetErr(stderr)
	return cmd
}

func argKey(args []string) string {
	if len(args) > 1 {
		return args[1]
	}
	return ""
}

// settings resolves --admin and the token's variable, from the config when one is given.
func (c *adminClient) settings() (base, tokenEnv string, err error) {
	base, tokenEnv = c.base, c.tokenEnv
	if (base == "" || tokenEnv == "") && *c.configPath != "" {
		cfg, err := policy.Load(*c.configPath, policy.LoadOptions{Getenv: c.getenv})
		if err != nil {
			return "", "", err
		}
		if base == "" {
			base = "http://" + dialable(cfg.AdminListen)
		}
		if tokenEnv == "" {
			tokenEnv = cfg.Admin.TokenEnv
		}
	}
	if base == "" {
		base = "http://127.0.0.1:9090"
	}
	if tokenEnv == "" {
		tokenEnv = defaultTokenEnv
	}
	return strings.TrimRight(base, "/"), tokenEnv, nil
}

// dialable turns a listen address into one to connect to: a listener on every address
// (":9090", "0.0.0.0:9090", "[::]:9090") is reached on loopback, which is also a Host that the
// admin listener answers (an unspecified address is not: console.HostGuard).
func dialable(listen string) string {
	host, port, err := net.SplitHostPort(listen)
	if err != nil {
		return listen
	}
	switch ip := net.ParseIP(host); {
	case host == "" || ip != nil && ip.To4() != nil && ip.IsUnspecified():
		host = "127.0.0.1"
	case ip != nil && ip.IsUnspecified():
		host = "::1"
	}
	return net.JoinHostPort(host, port)
}

// call sends one request to base+path and decodes a 2xx JSON answer into out; any other answer
// becomes an error carrying the problem's detail.
func (c *adminClient) call(ctx context.Context, base, method, path string, body, out any) error {
	_, tokenEnv, err := c.settings()
	if err != nil {
		return err
	}
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, base+path, rd)
	if err != nil {
		return err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if tok := c.getenv(tokenEnv); tok != "" {
		req.Header.Set("Authorization", "Bearer "+tok)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return fmt.Errorf("admin API %s: %w", base, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return fmt.Errorf("admin API %s: %w", base, err)
	}
	if resp.StatusCode/100 != 2 {
		var p struct {
			Detail string `json:"detail"`
		}
		_ = json.Unmarshal(data, &p)
		if p.Detail == "" {
			p.Detail = strings.TrimSpace(string(data))
		}
		if resp.StatusCode == http.StatusUnauthorized {
			// Say where the token came from: the usual cause is a variable never exported.
			if c.getenv(tokenEnv) == "" {
				p.Detail += fmt.Sprintf(" (the token is read from %s, which is empty: export it, or name another variable with --token-env)", tokenEnv)
			} else {
				p.Detail += fmt.Sprintf(" (sent the token held by %s)", tokenEnv)
			}
		}
		return fmt.Errorf("%s %s: %s: %s", method, path, resp.Status, p.Detail)
	}
	if raw, ok := out.(*json.RawMessage); ok {
		*raw = data
		return nil
	}
	return json.Unmarshal(data, out)
}

// show prints data as JSON with --json, else through table.
func (c *adminClient) show(data json.RawMessage, table func(w *tabwriter.Writer) error) error {
	if c.asJSON {
		_, err := c.stdout.Write(data)
		return err
	}
	tw := tabwriter.NewWriter(c.stdout, 0, 4, 2, ' ', 0)
	if err := table(tw); err != nil {
		return err
	}
	return tw.Flush()
}

func (c *adminClient) policies(ctx context.Context) error {
	base, _, err := c.settings()
	if err != nil {
		return err
	}
	var raw json.RawMessage
	if err := c.call(ctx, base, http.MethodGet, "/v1/policies", nil, &raw); err != nil {
		return err
	}
	var v struct{ Policies []console.PolicyInfo }
	if err := json.Unmarshal(raw, &v); err != nil {
		return err
	}
	return c.show(raw, func(w *tabwriter.Writer) error {
		fmt.Fprintln(w, "POLICY\tSCOPE\tALGORITHM\tKEY\tLIMIT\tMODE\tSUMMARY")
		for _, p := range v.Policies {
			fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%d\t%s\t%s\n", p.Name, p.Scope, p.Algorithm, p.Key, p.Limit, p.Mode, p.Summary)
		}
		return nil
	})
}

func (c *adminClient) get(ctx context.Context, pol, key, pseudonym, domain string, entries []string) error {
	base, _, err := c.settings()
	if err != nil {
		return err
	}
	q := url.Values{}
	if key != "" {
		q.Set("key", key)
	}
	if pseudonym != "" {
		q.Set("pseudonym", pseudonym)
	}
	if domain != "" {
		q.Set("domain", domain)
		q["entry"] = entries
	}
	var raw json.RawMessage
	if err := c.call(ctx, base, http.MethodGet, "/v1/keys/"+url.PathEscape(pol)+"?"+q.Encode(), nil, &raw); err != nil {
		return err
	}
	var ks console.KeyState
	if err := json.Unmarshal(raw, &ks); err != nil {
		return err
	}
	return c.show(raw, func(w *tabwriter.Writer) error {
		fmt.Fprintf(w, "policy\t%s\nkey\t%s\nlimit\t%d\nremaining\t%d\nreset after\t%s\nlimited\t%v\n",
			ks.Policy, ks.Key, ks.Limit, ks.Remaining, roundedSeconds(ks.ResetAfter), ks.Limited)
		if ks.RetryAfter != nil {
			fmt.Fprintf(w, "retry after\t%s\n", roundedSeconds(*ks.RetryAfter))
		}
		fmt.Fprintf(w, "exempt\t%v\n", ks.Exempt)
		if e := ks.Exemption; e != nil {
			fmt.Fprintf(w, "exemption\t%s until %s (%s)\n", e.ID, e.ExpiresAt.Format(time.RFC3339), e.Reason)
		}
		return nil
	})
}

func (c *adminClient) write(ctx context.Context, method, path string, body map[string]any) error {
	base, _, err := c.settings()
	if err != nil {
		return err
	}
	for k, v := range body { // send only what was given
		if s, ok := v.(string); ok && s == "" {
			delete(body, k)
		}
	}
	if lim, ok := body["limit"].(map[string]any); ok {
		for k, v := range lim {
			if v == "" || v == int64(0) {
				delete(lim, k)
			}
		}
	}
	var bodyArg any
	if body != nil {
		bodyArg = body
	}
	var raw json.RawMessage
	if err := c.call(ctx, base, method, path, bodyArg, &raw); err != nil {
		return err
	}
	var v map[string]any
	if err := json.Unmarshal(raw, &v); err != nil {
		return err
	}
	return c.show(raw, func(w *tabwriter.Writer) error {
		for _, k := range []string{"id", "policy", "key", "reset", "deleted", "unlimited", "limit", "expires_at", "reason"} {
			if x, ok := v[k]; ok {
				if m, ok := x.(map[string]any); ok {
					b, _ := json.Marshal(m)
					x = string(b)
				}
				fmt.Fprintf(w, "%s\t%v\n", k, x)
			}
		}
		return nil
	})
}

func (c *adminClient) top(ctx context.Context, pol string, n int, replicas []string) error {
	base, _, err := c.settings()
	if err != nil {
		return err
	}
	if len(replicas) == 0 {
		replicas = []string{base}
	}
	replicas = distinctURLs(replicas)
	lists := make([][]console.TopKey, 0, len(replicas))
	for _, r := range replicas {
		var v struct{ Keys []console.TopKey }
		var raw json.RawMessage
		// Each replica's own top n*2 (at least 100): a key heavy across replicas but below n
		// on each still shows up in the merge.
		path := fmt.Sprintf("/v1/top/%s?n=%d", url.PathEscape(pol), max(2*n, 100))
		if err := c.call(ctx, strings.TrimRight(r, "/"), http.MethodGet, path, nil, &raw); err != nil {
			return err
		}
		if err := json.Unmarshal(raw, &v); err != nil {
			return err
		}
		lists = append(lists, v.Keys)
	}
	merged := console.MergeTop(n, lists...)
	if c.asJSON {
		return json.NewEncoder(c.stdout).Encode(map[string]any{"policy": pol, "replicas": len(replicas), "keys": merged})
	}
	tw := tabwriter.NewWriter(c.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "KEY\tREQUESTS\t429S\t±ERROR")
	for _, k := range merged {
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\n", k.Key, k.Requests, k.Limited, k.Error)
	}
	return tw.Flush()
}

func (c *adminClient) exemptions(ctx context.Context) error {
	base, _, err := c.settings()
	if err != nil {
		return err
	}
	var raw json.RawMessage
	if err := c.call(ctx, base, http.MethodGet, "/v1/exemptions", nil, &raw); err != nil {
		return err
	}
	var v struct{ Exemptions []console.Exemption }
	if err := json.Unmarshal(raw, &v); err != nil {
		return err
	}
	return c.show(raw, func(w *tabwriter.Writer) error {
		fmt.Fprintln(w, "ID\tPOLICY\tKEY\tLIMIT\tEXPIRES\tREASON")
		for _, e := range v.Exemptions {
			lim := "unlimited"
			if !e.Unlimited && e.Limit != nil {
				b, _ := json.Marshal(e.Limit)
				lim = string(b)
			}
			fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\n", e.ID, e.Policy, e.Key, lim, e.ExpiresAt.Format(time.RFC3339), e.Reason)
		}
		return nil
	})
}

// distinctURLs drops repeated admin URLs (a trailing slash or the case of the scheme and host
// aside), keeping the first of each: a replica named twice is counted once.
func distinctURLs(urls []string) []string {
	seen := map[string]bool{}
	out := urls[:0:0]
	for _, u := range urls {
		k := strings.TrimRight(u, "/")
		if p, err := url.Parse(k); err == nil && p.Host != "" {
			p.Scheme, p.Host = strings.ToLower(p.Scheme), strings.ToLower(p.Host)
			k = p.String()
		}
		if !seen[k] {
			seen[k] = true
			out = append(out, u)
		}
	}
	return out
}

// exemptLimitGiven checks, before anything is sent, that `admin exempt` has the replacement
// limit its policy needs, naming the missing flag: --rate and --burst for a token or leaky
// bucket, --limit for the others (the policy's algorithm asked of the API; when it cannot be,
// both are named).
func (c *adminClient) exemptLimitGiven(ctx context.Context, pol, domain, rate string, burst, limit int64) error {
	algorithm := ""
	if domain == "" {
		if base, _, err := c.settings(); err == nil {
			var v struct{ Policies []console.PolicyInfo }
			if c.call(ctx, base, http.MethodGet, "/v1/policies", nil, &v) == nil {
				for _, p := range v.Policies {
					if p.Name == pol {
						algorithm = p.Algorithm
					}
				}
			}
		}
	}
	bucket := algorithm == "token_bucket" || algorithm == "leaky_bucket"
	var missing []string
	switch {
	case bucket && rate == "" && burst == 0:
		missing = []string{"--rate", "--burst"}
	case bucket && rate == "":
		missing = []string{"--rate"}
	case bucket && burst == 0:
		missing = []string{"--burst"}
	case algorithm != "" && !bucket && limit == 0:
		missing = []string{"--limit"}
	case algorithm == "" && rate == "" && burst == 0 && limit == 0:
		return fmt.Errorf("admin exempt %s: no replacement limit: give --rate and --burst (a token or leaky bucket), --limit (a window, quota or concurrency policy), or --unlimited", pol)
	}
	if len(missing) > 0 {
		verb := "is"
		if len(missing) > 1 {
			verb = "are"
		}
		return fmt.Errorf("admin exempt %s: %s %s missing (policy %s is a %s; or --unlimited for no limit)", pol, strings.Join(missing, " and "), verb, pol, algorithm)
	}
	return nil
}

// roundedSeconds prints a duration in seconds for a person (see rounded).
func roundedSeconds(sec float64) string {
	return rounded(time.Duration(sec * float64(time.Second)))
}

// rounded prints a duration for a person: to a tenth of a second from 1 s up (1.8s, not
// 1.812345678s), to the millisecond below (250ms).
func rounded(d time.Duration) string {
	if d >= time.Second || d <= -time.Second {
		return d.Round(100 * time.Millisecond).String()
	}
	return d.Round(time.Millisecond).String()
}
