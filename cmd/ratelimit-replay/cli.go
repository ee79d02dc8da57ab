package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/spf13/cobra"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/policy"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/replay"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

// errInvalid marks a config that did not validate; its problems are already printed.
var errInvalid = errors.New("invalid configuration")

// run executes the command line and returns the process exit code.
func run(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer, getenv func(string) string) int {
	root := newRootCmd(stdout, stderr, getenv)
	root.SetArgs(args)
	root.SetIn(stdin)
	if err := root.ExecuteContext(ctx); err != nil {
		if !errors.Is(err, errInvalid) {
			fmt.Fprintln(stderr, "ratelimit-replay:", err)
		}
		return 1
	}
	return 0
}

// options are the command's flags.
type options struct {
	configPath, format, keyFields, plotFile string
	asJSON                                  bool
	top                                     int
}

func newRootCmd(stdout, stderr io.Writer, getenv func(string) string) *cobra.Command {
	var o options
	cmd := &cobra.Command{
		// The logs are positional arguments (--config FILE [LOG ...]); Use names none so that the
		// usage line reads "ratelimit-replay [flags]".
		Use:   "ratelimit-replay",
		Short: "Replay access logs through the policies offline: what would this config have done?",
		Example: "  ratelimit-replay --config configs/replay-demo.yaml --key-field api_key --plot replay.png access.log.1 access.log\n" +
			"  ratelimit-replay --config policies.yaml --format alb --json 123456789012_elasticloadbalancing_us-east-1_app.my-lb.log.gz",
		Long: "ratelimit-replay --config FILE [LOG ...]: replay access logs (nginx/Apache combined, AWS ALB, the gateway's own log.access lines; " +
			"gzip or plain; stdin when no file is named, or -) through the policies of --config on the " +
			"memory store, on a clock taken from the logs' timestamps, and report per policy the " +
			"requests matched, admitted, limited and shadow-limited, the peak rate and the keys limited " +
			"most (as log pseudonyms). Give several files oldest first. See docs/replay.md.",
		Version:       version,
		SilenceUsage:  true,
		SilenceErrors: true,
		Args:          cobra.ArbitraryArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			return o.replay(cmd.Context(), args, cmd.InOrStdin(), stdout, stderr, getenv)
		},
	}
	fl := cmd.Flags()
	fl.StringVarP(&o.configPath, "config", "c", "", "the gateway's YAML config whose policies to replay (required)")
	fl.StringVar(&o.format, "format", "auto", "log format: auto (per line), combined, alb or json (the gateway's log.access)")
	fl.StringVar(&o.keyFields, "key-field", "", "combined: kinds of the extra fields after the user agent, in order "+
		"(api_key, user, header:NAME, - to skip one), e.g. api_key for a log_format ending in \"$http_x_api_key\"")
	fl.StringVar(&o.plotFile, "plot", "", "also draw requests/s over time, admitted vs limited, one panel per policy, to FILE.png or FILE.svg")
	fl.BoolVar(&o.asJSON, "json", false, "print the report as JSON")
	fl.IntVar(&o.top, "top", replay.DefaultTop, "how many of the keys limited most to list per policy")
	return cmd
}

// replay reads the logs named in args (stdin when none) through o's policies and prints the report.
func (o options) replay(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer, getenv func(string) string) error {
	if o.configPath == "" {
		return errors.New("--config is required")
	}
	f, err := replay.ParseFormat(o.format)
	if err != nil {
		return err
	}
	kf, err := replay.ParseKeyFields(o.keyFields)
	if err != nil {
		return err
	}
	if f != replay.Auto && f != replay.Combined && len(kf) > 0 {
		return fmt.Errorf("--key-field applies to the combined format, not %s", f)
	}
	var plotFormat string
	if o.plotFile != "" {
		if plotFormat, err = replay.PlotFormat(o.plotFile); err != nil {
			return err
		}
	}
	cfg, err := policy.Load(o.configPath, policy.LoadOptions{Getenv: getenv})
	if err != nil {
		policy.WriteInvalid(stderr, o.configPath, err)
		return errInvalid
	}
	set, err := policy.Compile(cfg, policy.CompileOptions{Getenv: getenv})
	if err != nil {
		policy.WriteInvalid(stderr, o.configPath, err)
		return errInvalid
	}
	ps, err := policy.LogPseudonyms(cfg, getenv)
	if err != nil {
		return err
	}
	r, err := replay.New(replay.Options{Set: set, MaxKeys: cfg.Store.MaxKeys, Pseudonyms: ps,
		Format: f, KeyFields: kf, Top: o.top, Progress: replayProgress(stderr)})
	if err != nil {
		return err
	}
	if len(args) == 0 {
		args = []string{"-"}
	}
	for _, name := range args {
		if err := replayFile(ctx, r, name, stdin); err != nil {
			return err
		}
	}
	r.Finish()
	rep := r.Report()
	if o.plotFile != "" {
		if err := writePlot(rep, o.plotFile, plotFormat); err != nil {
			return err
		}
	}
	if o.asJSON {
		return rep.WriteJSON(stdout)
	}
	return rep.WriteText(stdout)
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
