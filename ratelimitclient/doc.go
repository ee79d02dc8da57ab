// Package ratelimitclient backs off when a server says it is overloaded.
//
// It is an HTTP client transport that backs off when a server says it is
// overloaded or that the client is over its limit: on 429 Too Many Requests and 503 Service
// Unavailable it waits at least what the server asked for, plus random jitter, then sends the
// request again, within a bounded number of attempts and never past the request context's
// deadline.
//
// It is written for clients of ratelimit-proxy, but follows the standards, so it works in front
// of any server that sends Retry-After or the IETF RateLimit header.
//
// # Usage
//
// Wrap a transport (Options.Base; nil means http.DefaultTransport) and use it in an
// http.Client:
//
//	rt, err := ratelimitclient.New(ratelimitclient.Options{MaxAttempts: 4})
//	if err != nil {
//		return err
//	}
//	client := &http.Client{Transport: rt}
//	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
//	defer cancel()
//	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://gateway/api/items", nil)
//	resp, err := client.Do(req) // retried on 429/503 while the deadline allows
//
// The zero Transport is ready to use with the defaults documented on Options. A Transport is safe
// for concurrent use by many goroutines (provided its Base, Now, Sleep and Rand are), and should be
// shared like the http.Transport it wraps.
//
// # How long it waits
//
// Before retry number n (n = 1 for the second attempt) it waits
//
//	floor + rand[0, min(MaxJitter, BaseDelay × 2^(n-1)))
//
// which is the "full jitter" of the AWS Architecture Blog's "Exponential Backoff And Jitter",
// added on top of the server's floor instead of replacing it. The floor is, in this order:
//
//   - Retry-After, as delta-seconds ("120") or an HTTP date; a date in the past is a floor of 0;
//   - else the IETF RateLimit header (draft-ietf-httpapi-ratelimit-headers): the largest `t`
//     among its policies with no quota left (`r=0`, or no `r`), e.g. `"per-ip";r=0;t=3`; also the
//     older dictionary form `limit=10, remaining=0, reset=3`;
//   - else 0, and the wait is the jitter alone (plain exponential backoff with full jitter).
//
// Retry-After comes first because it answers "when may this request come back"; a RateLimit `t`
// says when a quota is fully restored, which can be later. The jitter is what keeps many clients
// that were told "come back in 1 second" at the same instant from all coming back at the same
// instant, and being rejected together again.
//
// # What it retries
//
// Only responses with status 429 or 503; transport errors (refused or reset connections) are
// returned as they are, because the server may have acted on the request. Only requests that
// are safe to send twice: the idempotent methods (GET, HEAD, OPTIONS, TRACE, PUT, DELETE) and any
// request with an Idempotency-Key (or X-Idempotency-Key) header; with
// Options.RetryNonIdempotent, any request. In every case the body must be replayable: no body,
// or Request.GetBody set (http.NewRequest sets it for *bytes.Buffer, *bytes.Reader and
// *strings.Reader bodies). A request that cannot be retried gets its first response.
//
// When it does not retry, the caller gets the last response unchanged, body open, as if the
// transport were not there: the attempts ran out, the server's floor exceeds Options.MaxWait,
// or the wait would reach the context's deadline (checked before sleeping, so a request never sleeps
// only to fail at its deadline; http.Client.Timeout sets such a deadline too). The bodies of discarded responses are drained (up to 64 KiB) and
// closed, so their connections go back to the pool. If the context ends while waiting,
// RoundTrip returns an error wrapping the context's error.
package ratelimitclient
