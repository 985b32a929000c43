"""Checks on a weight update before any engine sees it, and the errors of the training-job API.

A weight update must have exactly the tensors of the model's checkpoint, with the same shapes: vLLM's
``reload_weights`` on a partial or mis-shaped state dict either leaves a mix of old and new weights or
fails half-way through (on CPU a shape mismatch can take the engine core down). The executor therefore
compares the update's safetensors header (names and shapes; no tensor data is read) with the headers
of the checkpoint the engines were started from, and refuses a mismatch with one line, before pausing
any engine: the engines keep serving the weights they have.

``checkpoint_shapes(model)`` reads ``model``'s ``*.safetensors`` headers (a single file, or shards);
a model that is not a local folder (a hub name) gives ``None`` and updates are not checked.
Nothing here imports vLLM, Ray or torch.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Mapping
from pathlib import Path

from rollplan.models import UserInputError

Shapes = dict[str, tuple[int, ...]]
"""Tensor name -> shape."""


class WeightUpdateError(UserInputError):
    """``update_weights`` was given weights the engines cannot load, or a version that is not newer.
    Raised before any engine is touched: they keep serving their current weights."""


class LendError(UserInputError):
    """``lend`` was given slots or a return time training cannot honour (e.g. an end in the past)."""


def header_shapes(data: bytes | str | Path) -> Shapes:
    """Names and shapes from a safetensors header (``data``: the file's bytes, or its path)."""
    if isinstance(data, bytes | bytearray | memoryview):
        raw = bytes(data[:8])
        n = struct.unpack("<Q", raw)[0] if len(raw) == 8 else -1
        body = bytes(data[8 : 8 + n]) if 0 < n <= len(data) - 8 else b""
        where = "the weights bytes"
    else:
        where = str(data)
        with open(data, "rb") as f:
            raw = f.read(8)
            n = struct.unpack("<Q", raw)[0] if len(raw) == 8 else -1
            body = f.read(n) if 0 < n < (1 << 30) else b""
    try:
        header = json.loads(body)
    except ValueError:
        header = None
    if not isinstance(header, dict):
        raise WeightUpdateError(
            f"{where} are not a safetensors file (unreadable header)",
            fix="pass a state dict, safetensors bytes (safetensors.torch.save) or a .safetensors path",
        )
    return {k: tuple(int(x) for x in v["shape"]) for k, v in header.items() if k != "__metadata__"}


def state_dict_shapes(state_dict: Mapping[str, object]) -> Shapes:
    """Names and shapes of a state dict of tensors (anything with a ``.shape``)."""
    out: Shapes = {}
    for k, v in state_dict.items():
        shape = getattr(v, "shape", None)
        if shape is None:
            raise WeightUpdateError(
                f"state dict entry {k!r} is a {type(v).__name__}, not a tensor",
                fix="pass model.state_dict() (tensors only)",
            )
        out[str(k)] = tuple(int(x) for x in shape)
    return out


def checkpoint_shapes(model: str | Path) -> Shapes | None:
    """Shapes of every tensor in the local model folder ``model`` (all ``*.safetensors`` files), or
    None when ``model`` is not a local folder with safetensors files (nothing to check against)."""
    p = Path(model)
    files = sorted(p.glob("*.safetensors")) if p.is_dir() else []
    if not files:
        return None
    out: Shapes = {}
    for f in files:
        out.update(header_shapes(f))
    return out


def check_shapes(expected: Shapes, got: Shapes, *, limit: int = 3) -> None:
    """Raise ``WeightUpdateError`` (one line) unless ``got`` has exactly ``expected``'s names and shapes."""
    missing = sorted(set(expected) - set(got))
    unknown = sorted(set(got) - set(expected))
    bad = sorted(k for k in set(expected) & set(got) if expected[k] != got[k])
    if not (missing or unknown or bad):
        return

    def names(xs: list[str]) -> str:
        more = f" (+{len(xs) - limit} more)" if len(xs) > limit else ""
        return ", ".join(xs[:limit]) + more

    parts = []
    if missing:
        parts.append(f"{len(missing)} missing tensor(s): {names(missing)}")
    if bad:
        shown = [f"{k} {list(got[k])} != {list(expected[k])}" for k in bad]
        parts.append(f"{len(bad)} mis-shaped tensor(s): {names(shown)}")
    if unknown:
        parts.append(f"{len(unknown)} unknown tensor(s): {names(unknown)}")
    raise WeightUpdateError(
        "weight update refused, the engines keep their current weights: " + "; ".join(parts),
        fix="send the full state dict of the model the engines serve (same names and shapes)",
        missing=tuple(missing),
        mis_shaped=tuple(bad),
        unknown=tuple(unknown),
    )
