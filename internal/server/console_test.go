package server

import (
	"testing"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/dynamo"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/policy"
)

// admin.max_exemptions is validated against what the DynamoDB store's index of exemptions holds.
func TestMaxExemptionsBoundsAgree(t *testing.T) {
	if policy.MaxExemptions != dynamo.MaxExemptions {
		t.Fatalf("policy.MaxExemptions %d, dynamo.MaxExemptions %d: want them equal", policy.MaxExemptions, dynamo.MaxExemptions)
	}
}
