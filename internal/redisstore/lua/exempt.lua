-- The console's shared exemptions: KEYS[1] a hash (id -> the exemption's JSON), KEYS[2] a sorted
-- set (id -> its expiry, Unix ms). ARGV[1] the operation, ARGV[2] now (Unix ms). Expired ones
-- are removed first, so both keys only ever hold live exemptions.
local op, now = ARGV[1], tonumber(ARGV[2])
local gone = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', '(' .. now)
for _, id in ipairs(gone) do
  redis.call('HDEL', KEYS[1], id)
  redis.call('ZREM', KEYS[2], id)
end
local function keep()
  local last = redis.call('ZRANGE', KEYS[2], -1, -1, 'WITHSCORES')
  if #last == 2 then
    local ttl = math.max(tonumber(last[2]) - now, 1) + 60000
    redis.call('PEXPIRE', KEYS[1], ttl)
    redis.call('PEXPIRE', KEYS[2], ttl)
  end
end
if op == 'put' then
  -- ARGV[3] id, ARGV[4] JSON, ARGV[5] expiry (ms), ARGV[6] the most that may be stored.
  if not redis.call('ZSCORE', KEYS[2], ARGV[3]) and redis.call('ZCARD', KEYS[2]) >= tonumber(ARGV[6]) then
    return 0
  end
  redis.call('HSET', KEYS[1], ARGV[3], ARGV[4])
  redis.call('ZADD', KEYS[2], ARGV[5], ARGV[3])
  keep()
  return 1
elseif op == 'del' then
  local found = redis.call('ZSCORE', KEYS[2], ARGV[3])
  redis.call('HDEL', KEYS[1], ARGV[3])
  redis.call('ZREM', KEYS[2], ARGV[3])
  if found then return 1 end
  return 0
end
local ids = redis.call('ZRANGE', KEYS[2], 0, -1)
if #ids == 0 then return {} end
return redis.call('HMGET', KEYS[1], unpack(ids))
