-- Concurrency slots: a sorted set of the slots in flight, each scored by its lease's expiry
-- (Unix ms); a slot whose holder stopped renewing it leaves at that expiry.
-- p1 count, p2 this slot's id, p3 its expiry (ms), p4 key expiry (ms), p5 now (Unix ms).
local function slots_eval(key, now, p)
  redis.call('ZREMRANGEBYSCORE', key, '-inf', '(' .. p[5])
  local inflight = redis.call('ZCARD', key)
  return inflight < tonumber(p[1]), {inflight}
end

local function slots_commit(key, now, p, s)
  redis.call('ZADD', key, p[3], p[2])
  redis.call('PEXPIRE', key, p[4])
end

local function slots_out(ok, s, p)
  return {ok and 1 or 0, s[1], ok and p[2] or '0'}
end

-- slots_give frees the slot p1. 1: it was held.
local function slots_give(key, p)
  return redis.call('ZREM', key, p[1])
end
