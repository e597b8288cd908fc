-- heartbeat.lua: records one live instance and counts the live ones.
--
-- KEYS[1]  the instance set "<prefix>instances", a sorted set whose scores
--          are expiry times in ms since the Unix epoch.
-- ARGV[1]  the instance id (any string).
-- ARGV[2]  ttl in ms (> 0): how long this beat keeps the instance alive;
--          "0" removes the instance (graceful leave).
-- ARGV[3]  now in ms, or "" to use Redis TIME.
--
-- Reply: the number of live instances (members whose expiry is later than
-- now), after this beat. Members that expired are removed; the key itself
-- expires when its last member does.

local now
if ARGV[3] ~= '' then
  now = tonumber(ARGV[3])
else
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local ttl = tonumber(ARGV[2])
local key = KEYS[1]
if ttl > 0 then
  redis.call('ZADD', key, string.format('%.0f', now + ttl), ARGV[1])
else
  redis.call('ZREM', key, ARGV[1])
end
redis.call('ZREMRANGEBYSCORE', key, '-inf', string.format('%.0f', now))
local newest = redis.call('ZRANGE', key, '-1', '-1', 'WITHSCORES')
if newest[2] then
  redis.call('PEXPIRE', key, string.format('%.0f', tonumber(newest[2]) - now))
end
return redis.call('ZCARD', key)
