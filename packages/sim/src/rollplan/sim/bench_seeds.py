"""The replay matrix over several workload seeds: ``rollplan bench replay --matrix --seeds 0,1,2``.

One matrix run is deterministic, so it is the median of any number of runs of its seed; what one run cannot
show is how much its figures owe to the workload it drew. The seed draws the workload (which prompts make up
each batch and each sample's lengths, ``BatchSource.dataset``); the availability traces are fixed data. This
module runs ``run_matrix`` once per seed and reports, per cell, each seed's figures and their median, minimum
and maximum, and per target in how many seeds it holds (``seed_spread``), so a claim about the matrix is a claim
about its spread rather than one draw.

Notations (per cell c = trace x mode x workload, per seed s):

  r(c, s)      rollplan's tokens/s over the best other policy's (``rollplan_vs_best_other``)
  q(c, s)      the share of what is left (``share_of_what_is_left``; None where nothing is left)
  below(c)     seeds with r(c, s) < 1;  half(c)  seeds with the half target met (target cells only)

``seed_spread`` is pure (documents in, document out); ``run_matrix_seeds`` runs the replays.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from rollplan.models.errors import UserInputError
from rollplan.sim.bench_replay import HALF_TARGET, run_matrix

CellKey = tuple[str, str, str]


def parse_seeds(text: str) -> tuple[int, ...]:
    """``--seeds``: a comma list of distinct non-negative integers (at least one), in the order given.
    Raises a one-line ``UserInputError`` otherwise (a repeated seed would count one draw twice)."""
    parts = [p.strip() for p in text.split(",") if p.strip()]
    try:
        seeds = tuple(int(p) for p in parts)
    except ValueError:
        raise UserInputError(f"--seeds {text!r} is not a comma list of integers", fix="e.g. --seeds 0,1,2") from None
    if not seeds or any(s < 0 for s in seeds):
        raise UserInputError(f"--seeds {text!r} needs at least one non-negative integer", fix="e.g. --seeds 0,1,2")
    if len(set(seeds)) != len(seeds):
        raise UserInputError(f"--seeds {text!r} repeats a seed (one draw would count twice)",
                             fix="list each seed once, e.g. --seeds 0,1,2")
    return seeds


def spread(values: Sequence[float | None]) -> dict[str, Any]:
    """``values`` (one per seed, in seed order) with the median, minimum and maximum of those that are not
    None, each to 4 decimals as the bench's figures (all three None when none is a number)."""
    nums = [v for v in values if v is not None]
    return {
        "per_seed": list(values),
        "median": round(statistics.median(nums), 4) if nums else None,
        "min": round(min(nums), 4) if nums else None,
        "max": round(max(nums), 4) if nums else None,
    }


def _key(cell: dict[str, Any]) -> CellKey:
    return cell["trace"], cell["mode"], cell["workload"]


def _half_at_median(targets: Sequence[dict[str, Any]], field: str) -> str | None:
    """Of the target cells, those whose median ``field`` (a ``spread`` of shares) is >= 0.5 ("k/n"); None
    when no cell has it (the references were not replayed)."""
    have = [c[field] for c in targets if c[field] is not None]
    if not have:
        return None
    return f"{sum(m['median'] is not None and m['median'] >= HALF_TARGET for m in have)}/{len(targets)}"


def seed_spread(runs: Sequence[tuple[int, dict[str, Any]]]) -> dict[str, Any]:
    """Per cell and over the matrix, the spread over seeds of ``run_matrix`` documents ``runs`` ((seed, document)
    pairs, each with the same cells). Returns ``cells`` (per cell: each seed's best other policy, r, q, and the
    oracle's share, ``rollplan_share_at_most``, and the started oracle's share and part of the oracle's gain
    (``oracle_row``'s ``started``) where they were replayed, as ``spread``s; the seeds where
    rollplan is not below the best other and where the half target holds, as "k/n") and ``summary`` (per seed
    the matrix's own summary; the cells not below the best other in every seed; the target cells at half of
    what is left in every seed and at the median, those where some valid ceiling could give half at the
    median, and those where the started oracle takes half at the median; the lowest r of all). Raises
    ``ValueError`` when the runs' cells differ (they are not one matrix)."""
    if not runs:
        raise ValueError("no runs to summarise")
    seeds = [s for s, _ in runs]
    by_seed = [{_key(c): c for c in doc["matrix"]["cells"]} for _, doc in runs]
    order = [_key(c) for c in runs[0][1]["matrix"]["cells"]]
    for s, cells in zip(seeds, by_seed, strict=True):
        if set(cells) != set(order):
            raise ValueError(f"seed {s}'s matrix has other cells than seed {seeds[0]}'s")
    n = len(seeds)
    out_cells = []
    for key in order:
        per = [cells[key] for cells in by_seed]
        not_below = sum(bool(c["targets"]["not_below_best_other"]) for c in per)
        halves = [c["targets"]["half_of_what_is_left"] for c in per]
        oracle = [(c.get("oracle") or {}).get("share_of_what_is_left") for c in per]
        at_most = [(c.get("oracle") or {}).get("rollplan_share_at_most") for c in per]
        started = [((c.get("oracle") or {}).get("started") or {}) for c in per]
        shares = spread([c["share_of_what_is_left"] for c in per])
        out_cells.append({
            "trace": key[0], "mode": key[1], "workload": key[2],
            "best_other": [c["best_other"]["policy"] for c in per],
            "rollplan_vs_best_other": spread([c["rollplan_vs_best_other"] for c in per]),
            "share_of_what_is_left": shares,
            "left_tokens_per_s": spread([c.get("left_tokens_per_s") for c in per]),
            "oracle_share_of_what_is_left": spread(oracle) if any(c.get("oracle") for c in per) else None,
            "rollplan_share_at_most": spread(at_most) if any(c.get("oracle") for c in per) else None,
            "started_oracle_share_of_what_is_left": spread([x.get("share_of_what_is_left") for x in started])
            if any(started) else None,
            "started_oracle_of_oracle_gain": spread([x.get("of_oracle_gain") for x in started])
            if any(started) else None,
            "not_below_best_other": f"{not_below}/{n}",
            "half_of_what_is_left": None if all(h is None for h in halves) else f"{sum(bool(h) for h in halves)}/{n}",
            "half_at_median": None if all(h is None for h in halves) else (
                shares["median"] is not None and shares["median"] >= HALF_TARGET),
        })
    targets = [c for c in out_cells if c["half_of_what_is_left"] is not None]
    ratios = [v for c in out_cells for v in c["rollplan_vs_best_other"]["per_seed"] if v is not None]
    return {
        "seeds": seeds,
        "cells": out_cells,
        "summary": {
            "per_seed": [{"seed": s, **{k: doc["matrix"]["summary"][k] for k in
                                        ("not_below_best_other", "half_of_what_is_left", "min_rollplan_vs_best_other")},
                          "below_best_other": doc["matrix"]["summary"].get("below_best_other", [])}
                         for s, doc in runs],
            "cells": len(out_cells),
            "not_below_best_other_every_seed": sum(c["not_below_best_other"] == f"{n}/{n}" for c in out_cells),
            "half_of_what_is_left_every_seed": f"{sum(c['half_of_what_is_left'] == f'{n}/{n}' for c in targets)}/{len(targets)}",
            "half_of_what_is_left_at_median": f"{sum(bool(c['half_at_median']) for c in targets)}/{len(targets)}",
            "half_reachable_by_any_ceiling_at_median": _half_at_median(targets, "rollplan_share_at_most"),
            "started_oracle_half_at_median": _half_at_median(targets, "started_oracle_share_of_what_is_left"),
            "min_rollplan_vs_best_other": min(ratios, default=None),
        },
    }


def run_matrix_seeds(data_dir: str | Path, *, seeds: Sequence[int], on_seed: Callable[[int], None] | None = None,
                     **matrix: Any) -> dict[str, Any]:
    """``run_matrix`` once per seed of ``seeds`` (``matrix``: its other keyword arguments, the same for every
    seed), and their ``seed_spread``. Returns the JSON document: ``scenario`` (the first run's, its seed
    replaced by the list), ``seeds`` (``seed_spread``), ``runs`` (per seed its matrix without the cells'
    bench rows, which ``run_matrix`` prints in full), ``wall_s`` and ``cpu_s``."""
    if not seeds:
        raise UserInputError("no seeds given", fix="e.g. --seeds 0,1,2")
    t0 = time.perf_counter()
    runs = []
    for s in seeds:
        if on_seed is not None:
            on_seed(s)
        runs.append((s, run_matrix(data_dir, seed=s, **matrix)))
    first = runs[0][1]
    return {
        "benchmark": "replay-matrix-seeds",
        "scenario": {**first["scenario"], "seed": list(seeds)},
        "window": first["matrix"]["window"],
        "seeds": seed_spread(runs),
        "runs": [{"seed": s, "summary": doc["matrix"]["summary"],
                  "cells": [{k: v for k, v in c.items() if k != "row"} for c in doc["matrix"]["cells"]],
                  "wall_s": doc["wall_s"]} for s, doc in runs],
        "wall_s": round(time.perf_counter() - t0, 2),
        "cpu_s": round(sum(doc["cpu_s"] for _, doc in runs), 2),
    }
