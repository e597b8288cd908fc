-- fixed_window.lua: one counter per epoch-aligned bucket, the Lua twin of
-- pkg/algorithm.FixedWindow. Part of check.lua / refund.lua (concatenated after
-- lib.lua).
--
-- Storage: the counter's key holds b, count[b] and 0 (three integers, see
-- parse_state in lib.lua) for the bucket b = floor(now/W) of its last write
-- (the layout of sliding_window.lua, so that the two share their helpers)
-- and expires when the bucket ends, at (b+1)·W. KEYS, ARGV: none of its own;
-- the driver passes the key. State table: {b, count[b], 0}.

local fixed_window = {string_state = true} -- read with MGET

-- load returns the state stored as v (the key's MGET value, false if absent).
function fixed_window.load(key, w, now, v)
  return parse_windowed(v, w, now)
end

-- decide returns allowed, remaining, reset_ms, retry_ms and, when it admitted
-- and consumed, the new state.
function fixed_window.decide(s, now, w, l, cap, c, consume)
  local step = behind(s[1], now, w)
  now = now + step
  local b = idiv(now, w)
  local n = 0
  if s[1] == b then
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
    return ok, rem, reset, retry, {b, n, 0}
  end
  return ok, rem, reset, retry
end

-- store writes state s, decided at now, over the stored state o.
function fixed_window.store(key, w, s, o, now)
  store_windowed(key, w, s, o, 1, now)
end

-- refund takes back c hits admitted at now (Cluster: another slot denied).
function fixed_window.refund(key, w, c, l, now)
  refund_windowed(key, w, c, now)
end
