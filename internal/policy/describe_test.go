package policy

import "testing"

func TestPolicyDescriptions(t *testing.T) {
	set := mustCompile(t, planConfig+`  - name: daily
    key: api_key
    algorithm: fixed_window
    limit: 10000
    window: 24h
  - name: fast
    key: ip
    algorithm: sliding_window
    limit: 3
    window: 250ms
  - name: inflight
    key: api_key
    algorithm: concurrency
    limit: 8
  - name: failed-logins
    key: ip
    algorithm: fixed_window
    limit: 20
    window: 15m
    charge_on: [401, 5xx]
`)
	want := []struct{ summary, ietf string }{
		{"per-ip: key=ip token_bucket rate=10/s burst=20 enforce overrides=3", `"per-ip";q=20;w=2`},
		{"per-key: key=api_key fixed_window limit=100 window=1m enforce overrides=2", `"per-key";q=100;w=60`},
		{"per-user-writes: key=user sliding_window limit=5 window=1m enforce methods=POST,PUT path_prefix=/api/", `"per-user-writes";q=5;w=60`},
		{"per-tenant: key=header:X-Tenant leaky_bucket rate=5/m burst=3 shadow", `"per-tenant";q=3;w=36`},
		{"account: key=global token_bucket rate=1000/s burst=2000 enforce", `"account";q=2000;w=2`},
		{"daily: key=api_key fixed_window limit=10000 window=24h enforce", `"daily";q=10000;w=86400`},
		{"fast: key=ip sliding_window limit=3 window=250ms enforce", `"fast";q=3;w=1`},
		{"inflight: key=api_key concurrency limit=8 in flight enforce", `"inflight";q=8;qu="concurrent-requests"`},
		{"failed-logins: key=ip fixed_window limit=20 window=15m enforce charge_on=401,5xx", `"failed-logins";q=20;w=900`},
	}
	pols := set.Policies()
	if len(pols) != len(want) {
		t.Fatalf("got %d policies, want %d", len(pols), len(want))
	}
	for i, p := range pols {
		if p.Index != i || p.Summary != want[i].summary || p.IETFPolicy != want[i].ietf {
			t.Errorf("policy %d: got %d %q %q, want %d %q %q", i, p.Index, p.Summary, p.IETFPolicy, i, want[i].summary, want[i].ietf)
		}
	}
	for i, p := range pols {
		charged := map[int]bool{}
		for c := 100; c < 600; c++ {
			if p.ChargeOn != nil && p.ChargeOn.Has(c) {
				charged[c] = true
			}
		}
		switch {
		case p.Name == "failed-logins":
			if len(charged) != 101 || !charged[401] || !charged[500] || !charged[599] || charged[400] || charged[200] {
				t.Errorf("policy %d: charge_on [401, 5xx] compiled to %d statuses %v, want 401 and 500-599", i, len(charged), charged)
			}
		case p.ChargeOn != nil:
			t.Errorf("policy %d (%s): got a charge_on set, want nil (every answer charged)", i, p.Name)
		}
	}
	if h := set.Headers(); h != (Headers{Reset: ResetUnix}) {
		t.Errorf("got headers %+v, want unix reset without IETF", h)
	}
}
