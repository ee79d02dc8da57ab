package cli

// `ratelimit-proxy rls check`: one ShouldRateLimit call by hand, as Envoy would make it, to try
// rules and a running service without Envoy (envoyproxy/ratelimit's users reach for grpcurl
// and the proto files; this needs neither).

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	rlext "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/rls"
	"github.com/spf13/cobra"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// rlsCheckOptions are the flags of `rls check`.
type rlsCheckOptions struct {
	addr    string
	domain  string
	hits    uint32
	peek    bool
	timeout time.Duration
}

// newRLSCmd is `rls`, with its one subcommand `check`.
func newRLSCmd(stdout io.Writer) *cobra.Command {
	rls := &cobra.Command{
		Use:   "rls",
		Short: "Talk to a running rate limit service (rls.listen)",
		Args:  cobra.NoArgs,
	}
	var o rlsCheckOptions
	check := &cobra.Command{
		Use:   "check --domain DOMAIN KEY=VALUE[,KEY=VALUE...] ...",
		Short: "Call ShouldRateLimit once, as Envoy would, and print the answer",
		Long: "Call envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit on --addr (gRPC over " +
			"HTTP/2 cleartext) with one descriptor per argument, each a comma-separated list of " +
			"KEY=VALUE entries in order (remote_address=10.0.0.1 or generic_key=api,user=alice), and " +
			"print the overall code, each descriptor's status and the headers the service asks Envoy " +
			"to add. A call is charged as Envoy's would be (--hits each, default 1); --peek asks " +
			"without consuming (hits_addend 0 on every descriptor). Exit 0 when the service answered, " +
			"OK or OVER_LIMIT; 1 when it did not.",
		Example: "  ratelimit-proxy rls check --addr 127.0.0.1:8081 --domain edge remote_address=10.0.0.1\n" +
			"  ratelimit-proxy rls check --domain edge --peek api_key=k1",
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			req, err := rlsRequest(o, args)
			if err != nil {
				return err
			}
			return rlsCheck(cmd.Context(), o, req, stdout, cmd.ErrOrStderr())
		},
	}
	f := check.Flags()
	f.StringVar(&o.addr, "addr", "127.0.0.1:8081", "the service's address (rls.listen), host:port")
	f.StringVar(&o.domain, "domain", "", "the rule file's domain (required)")
	f.Uint32Var(&o.hits, "hits", 0, "hits_addend of the call (0: Envoy's default, one)")
	f.BoolVar(&o.peek, "peek", false, "consume nothing: hits_addend 0 on every descriptor")
	f.DurationVar(&o.timeout, "timeout", 5*time.Second, "how long to wait for the answer")
	rls.AddCommand(check)
	return rls
}

// rlsRequest builds the call from the flags and the descriptor arguments.
func rlsRequest(o rlsCheckOptions, args []string) (*pb.RateLimitRequest, error) {
	if o.domain == "" {
		return nil, errors.New("--domain is required")
	}
	if o.peek && o.hits != 0 {
		return nil, fmt.Errorf("--peek with --hits %d: a peek consumes nothing", o.hits)
	}
	req := &pb.RateLimitRequest{Domain: o.domain, HitsAddend: o.hits}
	for _, a := range args {
		d := &rlext.RateLimitDescriptor{}
		for _, kv := range strings.Split(a, ",") {
			k, v, ok := strings.Cut(kv, "=")
			if !ok || k == "" {
				return nil, fmt.Errorf("descriptor %q: entry %q is not KEY=VALUE", a, kv)
			}
			d.Entries = append(d.Entries, &rlext.RateLimitDescriptor_Entry{Key: k, Value: v})
		}
		if o.peek {
			d.HitsAddend = wrapperspb.UInt64(0)
		}
		req.Descriptors = append(req.Descriptors, d)
	}
	return req, nil
}

// rlsCheck makes the call and prints the answer.
func rlsCheck(ctx context.Context, o rlsCheckOptions, req *pb.RateLimitRequest, w, errOut io.Writer) error {
	conn, err := grpc.NewClient(o.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return fmt.Errorf("--addr %q: %w", o.addr, err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(ctx, o.timeout)
	defer cancel()
	var md metadata.MD
	resp, err := pb.NewRateLimitServiceClient(conn).ShouldRateLimit(ctx, req, grpc.Header(&md))
	if err != nil {
		return fmt.Errorf("ShouldRateLimit on %s: %w", o.addr, err)
	}
	if slices.Contains(md.Get(rls.DomainHeader), "unknown") {
		fmt.Fprintf(errOut, "warning: domain %q is unknown to this rate limit service: no rule applies, every descriptor is OK (as Envoy's unknown domains are)\n", req.GetDomain())
	}
	printRLSAnswer(w, req, resp)
	return nil
}

// printRLSAnswer prints the overall code, each descriptor's status and the headers to add.
func printRLSAnswer(w io.Writer, req *pb.RateLimitRequest, resp *pb.RateLimitResponse) {
	fmt.Fprintln(w, resp.GetOverallCode())
	for i, st := range resp.GetStatuses() {
		var entries []string
		if i < len(req.Descriptors) {
			for _, e := range req.Descriptors[i].GetEntries() {
				entries = append(entries, e.GetKey()+"="+e.GetValue())
			}
		}
		fmt.Fprintf(w, "  %s: %s", strings.Join(entries, ","), st.GetCode())
		if l := st.GetCurrentLimit(); l != nil {
			unit := strings.ToLower(l.GetUnit().String())
			if m := l.GetUnitMultiplier().GetValue(); m > 1 {
				unit = fmt.Sprintf("%d %ss", m, unit)
			}
			name := ""
			if l.GetName() != "" {
				name = " (" + l.GetName() + ")"
			}
			fmt.Fprintf(w, ", limit %d per %s%s, remaining %d, reset in %s", l.GetRequestsPerUnit(), unit, name,
				st.GetLimitRemaining(), rounded(st.GetDurationUntilReset().AsDuration()))
		} else if st.GetCode() == pb.RateLimitResponse_OK {
			fmt.Fprint(w, ", no limit")
		}
		fmt.Fprintln(w)
	}
	for _, h := range resp.GetResponseHeadersToAdd() {
		fmt.Fprintf(w, "  header %s: %s\n", h.GetKey(), h.GetValue())
	}
}
