-- take decides a group of charges at one instant, all or nothing: every charge is evaluated,
-- and when every non-shadow charge conforms, every conforming one is committed.
-- ARGV: now (ns), the charges' count, then per charge: algorithm, shadow (0|1), cost, p1..p5.
-- KEYS: one per charge. Returns {admitted, per charge {conforms, state before...}}.
local now, count = ARGV[1], tonumber(ARGV[2])
local stride = 8
local evals, states, oks = {}, {}, {}
local admitted = true
local out = {0}
for i = 1, count do
  local b = 2 + (i - 1) * stride
  local alg, shadow, n = tonumber(ARGV[b + 1]), ARGV[b + 2] == '1', tonumber(ARGV[b + 3])
  local p = {ARGV[b + 4], ARGV[b + 5], ARGV[b + 6], ARGV[b + 7], ARGV[b + 8]}
  local ok, s
  if alg == 1 or alg == 2 then
    ok, s = gcra_eval(KEYS[i], now, p)
  elseif alg == 3 or alg == 6 then
    ok, s = window_eval(KEYS[i], now, p, n)
  elseif alg == 4 then
    ok, s = sliding_eval(KEYS[i], now, p, n)
  elseif alg == 5 then
    ok, s = slots_eval(KEYS[i], now, p)
  else
    return redis.error_reply('ERR unknown algorithm ' .. tostring(alg))
  end
  evals[i], states[i], oks[i] = {alg, n, p}, s, ok
  if not ok and not shadow then admitted = false end
end
for i = 1, count do
  local alg, n, p = evals[i][1], evals[i][2], evals[i][3]
  local ok, s = oks[i] and admitted, states[i]
  if ok then
    if alg == 1 or alg == 2 then
      gcra_commit(KEYS[i], now, p, s)
    elseif alg == 3 or alg == 6 then
      window_commit(KEYS[i], now, p, s, n)
    elseif alg == 4 then
      sliding_commit(KEYS[i], now, p, s, n)
    else
      slots_commit(KEYS[i], now, p, s)
    end
  end
  local o
  if alg == 1 or alg == 2 then
    o = gcra_out(ok, s, p)
  elseif alg == 3 or alg == 6 then
    o = window_out(ok, s)
  elseif alg == 4 then
    o = sliding_out(ok, s)
  else
    o = slots_out(ok, s, p)
  end
  o[1] = oks[i] and 1 or 0
  o[#o + 1] = ok and 1 or 0
  out[i + 1] = o
end
if admitted then out[1] = 1 end
return out
