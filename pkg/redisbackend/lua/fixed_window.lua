-- fixed_window.lua: one counter per epoch-aligned bucket, the Lua twin of
-- pkg/algorithm.FixedWindow. Part of check.lua / refund.lua (concatenated after
-- lib.lua).
--
-- Storage: the counter's key holds b, count[b] and 0 (three integers, see
-- state_format in lib.lua) for the bucket b = floor(now/W) of its last write
-- (the layout of sliding_window.lua, so that the two share their helpers)
-- and expires when the bucket ends, at (b+1)·W. KEYS, ARGV: none of its own;
-- the driver passes the key. State table: {b, count[b], 0}.

local fixed_window = {string_state = true} -- read with MGET

-- load fills into with the state stored as v (the key's MGET value, false if
-- absent) and returns it.
fixed_window.load = load_windowed

-- decide returns allowed, remaining, reset_ms, retry_ms and, when it admitted
-- and consumed, the new state, written into into (which may be s: s is read
-- in full before into is written). A clock behind the stored bucket decides at
-- the bucket's start and adds the step to reset and retry (as
-- sliding_window.decide); idiv is written out (see load_windowed in lib.lua).
function fixed_window.decide(s, now, w, l, cap, c, consume, no_retry, into)
  local sb, step = s[1], 0
  if sb * w > now then
    step = sb * w - now
    now = sb * w
  end
  local b = now / w -- idiv(now, w); x - x % 1 is floor(x) without a call
  b = b - b % 1
  if b * w > now then
    b = b - 1
  elseif (b + 1) * w <= now then
    b = b + 1
  end
  local n = 0
  if sb == b then
    n = s[2]
  end
  local reset = (b + 1) * w - now
  local ok, retry = false, 0
  if c > l then
    retry = w
  elseif n + c <= l then
    ok = true
    if consume then
      n = n + c
    end
  else
    retry = reset
  end
  local rem = 0
  if n < l then
    rem = l - n
  end
  reset = reset + step
  if retry > 0 then
    retry = retry + step
  end
  if ok and consume then
    into[1], into[2], into[3] = b, n, 0
    return ok, rem, reset, retry, into
  end
  return ok, rem, reset, retry
end

-- store writes state s, decided at now, over a stored state of bucket ob;
-- the key expires when its bucket ends.
fixed_window.store = windowed_store(1)

-- refund takes back c hits admitted at now (Cluster: another slot denied).
function fixed_window.refund(key, w, c, l, now)
  refund_windowed(key, w, c, now)
end
