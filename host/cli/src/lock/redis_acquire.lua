-- Take a Redis lock and its fencing token in one step (fencekeeper lock --redis).
-- KEYS[1] the lock key, KEYS[2] the token counter, ARGV[1] a value no other holder
-- uses, ARGV[2] the TTL in milliseconds. Answers the token, or nil when the lock is
-- held. The script runs atomically: no other command runs between SET and INCR, so
-- each acquisition gets a counter value above every earlier one (on one node; see
-- docs/tokens.md for failover).
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  return redis.call('INCR', KEYS[2])
end
return false
