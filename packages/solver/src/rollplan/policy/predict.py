"""Length prediction, the one predictor of the decision core: what a policy may know about a trajectory.

The simulator knows every trajectory's true course and the executor knows nothing of it ahead; a policy sees
only what has happened. ``Predictor`` turns that into ``Estimate``s of the remaining decode tokens, new
prefill tokens, tool seconds and turns. The simulator's policies and the executor's controller use it alike
(callers: once per trajectory per snapshot, and once per finished trajectory):

1. History prior: per prompt (the history key: the same prompt recurs across epochs), the mean totals of its
   samples in earlier batches; for unseen prompts the mean over every trajectory finished so far; before
   anything has finished, the predictor's ``prior`` (``DEFAULT_PRIOR`` unless the caller knows better, e.g.
   the executor's per-item budget: ``Predictor.budget_prior``).
2. Seer-style group update: once a sibling (same group = same prompt, same batch) has finished, the group's
   finished samples replace the prior (GRPO samples of one prompt have similar lengths).
3. Group survival: the group's most advanced unfinished sample (``group_floors``) is a floor: the group is
   predicted to run at least ``1 + SURVIVAL`` times what that sample has done, whichever source the total
   comes from. The unfinished siblings are right-censored observations of the group's lengths (each will run
   at least as far as it has); the finished ones are the group's *first* finishers, so once some have
   finished their mean alone reads the rest of the group short.
4. Survival: a trajectory already past its predicted total is expected to go on for a fraction
   (``SURVIVAL``) of what it has done (heavy tails), at least one more turn.

The remaining prediction is the predicted total minus what the trajectory has observably done (tokens decoded,
turns finished, tool seconds spent), capped by what its budget leaves when the caller passes one (the
executor's ``max_turns`` x ``max_tokens``). The spread is the standard deviation of the samples behind the
prediction. ``SpreadCheck`` compares the spreads with what is later observed (the share of finished
trajectories whose total fell within one and two spreads of the prediction made when they started).
Pure bookkeeping: no I/O, no clock.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from rollplan.models.types import Estimate


@dataclass(frozen=True, slots=True)
class Totals:
    """Per-trajectory totals (what a finished trajectory reveals)."""

    decode: float
    prefill: float
    tool: float
    turns: float


def group_floors(progress: Iterable[tuple[str, float, float, float]]) -> dict[str, Totals]:
    """Group -> what its most advanced unfinished trajectory has done (decode tokens, tool seconds, turns; the
    prefill field 0): the floor ``Predictor.remaining`` / ``remaining_raw`` take for every trajectory of the
    group. ``progress``: (group, decode tokens, tool seconds, turns done) of each unfinished trajectory of the
    batch. "Most advanced": the most decode tokens (the first of equals). Callers: both adapters, at each
    snapshot (the simulator's policies, the executor's controller), with what each trajectory has observably
    done then."""
    out: dict[str, Totals] = {}
    for group, dec, tool, turns in progress:
        f = out.get(group)
        if f is None or dec > f.decode:
            out[group] = Totals(dec, 0.0, tool, turns)
    return out


DEFAULT_PRIOR = Totals(decode=4096.0, prefill=16384.0, tool=60.0, turns=24.0)
"""Prior before any trajectory has finished (agentic coding scale; replaced as soon as data arrives)."""
SURVIVAL = 0.5
"""A trajectory past its prediction is expected to run this fraction of what it has done so far."""


class _Acc:
    __slots__ = ("n", "s", "ss")

    def __init__(self) -> None:
        self.n = 0
        self.s = [0.0, 0.0, 0.0, 0.0]
        self.ss = [0.0, 0.0, 0.0, 0.0]

    def add(self, t: Totals) -> None:
        self.n += 1
        s, ss = self.s, self.ss
        for i, v in enumerate((t.decode, t.prefill, t.tool, t.turns)):
            s[i] += v
            ss[i] += v * v

    def mean(self) -> Totals:
        n = self.n
        return Totals(self.s[0] / n, self.s[1] / n, self.s[2] / n, self.s[3] / n)

    def std(self, i: int) -> float:
        if self.n < 2:
            return 0.0
        m = self.s[i] / self.n
        return math.sqrt(max(0.0, self.ss[i] / self.n - m * m))


@dataclass(frozen=True, slots=True)
class Remaining:
    """Predicted remaining work of one trajectory."""

    decode: Estimate
    prefill: Estimate
    tool: Estimate
    turns: Estimate
    source: str  # "group" | "history" | "global" | "default"


@dataclass(slots=True)
class SpreadCheck:
    """How well the predicted spreads describe what happens: for each finished trajectory, its decode total
    against the prediction (mean, spread) made when it started. ``within(k)``: share within ``k`` spreads
    (about 0.68 and 0.95 at k = 1, 2 for well-calibrated normal spreads)."""

    n: int = 0
    within_1: int = 0
    within_2: int = 0
    abs_error: float = 0.0

    def add(self, mean: float, spread: float, actual: float) -> None:
        self.n += 1
        err = abs(actual - mean)
        self.abs_error += err
        if err <= spread:
            self.within_1 += 1
        if err <= 2.0 * spread:
            self.within_2 += 1

    def within(self, k: int) -> float | None:
        if not self.n:
            return None
        return (self.within_1 if k == 1 else self.within_2) / self.n

    def summary(self) -> dict[str, float | int | None]:
        return {"n": self.n, "within_1_spread": self.within(1), "within_2_spreads": self.within(2),
                "mean_abs_error": self.abs_error / self.n if self.n else None}


class Predictor:
    """History prior + Seer-style group prediction (see the module docstring). One per policy run (a replay,
    or an executor's lifetime: the history carries over batches, the group statistics do not)."""

    def __init__(self, prior: Totals = DEFAULT_PRIOR) -> None:
        self.prior = prior
        self.spreads = SpreadCheck()
        self._history: dict[str, _Acc] = {}
        self._global = _Acc()
        self._groups: dict[str, _Acc] = {}
        self._batch = -1
        self.groups_seen = 0  # groups (over all batches) with at least one finished trajectory
        self._memo: dict[tuple[str, str], tuple[Totals, tuple[float, float, float, float], str]] = {}

    def start_batch(self, batch: int) -> None:
        """A new batch: group statistics restart (history and the global prior carry over)."""
        if batch != self._batch:
            self._batch = batch
            self._groups = {}
            self._memo = {}

    def observe(self, key: str, group: str, totals: Totals) -> None:
        """A trajectory of prompt ``key`` and group ``group`` finished with ``totals``."""
        g = self._groups.get(group)
        if g is None:
            g = self._groups[group] = _Acc()
            self.groups_seen += 1
        g.add(totals)
        h = self._history.get(key)
        if h is None:
            h = self._history[key] = _Acc()
        h.add(totals)
        self._global.add(totals)
        if self._memo:
            self._memo = {}

    def total(self, key: str, group: str) -> tuple[Totals, _Acc | None, str]:
        g = self._groups.get(group)
        if g is not None and g.n:
            return g.mean(), g, "group"
        h = self._history.get(key)
        if h is not None and h.n:
            return h.mean(), h, "history"
        if self._global.n:
            return self._global.mean(), self._global, "global"
        return self.prior, None, "default"

    @staticmethod
    def budget_prior(max_turns: int, max_tokens_per_turn: int, *, fraction: float = 0.5,
                     obs_tokens_per_turn: float = 16.0, tool_seconds_per_turn: float = 0.5) -> Totals:
        """A prior from a rollout item's budget: ``fraction`` of its turns and of its token budget (the
        executor's: nothing finished yet says more). ``obs_tokens_per_turn`` / ``tool_seconds_per_turn``: the
        environment's observation and tool time per turn, if the caller knows them."""
        turns = max(1.0, fraction * max_turns)
        return Totals(fraction * max_turns * max_tokens_per_turn, obs_tokens_per_turn * max(turns - 1.0, 0.0),
                      tool_seconds_per_turn * turns, turns)

    @staticmethod
    def capped(rem: Remaining, done: Totals, budget: Totals) -> Remaining:
        """``rem`` capped by what ``budget`` (total decode tokens and turns allowed) leaves after ``done``: a
        trajectory never decodes past its budget, so neither does its prediction (at least one token / turn)."""
        dec_left = max(budget.decode - done.decode, 1.0)
        turns_left = max(budget.turns - done.turns, 1.0)
        dec = min(max(rem.decode.mean, 1.0), dec_left)
        turns = min(max(rem.turns.mean, 1.0), turns_left)
        return Remaining(Estimate(dec, min(rem.decode.spread, dec)), rem.prefill, rem.tool,
                         Estimate(turns, min(rem.turns.spread, turns_left)), rem.source)

    def source(self, key: str, group: str) -> str:
        """Where a prediction for (``key``, ``group``) comes from now: "group", "history", "global" or
        "default" (see the module docstring)."""
        return self._cached_total(key, group)[2]

    def _cached_total(self, key: str, group: str) -> tuple[Totals, tuple[float, float, float, float], str]:
        hit = self._memo.get((key, group))
        if hit is None:
            tot, acc, src = self.total(key, group)
            sds = (acc.std(0), acc.std(1), acc.std(2), acc.std(3)) if acc is not None else (0.0, 0.0, 0.0, 0.0)
            hit = self._memo[(key, group)] = (tot, sds, src)
        return hit

    def remaining_raw(
        self, key: str, group: str, dec_done: float, pf_done: float, tool_done: float, turns_done: float,
        floor_dec: float = 0.0, floor_tool: float = 0.0, floor_turns: float = 0.0,
    ) -> tuple[float, float, float, float, tuple[float, float, float, float]]:
        """``remaining`` on plain floats (the snapshot's hot path): (decode, prefill, tool, turns, spreads)."""
        tot, sds, _src = self._cached_total(key, group)
        t_dec, t_pf, t_tool, t_turns = tot.decode, tot.prefill, tot.tool, tot.turns
        if floor_dec * (1.0 + SURVIVAL) > t_dec:
            g = 1.0 + SURVIVAL
            t_pf = max(t_pf, t_pf / max(t_dec, 1.0) * floor_dec * g)
            t_dec = floor_dec * g
            t_tool = max(t_tool, floor_tool * g)
            t_turns = max(t_turns, floor_turns * g)
        n_turns = t_turns if t_turns > 1.0 else 1.0
        per_turn = t_dec / n_turns
        dec = t_dec - dec_done
        if dec < per_turn * 0.5:
            dec = max(per_turn, SURVIVAL * dec_done)
        turns = t_turns - turns_done
        if turns < 1.0:
            turns = max(1.0, SURVIVAL * turns_done)
        pre = t_pf - pf_done if t_pf > pf_done else t_pf / n_turns * turns
        tool = t_tool - tool_done if t_tool > tool_done else t_tool / n_turns * turns
        return dec, pre, tool, turns, sds

    def remaining(self, key: str, group: str, done: Totals, floor: Totals | None = None,
                  prior: Totals | None = None) -> Remaining:
        """Remaining work of a trajectory that has observably done ``done`` so far. ``floor``: what the most
        advanced unfinished sibling has done (``group_floors``); the group is predicted to run at least
        ``1 + SURVIVAL`` times that (group survival), also once some siblings have finished (they are its
        short ones). ``prior``: this trajectory's own prior (e.g. its item's ``budget_prior``), used instead
        of the predictor's while nothing has finished."""
        tot, sds, src = self._cached_total(key, group)
        if prior is not None and src == "default":
            tot = prior
        if floor is not None and floor.decode * (1.0 + SURVIVAL) > tot.decode:
            g = 1.0 + SURVIVAL
            tot = Totals(floor.decode * g, max(tot.prefill, tot.prefill / max(tot.decode, 1.0) * floor.decode * g),
                         max(tot.tool, floor.tool * g), max(tot.turns, floor.turns * g))
        per_turn = tot.decode / max(tot.turns, 1.0)
        dec = tot.decode - done.decode
        if dec < per_turn * 0.5:  # past (or at) its prediction: heavy tail, expect more
            dec = max(per_turn, SURVIVAL * done.decode)
        turns = tot.turns - done.turns
        if turns < 1.0:
            turns = max(1.0, SURVIVAL * done.turns)
        pf_per_turn = tot.prefill / max(tot.turns, 1.0)
        tool_per_turn = tot.tool / max(tot.turns, 1.0)
        pre = max(0.0, tot.prefill - done.prefill) if tot.prefill > done.prefill else pf_per_turn * turns
        tool = max(0.0, tot.tool - done.tool) if tot.tool > done.tool else tool_per_turn * turns
        return Remaining(
            Estimate(dec, sds[0]), Estimate(pre, sds[1]), Estimate(tool, sds[2]), Estimate(turns, sds[3]), src
        )
