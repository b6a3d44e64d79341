"""The store's Lua scripts and how they are run: EVALSHA, falling back to EVAL when a server lacks them.

Every multi-command write is one script over the keys of one hash slot (see `keys`), so it is atomic on a
single server, behind Sentinel and on Redis Cluster alike, in one round trip, without WATCH. Scripts are
sent as EVALSHA; a server that does not hold a script yet (a fresh server, a failover, SCRIPT FLUSH)
answers NOSCRIPT, and the call is repeated with EVAL, which also caches the script there. A NOSCRIPT
reply means the script did not run, so the repetition never applies a write twice.

Versions are compared as decimal strings (length, then lexically) so that uint64 versions beyond 2^53
compare exactly, which Lua's double-based tonumber would not.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from redis.exceptions import NoScriptError

Arg = str | bytes | int | float


@dataclass(frozen=True, slots=True)
class LuaScript:
    """A Lua script and its SHA1 (what EVALSHA names it by)."""

    name: str
    source: str
    sha: str = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "sha", hashlib.sha1(self.source.encode()).hexdigest())


@dataclass(frozen=True, slots=True)
class ScriptCall:
    """One invocation: the script, its keys (one hash slot) and its arguments."""

    script: LuaScript
    keys: Sequence[str]
    args: Sequence[Arg]


async def run_script(client: Any, call: ScriptCall) -> Any:
    """Run one script call on `client` (a redis.asyncio Redis or RedisCluster) and return its reply.

    Raises:
        redis errors as the client raises them.
    """
    try:
        return await client.evalsha(call.script.sha, len(call.keys), *call.keys, *call.args)
    except NoScriptError:
        return await client.eval(call.script.source, len(call.keys), *call.keys, *call.args)


async def run_scripts(client: Any, calls: Sequence[ScriptCall]) -> list[Any]:
    """Run many script calls pipelined (not as a transaction): one round trip per server involved, plus
    one more for the calls a server answered NOSCRIPT. Calls on one server run in the given order.

    Returns:
        The replies in the order of `calls`; a call that failed has its exception in its place.
    """
    if not calls:
        return []
    async with client.pipeline(transaction=False) as pipe:
        for call in calls:
            # execute_command: redis-py's cluster pipeline blocks its evalsha() method (not the command;
            # it routes EVALSHA by its keys, and our scripts' keys share one slot).
            pipe.execute_command("EVALSHA", call.script.sha, len(call.keys), *call.keys, *call.args)
        replies = list(await pipe.execute(raise_on_error=False))
    missing = [i for i, reply in enumerate(replies) if isinstance(reply, NoScriptError)]
    if missing:
        async with client.pipeline(transaction=False) as pipe:
            for i in missing:
                call = calls[i]
                pipe.execute_command("EVAL", call.script.source, len(call.keys), *call.keys, *call.args)
            for i, reply in zip(missing, await pipe.execute(raise_on_error=False), strict=True):
                replies[i] = reply
    return replies


# KEYS: decision hash, epoch counter (same engine, same slot). ARGV: version, mode, k, n, reason, decided_at_s,
# pool, payload, retention in milliseconds ("0": keep forever). Returns 1 when written, 0 when the stored
# version is >= ARGV[1]. A write renews the retention of both keys.
PUT_DECISION = LuaScript("put_decision", """
local stored = redis.call('HGET', KEYS[1], 'version')
if stored then
  local v = ARGV[1]
  if #v < #stored or (#v == #stored and v <= stored) then
    return 0
  end
end
redis.call('HSET', KEYS[1], 'version', ARGV[1], 'mode', ARGV[2], 'k', ARGV[3], 'n', ARGV[4],
  'reason', ARGV[5], 'decided_at_s', ARGV[6], 'pool', ARGV[7], 'payload', ARGV[8])
if ARGV[9] ~= '0' then
  redis.call('PEXPIRE', KEYS[1], ARGV[9])
  redis.call('PEXPIRE', KEYS[2], ARGV[9])
end
return 1
""")


# KEYS: epoch counter, decision hash (same engine, same slot). ARGV: retention in milliseconds ("0": keep
# forever). Returns the new epoch: INCR of the counter, raised above the epoch of the stored decision's
# version (its decimal digits before the last nine) when the counter is behind it, e.g. after the counter was
# lost (a failover that dropped the last writes). With a retention, the epoch is also above the server's Unix
# time in seconds, and the counter expires with the retention: an engine whose keys expired gets epochs above
# every one it had, as long as it never reserved more epochs than seconds went by (more than one reservation
# per second, sustained for the whole retention).
RESERVE_EPOCH = LuaScript("reserve_epoch", """
local epoch = redis.call('INCR', KEYS[1])
local floor = 0
local stored = redis.call('HGET', KEYS[2], 'version')
if stored and #stored > 9 then
  floor = tonumber(string.sub(stored, 1, #stored - 9)) or 0
end
if ARGV[1] ~= '0' then
  local now_s = tonumber(redis.call('TIME')[1])
  if now_s > floor then floor = now_s end
end
if floor >= epoch then
  epoch = floor + 1
  redis.call('SET', KEYS[1], string.format('%d', epoch))
end
if ARGV[1] ~= '0' then redis.call('PEXPIRE', KEYS[1], ARGV[1]) end
return epoch
""")


# Compare-and-set of an operator record with its audit entry and change notice (the WATCH/MULTI of one
# slot, as a script). KEYS: record hash, audit stream. ARGV: [1] the field compared, [2] "1" when a record
# is expected (then [3] is its exact value) or "0" when none is, [4] PEXPIREAT milliseconds or "0",
# [5] audit MAXLEN (~), [6] channel ("" publishes nothing), [7] notice, [8] number N of hash field/value
# items that follow (0 deletes the record), then the N items, then the audit entry's field/value items.
# Returns 0 (nothing written) when the record is not the one expected, else 1.
CHANGE_RECORD = LuaScript("change_record", """
local current = redis.call('HGET', KEYS[1], ARGV[1])
if ARGV[2] == '1' then
  if current ~= ARGV[3] then return 0 end
elseif current then
  return 0
end
redis.call('DEL', KEYS[1])
local n = tonumber(ARGV[8])
if n > 0 then
  redis.call('HSET', KEYS[1], unpack(ARGV, 9, 8 + n))
  if ARGV[4] ~= '0' then redis.call('PEXPIREAT', KEYS[1], ARGV[4]) end
end
redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[5], '*', unpack(ARGV, 9 + n, #ARGV))
if ARGV[6] ~= '' then redis.call('PUBLISH', ARGV[6], ARGV[7]) end
return 1
""")

# KEYS: a hash. ARGV: [1] PEXPIRE milliseconds, [2] "1" to drop the previous fields first, then field/value
# items. Writes the fields and the expiry together.
HSET_WITH_TTL = LuaScript("hset_with_ttl", """
if ARGV[2] == '1' then redis.call('DEL', KEYS[1]) end
redis.call('HSET', KEYS[1], unpack(ARGV, 3, #ARGV))
redis.call('PEXPIRE', KEYS[1], ARGV[1])
return 1
""")

# KEYS: a sorted set. ARGV: [1] a score, then members. Removes each member whose score is still below ARGV[1]
# (one another client has re-stamped since it was read stays). Returns how many it removed.
ZREM_IF_BELOW = LuaScript("zrem_if_below", """
local cutoff = tonumber(ARGV[1])
local removed = 0
for i = 2, #ARGV do
  local score = redis.call('ZSCORE', KEYS[1], ARGV[i])
  if score and tonumber(score) < cutoff then
    removed = removed + redis.call('ZREM', KEYS[1], ARGV[i])
  end
end
return removed
""")
