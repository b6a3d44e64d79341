"""Encoding of what the store keeps in Redis: protobuf payloads, audit JSON, stream entries.

Payloads are the deterministic protobuf serialization; the audit carries one-line JSON with the proto
field names so that operators can read it with redis-cli. A payload that does not parse is logged and
reported as None (a corrupt entry must not take the controller down). No I/O here.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import TypeVar

from google.protobuf import json_format
from google.protobuf.message import DecodeError, Message

from controlplane.api.v1 import operator_pb2

logger = logging.getLogger(__name__)

MessageT = TypeVar("MessageT", bound=Message)


def text(value: bytes | str) -> str:
    """A Redis reply as text (UTF-8)."""
    return value.decode() if isinstance(value, bytes) else value


def parse_payload(message_type: type[MessageT], raw: bytes | None, *, key: str) -> MessageT | None:
    """The message serialized in `raw`; None when raw is None or does not parse (logged with `key`)."""
    if raw is None:
        return None
    message = message_type()
    try:
        message.ParseFromString(raw)
    except DecodeError:
        logger.error("skipping %s: its %s payload does not parse", key, message_type.DESCRIPTOR.name)
        return None
    return message


def record_json(record: operator_pb2.OverrideRecord | None) -> str:
    """One-line JSON of an override record with proto field names, keys sorted; "" for None."""
    if record is None:
        return ""
    return json_format.MessageToJson(record, indent=None, preserving_proto_field_name=True, sort_keys=True)


def is_expired(record: operator_pb2.OverrideRecord, *, now_s: float) -> bool:
    """True when the override has an expiry (expires_at_s > 0) at or before now_s (Unix seconds)."""
    return 0.0 < record.expires_at_s <= now_s


def text_fields(fields: Mapping[bytes, bytes]) -> dict[str, str]:
    """A hash or stream entry's fields as text."""
    return {text(name): text(value) for name, value in fields.items()}


def stream_entries(entries: Iterable[tuple[bytes, Mapping[bytes, bytes]]]) -> list[dict[str, str]]:
    """XRANGE/XREVRANGE replies as dicts of text fields plus "id" (the stream id)."""
    return [{"id": text(entry_id), **text_fields(fields)} for entry_id, fields in entries]
