-- Sliding window: a hash of w (slot width, ns), s (newest slot number), g (generation) and the
-- ring's counters 0..10 (slot j counts in field j mod 11).
-- p1 width, p2 now's slot, p3 count, p4 expiry (ms) for a ring whose newest slot is now's, p5
-- generation if new.
local ring = 11

local function sliding_eval(key, now, p, n)
  local st = redis.call('HMGET', key, 'w', 's', 'g', '0', '1', '2', '3', '4', '5', '6', '7', '8', '9', '10')
  local w, cur = tonumber(p[1]), tonumber(p[2])
  local s, g = tonumber(st[2] or '0'), st[3] or p[5]
  local counts = {}
  for i = 0, ring - 1 do counts[i] = tonumber(st[4 + i] or '0') end
  if tonumber(st[1] or '0') ~= w then
    s = cur
    for i = 0, ring - 1 do counts[i] = 0 end
  elseif cur - s >= ring then
    s = cur
    for i = 0, ring - 1 do counts[i] = 0 end
  elseif cur > s then
    for j = s + 1, cur do counts[j % ring] = 0 end
    s = cur
  end
  local sum = 0
  for i = 0, ring - 1 do sum = sum + counts[i] end
  return sum + n <= tonumber(p[3]), {s, g, counts}
end

local function sliding_commit(key, now, p, s, n)
  local counts = s[3]
  counts[s[1] % ring] = counts[s[1] % ring] + n
  local args = {'w', p[1], 's', s[1], 'g', s[2]}
  for i = 0, ring - 1 do
    args[#args + 1] = tostring(i)
    args[#args + 1] = counts[i]
  end
  redis.call('HSET', key, unpack(args))
  local later = math.max(s[1] - tonumber(p[2]), 0) * tonumber(p[1])
  redis.call('PEXPIRE', key, tonumber(p[4]) + ms(later))
  counts[s[1] % ring] = counts[s[1] % ring] - n -- the state before, for the verdict
end

local function sliding_out(ok, s)
  local out = {ok and 1 or 0, s[1], s[2]}
  for i = 0, ring - 1 do out[#out + 1] = s[3][i] end
  return out
end

-- sliding_give: p1 width, p2 the charge's slot, p3 its generation. 1: given back.
local function sliding_give(key, p, n)
  local slot = tonumber(p[2])
  local st = redis.call('HMGET', key, 'w', 's', 'g', tostring(slot % ring))
  if st[1] ~= p[1] or st[3] ~= p[3] then return 0 end
  local s = tonumber(st[2])
  if slot > s or slot <= s - ring or tonumber(st[4] or '0') < n then return 0 end
  redis.call('HINCRBY', key, tostring(slot % ring), -n)
  return 1
end
