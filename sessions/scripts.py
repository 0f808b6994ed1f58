"""Lua scripts: each is one atomic check-and-write, registered once per client (EVALSHA, with redis-py
reloading a script after NOSCRIPT, e.g. when Redis restarted empty).

Times that decide expiry come from the server's TIME, so replicas with skewed clocks agree.
"""

# KEYS: record, spoken. ARGV: ttl_ms, field, value, … → 1 created, 0 already there.
CREATE_SESSION = """
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
for i = 2, #ARGV, 2 do redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1]) end
redis.call('PEXPIRE', KEYS[1], ARGV[1])
redis.call('DEL', KEYS[2])
return 1
"""

# KEYS: record, spoken. ARGV: ttl_ms, spoken_max, n_fields, field, value, …, spoken entries …
# Writes the record (and its spoken log) only where it is missing: an owner restoring what Redis lost.
RESTORE_SESSION = """
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
local n = tonumber(ARGV[3])
for i = 4, 3 + 2 * n, 2 do redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1]) end
redis.call('PEXPIRE', KEYS[1], ARGV[1])
redis.call('DEL', KEYS[2])
for i = 4 + 2 * n, #ARGV do redis.call('RPUSH', KEYS[2], ARGV[i]) end
if redis.call('EXISTS', KEYS[2]) == 1 then
  redis.call('LTRIM', KEYS[2], -tonumber(ARGV[2]), -1)
  redis.call('PEXPIRE', KEYS[2], ARGV[1])
end
return 1
"""

# KEYS: record, spoken. ARGV: ttl_ms, now_ms, field, value, … → 1 updated, 0 no such session.
# HSET on a missing key would resurrect a partial record, hence the existence check.
UPDATE_SESSION = """
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
redis.call('HSET', KEYS[1], 'last_seen_ms', ARGV[2])
for i = 3, #ARGV, 2 do redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1]) end
redis.call('PEXPIRE', KEYS[1], ARGV[1])
redis.call('PEXPIRE', KEYS[2], ARGV[1])
return 1
"""

# The spoken log holds one entry per utterance. Entries are JSON that begins `{"u": <index>, "f": <0|1>`
# (SpokenEntry.to_json), so a script finds an utterance's entry by that prefix (the caller passes it:
# ARGV's last) and reads whether it is finished from the character after it, without a JSON parser.
_FIND_ENTRY = """
local p = ARGV[#ARGV]
local entries = redis.call('LRANGE', KEYS[2], 0, -1)
local at = nil
for i = #entries, 1, -1 do
  if string.sub(entries[i], 1, #p) == p then at = i break end
end
"""

_RAISE_NEXT = """
if redis.call('EXISTS', KEYS[1]) == 0 then return -1 end
local nxt = tonumber(redis.call('HGET', KEYS[1], 'next_utterance') or '0')
local idx = tonumber(ARGV[3])
if idx + 1 > nxt then
  nxt = idx + 1
  redis.call('HSET', KEYS[1], 'next_utterance', nxt)
end
redis.call('HSET', KEYS[1], 'last_seen_ms', ARGV[2])
redis.call('PEXPIRE', KEYS[1], ARGV[1])
"""

# KEYS: record, spoken. ARGV: ttl_ms, now_ms, utterance_index, entry_json, spoken_max, entry_prefix
# → next_utterance, or -1 when there is no such session. Marks the utterance as started (an unfinished
# entry) and moves next_utterance past it, so a replica killed mid-utterance leaves it named in the log
# and the next replica does not reuse its index. Idempotent: an entry already there is left alone.
BEGIN_UTTERANCE = _RAISE_NEXT + _FIND_ENTRY + """
if not at then
  redis.call('RPUSH', KEYS[2], ARGV[4])
  redis.call('LTRIM', KEYS[2], -tonumber(ARGV[5]), -1)
end
redis.call('PEXPIRE', KEYS[2], ARGV[1])
return nxt
"""

# KEYS: record, spoken. ARGV: ttl_ms, now_ms, utterance_index, entry_json, cancelled(0|1), spoken_max,
# entry_prefix → next_utterance, or -1 when there is no such session. Replaces the utterance's started
# entry (or appends one) and bumps `completed` or `cancelled`. Idempotent: an utterance already recorded
# as finished is left alone, so a write replayed after an outage (which Redis may have applied already,
# its reply lost in a timeout) counts once.
RECORD_UTTERANCE = _RAISE_NEXT + _FIND_ENTRY + """
redis.call('PEXPIRE', KEYS[2], ARGV[1])
if at and string.sub(entries[at], #p + 1, #p + 1) == '1' then return nxt end
if ARGV[5] == '1' then
  redis.call('HINCRBY', KEYS[1], 'cancelled', 1)
else
  redis.call('HINCRBY', KEYS[1], 'completed', 1)
end
if at then
  redis.call('LSET', KEYS[2], at - 1, ARGV[4])
else
  redis.call('RPUSH', KEYS[2], ARGV[4])
  redis.call('LTRIM', KEYS[2], -tonumber(ARGV[6]), -1)
end
redis.call('PEXPIRE', KEYS[2], ARGV[1])
return nxt
"""

# KEYS: record, control channel. ARGV: message → receivers, or -1 when there is no such session.
PUBLISH_IF_SESSION = """
if redis.call('EXISTS', KEYS[1]) == 0 then return -1 end
return redis.call('PUBLISH', KEYS[2], ARGV[1])
"""

# KEYS: lease, record. ARGV: token, lease_ttl_ms, replica, policy ('takeover'|'refuse')
# → {1, ''} acquired, {2, old_token} taken over, {0, holder} refused, {-1, ''} no such session.
ACQUIRE_LEASE = """
if redis.call('EXISTS', KEYS[2]) == 0 then return {-1, ''} end
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  redis.call('HSET', KEYS[2], 'owner_replica', ARGV[3], 'owner_token', ARGV[1])
  return {1, ''}
end
local cur = redis.call('GET', KEYS[1])
if cur == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return {1, ''}
end
if ARGV[4] ~= 'takeover' then return {0, cur} end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
redis.call('HSET', KEYS[2], 'owner_replica', ARGV[3], 'owner_token', ARGV[1])
return {2, cur}
"""

# KEYS: lease, record, spoken. ARGV: token, lease_ttl_ms, session_ttl_ms, now_ms
# → 1 renewed, 0 lost to another owner, 2 renewed but the record is gone (Redis lost it: restore).
# An absent lease is reclaimed: nobody else holds it, and Redis may have restarted empty.
RENEW_LEASE = """
local cur = redis.call('GET', KEYS[1])
if cur and cur ~= ARGV[1] then return 0 end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
if redis.call('EXISTS', KEYS[2]) == 0 then return 2 end
redis.call('HSET', KEYS[2], 'last_seen_ms', ARGV[4])
redis.call('PEXPIRE', KEYS[2], ARGV[3])
redis.call('PEXPIRE', KEYS[3], ARGV[3])
return 1
"""

# KEYS: lease, record. ARGV: token → 1 released, 0 not ours (compare-and-delete).
RELEASE_LEASE = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('DEL', KEYS[1])
if redis.call('HGET', KEYS[2], 'owner_token') == ARGV[1] then
  redis.call('HDEL', KEYS[2], 'owner_replica', 'owner_token')
end
return 1
"""

_NOW_MS = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
"""

# Stream slots: a sorted set per tenant, member = slot id, score = expiry (server ms). Expired members
# are purged before counting, so a crashed replica's slots stop counting once their lease runs out.
# The set's own TTL follows its longest-lived member.

# KEYS: streams. ARGV: slot_id, ttl_ms, limit → {1, active} acquired, {0, active} at the limit.
ACQUIRE_STREAM = _NOW_MS + """
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
local n = redis.call('ZCARD', KEYS[1])
if n >= tonumber(ARGV[3]) then return {0, n} end
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[2]), ARGV[1])
if redis.call('PTTL', KEYS[1]) < tonumber(ARGV[2]) then redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
return {1, n + 1}
"""

# KEYS: streams. ARGV: slot_id, ttl_ms → 1 renewed, 0 expired (no longer counted; re-acquire).
RENEW_STREAM = _NOW_MS + """
local exp = redis.call('ZSCORE', KEYS[1], ARGV[1])
if not exp or tonumber(exp) <= now then
  redis.call('ZREM', KEYS[1], ARGV[1])
  return 0
end
redis.call('ZADD', KEYS[1], 'XX', now + tonumber(ARGV[2]), ARGV[1])
if redis.call('PTTL', KEYS[1]) < tonumber(ARGV[2]) then redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
return 1
"""

# KEYS: streams → live slots.
COUNT_STREAMS = _NOW_MS + """
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
return redis.call('ZCARD', KEYS[1])
"""

# KEYS: voice, index, sizes (hash: voice_id → bytes stored). ARGV: voice_id, max_voices, replace(0|1), size,
# max_tenant_bytes, field, value, … → {1, tenant bytes after}, {-1, 0} exists (and not replacing),
# {-2, 0} tenant at its voice limit, {-3, tenant bytes of the others} the bytes would pass the quota.
# The total is summed from the sizes hash (≤ max_voices entries) rather than kept in a counter, so it
# cannot drift from what is stored; a replaced voice's old size is not counted twice.
PUT_VOICE = """
local exists = redis.call('EXISTS', KEYS[1]) == 1
if exists and ARGV[3] == '0' then return {-1, 0} end
if not exists and redis.call('SCARD', KEYS[2]) >= tonumber(ARGV[2]) then return {-2, 0} end
local total = 0
for _, v in ipairs(redis.call('HVALS', KEYS[3])) do total = total + tonumber(v) end
local others = total - tonumber(redis.call('HGET', KEYS[3], ARGV[1]) or '0')
local size = tonumber(ARGV[4])
if others + size > tonumber(ARGV[5]) then return {-3, others} end
redis.call('DEL', KEYS[1])
for i = 6, #ARGV, 2 do redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1]) end
redis.call('SADD', KEYS[2], ARGV[1])
redis.call('HSET', KEYS[3], ARGV[1], size)
return {1, others + size}
"""

# KEYS: voice, index, sizes. ARGV: voice_id → 1 deleted, 0 no such voice. Frees its bytes of the quota.
DELETE_VOICE = """
local n = redis.call('DEL', KEYS[1])
redis.call('SREM', KEYS[2], ARGV[1])
redis.call('HDEL', KEYS[3], ARGV[1])
return n
"""

# KEYS: index, sizes → {voices, bytes}.
VOICE_USAGE = """
local total = 0
for _, v in ipairs(redis.call('HVALS', KEYS[2])) do total = total + tonumber(v) end
return {redis.call('SCARD', KEYS[1]), total}
"""
