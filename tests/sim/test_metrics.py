"""Replay metrics: the tail share and its paired (common-batch) comparison.

Invariants checked:
- the tail share of a batch is (end - completion of the ceil(90%)-th trajectory) / rollout, hand-computed;
- ``common_tail_shares`` averages each policy over exactly the batches every policy completed, ignoring
  unfinished batches, so a policy that reaches more batches is not judged on batches the others never ran.
"""

from __future__ import annotations

import pytest

from rollplan.sim.metrics import common_tail_shares, tail_share


def test_tail_share_by_hand() -> None:
    done = [float(t) for t in range(1, 11)]  # 10 trajectories, the 9th completes at 9 s, the batch at 10 s
    assert tail_share(done, 10.0) == pytest.approx(0.1)
    assert tail_share([], 10.0) is None
    assert tail_share(done, 0.0) is None


def _summary(rows: list[tuple[int, float | None, float | None]]) -> dict:
    return {"batches": [{"index": i, "rollout_s": r, "tail_share": t} for i, r, t in rows]}


def test_common_tail_shares_pair_the_batches() -> None:
    fast = _summary([(0, 600.0, 0.2), (1, 1000.0, 0.4), (2, 700.0, 0.3), (3, None, None)])
    slow = _summary([(0, 1800.0, 0.25), (1, None, None)])
    out = common_tail_shares({"fast": fast, "slow": slow})
    assert out["batches"] == [0]
    assert out["mean"] == {"fast": 0.2, "slow": 0.25}
    # Judged on their own batches, the slow policy would look better (0.25 < 0.3): the pairing matters.
    alone = {k: sum(b["tail_share"] for b in v["batches"] if b["tail_share"] is not None)
             / sum(1 for b in v["batches"] if b["tail_share"] is not None) for k, v in (("fast", fast), ("slow", slow))}
    assert alone["slow"] < alone["fast"]


def test_common_tail_shares_without_common_batches() -> None:
    out = common_tail_shares({"a": _summary([(0, 10.0, 0.1)]), "b": _summary([])})
    assert out == {"batches": [], "mean": {"a": None, "b": None}}
    assert common_tail_shares({}) == {"batches": [], "mean": {}}
