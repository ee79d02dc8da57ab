-- give gives admitted charges back. ARGV: the entries' count, then per entry: algorithm, cost,
-- p1..p3. KEYS: one per entry. Returns one 0|1 per entry: given back or not.
local count = tonumber(ARGV[1])
local stride = 5
local out = {}
for i = 1, count do
  local b = 1 + (i - 1) * stride
  local alg, n = tonumber(ARGV[b + 1]), tonumber(ARGV[b + 2])
  local p = {ARGV[b + 3], ARGV[b + 4], ARGV[b + 5]}
  local r = 0
  if alg == 1 or alg == 2 then
    r = gcra_give(KEYS[i], p)
  elseif alg == 3 or alg == 6 then
    r = window_give(KEYS[i], p, n)
  elseif alg == 4 then
    r = sliding_give(KEYS[i], p, n)
  elseif alg == 5 then
    r = slots_give(KEYS[i], p)
  end
  out[i] = r
end
return out
