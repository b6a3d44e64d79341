"""Wire-level constants and rules that both sides of the contract use: one home, importable by the agent.

Imports only the generated protobuf code (`controlplane.api`), so `agents` may import this module
(an import-linter contract keeps it that way). No I/O.

- Engine ids: `ENGINE_ID_PATTERN` ([A-Za-z0-9._:-]{1,128}).
- Pools: a pool is one model on one accelerator type in one KV-transfer role; its key is
  "<model>|<accelerator>", with "|<role>" appended for an engine with a KV connector (`KvRole`: producer,
  consumer, both), so a model's prefill and decode instances never share statistics while an engine without a
  role keeps the key it always had. Names are 1..MAX_POOL_NAME_CHARS printable characters without "|" (no
  control characters, no NUL). `pool_key_of` / `make_pool_key` build a key from names, `pool_key_of_message`
  from a `Pool` message, `pool_of_key` parses one back.
- Modes: `Mode` is the one vocabulary of batching modes (the core decides one, the agent enforces one);
  `MODE_FROM_PROTO` / `MODE_TO_PROTO` map it to and from the wire enum, `MODE_NAMES` the wire enum to the
  lower-case names used in records, metrics and logs, `MODE_CODES` to the numbers of the mode gauge.
- Budgets: `min_budget_tokens` is the smallest per-step token budget a decision may carry; an agent NACKs
  a decision below it (`budget_below_floor`) and the controller never emits one.
- Versions: a decision version is `epoch · VERSION_EPOCH_FACTOR + sequence` (see `compose_version`); the
  epoch is reserved per engine in the store whenever an engine's stream opens, so versions keep increasing
  when an engine moves between controller replicas.
- Support: an agent's Hello says what its probe of vLLM's internals found (`AgentSupport`): `SUPPORT_LEVEL_NAMES`
  maps the wire enum to "full", "degraded", "stock"; at most MAX_SUPPORT_MISSING internals named, each at most
  MAX_SUPPORT_NAME_CHARS printable characters, and a detail of at most MAX_SUPPORT_DETAIL_CHARS (the agent cuts
  to these bounds, the controller refuses a Hello beyond them).
- Steps: `steps_message` builds a batch's `Steps`, its columns packed by `pack_step_columns` into
  `Steps.packed_columns` (STEP_PACKED_BYTES per step), which the controller reads without a per-value conversion.
  A controller that reads them says so in the Connect stream's initial metadata (STEPS_METADATA: "cp-steps:
  packed"; `reads_packed_steps`); an agent packs only then, so an agent newer than its controller still sends
  fields it reads.
- Error text: `bounded` cuts echoed input to a fixed prefix so an error never carries a whole payload.
"""

from __future__ import annotations

import array
import enum
import re
import sys
from collections.abc import Iterable, Sequence

from controlplane.api.v1 import agent_pb2, common_pb2

ENGINE_ID_PATTERN = re.compile(r"[A-Za-z0-9._:-]{1,128}")
POOL_KEY_SEPARATOR = "|"
MAX_POOL_NAME_CHARS = 256
MAX_ECHO_CHARS = 64
UINT32_MAX = (1 << 32) - 1
UINT64_MAX = (1 << 64) - 1
VERSION_EPOCH_FACTOR = 10**9
# The smallest per-step token budget worth running: below it an engine spends its time on step overhead
# (a 1-token budget ran 300 steps/s of one token each on the CPU engine).
MIN_BUDGET_TOKENS = 256
MAX_SUPPORT_MISSING = 64
MAX_SUPPORT_NAME_CHARS = 128
MAX_SUPPORT_DETAIL_CHARS = 512
SUPPORT_LEVEL_NAMES = {agent_pb2.SUPPORT_LEVEL_FULL: "full", agent_pb2.SUPPORT_LEVEL_DEGRADED: "degraded",
                       agent_pb2.SUPPORT_LEVEL_STOCK: "stock"}
SUPPORT_LEVEL_FROM_NAME = {name: level for level, name in SUPPORT_LEVEL_NAMES.items()}
STEP_PACKED_BYTES = 20  # per step in Steps.packed_columns: a float64 duration and three uint32 counts
STEPS_METADATA = ("cp-steps", "packed")  # the controller's Connect initial metadata: it reads packed steps



class Mode(enum.StrEnum):
    """Batching mode an engine runs in.

    MB: stock vLLM mixed batching (with the P-PAS token budget).
    EB: exclusive batching (prefill-only and decode-only steps, threshold k, admission cap N).
    PASSTHROUGH: stock vLLM, untouched.
    """

    MB = "mb"
    EB = "eb"
    PASSTHROUGH = "passthrough"


MODE_TO_PROTO = {Mode.MB: common_pb2.MODE_MB, Mode.EB: common_pb2.MODE_EB,
                 Mode.PASSTHROUGH: common_pb2.MODE_PASSTHROUGH}
MODE_FROM_PROTO = {wire: mode for mode, wire in MODE_TO_PROTO.items()}
MODE_NAMES = {common_pb2.MODE_UNSPECIFIED: "unspecified",
              **{wire: mode.value for wire, mode in MODE_FROM_PROTO.items()}}
MODE_CODES = {common_pb2.MODE_MB: 1, common_pb2.MODE_EB: 2, common_pb2.MODE_PASSTHROUGH: 3}


class KvRole(enum.StrEnum):
    """An engine's role in disaggregated prefill/decode: vLLM's kv_transfer_config.kv_role.

    NONE: no KV connector; the pool key is "<model>|<accelerator>".
    PRODUCER: a prefill instance (kv_producer): it computes prompts and sends their KV.
    CONSUMER: a decode instance (kv_consumer): it receives prompts' KV and decodes.
    BOTH: kv_both: sends and receives KV, and runs whole requests.
    """

    NONE = ""
    PRODUCER = "producer"
    CONSUMER = "consumer"
    BOTH = "both"


KV_ROLE_TO_PROTO = {KvRole.NONE: common_pb2.KV_ROLE_UNSPECIFIED, KvRole.PRODUCER: common_pb2.KV_ROLE_PRODUCER,
                    KvRole.CONSUMER: common_pb2.KV_ROLE_CONSUMER, KvRole.BOTH: common_pb2.KV_ROLE_BOTH}
KV_ROLE_FROM_PROTO = {wire: role for role, wire in KV_ROLE_TO_PROTO.items()}
# vLLM's spelling of each role (KVTransferConfig.kv_role).
KV_ROLE_FROM_VLLM = {"kv_producer": KvRole.PRODUCER, "kv_consumer": KvRole.CONSUMER, "kv_both": KvRole.BOTH}
_KV_ROLES_BY_VALUE = {role.value: role for role in KvRole}


def bounded(text: object, limit: int = MAX_ECHO_CHARS) -> str:
    """repr() of `text` cut to `limit` characters, with the original length when cut."""
    shown = repr(text)
    if len(shown) <= limit:
        return shown
    size = len(text) if isinstance(text, str | bytes) else len(shown)
    return f"{shown[:limit]}… ({size} chars)"


def is_valid_engine_id(engine_id: str) -> bool:
    return ENGINE_ID_PATTERN.fullmatch(engine_id) is not None


def pool_name_problem(name: str) -> str | None:
    """Why `name` cannot be a pool's model or accelerator name, or None when it can."""
    if not name:
        return "must not be empty"
    if len(name) > MAX_POOL_NAME_CHARS:
        return f"longer than {MAX_POOL_NAME_CHARS} characters ({len(name)})"
    if POOL_KEY_SEPARATOR in name:
        return f"must not contain {POOL_KEY_SEPARATOR!r}"
    if not name.isprintable():
        return "must contain only printable characters (no control characters or NUL)"
    return None


def pool_key_of(model: str, accelerator: str, kv_role: str = "") -> str:
    """"<model>|<accelerator>", or "<model>|<accelerator>|<kv_role>" for a role: the one way a pool key is built;
    unvalidated (for names already checked, or to compare with keys that were: an invalid name gives a key no
    valid pool has)."""
    key = f"{model}{POOL_KEY_SEPARATOR}{accelerator}"
    return f"{key}{POOL_KEY_SEPARATOR}{kv_role}" if kv_role else key


def make_pool_key(model: str, accelerator: str, kv_role: str = "") -> str:
    """`pool_key_of` after checking both names and the role (one of `KvRole`'s values); raises ValueError
    (bounded echo) when one is invalid."""
    for field, name in (("model", model), ("accelerator", accelerator)):
        problem = pool_name_problem(name)
        if problem is not None:
            raise ValueError(f"pool {field} {bounded(name)} {problem}")
    if kv_role not in _KV_ROLES_BY_VALUE:
        raise ValueError(f"pool kv_role {bounded(kv_role)} is not one of producer, consumer, both")
    return pool_key_of(model, accelerator, kv_role)


def kv_role_name(wire: int) -> str:
    """The key's spelling of a wire KvRole; an unknown value gives "kv_role_<n>", which no valid pool has."""
    role = KV_ROLE_FROM_PROTO.get(wire)
    return role.value if role is not None else f"kv_role_{wire}"


def pool_key_of_message(pool: common_pb2.Pool) -> str:
    """The key of a `Pool` message (unvalidated, as `pool_key_of`)."""
    return pool_key_of(pool.model, pool.accelerator, kv_role_name(pool.kv_role))


def pool_of_key(key: str) -> common_pb2.Pool:
    """The `Pool` message of a key `pool_key_of` built (the inverse of `pool_key_of_message` for valid keys); a
    role it does not know is left unset."""
    model, _, rest = key.partition(POOL_KEY_SEPARATOR)
    accelerator, _, role = rest.partition(POOL_KEY_SEPARATOR)
    wire = KV_ROLE_TO_PROTO[_KV_ROLES_BY_VALUE.get(role, KvRole.NONE)]
    return common_pb2.Pool(model=model, accelerator=accelerator, kv_role=wire)


def min_budget_tokens(max_num_batched_tokens: int) -> int:
    """The budget floor for an engine started with `max_num_batched_tokens` (never above it)."""
    return max(1, min(int(max_num_batched_tokens), MIN_BUDGET_TOKENS))


def _check_int(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} must be an int, got {type(value).__name__} {bounded(value)}")
    return value


def compose_version(epoch: int, sequence: int) -> int:
    """The version of decision `sequence` in `epoch`: epoch · 10^9 + sequence.

    Raises:
        ValueError: for a negative epoch, a sequence outside [0, 10^9), a non-int argument, or a version
            above 2^64 − 1 (uint64 overflow).
    """
    _check_int("epoch", epoch)
    _check_int("sequence", sequence)
    if epoch < 0:
        raise ValueError(f"epoch must not be negative, got {epoch}")
    if not 0 <= sequence < VERSION_EPOCH_FACTOR:
        raise ValueError(f"sequence must be in [0, {VERSION_EPOCH_FACTOR}), got {sequence}: take a new epoch")
    version = epoch * VERSION_EPOCH_FACTOR + sequence
    if version > UINT64_MAX:
        raise ValueError(f"epoch {epoch} with sequence {sequence} gives version {version}, above uint64")
    return version


def split_version(version: int) -> tuple[int, int]:
    """(epoch, sequence) of a version: the inverse of `compose_version`.

    Raises:
        ValueError: for a non-int, negative or above-uint64 version.
    """
    _check_int("version", version)
    if not 0 <= version <= UINT64_MAX:
        raise ValueError(f"version must be in [0, {UINT64_MAX}] (uint64), got {version}")
    return divmod(version, VERSION_EPOCH_FACTOR)


def pack_step_columns(duration_s: Sequence[float], prefill_tokens: Sequence[int], decode_tokens: Sequence[int],
                      decode_requests: Sequence[int]) -> bytes:
    """`Steps.packed_columns` for these columns (of one length): the durations as little-endian float64, then
    the three counts as little-endian uint32.

    Raises:
        ValueError: columns of different lengths; OverflowError / TypeError: a count that is not a uint32.
    """
    if not len(duration_s) == len(prefill_tokens) == len(decode_tokens) == len(decode_requests):
        raise ValueError("step columns must have equal lengths")
    parts = [array.array("d", duration_s)]
    parts += [array.array("I", column) for column in (prefill_tokens, decode_tokens, decode_requests)]
    if parts[1].itemsize != 4:  # "I" is 4 bytes on every platform vLLM runs on; anything else is not packed
        raise OverflowError("array type 'I' is not 4 bytes here")
    if sys.byteorder != "little":
        for part in parts:
            part.byteswap()
    return b"".join(part.tobytes() for part in parts)


def reads_packed_steps(metadata: Iterable[tuple[str, str | bytes]] | None) -> bool:
    """Whether a Connect stream's initial metadata says the controller reads `Steps.packed_columns`."""
    return any((key, value) == STEPS_METADATA for key, value in metadata or ())


def steps_message(duration_s: Sequence[float], prefill_tokens: Sequence[int], decode_tokens: Sequence[int],
                  decode_requests: Sequence[int], *, packed: bool, mode: Sequence[int] = (),
                  budget_tokens: Sequence[int] = ()) -> agent_pb2.Steps:
    """A batch's `Steps`: packed (`pack_step_columns`) when `packed` (the controller reads them) and the columns
    pack, else the repeated fields (columns of different lengths go that way, for the controller to refuse; a
    count that is not a uint32 raises there as protobuf's uint32 fields do); the mode and budget columns as
    given."""
    if packed:
        try:
            columns = pack_step_columns(duration_s, prefill_tokens, decode_tokens, decode_requests)
        except (OverflowError, TypeError, ValueError):
            pass
        else:
            return agent_pb2.Steps(packed_columns=columns, mode=mode, budget_tokens=budget_tokens)
    return agent_pb2.Steps(prefill_tokens=prefill_tokens, decode_tokens=decode_tokens, decode_requests=decode_requests,
                           duration_s=duration_s, mode=mode, budget_tokens=budget_tokens)
