"""Rollout workloads: what a batch of multi-turn trajectories will do, with the true lengths.

A ``Workload`` is a tuple of ``TrajectorySpec`` (grouped: the samples of one prompt share ``group``), each a
prompt and a list of ``Turn``s. Turn k: append ``prefill_tokens`` new tokens (the previous tool's
observation; usually 0 for turn 0, whose input is the prompt), decode ``decode_tokens``, then wait
``tool_seconds`` for the tool/environment (after the last turn: trailing environment time, e.g. a final test
run; 0 = the trajectory is done when its last decode ends). The context before turn k's decode is
``prompt_tokens + sum(prefill[:k+1]) + sum(decode[:k])``: every generated token stays in the context.

File format: JSONL, documented in docs/inputs.md (``load_workload`` / ``save_workload``; errors name file:line).
Builders: ``swebench_workload`` (real coding-agent traces), ``azure_workload`` (single-turn Azure code trace),
``synthetic_workload`` (seeded, heavy-tailed, multi-turn). All builders are deterministic given ``seed``.

Workloads that do not flatter the predictor (``rollplan workload build``, ``rollplan replay`` and ``rollplan bench
replay`` take the same two options):

- Dispersion (``--dispersion SIGMA``, ``with_dispersion``): how much the samples of one prompt differ, the
  lognormal sigma of each sample's decode-length factor (default ``DEFAULT_DISPERSION`` = 0.15, today's), with
  the per-turn, tool and turn-count jitters scaled alongside; 0 gives identical samples.
- First epoch (``--first-epoch``): every batch's prompts are new to the policies. Decision: the history is
  disabled per prompt, not avoided by the draw. A policy's cross-batch history is keyed by prompt (the batch
  source's history key, ``rollplan.sim.replay.BatchSource``): a batch of a first-epoch replay keys its prompts
  by (prompt, batch) (``rollplan.sim.bench_replay.FirstEpochSource``), so no batch finds a prompt in the
  history, neither the warm-up steps' nor an earlier batch's; the group (Seer) update and the global prior (the
  mean over every finished trajectory) still apply, as they do for a job in its first epoch. Drawing unseen
  prompts instead cannot work on the shared data: the bench's 3 warm-up batches draw 384 prompts from 166
  recorded runs, and a workload file is every batch's prompt set. ``workload build --first-epoch`` writes
  ``"first_epoch": true`` into the file's meta line; ``rollplan replay`` honours it.
"""

from __future__ import annotations

import csv
import json
import logging
import math
import random
import statistics
from collections.abc import Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from rollplan.models.errors import TraceError, UserInputError

log = logging.getLogger(__name__)


# --- data model ---------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Turn:
    """One LLM call of a trajectory: prefill ``prefill_tokens`` new tokens, decode ``decode_tokens``, then a
    tool/environment wait of ``tool_seconds``. Invariants: prefill >= 0, decode >= 1, tool_seconds >= 0 finite."""

    prefill_tokens: int
    decode_tokens: int
    tool_seconds: float = 0.0

    def __post_init__(self) -> None:
        if self.prefill_tokens < 0 or self.decode_tokens < 1:
            raise ValueError(f"turn needs prefill_tokens >= 0 and decode_tokens >= 1, got {self}")
        if not (math.isfinite(self.tool_seconds) and self.tool_seconds >= 0):
            raise ValueError(f"turn needs a finite tool_seconds >= 0, got {self.tool_seconds}")


@dataclass(frozen=True, slots=True)
class TrajectorySpec:
    """The true course of one trajectory. ``source``: provenance (e.g. ``swebench:glm:<task>``), free text."""

    id: str
    group: str
    prompt_tokens: int
    turns: tuple[Turn, ...]
    source: str = ""

    def __post_init__(self) -> None:
        if not self.id or not self.group:
            raise ValueError("trajectory id and group must be non-empty")
        if self.prompt_tokens < 1:
            raise ValueError(f"{self.id}: prompt_tokens must be >= 1, got {self.prompt_tokens}")
        if not self.turns:
            raise ValueError(f"{self.id}: a trajectory needs at least one turn")

    @property
    def num_turns(self) -> int:
        return len(self.turns)

    @property
    def decode_tokens(self) -> int:
        """Tokens generated over all turns."""
        return sum(t.decode_tokens for t in self.turns)

    @property
    def prefill_tokens(self) -> int:
        """Tokens prefilled over the whole trajectory: the prompt plus every turn's new tokens."""
        return self.prompt_tokens + sum(t.prefill_tokens for t in self.turns)

    @property
    def tool_seconds(self) -> float:
        return sum(t.tool_seconds for t in self.turns)

    @property
    def final_context(self) -> int:
        """Context length after the last decode (the largest it gets)."""
        return self.prefill_tokens + self.decode_tokens

    def context_before(self, k: int) -> int:
        """Tokens in context when turn ``k`` starts decoding (its prefill done)."""
        turns = self.turns[: k + 1]
        return self.prompt_tokens + sum(t.prefill_tokens for t in turns) + sum(t.decode_tokens for t in turns[:-1])


@dataclass(frozen=True, slots=True)
class Workload:
    """A rollout batch. ``meta``: provenance (builder, seed, parameters); plain JSON data, never mutated."""

    trajectories: tuple[TrajectorySpec, ...]
    meta: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        seen: set[str] = set()
        for t in self.trajectories:
            if t.id in seen:
                raise ValueError(f"duplicate trajectory id {t.id!r}")
            seen.add(t.id)

    def __len__(self) -> int:
        return len(self.trajectories)

    def __iter__(self) -> Iterator[TrajectorySpec]:
        return iter(self.trajectories)

    def groups(self) -> dict[str, tuple[TrajectorySpec, ...]]:
        """Group id -> its trajectories, groups in order of first appearance."""
        out: dict[str, list[TrajectorySpec]] = {}
        for t in self.trajectories:
            out.setdefault(t.group, []).append(t)
        return {g: tuple(ts) for g, ts in out.items()}

    def truncated(self, max_context: int) -> Workload:
        """Every trajectory cut to fit ``max_context`` (see ``truncate_to_context``)."""
        trajs = tuple(truncate_to_context(t, max_context) for t in self.trajectories)
        changed = sum(1 for a, b in zip(trajs, self.trajectories, strict=True) if a is not b)
        return Workload(trajs, {**self.meta, "max_context": max_context, "truncated": changed})

    def summary(self) -> dict[str, Any]:
        """Plain-data statistics: sizes, per-trajectory distributions, and group length similarity.

        ``decode_cv_within_groups``: mean over groups (of 2+ samples) of the coefficient of variation of total
        decode tokens; ``decode_cv_across_groups``: CV of the group means. Seer-style prediction relies on
        the first being much smaller than the second.
        """
        groups = self.groups()
        sizes = [len(g) for g in groups.values()]
        totals = {g: [t.decode_tokens for t in ts] for g, ts in groups.items()}
        within = [_cv(v) for v in totals.values() if len(v) > 1]
        means = [statistics.fmean(v) for v in totals.values()]
        return {
            "trajectories": len(self.trajectories),
            "groups": len(groups),
            "samples_per_group": {"min": min(sizes, default=0), "max": max(sizes, default=0)},
            "turns": _stats([t.num_turns for t in self]),
            "prompt_tokens": _stats([t.prompt_tokens for t in self]),
            "prefill_tokens": _stats([t.prefill_tokens for t in self], total=True),
            "decode_tokens": _stats([t.decode_tokens for t in self], total=True),
            "tool_seconds": _stats([t.tool_seconds for t in self], total=True),
            "final_context": _stats([t.final_context for t in self]),
            "decode_cv_within_groups": round(statistics.fmean(within), 4) if within else None,
            "decode_cv_across_groups": round(_cv(means), 4) if len(means) > 1 else None,
            "meta": dict(self.meta),
        }


def _cv(xs: Sequence[float]) -> float:
    m = statistics.fmean(xs)
    return statistics.pstdev(xs) / m if m > 0 else 0.0


def _stats(xs: Sequence[float], *, total: bool = False) -> dict[str, float]:
    if not xs:
        return {}
    s = sorted(xs)

    def pct(p: float) -> float:  # nearest rank
        return s[min(len(s) - 1, max(0, math.ceil(p * len(s)) - 1))]

    out = {"mean": round(statistics.fmean(s), 3), "p50": pct(0.5), "p90": pct(0.9), "max": s[-1]}
    if total:
        out["total"] = round(sum(s), 3)
    return out


def truncate_to_context(spec: TrajectorySpec, max_context: int) -> TrajectorySpec:
    """``spec`` cut so its context never exceeds ``max_context`` tokens (returned unchanged when it fits).

    Rules, as an RL rollout with a context limit behaves:
    - a prompt that leaves no room for one decode token is cut to ``max_context // 2`` (frameworks cap the
      prompt length); a prompt that fits is never touched;
    - a turn whose new (observation) tokens leave no room for one decode token is dropped with every later
      turn: the trajectory ends after the previous turn, whose tool call did run;
    - a turn whose decode would overflow is cut to the room left and becomes the last turn, with no tool call;
    - turn 0's prefill is cut rather than dropped, so at least one turn remains.
    """
    if max_context < 2:
        raise ValueError(f"max_context must be >= 2, got {max_context}")
    if spec.final_context <= max_context:
        return spec
    prompt = spec.prompt_tokens if spec.prompt_tokens < max_context else max_context // 2
    ctx = prompt
    out: list[Turn] = []
    for k, t in enumerate(spec.turns):
        prefill = t.prefill_tokens
        if ctx + prefill >= max_context:
            if k > 0:
                break
            prefill = max_context - ctx - 1
        ctx += prefill
        room = max_context - ctx
        if t.decode_tokens > room:
            out.append(Turn(prefill, room, 0.0))
            break
        out.append(t if prefill == t.prefill_tokens else Turn(prefill, t.decode_tokens, t.tool_seconds))
        ctx += t.decode_tokens
    return replace(spec, prompt_tokens=prompt, turns=tuple(out))


# --- JSONL I/O (pydantic at the edge) -----------------------------------------------------------------------


class _TurnIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    prefill_tokens: int = Field(0, ge=0, strict=True)
    decode_tokens: int = Field(ge=1, strict=True)
    tool_seconds: float = Field(0.0, ge=0, allow_inf_nan=False, strict=True)


class _TrajectoryIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    id: str = Field(min_length=1)
    group: str = Field(min_length=1)
    prompt_tokens: int = Field(ge=1, strict=True)
    turns: list[_TurnIn] = Field(min_length=1)
    source: str = ""


_FORMAT_FIX = "see docs/inputs.md (workload JSONL): one trajectory per line"


def parse_workload(text: str, *, source: str = "<input>") -> Workload:
    """Parse workload JSONL. Blank lines are skipped; an optional first line ``{"meta": {...}}`` holds
    provenance. Raises ``TraceError`` naming ``source:line`` for bad JSON, a field of the wrong type or range
    (negative tokens or durations), a duplicate id, or an empty file."""
    meta: dict[str, Any] = {}
    trajs: list[TrajectorySpec] = []
    first_line: dict[str, int] = {}
    for lineno, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line:
            continue
        try:
            doc = json.loads(line)
        except json.JSONDecodeError as err:
            raise TraceError(source, lineno, f"not valid JSON ({err.msg})", fix=_FORMAT_FIX) from None
        if not trajs and not meta and isinstance(doc, dict) and set(doc) == {"meta"}:
            if not isinstance(doc["meta"], dict):
                raise TraceError(source, lineno, "'meta' must be an object", fix=_FORMAT_FIX)
            meta = doc["meta"]
            continue
        try:
            t = _TrajectoryIn.model_validate(doc)
        except ValidationError as err:
            e = err.errors()[0]
            loc = ".".join(str(p) for p in e["loc"]) or "(line)"
            got = f" (got {e['input']!r})" if not isinstance(e.get("input"), dict | list) else ""
            raise TraceError(source, lineno, f"{loc}: {e['msg']}{got}", fix=_FORMAT_FIX) from None
        if t.id in first_line:
            raise TraceError(source, lineno, f"duplicate trajectory id {t.id!r} (first on line {first_line[t.id]})",
                             fix="give every trajectory a unique id")
        first_line[t.id] = lineno
        turns = tuple(Turn(u.prefill_tokens, u.decode_tokens, u.tool_seconds) for u in t.turns)
        trajs.append(TrajectorySpec(t.id, t.group, t.prompt_tokens, turns, t.source))
    if not trajs:
        raise TraceError(source, None, "no trajectories in the workload file", fix=_FORMAT_FIX)
    return Workload(tuple(trajs), meta)


def load_workload(path: str | Path) -> Workload:
    """Read a workload JSONL file (see ``parse_workload``)."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise TraceError(str(path), None, "file not found", fix="check the path") from None
    except (OSError, UnicodeDecodeError) as err:
        raise TraceError(str(path), None, f"cannot read the file ({err})", fix="pass a UTF-8 JSONL file") from None
    return parse_workload(text, source=str(path))


def workload_meta(path: str | Path) -> dict[str, Any]:
    """The provenance of a workload file (its optional ``{"meta": ...}`` first line; {} without one), read
    without parsing the trajectories. A file ``load_workload`` would reject may still return {} here."""
    try:
        with Path(path).open(encoding="utf-8") as f:
            for raw in f:
                line = raw.strip()
                if not line:
                    continue
                try:
                    doc = json.loads(line)
                except json.JSONDecodeError:
                    return {}
                if isinstance(doc, dict) and set(doc) == {"meta"} and isinstance(doc["meta"], dict):
                    return doc["meta"]
                return {}
    except (OSError, UnicodeDecodeError):
        return {}
    return {}


def load_history(path: str | Path, known: Collection[str]) -> tuple[TrajectorySpec, ...]:
    """Finished trajectories of the RL steps before a replay (a workload JSONL file, ``load_workload``), each
    naming its prompt by its ``group``: the history a policy's length predictor starts from. ``known``: the
    prompts the replay draws (its history keys). Raises ``TraceError`` for a malformed file, and naming the
    file, the first trajectory (by line) and the count, for a history that names a prompt not in ``known``:
    its lengths would never be looked up, so the file was most likely written for another workload."""
    w = load_workload(path)
    bad = [t for t in w.trajectories if t.group not in known]
    if bad:
        first = bad[0]
        examples = ", ".join(repr(k) for k in sorted(known)[:3])
        raise TraceError(str(path), _line_of(path, first.id),
                         f"history trajectory {first.id!r} names prompt {first.group!r}, which the workload does not "
                         f"have ({len(bad)} of {len(w)} history trajectories name unknown prompts)",
                         fix=f"set each history trajectory's group to a prompt of the replayed workload (e.g. {examples})")
    return w.trajectories


def _line_of(path: str | Path, traj_id: str) -> int | None:
    """The line of ``path`` holding trajectory ``traj_id`` (for error messages; None when not found)."""
    try:
        for lineno, raw in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), start=1):
            if raw.strip().startswith("{") and f'"{traj_id}"' in raw:
                doc = json.loads(raw)
                if isinstance(doc, dict) and doc.get("id") == traj_id:
                    return lineno
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    return None


def workload_to_jsonl(w: Workload) -> str:
    """The JSONL text of ``w`` (a meta line first when ``w.meta`` is non-empty); ``parse_workload`` inverts it."""
    lines = [json.dumps({"meta": dict(w.meta)}, separators=(",", ":"))] if w.meta else []
    for t in w.trajectories:
        doc: dict[str, Any] = {"id": t.id, "group": t.group, "prompt_tokens": t.prompt_tokens, "turns": [
            {"prefill_tokens": u.prefill_tokens, "decode_tokens": u.decode_tokens, "tool_seconds": u.tool_seconds}
            for u in t.turns
        ]}
        if t.source:
            doc["source"] = t.source
        lines.append(json.dumps(doc, separators=(",", ":")))
    return "\n".join(lines) + "\n"


def save_workload(w: Workload, path: str | Path) -> None:
    Path(path).write_text(workload_to_jsonl(w), encoding="utf-8")


# --- seeded within-group variation --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class GroupVariation:
    """How the samples of one group differ from the group's base trajectory (all lognormal, median 1).

    ``sample_sigma``: one factor per sample on every decode length (a "verbose" vs "terse" sample).
    ``turn_sigma``: per-turn jitter on decode and new prefill tokens. ``tool_sigma``: per-turn jitter on tool
    seconds. ``turns_sigma``: factor on the number of turns (fewer: middle turns dropped, the final turn kept;
    more: copies of middle turns inserted before the final turn). Small sigmas keep samples of one prompt
    similar in length, as observed in GRPO groups (Seer); 0 everywhere gives identical samples.
    """

    sample_sigma: float = 0.15
    turn_sigma: float = 0.1
    tool_sigma: float = 0.2
    turns_sigma: float = 0.1


DEFAULT_DISPERSION = 0.15
"""The within-group dispersion of the builders (``GroupVariation().sample_sigma``): each sample's decode
lengths are its group's base run x lognormal(0, 0.15), with the per-turn, tool and turn-count jitters of
``GroupVariation``'s defaults beside it."""


def check_dispersion(sigma: float) -> float:
    """``sigma`` if it is a usable dispersion (finite, >= 0); else a one-line ``UserInputError``."""
    if not (isinstance(sigma, int | float) and math.isfinite(sigma) and sigma >= 0):
        raise UserInputError(f"bad dispersion {sigma!r}: it must be a finite number >= 0",
                             fix=f"pass --dispersion SIGMA >= 0 (0: identical samples; default {DEFAULT_DISPERSION})")
    return float(sigma)


def with_dispersion(sigma: float | None, base: GroupVariation | None = None) -> GroupVariation:
    """``base`` (default ``GroupVariation()``) at within-group dispersion ``sigma``: ``sample_sigma`` = sigma
    and the other three sigmas (per-turn, tool, turn count) scaled by ``sigma / base.sample_sigma``, so the
    default dispersion (``DEFAULT_DISPERSION``) gives ``GroupVariation()`` exactly, 0 gives identical samples
    of a prompt, and a larger sigma spreads every length of a group more. (A base with ``sample_sigma`` 0
    keeps its other sigmas for sigma > 0.) ``sigma`` None: ``base`` unchanged. Raises ``UserInputError`` for a
    negative or non-finite sigma (``check_dispersion``)."""
    v = base if base is not None else GroupVariation()
    if sigma is None:
        return v
    sigma = check_dispersion(sigma)
    f = 0.0 if sigma == 0 else (sigma / v.sample_sigma if v.sample_sigma > 0 else 1.0)
    return GroupVariation(sample_sigma=sigma, turn_sigma=v.turn_sigma * f, tool_sigma=v.tool_sigma * f,
                          turns_sigma=v.turns_sigma * f)


def vary(
    base: TrajectorySpec, rng: random.Random, variation: GroupVariation, *, traj_id: str, group: str
) -> TrajectorySpec:
    """One sample of ``base``'s group: same prompt, lengths varied by ``variation`` drawn from ``rng``."""
    v = variation
    turns = list(base.turns)
    n = len(turns)
    if n > 1 and v.turns_sigma > 0:
        target = max(1, round(n * rng.lognormvariate(0.0, v.turns_sigma)))
        if target < n:
            turns = [*turns[: target - 1], turns[-1]]
        elif target > n:
            pool = turns[1:-1] or turns[:-1]
            for _ in range(target - n):
                turns.insert(rng.randint(1, len(turns) - 1), rng.choice(pool))
    scale = rng.lognormvariate(0.0, v.sample_sigma) if v.sample_sigma > 0 else 1.0
    out: list[Turn] = []
    for k, t in enumerate(turns):
        jd = rng.lognormvariate(0.0, v.turn_sigma) if v.turn_sigma > 0 else 1.0
        jp = rng.lognormvariate(0.0, v.turn_sigma) if v.turn_sigma > 0 else 1.0
        jt = rng.lognormvariate(0.0, v.tool_sigma) if v.tool_sigma > 0 else 1.0
        prefill = t.prefill_tokens if k == 0 else round(t.prefill_tokens * jp)
        out.append(Turn(prefill, max(1, round(t.decode_tokens * scale * jd)), round(t.tool_seconds * jt, 3)))
    return TrajectorySpec(traj_id, group, base.prompt_tokens, tuple(out), base.source)


def _pick(rng: random.Random, items: Sequence[Any], k: int) -> list[Any]:
    """``k`` items: a seeded permutation, repeated (re-shuffled) when ``k`` exceeds ``len(items)``."""
    out: list[Any] = []
    while len(out) < k:
        out.extend(rng.sample(list(items), len(items)))
    return out[:k]


def _group_id(gi: int, groups: int) -> str:
    return f"g{gi:0{max(2, len(str(groups - 1)))}d}"


def _check_batch(groups: int, samples: int, max_context: int | None) -> None:
    if groups < 1 or samples < 1:
        raise UserInputError(f"need groups >= 1 and samples >= 1, got {groups} x {samples}",
                             fix="pass --groups G --samples n with G, n >= 1")
    if max_context is not None and max_context < 2:
        raise UserInputError(f"max_context must be >= 2 tokens, got {max_context}", fix="use a model's context length")


def _batch(
    bases: Sequence[TrajectorySpec], *, groups: int, samples: int, seed: int, variation: GroupVariation,
    max_context: int | None, meta: dict[str, Any],
) -> Workload:
    """G groups x n samples: group gi varies ``bases[gi]``, each group with its own seeded stream."""
    trajs: list[TrajectorySpec] = []
    truncated = 0
    for gi, base in enumerate(bases):
        g = _group_id(gi, groups)
        rng = random.Random(f"{seed}:group:{gi}")  # str seeds hash with sha512: stable across runs
        for j in range(samples):
            spec = vary(base, rng, variation, traj_id=f"{g}/s{j}", group=g)
            if max_context is not None:
                cut = truncate_to_context(spec, max_context)
                truncated += cut is not spec
                spec = cut
            trajs.append(spec)
    full = {**meta, "groups": groups, "samples": samples, "seed": seed, "max_context": max_context,
            "variation": {f: getattr(variation, f) for f in GroupVariation.__slots__}}
    if max_context is not None:
        full["truncated"] = truncated
    return Workload(tuple(trajs), full)


# --- builder: SWE-bench agent traces ------------------------------------------------------------------------

_LLM_COLUMNS = ("source", "task", "attempt", "call_idx", "is_sidechain", "t_first_block_s", "context_tokens",
                "output_tokens_reported", "output_chars")
_TOOL_COLUMNS = ("source", "task", "attempt", "t_start_s", "duration_s")


def _read_csv(path: str | Path, columns: Sequence[str]) -> list[tuple[int, dict[str, str]]]:
    """(line, row) for every data row; checks the header. Raises ``TraceError``."""
    src = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8-sig")
    except FileNotFoundError:
        raise TraceError(src, None, "file not found", fix="check the path (the shared data lives in ../shared/data)") from None
    except (OSError, UnicodeDecodeError) as err:
        raise TraceError(src, None, f"cannot read the file ({err})", fix="pass a readable CSV file") from None
    reader = csv.DictReader(text.splitlines())
    header = reader.fieldnames or []
    if not header:
        raise TraceError(src, None, "the file is empty", fix="pass a non-empty CSV file")
    missing = [c for c in columns if c not in header]
    if missing:
        raise TraceError(src, 1, f"header lacks column(s) {', '.join(missing)}", fix=f"use a CSV with columns {', '.join(columns)}")
    rows = []
    for rec in reader:
        if None in rec:
            raise TraceError(src, reader.line_num, "more fields than header columns", fix="fix the row")
        rows.append((reader.line_num, rec))
    if not rows:
        raise TraceError(src, None, "the file has a header but no rows", fix="pass a non-empty CSV file")
    return rows


def _num(src: str, line: int, row: Mapping[str, str], col: str, kind: type = int, *, minimum: float = 0) -> Any:
    value = (row.get(col) or "").strip()
    try:
        x = kind(value) if kind is int else float(value)
    except ValueError:
        raise TraceError(src, line, f"{col} {value!r} is not a{'n integer' if kind is int else ' number'}",
                         fix=f"write {col} as a number") from None
    if not math.isfinite(x) or x < minimum:
        raise TraceError(src, line, f"{col} = {value} is {'negative' if x < minimum else 'not finite'}",
                         fix=f"use {col} >= {minimum:g}")
    return x


def _agent_model(source: str) -> str:
    s = source.lower()
    return "haiku" if "haiku" in s else "glm" if "glm" in s else s.split("(")[0]


def swebench_runs(
    llm_calls: str | Path, tool_calls: str | Path, *, models: Sequence[str] | None = None, min_turns: int = 1
) -> tuple[TrajectorySpec, ...]:
    """One trajectory per recorded agent run (source, task, attempt), from the shared SWE-bench traces.

    Main-chain LLM calls (``is_sidechain == 0``) are the turns, in ``call_idx`` order. Sidechain rows (a
    sub-agent started by the ``Task`` tool) are skipped: the main agent waits on that Task tool call, so the
    sub-agent's time counts as tool seconds of the turn that called it. Per turn k:
    decode = ``output_tokens_reported`` (GLM) or ``ceil(output_chars / 4)`` (haiku: the reported count is
    useless), at least 1; prefill (k >= 1) = ``max(0, context_k - context_{k-1} - decode_{k-1})``: the new
    observation tokens (GLM drops reasoning tokens from the next prompt, so the difference can be negative:
    clamped); the first call's context is the prompt. Tool seconds of turn k = length of the union of the
    tool-call intervals starting in ``[first block of call k, first block of call k+1)``, clipped at the
    latter (parallel calls overlap, so the union, not the sum). ``models``: keep only runs of these agent
    models (``glm``, ``haiku``); ``min_turns``: keep only runs with at least that many main-chain calls (a few
    haiku runs answer in one call without tools). Ids ``<model>:<task>:<attempt>``, group = task.
    """
    lsrc, tsrc = str(llm_calls), str(tool_calls)
    runs: dict[tuple[str, str, str], list[tuple[int, dict[str, str]]]] = {}
    for line, row in _read_csv(llm_calls, _LLM_COLUMNS):
        side = (row["is_sidechain"] or "").strip()
        if side not in ("0", "1"):
            raise TraceError(lsrc, line, f"is_sidechain {side!r} is not 0 or 1", fix="write 0 or 1")
        if side == "1":
            continue
        runs.setdefault((row["source"], row["task"], row["attempt"]), []).append((line, row))
    tools: dict[tuple[str, str, str], list[tuple[float, float]]] = {}
    for line, row in _read_csv(tool_calls, _TOOL_COLUMNS):
        start = _num(tsrc, line, row, "t_start_s", float)
        dur = _num(tsrc, line, row, "duration_s", float)
        tools.setdefault((row["source"], row["task"], row["attempt"]), []).append((start, start + dur))
    wanted = {m.lower() for m in models} if models else None
    out: list[TrajectorySpec] = []
    clamped = 0
    for key in sorted(runs):
        source, task, attempt = key
        model = _agent_model(source)
        if (wanted is not None and model not in wanted) or len(runs[key]) < min_turns:
            continue
        calls = []
        for line, row in runs[key]:
            idx = _num(lsrc, line, row, "call_idx")
            ctx = _num(lsrc, line, row, "context_tokens", minimum=1)
            if model == "haiku":
                dec = math.ceil(_num(lsrc, line, row, "output_chars") / 4)
            else:
                dec = _num(lsrc, line, row, "output_tokens_reported")
            calls.append((idx, _num(lsrc, line, row, "t_first_block_s", float), ctx, max(1, dec)))
        calls.sort()
        intervals = sorted(tools.get(key, []))
        turns: list[Turn] = []
        for k, (_, t_first, ctx, dec) in enumerate(calls):
            t_next = calls[k + 1][1] if k + 1 < len(calls) else math.inf
            tool_s = _union_length([(a, min(b, t_next)) for a, b in intervals if t_first <= a < t_next])
            if k == 0:
                prefill = 0
            else:
                growth = ctx - calls[k - 1][2] - calls[k - 1][3]
                clamped += growth < 0
                prefill = max(0, growth)
            turns.append(Turn(prefill, dec, round(tool_s, 3)))
        out.append(TrajectorySpec(f"{model}:{task}:{attempt}", task, calls[0][2], tuple(turns),
                                  f"swebench:{model}:{task}:{attempt}"))
    if not out:
        raise UserInputError(f"no agent runs in {lsrc} for models {sorted(wanted) if wanted else 'all'} with "
                             f">= {min_turns} turns", fix="check the file, the model filter (glm, haiku) and min_turns")
    log.debug("swebench: %d runs, %d turn(s) with context growth below the previous output (clamped)", len(out), clamped)
    return tuple(out)


def _union_length(intervals: Sequence[tuple[float, float]]) -> float:
    total, end = 0.0, -math.inf
    for a, b in sorted(intervals):
        if b <= end:
            continue
        total += b - max(a, end)
        end = b
    return total


def swebench_workload(
    llm_calls: str | Path,
    tool_calls: str | Path,
    *,
    groups: int,
    samples: int,
    seed: int,
    max_context: int | None = None,
    models: Sequence[str] | None = None,
    min_turns: int = 1,
    variation: GroupVariation = GroupVariation(),
) -> Workload:
    """An RL batch of ``groups`` x ``samples`` from the SWE-bench agent traces (see ``swebench_runs``).

    Each group is one recorded run (distinct runs while ``groups`` <= runs, then re-drawn), seeded; its samples
    are ``vary``-ed copies (same prompt, similar lengths). ``max_context``: cut every sample to fit
    (``truncate_to_context``); None keeps the recorded lengths (up to ~127k tokens).
    """
    _check_batch(groups, samples, max_context)
    runs = swebench_runs(llm_calls, tool_calls, models=models, min_turns=min_turns)
    bases = _pick(random.Random(f"{seed}:select"), runs, groups)
    meta = {"builder": "swebench", "llm_calls": Path(llm_calls).name, "tool_calls": Path(tool_calls).name,
            "models": sorted(models) if models else "all", "min_turns": min_turns, "runs": [b.id for b in bases]}
    return _batch(bases, groups=groups, samples=samples, seed=seed, variation=variation,
                  max_context=max_context, meta=meta)


# --- builder: Azure single-turn ------------------------------------------------------------------------------


def azure_workload(
    path: str | Path,
    *,
    groups: int,
    samples: int,
    seed: int,
    grouping: Literal["replicate", "consecutive"] = "replicate",
    sample_sigma: float = 0.2,
    max_context: int | None = None,
) -> Workload:
    """Single-turn trajectories from the Azure LLM inference trace (``ContextTokens`` = prompt,
    ``GeneratedTokens`` = decode, no tool time).

    ``replicate`` (default, GRPO-like): each group is one seeded random row, its samples share the prompt and
    draw decode = GeneratedTokens x lognormal(0, ``sample_sigma``). ``consecutive``: ``groups x samples``
    consecutive rows from a seeded offset (wrapping), as recorded, ``samples`` rows per group (different
    prompts: no within-group similarity).
    """
    _check_batch(groups, samples, max_context)
    src = str(path)
    rows = []
    for line, row in _read_csv(path, ("ContextTokens", "GeneratedTokens")):
        ctx = _num(src, line, row, "ContextTokens", minimum=1)
        gen = _num(src, line, row, "GeneratedTokens", minimum=1)
        rows.append((ctx, gen, line))
    meta: dict[str, Any] = {"builder": "azure", "file": Path(path).name, "grouping": grouping}
    if grouping == "replicate":
        bases = [
            TrajectorySpec(f"azure:{line}", f"azure:{line}", ctx, (Turn(0, gen),), f"azure:{Path(path).name}:{line}")
            for ctx, gen, line in _pick(random.Random(f"{seed}:select"), rows, groups)
        ]
        var = GroupVariation(sample_sigma=sample_sigma, turn_sigma=0.0, tool_sigma=0.0, turns_sigma=0.0)
        return _batch(bases, groups=groups, samples=samples, seed=seed, variation=var, max_context=max_context,
                      meta=meta)
    if grouping != "consecutive":
        raise UserInputError(f"unknown grouping {grouping!r}", fix="use replicate or consecutive")
    start = random.Random(f"{seed}:select").randrange(len(rows))
    trajs = []
    for gi in range(groups):
        g = _group_id(gi, groups)
        for j in range(samples):
            ctx, gen, line = rows[(start + gi * samples + j) % len(rows)]
            trajs.append(TrajectorySpec(f"{g}/s{j}", g, ctx, (Turn(0, gen),), f"azure:{Path(path).name}:{line}"))
    w = Workload(tuple(trajs), {**meta, "groups": groups, "samples": samples, "seed": seed,
                                "max_context": max_context, "first_line": rows[start][2]})
    return w.truncated(max_context) if max_context is not None else w


# --- builder: synthetic ----------------------------------------------------------------------------------------


def synthetic_workload(
    groups: int = 4,
    samples: int = 4,
    seed: int = 0,
    *,
    turns_median: float = 6.0,
    max_turns: int = 30,
    prompt_median: float = 2000.0,
    observation_median: float = 300.0,
    decode_median: float = 250.0,
    tool_median_s: float = 1.0,
    length_sigma: float = 0.8,
    variation: GroupVariation = GroupVariation(),
    max_context: int | None = None,
) -> Workload:
    """A seeded multi-turn batch with heavy-tailed lengths, shaped like the SWE-bench traces but small.

    Per group (lognormal, the given medians): turn count (sigma 0.5, capped at ``max_turns``), prompt (sigma
    0.4), a decode scale with sigma ``length_sigma`` (the heavy tail across groups), an observation size and a
    tool time scale. The group's base trajectory draws each turn around those (decode sigma 0.5, observation
    sigma 0.7, tool sigma 1.2: mostly short tools, a few long ones); samples are ``vary``-ed copies.
    """
    _check_batch(groups, samples, max_context)
    if max_turns < 1:
        raise UserInputError(f"max_turns must be >= 1, got {max_turns}", fix="use 1 or more")
    rng = random.Random(f"{seed}:synthetic")
    bases: list[TrajectorySpec] = []
    for gi in range(groups):
        n = min(max_turns, max(1, round(rng.lognormvariate(math.log(turns_median), 0.5))))
        prompt = max(16, round(rng.lognormvariate(math.log(prompt_median), 0.4)))
        dec = rng.lognormvariate(math.log(decode_median), length_sigma)
        obs = rng.lognormvariate(math.log(observation_median), 0.5)
        tool = rng.lognormvariate(math.log(tool_median_s), 0.8)
        turns = tuple(
            Turn(
                0 if k == 0 else round(obs * rng.lognormvariate(0.0, 0.7)),
                max(1, round(dec * rng.lognormvariate(0.0, 0.5))),
                0.0 if k == n - 1 else round(tool * rng.lognormvariate(0.0, 1.2), 3),
            )
            for k in range(n)
        )
        bases.append(TrajectorySpec(f"synthetic:{gi}", f"synthetic:{gi}", prompt, turns, f"synthetic:{seed}:{gi}"))
    meta = {"builder": "synthetic", "turns_median": turns_median, "max_turns": max_turns,
            "prompt_median": prompt_median, "observation_median": observation_median,
            "decode_median": decode_median, "tool_median_s": tool_median_s, "length_sigma": length_sigma}
    return _batch(bases, groups=groups, samples=samples, seed=seed, variation=variation, max_context=max_context,
                  meta=meta)
