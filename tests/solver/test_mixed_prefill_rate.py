"""The planner prices a decoding slot's prefill with the batched step model (``PerfModel.step_time``).

Invariants (one snapshot, three real step models that differ only in how a mixed step combines its parts):
- with the roofline's batched mixed step, a decoding slot's prefill rate ``mu`` exceeds a PREFILL slot's
  prefill-only rate ``mu_p`` (the weights are read once for the chunk and the decodes);
- with "added" mixed steps (decode + chunk), ``mu == mu_p``: the planner reads ``step_time``;
- the stall a MIXED slot's own prefill causes (``e_js``) is shorter under the batched model than under the
  added one, and a PREFILL slot's throughput (``mu_p``) does not move.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from factories import make_slot, make_snapshot, make_traj, planner_config

from rollplan.models.perf import RooflinePerfModel, perf_model
from rollplan.models.types import Role
from rollplan.solver.core.instance import build_instance


@dataclass(frozen=True)
class _Added:
    """The roofline model with a mixed step priced as decode step + prefill chunk (the old rule)."""

    base: RooflinePerfModel

    def step_time(self, prefill_tokens: int, prefill_context: int, decode_seqs: int, decode_kv_tokens: float) -> float:
        dec = self.base.decode_step_time(decode_seqs, decode_kv_tokens / decode_seqs) if decode_seqs else 0.0
        pre = self.base.prefill_time([prefill_tokens], [prefill_context]) if prefill_tokens else 0.0
        return dec + pre

    def __getattr__(self, name: str):
        return getattr(self.base, name)


def _instance(added: bool):
    base = perf_model("h800", "qwen3-8b")
    assert isinstance(base, RooflinePerfModel)
    model = _Added(base) if added else base
    snap = make_snapshot([make_slot("s0"), make_slot("s1", role=Role.PREFILL)],
                         [make_traj(f"t{i}", slot="s0", context=6000, decode=400, prefill=8000, turns=4)
                          for i in range(6)])
    return build_instance(snap, planner_config(perf=lambda gpu, tp: model))


def test_decoding_slots_prefill_at_the_mixed_step_rate() -> None:
    batched, added = _instance(False), _instance(True)
    for inst in (batched, added):
        assert all(s.mu_p > 0 for s in inst.slots)
    assert all(s.mu > 1.03 * s.mu_p for s in batched.slots)
    assert all(s.mu == pytest.approx(s.mu_p, rel=1e-9) for s in added.slots)
    assert [s.mu_p for s in batched.slots] == pytest.approx([s.mu_p for s in added.slots])
    # The prefill a MIXED slot runs for its own trajectories costs it less time under the batched model.
    assert batched.stall_seconds(0, 0, Role.MIXED) < added.stall_seconds(0, 0, Role.MIXED)
