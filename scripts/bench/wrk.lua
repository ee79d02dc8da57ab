-- wrk script for `make bench`. Environment:
--   BENCH_KEYS=N   rotate X-Api-Key over N distinct keys (key-0 .. key-N-1), each thread from
--                  its own offset, so the api_key policy tracks N buckets and rejects nothing;
--   BENCH_HOT=KEY  send X-Api-Key: KEY on every request (the always-rejected hot key).
-- done() prints one machine-readable line, the same format as scripts/bench/loadgen.
local keys = tonumber(os.getenv("BENCH_KEYS") or "0")
local hot = os.getenv("BENCH_HOT") or ""
local counter = 0
local thread_seq = 0

function setup(thread)
  thread:set("offset", thread_seq * 7919)
  thread_seq = thread_seq + 1
end

function init(args)
  counter = offset or 0
end

function request()
  if hot ~= "" then
    wrk.headers["X-Api-Key"] = hot
  elseif keys > 0 then
    counter = counter + 1
    wrk.headers["X-Api-Key"] = "key-" .. (counter % keys)
  end
  return wrk.format(nil)
end

function done(summary, latency, requests)
  local secs = summary.duration / 1e6
  local non2xx = summary.errors.status
  local errs = summary.errors.connect + summary.errors.read + summary.errors.write + summary.errors.timeout
  io.write(string.format("RESULT requests=%d seconds=%.2f rps=%.0f p50_us=%d p99_us=%d non2xx=%d errors=%d\n",
    summary.requests, secs, summary.requests / secs, latency:percentile(50), latency:percentile(99), non2xx, errs))
end
