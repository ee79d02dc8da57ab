package cli

import (
	"strings"
	"testing"
	"time"

	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/types/known/durationpb"
)

// TestRLSCheckRoundsReset: `rls check` prints the time until a reset as `admin get` does, to a
// tenth of a second (reset in 9.2s, not 9.247s).
func TestRLSCheckRoundsReset(t *testing.T) {
	req, err := rlsRequest(rlsCheckOptions{domain: "edge", hits: 1}, []string{"remote_address=10.0.0.1"})
	if err != nil {
		t.Fatal(err)
	}
	resp := &pb.RateLimitResponse{OverallCode: pb.RateLimitResponse_OK, Statuses: []*pb.RateLimitResponse_DescriptorStatus{{
		Code:               pb.RateLimitResponse_OK,
		CurrentLimit:       &pb.RateLimitResponse_RateLimit{RequestsPerUnit: 5, Unit: pb.RateLimitResponse_RateLimit_MINUTE},
		LimitRemaining:     4,
		DurationUntilReset: durationpb.New(9247 * time.Millisecond),
	}}}
	var out strings.Builder
	printRLSAnswer(&out, req, resp)
	if want := "  remote_address=10.0.0.1: OK, limit 5 per minute, remaining 4, reset in 9.2s\n"; !strings.Contains(out.String(), want) {
		t.Errorf("rls check printed\n%s\nwant the line %q", out.String(), want)
	}
}
