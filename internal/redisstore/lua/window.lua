-- Fixed window and calendar quota. The key is a hash: e, the end of the window or period its
-- count belongs to (an instant), c the count, g its generation (set when the hash is made, so a
-- give-back of a charge taken before a reset finds another generation).
-- p1 the end of now's window or period, p2 count, p3 expiry (ms), p4 generation if new.
-- The state's fourth field is true while the hash holds the window being counted: a commit
-- then only adds to c, since e, g and the expiry set when the window began still hold (one
-- command a decision instead of two, the fixed window's common case).
local function window_eval(key, now, p, n)
  local st = redis.call('HMGET', key, 'e', 'c', 'g')
  local e, c, g = st[1], tonumber(st[2] or '0'), st[3] or p[4]
  local same = e ~= false and st[3] ~= false
  if not e or cmp(e, p[1]) < 0 then
    e, c, same = p[1], 0, false
  end
  return c + n <= tonumber(p[2]), {e, c, g, same}
end

local function window_commit(key, now, p, s, n)
  if s[4] then
    redis.call('HINCRBY', key, 'c', n)
    return
  end
  redis.call('HSET', key, 'e', s[1], 'c', s[2] + n, 'g', s[3])
  -- A clock that stepped back keeps counting in the later window: keep it until its end.
  redis.call('PEXPIRE', key, tonumber(p[3]) + ms(math.max(diff(s[1], p[1]), 0)))
end

local function window_out(ok, s)
  return {ok and 1 or 0, s[1], s[2], s[3]}
end

-- window_give: p1 the end of the charge's window, p2 its generation. 1: given back.
local function window_give(key, p, n)
  local st = redis.call('HMGET', key, 'e', 'c', 'g')
  if st[1] ~= p[1] or st[3] ~= p[2] or tonumber(st[2] or '0') < n then return 0 end
  redis.call('HINCRBY', key, 'c', -n)
  return 1
end
