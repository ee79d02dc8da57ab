package cli

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/policy"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/server"
)

// Options configure Run.
type Options struct {
	// Version is what --version prints.
	Version string
	// Server, when set, adjusts the server.Options that serve passes to server.Run. It is the
	// one hook through which a test harness's gateway (internal/testkit/gateway) adds its seams
	// (a shifted clock, a wrapped store); the shipped binary leaves it nil.
	Server func(*server.Options)
}

// errInvalid marks a config that did not validate; its problems are already printed.
var errInvalid = errors.New("invalid configuration")

// Run executes the command line args (without the program's name) and returns the process's
// exit code.
func Run(ctx context.Context, args []string, stdout, stderr io.Writer, getenv func(string) string, o Options) int {
	root := newRootCmd(stdout, stderr, getenv, o)
	root.SetArgs(args)
	if err := root.ExecuteContext(ctx); err != nil {
		if !errors.Is(err, errInvalid) {
			fmt.Fprintln(stderr, "ratelimit-proxy:", err)
		}
		return 1
	}
	return 0
}

func newRootCmd(stdout, stderr io.Writer, getenv func(string) string, o Options) *cobra.Command {
	var configPath string
	serve := func(cmd *cobra.Command, _ []string) error {
		if configPath == "" {
			return errors.New("--config is required")
		}
		so := server.Options{ConfigPath: configPath, Getenv: getenv, Log: stderr}
		if o.Server != nil {
			o.Server(&so)
		}
		err := server.Run(cmd.Context(), so)
		if fe := (policy.Errors{}); errors.As(err, &fe) {
			// The same report as validate's: every problem on its own line.
			return printInvalid(configPath, fe, stderr)
		}
		return err
	}
	root := &cobra.Command{
		Use:           "ratelimit-proxy",
		Short:         "A rate-limiting reverse proxy for one HTTP service",
		Version:       o.Version,
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
	root.AddCommand(newRLSCmd(stdout))
	root.AddCommand(newAdminCmd(&configPath, getenv, stdout, stderr))
	return root
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
	created, err := server.CreateTable(ctx, cfg)
	if err != nil {
		return fmt.Errorf("table create %s (%s): %w", d.Table, where, err)
	}
	what := "existed already; left as it was, TTL on ttl ensured"
	if created {
		what = "created: partition key pk (S), on-demand billing, TTL on ttl"
	}
	fmt.Fprintf(stdout, "table %s (%s): %s; ACTIVE\n", d.Table, where, what)
	return nil
}

// validate prints one line per policy, the rls rules, protect and the console for a good file,
// or every problem for a bad one.
func validate(path string, getenv func(string) string, stdout, stderr io.Writer) error {
	cfg, set, err := policy.Check(path, policy.LoadOptions{Getenv: getenv}, policy.CompileOptions{Getenv: getenv})
	if err != nil {
		return printInvalid(path, err, stderr)
	}
	fmt.Fprintf(stdout, "%s: ok, %s\n", path, policy.Plural(len(set.Policies()), "policy", "policies"))
	for _, p := range set.Policies() {
		fmt.Fprintln(stdout, "  "+p.Summary)
	}
	if r := set.RLS(); r != nil {
		domains := "domains"
		if len(r.Domains()) == 1 {
			domains = "domain"
		}
		fmt.Fprintf(stdout, "  rls: %s in %s %s from %s of %s\n", policy.Plural(r.Len(), "rule", "rules"), domains,
			strings.Join(r.Domains(), ", "), policy.Plural(len(r.Files()), "file", "files"), cfg.RLS.ConfigDir)
	}
	fmt.Fprintln(stdout, "  "+policy.ProtectSummary(cfg))
	fmt.Fprintln(stdout, "  "+policy.AdminSummary(cfg))
	if tc := cfg.Telemetry; tc.Enabled() {
		proto := cmp.Or(tc.OTLP.Protocol, "grpc")
		fmt.Fprintf(stdout, "  telemetry: traces to %s (%s), sample ratio %g", tc.OTLP.Endpoint, proto, tc.Traces.Ratio())
		if tc.Metrics.OTLP {
			fmt.Fprintf(stdout, "; metrics every %s", tc.Metrics.Every())
		}
		fmt.Fprintln(stdout)
	}
	for _, w := range policy.Warnings(cfg) {
		fmt.Fprintln(stderr, "  warning: "+w)
	}
	return nil
}

// printInvalid prints every problem of a configuration that did not load or validate.
func printInvalid(path string, err error, stderr io.Writer) error {
	policy.WriteInvalid(stderr, path, err)
	return errInvalid
}
