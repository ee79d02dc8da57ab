package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/policy"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/replay"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/server"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

// errInvalid marks a config that did not validate; its problems are already printed.
var errInvalid = errors.New("invalid configuration")

// run executes the command line and returns the process exit code.
func run(ctx context.Context, args []string, stdout, stderr io.Writer, getenv func(string) string) int {
	root := newRootCmd(stdout, stderr, getenv)
	root.SetArgs(args)
	if err := root.ExecuteContext(ctx); err != nil {
		if !errors.Is(err, errInvalid) {
			fmt.Fprintln(stderr, "ratelimit-proxy:", err)
		}
		return 1
	}
	return 0
}

func newRootCmd(stdout, stderr io.Writer, getenv func(string) string) *cobra.Command {
	var configPath string
	var clockOffset time.Duration
	serve := func(cmd *cobra.Command, _ []string) error {
		if configPath == "" {
			return errors.New("--config is required")
		}
		err := server.Run(cmd.Context(), server.Options{ConfigPath: configPath, Getenv: getenv, Log: stderr,
			Now: offsetClock(clockOffset)})
		if fe := (policy.Errors{}); errors.As(err, &fe) {
			// The same report as validate's: every problem on its own line.
			return printInvalid(configPath, fe, stderr)
		}
		return err
	}
	root := &cobra.Command{
		Use:           "ratelimit-proxy",
		Short:         "A rate-limiting reverse proxy for one HTTP service",
		Version:       version,
		SilenceUsage:  true,
		SilenceErrors: true,
		Args:          cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if configPath == "" {
				return cmd.Help()
			}
			return serve(cmd, args)
		},
	}
	root.SetOut(stdout)
	root.SetErr(stderr)
	root.PersistentFlags().StringVarP(&configPath, "config", "c", "", "path to the YAML configuration")

	serveCmd := &cobra.Command{
		Use:   "serve",
		Short: "Run the gateway",
		Args:  cobra.NoArgs,
		RunE:  serve,
	}
	root.AddCommand(serveCmd)
	for _, c := range []*cobra.Command{root, serveCmd} {
		addTestClockOffset(c, &clockOffset)
	}
	root.AddCommand(&cobra.Command{
		Use:   "validate",
		Short: "Check a configuration file and print a summary of each policy",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if configPath == "" {
				return errors.New("--config is required")
			}
			return validate(configPath, getenv, stdout, stderr)
		},
	})
	table := &cobra.Command{
		Use:   "table",
		Short: "Manage the DynamoDB table of store.backend dynamodb",
		Args:  cobra.NoArgs,
	}
	table.AddCommand(&cobra.Command{
		Use:   "create",
		Short: "Create the table named by store.dynamodb (on-demand billing, TTL on ttl) if it is missing",
		Long: "Create the table named by store.dynamodb.table with the standard AWS credential chain: " +
			"partition key pk (string), on-demand billing, TTL on the attribute ttl. An existing table is kept " +
			"and TTL is still enabled. For operators who do not give the gateway CreateTable rights.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if configPath == "" {
				return errors.New("--config is required")
			}
			return createTable(cmd.Context(), configPath, getenv, stdout, stderr)
		},
	})
	root.AddCommand(table)
	root.AddCommand(newReplayCmd(&configPath, getenv, stdout, stderr))
	root.AddCommand(newRLSCmd(stdout))
	root.AddCommand(newAdminCmd(&configPath, getenv, stdout, stderr))
	return root
}

// testClockOffsetFlag shifts the gateway's clock: for tests only (see offsetClock).
const testClockOffsetFlag = "test-clock-offset"

// addTestClockOffset adds the hidden --test-clock-offset flag to c.
func addTestClockOffset(c *cobra.Command, d *time.Duration) {
	c.Flags().DurationVar(d, testClockOffsetFlag, 0,
		"TESTS ONLY: shift the gateway's clock by this duration (e.g. -2s), to run replicas whose clocks disagree")
	_ = c.Flags().MarkHidden(testClockOffsetFlag) // cannot fail: the flag was just added
}

// offsetClock is the gateway's clock shifted by d, or nil (time.Now, the fast path) for 0.
// Multi-process tests run replicas whose clocks disagree with it (docs/development.md): the
// shift reaches every instant the gateway decides with (decisions, leases, concurrency slots,
// quotas, JWT expiry), and what the clock-offset estimator measures against DynamoDB's Date.
func offsetClock(d time.Duration) func() time.Time {
	if d == 0 {
		return nil
	}
	return func() time.Time { return time.Now().Add(d) }
}

// newReplayCmd is `replay --config FILE [LOG ...]`; internal/replay does the work.
func newReplayCmd(configPath *string, getenv func(string) string, stdout, stderr io.Writer) *cobra.Command {
	var format, keyFields, plotFile string
	var asJSON bool
	var top int
	cmd := &cobra.Command{
		// The logs are positional arguments (replay --config FILE [LOG ...]); Use names none so
		// that the usage line reads "ratelimit-proxy replay [flags]" as the docs check it.
		Use:   "replay",
		Short: "Replay access logs through the policies offline: what would this config have done?",
		Example: "  ratelimit-proxy replay --config configs/replay-demo.yaml --key-field api_key --plot replay.png access.log.1 access.log\n" +
			"  ratelimit-proxy replay --config policies.yaml --format alb --json 123456789012_elasticloadbalancing_us-east-1_app.my-lb.log.gz",
		Long: "ratelimit-proxy replay --config FILE [LOG ...]: replay access logs (nginx/Apache combined, AWS ALB, the gateway's own log.access lines; " +
			"gzip or plain; stdin when no file is named, or -) through the policies of --config on the " +
			"memory store, on a clock taken from the logs' timestamps, and report per policy the " +
			"requests matched, admitted, limited and shadow-limited, the peak rate and the keys limited " +
			"most (as log pseudonyms). Give several files oldest first. See docs/replay.md.",
		Args: cobra.ArbitraryArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if *configPath == "" {
				return errors.New("--config is required")
			}
			f, err := replay.ParseFormat(format)
			if err != nil {
				return err
			}
			kf, err := replay.ParseKeyFields(keyFields)
			if err != nil {
				return err
			}
			if f != replay.Auto && f != replay.Combined && len(kf) > 0 {
				return fmt.Errorf("--key-field applies to the combined format, not %s", f)
			}
			var plotFormat string
			if plotFile != "" {
				if plotFormat, err = replay.PlotFormat(plotFile); err != nil {
					return err
				}
			}
			cfg, err := policy.Load(*configPath, policy.LoadOptions{Getenv: getenv})
			if err != nil {
				return printInvalid(*configPath, err, stderr)
			}
			set, err := policy.Compile(cfg, policy.CompileOptions{Getenv: getenv})
			if err != nil {
				return printInvalid(*configPath, err, stderr)
			}
			ps, err := policy.LogPseudonyms(cfg, getenv)
			if err != nil {
				return err
			}
			r, err := replay.New(replay.Options{Set: set, MaxKeys: cfg.Store.MaxKeys, Pseudonyms: ps,
				Format: f, KeyFields: kf, Top: top, Progress: replayProgress(stderr)})
			if err != nil {
				return err
			}
			if len(args) == 0 {
				args = []string{"-"}
			}
			for _, name := range args {
				if err := replayFile(cmd.Context(), r, name, cmd.InOrStdin()); err != nil {
					return err
				}
			}
			r.Finish()
			rep := r.Report()
			if plotFile != "" {
				if err := writePlot(rep, plotFile, plotFormat); err != nil {
					return err
				}
			}
			if asJSON {
				return rep.WriteJSON(stdout)
			}
			return rep.WriteText(stdout)
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&format, "format", "auto", "log format: auto (per line), combined, alb or json (the gateway's log.access)")
	fl.StringVar(&keyFields, "key-field", "", "combined: kinds of the extra fields after the user agent, in order "+
		"(api_key, user, header:NAME, - to skip one), e.g. api_key for a log_format ending in \"$http_x_api_key\"")
	fl.StringVar(&plotFile, "plot", "", "also draw requests/s over time, admitted vs limited, one panel per policy, to FILE.png or FILE.svg")
	fl.BoolVar(&asJSON, "json", false, "print the report as JSON")
	fl.IntVar(&top, "top", replay.DefaultTop, "how many of the keys limited most to list per policy")
	return cmd
}

// replayFile feeds one log (- for stdin) to r.
func replayFile(ctx context.Context, r *replay.Replayer, name string, stdin io.Reader) error {
	if name == "-" {
		return r.Read(ctx, "stdin", stdin)
	}
	f, err := os.Open(name)
	if err != nil {
		return err
	}
	defer f.Close()
	return r.Read(ctx, name, f)
}

// writePlot draws the report to file.
func writePlot(rep *replay.Report, file, format string) error {
	f, err := os.Create(file)
	if err != nil {
		return err
	}
	if err := rep.Plot(f, format); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// tableCreateTimeout bounds `table create`: creating a table and waiting until it is ACTIVE
// takes seconds on AWS.
const tableCreateTimeout = 60 * time.Second

// createTable loads and validates the configuration, then creates its DynamoDB table.
func createTable(ctx context.Context, path string, getenv func(string) string, stdout, stderr io.Writer) error {
	cfg, err := policy.Load(path, policy.LoadOptions{Getenv: getenv})
	if err == nil {
		err = cfg.Validate(getenv)
	}
	if err != nil {
		return printInvalid(path, err, stderr)
	}
	if cfg.Store.Backend != "dynamodb" {
		return fmt.Errorf("%s: store.backend is %s: table create needs store.backend: dynamodb", path, cfg.Store.Backend)
	}
	ctx, cancel := context.WithTimeout(ctx, tableCreateTimeout)
	defer cancel()
	d := cfg.Store.DynamoDB
	where := "AWS"
	if d.Endpoint != "" {
		where = d.Endpoint
	}
	if err := server.CreateTable(ctx, cfg); err != nil {
		return fmt.Errorf("table create %s (%s): %w", d.Table, where, err)
	}
	fmt.Fprintf(stdout, "table %s (%s): ACTIVE, partition key pk (S), on-demand billing, TTL on ttl (created if it was missing)\n", d.Table, where)
	return nil
}

// validate prints one line per policy for a good file, or every problem for a bad one.
func validate(path string, getenv func(string) string, stdout, stderr io.Writer) error {
	cfg, err := policy.Load(path, policy.LoadOptions{Getenv: getenv})
	if err == nil {
		var set *policy.Set
		if set, err = policy.Compile(cfg, policy.CompileOptions{Getenv: getenv}); err == nil {
			fmt.Fprintf(stdout, "%s: ok, %d policies\n", path, len(set.Policies()))
			for _, p := range set.Policies() {
				fmt.Fprintln(stdout, "  "+p.Summary)
			}
			if r := set.RLS(); r != nil {
				fmt.Fprintf(stdout, "  rls: %d rules in domains %s from %d files of %s\n", r.Len(), strings.Join(r.Domains(), ", "), len(r.Files()), cfg.RLS.ConfigDir)
			}
			for _, w := range policy.Warnings(cfg) {
				fmt.Fprintln(stderr, "  warning: "+w)
			}
			return nil
		}
	}
	return printInvalid(path, err, stderr)
}

// printInvalid prints every problem of a configuration that did not load or validate.
func printInvalid(path string, err error, stderr io.Writer) error {
	fmt.Fprintf(stderr, "%s: invalid\n", path)
	var fe policy.Errors
	if errors.As(err, &fe) {
		for _, e := range fe {
			fmt.Fprintln(stderr, "  "+e.Error())
		}
	} else {
		fmt.Fprintln(stderr, "  "+err.Error())
	}
	return errInvalid
}
