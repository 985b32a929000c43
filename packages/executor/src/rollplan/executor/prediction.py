"""Group-aware length prediction (Seer's observation: samples of one prompt have similar lengths).

``GroupPredictor`` learns from finished trajectories and predicts, for an unfinished one, its remaining
decode tokens, prefill (observation) tokens, tool seconds and turns, as ``Estimate``s:

- once a sibling in the same group has finished, the group's finished siblings (mean, with their spread)
  predict the totals; the first finished sibling alone is enough;
- otherwise the mean over all finished trajectories of the batch, if any;
- otherwise a prior from the item's budget (``max_turns`` x ``max_tokens``) scaled by ``prior_fraction``,
  with a wide spread.

Remaining = predicted total - progress so far, never below a floor (one token / zero seconds / the turn
in progress), so a trajectory that outlives its siblings is still predicted to need a little more.

Invariants (tested with hypothesis): every estimate is finite and >= 0; remaining decode tokens never
exceed the item's budget left; with a finished sibling of total T, an unfinished sibling that has
generated g < T tokens is predicted T - g remaining.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from rollplan.models import Estimate


@dataclass(frozen=True, slots=True)
class Totals:
    """What one finished trajectory consumed in total."""

    decode_tokens: float
    prefill_tokens: float  # observation tokens appended after the first turn
    tool_seconds: float
    turns: float


@dataclass(frozen=True, slots=True)
class Progress:
    """How far an unfinished trajectory is, and its budget."""

    group: str
    decode_tokens: int
    prefill_tokens: int
    tool_seconds: float
    turns_done: int
    max_turns: int
    max_tokens_per_turn: int
    in_turn_tokens: int = 0  # tokens already made in the current turn (counted in decode_tokens too)


@dataclass(frozen=True, slots=True)
class Prediction:
    decode: Estimate
    prefill: Estimate
    tool: Estimate
    turns: Estimate
    source: str  # "group" | "batch" | "prior"


def _mean_spread(xs: list[float]) -> tuple[float, float]:
    m = sum(xs) / len(xs)
    if len(xs) < 2:
        return m, 0.25 * m  # one sample: assume +-25 %
    var = sum((x - m) ** 2 for x in xs) / (len(xs) - 1)
    return m, math.sqrt(var)


@dataclass(slots=True)
class GroupPredictor:
    """Mutable: ``observe`` finished trajectories, ``predict`` unfinished ones. One per rollout batch."""

    prior_fraction: float = 0.5
    obs_tokens_prior: float = 16.0
    tool_seconds_prior: float = 0.5
    _groups: dict[str, list[Totals]] = field(default_factory=dict)
    _all: list[Totals] = field(default_factory=list)

    def observe(self, group: str, totals: Totals) -> None:
        self._groups.setdefault(group, []).append(totals)
        self._all.append(totals)

    def finished_in_group(self, group: str) -> int:
        return len(self._groups.get(group, ()))

    def predict(self, p: Progress) -> Prediction:
        samples = self._groups.get(p.group)
        source = "group"
        if not samples:
            samples, source = self._all, "batch"
        budget_tokens = p.max_turns * p.max_tokens_per_turn
        if samples:
            dm, ds = _mean_spread([s.decode_tokens for s in samples])
            pm, ps = _mean_spread([s.prefill_tokens for s in samples])
            tm, ts = _mean_spread([s.tool_seconds for s in samples])
            um, us = _mean_spread([s.turns for s in samples])
        else:
            source = "prior"
            dm, ds = self.prior_fraction * budget_tokens, 0.5 * self.prior_fraction * budget_tokens
            um, us = max(1.0, self.prior_fraction * p.max_turns), 0.5 * p.max_turns
            pm, ps = self.obs_tokens_prior * max(um - 1.0, 0.0), self.obs_tokens_prior
            tm, ts = self.tool_seconds_prior * um, self.tool_seconds_prior
        turns_left_budget = max(p.max_turns - p.turns_done, 1)
        turns_rem = min(max(um - p.turns_done, 1.0), float(turns_left_budget))
        # Tokens left in the budget: the current turn's remainder plus full later turns.
        budget_left = max(budget_tokens - p.decode_tokens, 1)
        decode_rem = min(max(dm - p.decode_tokens, 1.0), float(budget_left))
        prefill_rem = max(pm - p.prefill_tokens, 0.0)
        tool_rem = max(tm - p.tool_seconds, 0.0)
        return Prediction(
            decode=Estimate(decode_rem, min(ds, decode_rem)),
            prefill=Estimate(prefill_rem, ps),
            tool=Estimate(tool_rem, ts),
            turns=Estimate(turns_rem, us),
            source=source,
        )
