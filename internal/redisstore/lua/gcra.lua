-- Token and leaky bucket (GCRA). The key is a hash: t, the theoretical arrival time (an instant),
-- and m, the marker of the write that left it (a give-back lands only while m is its charge's).
-- p1 cost (n*T ns), p2 tau (ns), p3 this write's marker, p4 expiry slack (ms).
local function gcra_eval(key, now, p)
  local st = redis.call('HMGET', key, 't', 'm')
  local tat = st[1] or '0'
  local d = math.max(diff(tat, now), 0)
  return d + tonumber(p[1]) <= tonumber(p[2]), {tat, d}
end

local function gcra_commit(key, now, p, s)
  local ahead = s[2] + tonumber(p[1])
  redis.call('HSET', key, 't', add(now, ahead), 'm', p[3])
  redis.call('PEXPIRE', key, ms(ahead) + tonumber(p[4]))
end

local function gcra_out(ok, s, p)
  return {ok and 1 or 0, s[1], ok and p[3] or '0'}
end

-- gcra_give gives a token-bucket charge back while the bucket is as its write left it.
-- p1 cost (ns), p2 the charge's marker, p3 the give-back's own marker. 1: given back (now or by
-- an earlier copy of this give-back), 0: something wrote since.
local function gcra_give(key, p)
  local st = redis.call('HMGET', key, 't', 'm')
  if st[2] == p[3] then return 1 end
  if not st[1] or st[2] ~= p[2] then return 0 end
  redis.call('HSET', key, 't', add(st[1], -tonumber(p[1])), 'm', p[3])
  return 1
end
