-- fixed_window.lua: one counter per epoch-aligned bucket, the Lua twin of
-- pkg/algorithm.FixedWindow. Part of check.lua / refund.lua (concatenated after
-- lib.lua).
--
-- Storage: <base>:<b> holds count[b] for bucket b = floor(now/W) as a decimal
-- integer string and expires when the bucket ends, at (b+1)·W.
-- KEYS, ARGV: none of its own; the driver passes the key base <prefix>{<id>}.
-- State table: {b = bucket, n = count[b], key = the key of bucket b (nil if
-- unknown)}.

local fixed_window = {}

-- keys and load: as sliding_window's, with the current bucket only.
function fixed_window.keys(base, w, now, ks)
  ks[#ks + 1] = bucket_key(base, idiv(now, w))
end

function fixed_window.load(base, w, now, ks, vals, i)
  return {b = idiv(now, w), n = num_of(vals[i]), key = ks[i]}
end

-- decide returns allowed, remaining, reset_ms, retry_ms and the new state.
function fixed_window.decide(s, now, w, l, cap, c, consume)
  local b = idiv(now, w)
  local n = 0
  if s.b == b then
    n = s.n
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
  local key = s.key
  if s.b ~= b then
    key = nil
  end
  return ok, rem, reset, retry, {b = b, n = n, key = key}
end

-- store writes state s over the stored state o, as sliding_window.store.
function fixed_window.store(base, w, s, now, o)
  local on = nil
  if o.b == s.b then
    on = o.n
  end
  store_bucket(base, w, s.b, s.key, s.n, on, 1, now)
end

-- refund takes back c hits admitted at now (Cluster: another slot denied).
function fixed_window.refund(base, w, c, l, now)
  refund_bucket(base, w, c, now)
end
