"""Training-GPU lending (as in PEARL / ROLL): training GPUs serve rollout while the trainer is idle.

A small pure component. The simulator owns the clock and the RL loop; it tells this schedule when training
steps run, and asks which lent slots are usable in an interval and when they must be back:

- ``LendingConfig``: how many GPUs, their kind, the train-step duration, the mode, the reclaim notice.
- ``LendingSchedule.next_train_step(ready_at, prev_end=, known_at=)``: when the next training step runs.
  ``sync``: rollout of batch k, then the step on batch k (``ready_at`` = rollout k done); the next rollout starts
  when the step ends. ``async`` (one-step off-policy): the step on batch k starts when rollout k is done *and*
  step k-1 has ended (``prev_end``); rollout continues meanwhile. ``known_at``: when the simulator learns the
  step's start; the trainer then waits at least ``reclaim_notice_s`` so lent slots get their notice (pass None
  when the lent slots are already empty, e.g. at the end of a sync rollout).
- ``windows(steps)``: the idle gaps between training steps (after ``lend_delay_s``), each a ``LendWindow``
  with the time the slots must be back (the next step's start; None while no step is scheduled).
- ``available(t0, t1, steps)`` / ``window_at(t, steps)``: "which lent slots are available in [t0, t1) and when
  must they be back".
- ``events(steps)``: the same as ``AvailabilityEvent``s: LEND (slots with source LENT_BY_TRAINING, ``return_by``
  and ``deadline`` = window end) and RECLAIM at ``end - reclaim_notice_s`` (not before the LEND) with
  ``deadline`` = window end. ``lend_event``/``reclaim_event`` build single events for an online driver.

Lent slots are ``f"{node_prefix}{k}/g{i}"``: ``gpus`` GPUs on nodes of ``gpus_per_node``, tp=1.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from rollplan.models.errors import SchemaError, UserInputError
from rollplan.models.specs import gpu_kind
from rollplan.models.types import AvailabilityEvent, EventKind, Slot, SlotSource


class LendMode(StrEnum):
    SYNC = "sync"  # rollout, then train on that batch; lent GPUs serve rollout, train during the step
    ASYNC = "async"  # one-step off-policy: rollout k+1 overlaps the step on batch k; lend only while idle


@dataclass(frozen=True, slots=True)
class LendingConfig:
    """The lending part of a scenario. Seconds throughout.

    ``gpus``: training GPUs lent to rollout between steps (0 = no lending). ``train_step_s``: duration of one
    training step. ``reclaim_notice_s``: how long before a step starts the trainer announces the reclaim.
    ``lend_delay_s``: hand-over time after a step ends before the GPUs are usable by rollout (e.g. offloading
    optimizer state); engine start/wake/weight sync are the simulator's actions, not part of this delay.
    """

    gpus: int = 8
    gpu: str = "h800"
    gpus_per_node: int = 8
    train_step_s: float = 120.0
    mode: LendMode = LendMode.SYNC
    reclaim_notice_s: float = 10.0
    lend_delay_s: float = 0.0
    node_prefix: str = "train"

    def __post_init__(self) -> None:
        gpu_kind(self.gpu)  # unknown kind -> UnknownNameError
        if self.gpus < 0:
            raise UserInputError(f"lent gpus must be >= 0, got {self.gpus}", fix="use 0 (no lending) or more")
        if self.gpus_per_node < 1:
            raise UserInputError(f"gpus_per_node must be >= 1, got {self.gpus_per_node}", fix="use 1 or more")
        for name in ("train_step_s", "reclaim_notice_s", "lend_delay_s"):
            v = getattr(self, name)
            if not (math.isfinite(v) and v >= 0):
                raise UserInputError(f"{name} must be a finite number >= 0, got {v}", fix=f"set {name} in seconds")


class _LendingConfigIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    gpus: int = Field(8, ge=0)
    gpu: str = "h800"
    gpus_per_node: int = Field(8, ge=1)
    train_step_s: float = Field(120.0, ge=0, allow_inf_nan=False)
    mode: LendMode = LendMode.SYNC
    reclaim_notice_s: float = Field(10.0, ge=0, allow_inf_nan=False)
    lend_delay_s: float = Field(0.0, ge=0, allow_inf_nan=False)
    node_prefix: str = Field("train", min_length=1)


def lending_config_from_dict(data: Mapping[str, Any], *, source: str = "<config>") -> LendingConfig:
    """Parse the ``lending`` part of a scenario config (unknown keys rejected). Raises ``SchemaError``."""
    try:
        parsed = _LendingConfigIn.model_validate(dict(data))
    except ValidationError as err:
        first = err.errors()[0]
        loc = ".".join(str(p) for p in first["loc"]) or "(lending)"
        raise SchemaError(f"{source}: lending.{loc}", first["msg"],
                          fix="see docs/inputs.md (training-GPU lending) for the keys") from None
    return LendingConfig(**parsed.model_dump())


@dataclass(frozen=True, slots=True)
class TrainStep:
    """One training step occupying the training GPUs over ``[start, end)``."""

    start: float
    end: float


@dataclass(frozen=True, slots=True)
class LendWindow:
    """Lent slots ``slot_ids`` are usable from ``start``; they must be back by ``end`` (None: no step is
    scheduled yet, so no deadline is known). ``reclaim_at``: when the trainer issues its RECLAIM."""

    start: float
    end: float | None
    reclaim_at: float | None
    slot_ids: tuple[str, ...]

    def overlaps(self, t0: float, t1: float) -> bool:
        """True when the window intersects ``[t0, t1)``."""
        return self.start < t1 and (self.end is None or self.end > t0)

    def contains(self, t: float) -> bool:
        return self.start <= t and (self.end is None or t < self.end)


@dataclass(frozen=True, slots=True)
class LendingSchedule:
    """Lending derived from training steps. Pure: every method is a function of its arguments.

    ``steps`` arguments are the training steps known so far, sorted, non-overlapping; ``start`` is when the
    replay begins (training idle from then until the first step).
    """

    config: LendingConfig

    @property
    def slots(self) -> tuple[Slot, ...]:
        """The lent slots (source LENT_BY_TRAINING, ``return_by`` None: windows carry the deadlines)."""
        c = self.config
        kind = gpu_kind(c.gpu).name
        out: list[Slot] = []
        for k in range(c.gpus):
            node = f"{c.node_prefix}{k // c.gpus_per_node}"
            out.append(Slot(id=f"{node}/g{k % c.gpus_per_node}", gpu=kind, node=node, tp=1,
                            source=SlotSource.LENT_BY_TRAINING))
        return tuple(out)

    @property
    def slot_ids(self) -> tuple[str, ...]:
        return tuple(s.id for s in self.slots)

    # --- training steps ---------------------------------------------------------------------------------

    def next_train_step(
        self, ready_at: float, *, prev_end: float | None = None, known_at: float | None = None
    ) -> TrainStep:
        """The next training step: starts at ``max(ready_at, prev_end, known_at + reclaim_notice_s)``.

        ``ready_at``: the batch it trains on is rolled out. ``prev_end``: the previous step's end (async).
        ``known_at``: when that start became known (omit when no lent slot holds work then).
        """
        start = ready_at
        if prev_end is not None:
            start = max(start, prev_end)
        if known_at is not None and self.config.gpus > 0:
            start = max(start, known_at + self.config.reclaim_notice_s)
        return TrainStep(start, start + self.config.train_step_s)

    def train_steps(self, rollout_done: Sequence[float]) -> tuple[TrainStep, ...]:
        """Offline: the training steps for batches whose rollouts completed at ``rollout_done`` (sorted).

        sync: step k starts when rollout k is done; rollout k+1 can only start after step k, so
        ``rollout_done[k+1] >= end of step k`` is required (ValueError otherwise). async: step k starts at
        ``max(rollout_done[k], end of step k-1)``. No reclaim notice is added here (see ``next_train_step``).
        """
        steps: list[TrainStep] = []
        for k, done in enumerate(rollout_done):
            prev = steps[-1].end if steps else None
            if self.config.mode is LendMode.SYNC:
                if prev is not None and done < prev:
                    raise ValueError(f"sync mode: rollout {k} done at {done} before training step {k - 1} ended at {prev}")
                steps.append(self.next_train_step(done))
            else:
                steps.append(self.next_train_step(done, prev_end=prev))
        return tuple(steps)

    # --- windows and events ---------------------------------------------------------------------------------

    def windows(self, steps: Sequence[TrainStep], *, start: float = 0.0) -> tuple[LendWindow, ...]:
        """The lending windows: the idle gaps before, between and after ``steps`` (the last one open-ended).

        A gap shorter than ``lend_delay_s`` lends nothing. Empty when ``config.gpus == 0``.
        """
        if self.config.gpus == 0:
            return ()
        ids = self.slot_ids
        out: list[LendWindow] = []
        idle_from = start
        for step in sorted(steps, key=lambda s: s.start):
            if step.end <= start:
                idle_from = max(idle_from, step.end)
                continue
            lend_at = idle_from + self.config.lend_delay_s
            if lend_at < step.start:
                reclaim = max(lend_at, step.start - self.config.reclaim_notice_s)
                out.append(LendWindow(lend_at, step.start, reclaim, ids))
            idle_from = max(idle_from, step.end)
        out.append(LendWindow(idle_from + self.config.lend_delay_s, None, None, ids))
        return tuple(out)

    def available(self, t0: float, t1: float, steps: Sequence[TrainStep], *, start: float = 0.0) -> tuple[LendWindow, ...]:
        """Windows during which the lent slots are usable within ``[t0, t1)``, with their return deadlines."""
        return tuple(w for w in self.windows(steps, start=start) if w.overlaps(t0, t1))

    def window_at(self, t: float, steps: Sequence[TrainStep], *, start: float = 0.0) -> LendWindow | None:
        """The window containing ``t`` (the lent slots are usable at ``t`` until ``.end``), or None."""
        return next((w for w in self.windows(steps, start=start) if w.contains(t)), None)

    def lend_event(self, t: float, until: float | None = None) -> AvailabilityEvent:
        """LEND at ``t`` of every lent slot, to be back by ``until`` (None: not yet known)."""
        slots = tuple(replace(s, return_by=until) for s in self.slots)
        return AvailabilityEvent(time=t, kind=EventKind.LEND, slot_ids=tuple(s.id for s in slots), slots=slots,
                                 deadline=until)

    def reclaim_event(self, t: float, deadline: float) -> AvailabilityEvent:
        """RECLAIM issued at ``t``: every lent slot must be empty and returned by ``deadline``."""
        return AvailabilityEvent(time=t, kind=EventKind.RECLAIM, slot_ids=self.slot_ids, deadline=deadline)

    def events(self, steps: Sequence[TrainStep], *, start: float = 0.0) -> tuple[AvailabilityEvent, ...]:
        """LEND/RECLAIM events for ``windows(steps)``, time-ordered (a LEND precedes a RECLAIM at the same time)."""
        out: list[AvailabilityEvent] = []
        for w in self.windows(steps, start=start):
            out.append(self.lend_event(w.start, w.end))
            if w.end is not None and w.reclaim_at is not None:
                out.append(self.reclaim_event(w.reclaim_at, w.end))
        return tuple(sorted(out, key=lambda e: e.time))  # stable: LEND stays before its RECLAIM

