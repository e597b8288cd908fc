-- sliding_log.lua: a sorted set of admitted hit times, the Lua twin of
-- pkg/algorithm.SlidingLog. Part of check.lua / refund.lua (concatenated after
-- lib.lua).
--
-- Storage: the counter's key is a sorted set with one member per admitted
-- hit, score = the hit's time in ms, member = "<time>:<seq>" with seq a
-- zero-padded 10-digit counter of the hits at that time (one more than the
-- highest present, so members are unique; ZADD NX retries with the next seq
-- should one clash). Hits at or before now−W are trimmed when the set is
-- written; the key expires W after its newest hit. KEYS, ARGV: none of its
-- own; the driver passes the key. State table: {key, n = stored hits later
-- than now−W, added = tentative hits of this batch at now}. Stored hits are
-- counted and located with ZCOUNT and ZRANGE BYSCORE ... LIMIT, never loaded
-- whole. A key of another type (another program writing under the prefix)
-- counts as an empty log and is replaced by the next admitted hit, as a
-- foreign value in a string counter is (lib.lua): it must not fail the call,
-- which carries other callers' requests.

-- The log is not a string: the driver does not read it with MGET (v is
-- always false here); load counts it.
local sliding_log = {string_state = false}

-- sl_pcall runs a sorted-set command that reads or trims the log and returns
-- its reply, or nil when the key holds another type; any other error is
-- raised as it is.
local function sl_pcall(...)
  local r = redis.pcall(...)
  if type(r) == 'table' and r.err then
    if string.sub(r.err, 1, 9) == 'WRONGTYPE' then
      return nil
    end
    error(r)
  end
  return r
end

-- sl_nth returns the time of the k-th oldest stored hit later than cutoff.
local function sl_nth(key, cutoff, k)
  local r = redis.call('ZRANGE', key, '(' .. fmt_int(cutoff), '+inf', 'BYSCORE', 'LIMIT', fmt_int(k - 1), '1',
    'WITHSCORES')
  return tonumber(r[2])
end

function sliding_log.load(key, w, now, v)
  return {key = key, n = sl_pcall('ZCOUNT', key, '(' .. fmt_int(now - w), '+inf') or 0, added = 0}
end

-- decide returns allowed, remaining, reset_ms, retry_ms and the new state.
function sliding_log.decide(s, now, w, l, cap, c, consume)
  local cutoff = now - w
  local added = s.added
  local n = s.n + added
  local ok, retry = false, 0
  if c > l then
    retry = w
  elseif n + c <= l then
    ok = true
    if consume then
      added = added + c
      n = n + c
    end
  else
    -- Enough hits must leave: the k-th oldest, k = n+c−L.
    local k = n + c - l
    local t = now
    if k <= s.n then
      t = sl_nth(s.key, cutoff, k)
    end
    retry = t + w - now
  end
  local rem = 0
  if n < l then
    rem = l - n
  end
  local reset = w
  if s.n > 0 then
    reset = sl_nth(s.key, cutoff, 1) + w - now
  end
  return ok, rem, reset, retry, {key = s.key, n = s.n, added = added}
end

function sliding_log.store(key, w, s, o, now)
  if not sl_pcall('ZREMRANGEBYSCORE', key, '-inf', fmt_int(now - w)) then
    redis.call('DEL', key) -- another type, counted as an empty log by load
  end
  local todo = s.added
  local t = fmt_int(now)
  -- Next seq: one more than the highest member at score now (members of
  -- equal score sort by name, and seq is zero-padded, so that is the last).
  -- A foreign member's seq of 16 digits or more is ignored: beyond 2^53
  -- seq + 1 == seq, every member built would be the same, and the loop
  -- below would never end. Below 1e15 each pass names new members, so it
  -- ends whatever members exist.
  local seq = 0
  local last = redis.call('ZRANGE', key, t, t, 'BYSCORE', 'REV', 'LIMIT', '0', '1')
  if last[1] then
    local n = tonumber(string.match(last[1], ':(%d+)$'))
    if n and n < 1e15 then
      seq = n + 1
    end
  end
  while todo > 0 do
    local chunk = math.min(todo, 1000)
    local args = {}
    for i = 1, chunk do
      args[2 * i - 1] = t
      args[2 * i] = t .. ':' .. string.format('%010.0f', seq)
      seq = seq + 1
    end
    todo = todo - redis.call('ZADD', key, 'NX', unpack(args))
  end
  local newest = redis.call('ZRANGE', key, '-1', '-1', 'WITHSCORES')
  local last = now
  if newest[2] then
    -- A foreign score far ahead (up to inf) would overflow the expiry:
    -- PEXPIRE fails the call, or a negative expiry deletes the log.
    last = math.max(last, math.min(tonumber(newest[2]), now + ahead_max))
  end
  redis.call('PEXPIRE', key, px(last + w - now))
end

-- refund takes back c hits admitted at now (Cluster: another slot denied) by
-- removing c members scored now: hits at the same instant are
-- interchangeable, so which ones go does not matter.
function sliding_log.refund(key, w, c, l, now)
  local t = fmt_int(now)
  local m = redis.call('ZRANGE', key, t, t, 'BYSCORE', 'LIMIT', '0', fmt_int(c))
  for i = 1, #m, 1000 do
    redis.call('ZREM', key, unpack(m, i, math.min(i + 999, #m)))
  end
end
