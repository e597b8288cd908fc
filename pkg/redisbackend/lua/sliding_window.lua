-- sliding_window.lua: the two-counter sliding window (after Cloudflare), the
-- Lua twin of pkg/algorithm.SlidingWindow. Part of check.lua / refund.lua
-- (concatenated after lib.lua).
--
-- Storage: <base>:<b> holds count[b] for bucket b = floor(now/W) as a decimal
-- integer string and expires 2W after the start of bucket b, i.e. at (b+2)·W.
-- KEYS, ARGV: none of its own; the driver passes the key base <prefix>{<id>}.
-- State table: {b = bucket, cur = count[b], prev = count[b-1], key = the key
-- of bucket b (nil if unknown)}.

local sliding_window = {}

-- sw_weight is ceil(prev·(W−elapsed)/W), multiply then divide, in doubles.
local function sw_weight(prev, elapsed, w)
  if prev == 0 then
    return 0
  end
  return math.ceil(prev * (w - elapsed) / w)
end

-- sw_admits is the predicate at t on the counts (cur, prev) of bucket b.
local function sw_admits(b, cur, prev, t, c, w, l)
  local bn = idiv(t, w)
  if bn == b + 1 then
    cur, prev = 0, cur
  elseif bn > b + 1 then
    cur, prev = 0, 0
  end
  return cur + sw_weight(prev, t - bn * w, w) + c <= l
end

-- sw_retry_at is the earliest t > now at which sw_admits holds for the
-- unchanged counts: an analytic estimate, corrected with the predicate.
local function sw_retry_at(b, cur, prev, now, c, w, l)
  local t = (b + 2) * w
  local function earliest(pr, r)
    if pr == 0 then
      return 0
    end
    return w - idiv(r * w, pr)
  end
  if cur + c <= l then
    local e = earliest(prev, l - cur - c)
    if e < w then
      t = b * w + math.max(e, 0)
    end
  else
    local e = earliest(cur, l - c)
    if e < w then
      t = (b + 1) * w + math.max(e, 0)
    end
  end
  t = math.max(t, now + 1)
  while t > now + 1 and sw_admits(b, cur, prev, t - 1, c, w, l) do
    t = t - 1
  end
  while not sw_admits(b, cur, prev, t, c, w, l) do
    t = t + 1
  end
  return t
end

-- keys appends the keys load reads, current bucket first, to ks.
function sliding_window.keys(base, w, now, ks)
  local b = idiv(now, w)
  ks[#ks + 1] = bucket_key(base, b)
  ks[#ks + 1] = bucket_key(base, b - 1)
end

-- load returns the state from the values of keys' keys, read (MGET) into
-- vals from index i on; ks are those keys.
function sliding_window.load(base, w, now, ks, vals, i)
  return {b = idiv(now, w), cur = num_of(vals[i]), prev = num_of(vals[i + 1]), key = ks[i]}
end

-- decide returns allowed, remaining, reset_ms, retry_ms and the new state.
function sliding_window.decide(s, now, w, l, cap, c, consume)
  local b = idiv(now, w)
  local cur, prev = 0, 0
  if s.b == b then
    cur, prev = s.cur, s.prev
  elseif s.b == b - 1 then
    prev = s.cur
  end
  local pw = sw_weight(prev, now - b * w, w)
  local ok, retry = false, 0
  if c > l then
    retry = w
  elseif cur + pw + c <= l then
    ok = true
    if consume then
      cur = cur + c
    end
  else
    retry = sw_retry_at(b, cur, prev, now, c, w, l) - now
  end
  local rem = 0
  if cur + pw < l then
    rem = l - cur - pw
  end
  local key = s.key
  if s.b ~= b then
    key = nil
  end
  return ok, rem, (b + 1) * w - now, retry, {b = b, cur = cur, prev = prev, key = key}
end

-- store writes state s, decided at now, over the stored state o (both from
-- load and decide at the same now). A counter that exists keeps its expiry
-- and only grows (INCRBY, the cheapest write); a new one is created with it.
function sliding_window.store(base, w, s, now, o)
  local stored = nil
  if o.b == s.b then
    stored = o.cur
  end
  store_bucket(base, w, s.b, s.key, s.cur, stored, 2, now)
end

-- refund takes back c hits admitted at now (Cluster: another slot denied).
function sliding_window.refund(base, w, c, l, now)
  refund_bucket(base, w, c, now)
end
