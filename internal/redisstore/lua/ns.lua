-- Instants are Unix nanoseconds passed as decimal strings: Lua's numbers are doubles, exact
-- only to 2^53 (104 days of nanoseconds), so an instant is split into seconds and
-- nanoseconds and only differences and spans (each well below 2^53) are numbers.
local function split(s)
  local n = #s
  if n <= 9 then return 0, tonumber(s) end
  return tonumber(string.sub(s, 1, n - 9)), tonumber(string.sub(s, n - 8))
end

-- diff returns a - b in nanoseconds.
local function diff(a, b)
  local as, an = split(a)
  local bs, bn = split(b)
  return (as - bs) * 1e9 + (an - bn)
end

-- add returns the instant a + d (d a whole number of nanoseconds, of either sign), never
-- before the epoch.
local function add(a, d)
  local s, n = split(a)
  n = n + d
  local carry = math.floor(n / 1e9)
  s = s + carry
  n = n - carry * 1e9
  if s < 0 then return '0' end
  if s == 0 then return string.format('%d', n) end
  return string.format('%d%09d', s, n)
end

-- cmp orders two instants: negative, 0 or positive.
local function cmp(a, b)
  if #a ~= #b then return #a - #b end
  if a < b then return -1 end
  if a > b then return 1 end
  return 0
end

-- ms is a span in nanoseconds as whole milliseconds, rounded up, at least 1.
local function ms(d)
  return math.max(math.ceil(d / 1e6), 1)
end
