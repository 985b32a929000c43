"""JSON round-trip for the data model (pydantic at the edge).

``to_json(obj)`` / ``to_jsonable(obj)`` serialise any model dataclass; ``snapshot_from_json``,
``plan_from_json`` and ``from_json(cls, text)`` parse and raise ``SchemaError`` naming the field path
(e.g. ``snap.json: trajectories.3.context_tokens: Input should be a valid integer``).
``json_schema(cls)`` gives the documented JSON Schema of a type.
"""

from __future__ import annotations

import json
from functools import cache
from typing import Any, TypeVar

from pydantic import TypeAdapter, ValidationError

from rollplan.models.errors import SchemaError
from rollplan.models.types import AvailabilityEvent, ClusterSnapshot, Phase, Plan

T = TypeVar("T")


@cache
def _adapter(cls: Any) -> TypeAdapter[Any]:
    return TypeAdapter(cls)


def _where(source: str, err: ValidationError) -> tuple[str, str]:
    first = err.errors()[0]
    loc = ".".join(str(p) for p in first["loc"]) or "(document)"
    return f"{source}: {loc}", first["msg"]


def to_jsonable(obj: Any) -> Any:
    """Plain JSON-compatible Python data (dicts, lists, str, numbers) for any model object."""
    return _adapter(type(obj)).dump_python(obj, mode="json")


def to_json(obj: Any, *, indent: int | None = 2) -> str:
    return json.dumps(to_jsonable(obj), indent=indent)


def from_jsonable(cls: type[T], data: Any, *, source: str = "<input>") -> T:
    try:
        return _adapter(cls).validate_python(data)
    except ValidationError as err:
        where, msg = _where(source, err)
        raise SchemaError(where, msg, fix=f"make the document match the {cls.__name__} schema (docs/schema.md)") from None


def from_json(cls: type[T], text: str | bytes, *, source: str = "<input>") -> T:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        raise SchemaError(f"{source}:{err.lineno}", f"not valid JSON ({err.msg})", fix="fix the JSON syntax") from None
    return from_jsonable(cls, data, source=source)


def check_snapshot(snap: ClusterSnapshot, *, source: str = "<snapshot>") -> ClusterSnapshot:
    """Semantic checks beyond types: unique ids, non-negative quantities, references to known slots.

    Raises ``SchemaError`` naming the field path. Returns the snapshot unchanged.
    """
    seen: set[str] = set()
    for i, s in enumerate(snap.slots):
        if s.id in seen:
            raise SchemaError(f"{source}: slots.{i}.id", f"duplicate slot id {s.id!r}", fix="give every slot a unique id")
        seen.add(s.id)
        if s.tp < 1:
            raise SchemaError(f"{source}: slots.{i}.tp", f"tp must be >= 1, got {s.tp}", fix="set tp to 1 or more")
    tids: set[str] = set()
    for i, t in enumerate(snap.trajectories):
        where = f"{source}: trajectories.{i}"
        if t.id in tids:
            raise SchemaError(f"{where}.id", f"duplicate trajectory id {t.id!r}", fix="give every trajectory a unique id")
        tids.add(t.id)
        if t.context_tokens < 0:
            raise SchemaError(f"{where}.context_tokens", f"must be >= 0, got {t.context_tokens}", fix="use a token count >= 0")
        for name in ("remaining_decode_tokens", "remaining_prefill_tokens", "remaining_tool_seconds", "remaining_turns"):
            est = getattr(t, name)
            if est.mean < 0 or est.spread < 0:
                raise SchemaError(f"{where}.{name}", f"mean and spread must be >= 0, got {est}", fix="use values >= 0")
        if t.slot is not None and t.slot not in seen and t.phase is not Phase.DONE:
            raise SchemaError(
                f"{where}.slot", f"unknown slot {t.slot!r}", fix="reference a slot listed in 'slots', or null"
            )
    return snap


def snapshot_from_json(text: str | bytes, *, source: str = "<snapshot>") -> ClusterSnapshot:
    return check_snapshot(from_json(ClusterSnapshot, text, source=source), source=source)


def plan_from_json(text: str | bytes, *, source: str = "<plan>") -> Plan:
    return from_json(Plan, text, source=source)


def event_from_json(text: str | bytes, *, source: str = "<event>") -> AvailabilityEvent:
    return from_json(AvailabilityEvent, text, source=source)


def json_schema(cls: Any) -> dict[str, Any]:
    return _adapter(cls).json_schema()
