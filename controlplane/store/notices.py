"""Override change notices: what one controller replica publishes so that the others reload overrides.

A notice names the change (action, kind, scope, actor, time); it does not carry the override itself,
because Redis pub/sub delivers at most once: a replica reloads the overrides from the store (the source
of truth) on every notice, and reloads everything on a "resync" notice, which the watcher emits after
each (re)subscription, i.e. whenever notices may have been missed. No I/O here.
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass
from typing import Literal

logger = logging.getLogger(__name__)

NoticeAction = Literal["set", "clear", "resync"]
_ACTIONS = ("set", "clear", "resync")


@dataclass(frozen=True, slots=True)
class OverrideNotice:
    """A change of the overrides, as seen on the channel `<prefix>:overrides`.

    Attributes:
        action: "set" or "clear" for a change; "resync" when the watcher has just (re)subscribed and
            notices may have been lost: reload every override.
        kind: "delta" or "pin"; "" for resync.
        scope: the scope key ("fleet", "pool:<model>|<accelerator>", "engine:<id>"); "" for resync.
        actor: who made the change; "" for resync.
        at_s: when the change was made, Unix seconds (the writer's clock); 0 for resync.
    """

    action: NoticeAction
    kind: str = ""
    scope: str = ""
    actor: str = ""
    at_s: float = 0.0


RESYNC = OverrideNotice(action="resync")


def encode_notice(notice: OverrideNotice) -> str:
    """The JSON text published for a notice."""
    return json.dumps(asdict(notice), sort_keys=True)


def decode_notice(data: bytes | str) -> OverrideNotice | None:
    """The notice in a published message; None (logged) when the message is not a valid notice."""
    try:
        fields = json.loads(data)
        action = fields["action"]
        if action not in _ACTIONS:
            raise ValueError(f"unknown action {action!r}")
        return OverrideNotice(
            action=action,
            kind=str(fields.get("kind", "")),
            scope=str(fields.get("scope", "")),
            actor=str(fields.get("actor", "")),
            at_s=float(fields.get("at_s", 0.0)),
        )
    except (ValueError, TypeError, KeyError) as err:
        logger.warning("ignoring a malformed override notice %r: %s", data, err)
        return None
