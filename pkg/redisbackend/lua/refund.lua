-- refund.lua: takes back what check.lua consumed in one Redis Cluster slot
-- when another slot of the same batch vetoed it. The script sent to Redis is
-- lib.lua, the four algorithm files and this driver, concatenated.
--
-- KEYS[i]  the key "<prefix>{<id>}" of consumed request i (i = 1..n).
-- ARGV[1]  now: the clock check.lua decided the slot's batch at (its reply
--          [1]), which names the window bucket the hits went to.
-- ARGV[1+i] request i: "<alg> <window_ms> <limit> <hits>", four decimal
--          integers separated by one space (alg as in check.lua).
--
-- Reply: the integer n (number of refunds applied).
--
-- Refunds never go below zero and never give back more than was taken; a key
-- that has expired meanwhile is left alone.

bind_globals()
local now = tonumber(ARGV[1])
for i = 1, #KEYS do
  local a, w, l, c = string.match(ARGV[1 + i], '^(%d) (%d+) (%d+) (%d+)$')
  local m = a and algs[tonumber(a)] -- algs: algorithms.lua
  if not m then
    return redis.error_reply('ERR envoy-rls refund: malformed request ' .. i)
  end
  m.refund(KEYS[i], tonumber(w), tonumber(c), tonumber(l), now)
end
return #KEYS
