package sim

import (
	"fmt"
	"time"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/policy"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/testkit/exactcheck"
)

// The workload's policies: every algorithm the shared store serves, leases on and off, charge_on
// policies (given back when the simulated answer is not charged), with small limits so that the
// offered load is a few times each bound. conc is a concurrency limit's count (judged apart).
type simPolicy struct {
	name   string
	limit  exactcheck.Limit
	conc   int64
	lease  bool // the DynamoDB store only: leases mean nothing to a store in one process
	refund bool // charge_on: some admitted charges are given back
	yaml   string
}

var policies = []simPolicy{
	{name: "tb", limit: exactcheck.Limit{Kind: exactcheck.GCRA, Rate: 10, Burst: 5}, refund: true, yaml: `
    algorithm: token_bucket
    rate: 10/s
    burst: 5
    charge_on: [200]`},
	{name: "lb", limit: exactcheck.Limit{Kind: exactcheck.GCRA, Rate: 8, Burst: 5}, yaml: `
    algorithm: leaky_bucket
    rate: 8/s
    burst: 4`},
	{name: "fw", limit: exactcheck.Limit{Kind: exactcheck.FixedWindow, Limit: 12, Window: 2 * time.Second}, refund: true, yaml: `
    algorithm: fixed_window
    limit: 12
    window: 2s
    charge_on: [200]`},
	{name: "sw", limit: exactcheck.Limit{Kind: exactcheck.SlidingWindow, Limit: 10, Window: 2 * time.Second}, yaml: `
    algorithm: sliding_window
    limit: 10
    window: 2s`},
	{name: "conc", conc: 3, yaml: `
    algorithm: concurrency
    limit: 3`},
	{name: "tbl", limit: exactcheck.Limit{Kind: exactcheck.GCRA, Rate: 10, Burst: 6}, lease: true, yaml: `
    algorithm: token_bucket
    rate: 10/s
    burst: 6
    lease: {enabled: true, shards: 2}`},
	{name: "fwl", limit: exactcheck.Limit{Kind: exactcheck.FixedWindow, Limit: 12, Window: 2 * time.Second}, lease: true, yaml: `
    algorithm: fixed_window
    limit: 12
    window: 2s
    lease: {enabled: true, shards: 2}`},
}

// groups are the policy sets a decision charges together (all or nothing).
var groups = [][]string{
	{"tb"}, {"lb"}, {"fw"}, {"sw"}, {"conc"}, {"tbl"}, {"fwl"},
	{"tb", "fw"}, {"fw", "sw"}, {"conc", "tb"}, {"tbl", "fwl"}, {"lb", "sw", "fw"},
}

// keyValues are the api keys a decision draws from.
var keyValues = []string{"alice", "bob", "carol", "dave"}

func policyByName(name string) *simPolicy {
	for i := range policies {
		if policies[i].name == name {
			return &policies[i]
		}
	}
	return nil
}

// compilePolicies is the policy set, through the real loader and compiler.
func compilePolicies() (*policy.Set, error) {
	y := "upstream: http://127.0.0.1:1\nidentity: {api_key_header: X-Api-Key}\npolicies:\n"
	for _, p := range policies {
		y += fmt.Sprintf("  - name: %s\n    key: api_key\n%s\n", p.name, p.yaml[1:])
	}
	cfg, err := policy.Parse([]byte(y), policy.LoadOptions{Getenv: func(string) string { return "" }})
	if err != nil {
		return nil, fmt.Errorf("sim: policies: %w", err)
	}
	return policy.Compile(cfg, policy.CompileOptions{Getenv: func(string) string { return "" }})
}
