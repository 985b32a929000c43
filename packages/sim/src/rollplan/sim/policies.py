"""The six policies compared on every replay. They all see the same simulator state and act only through
its policy API (``set_role``, ``migrate``, ``order``/``choose_slot`` for dispatch); none sees true lengths.

- ``static-colocated`` (ROLL-like fixed resources): the dedicated GPUs only, all MIXED; FCFS; least-loaded
  placement; sticky sessions (a trajectory stays where its KV is).
- ``static-disagg``: the dedicated GPUs only, a fixed P:D split (``pd``, default 1:3); FCFS; least-loaded
  placement on the DECODE slots.
- ``elastic-colocated`` (RLBoost-like): every GPU it may use (dedicated, lent, preemptible), always MIXED,
  engines started on arrival (cold start / wake + sync); FCFS; least-loaded placement; a slot under notice or
  reclaim takes no new work; preemption = recompute (the KV is lost, the trajectory re-prefills elsewhere).
- ``formula-pd`` (Dynamo-planner-like): every usable GPU, the P:D split recomputed each interval in closed
  form from the measured prefill/decode load and per-GPU capacities, switched immediately whatever it costs
  (no switching-cost awareness); FCFS; least-loaded placement on DECODE slots; recompute on preemption.
- ``elastic-plus`` (RLBoost+/Seer-like, the strongest baseline): ``elastic-colocated`` (every GPU, always
  MIXED, recompute on preemption) with the rollplan policy's length predictor and cross-batch history
  (``rollplan.sim.predict``, the same warm start and updates) and its longest-predicted-first dispatch (the same
  pessimistic key, ``DISPATCH_Z``), least-loaded placement under vLLM's default admission (the simulator's
  watermark, no headroom); never calls the planner. See ``ElasticPlus``.
- ``rollplan``: ``rollplan.solver.plan`` on a snapshot with predicted lengths (``rollplan.sim.predict``);
  applies roles, engine starts and migrations of the plan; longest-predicted-first dispatch following the
  plan's placement, admitting a new trajectory only where a headroom of the KV stays free beyond what the
  residents hold (those in tool calls included): more on the slots of predicted-critical trajectories, less on
  the others while the batch is bound by its bulk. See ``RollplanPolicy.choose_slot``.

Re-invocation: on every availability event, at batch start and every ``replan_interval_s`` (the simulator
calls ``on_replan``; it skips interval calls while nothing changes and nothing runs, see
``rollplan.sim.engine.IDLE_TICKS``); dispatch (``order`` + ``choose_slot``) runs whenever capacity frees up.
"""

from __future__ import annotations

import heapq
import logging
import math
import time
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from rollplan.models.errors import UnknownNameError, UserInputError
from rollplan.models.types import EngineState, Role, SlotSource
from rollplan.policy.dispatch import (
    BULK_HEADROOM,
    BULK_SHARE,
    CRITICAL_HEADROOM,
    CRITICAL_SHARE,
    DISPATCH_Z,
    INFORMED_SOURCES,
    KV_HEADROOM,
    MOVE_RULES,
    MOVES,
    Headrooms,
    SlotLoad,
    bulk_regime_pays,
    carries_out_move,
    critical_set,
    follows_plan,
    is_bulk_bound,
    pessimistic_parts,
    reference_step,
    required_room,
)
from rollplan.policy.dispatch import choose_slot as core_choose_slot
from rollplan.policy.predict import Totals, group_floors
from rollplan.sim.engine import DECODING

if TYPE_CHECKING:
    from rollplan.sim.engine import Simulator, SlotState
    from rollplan.sim.state import TrajState

log = logging.getLogger(__name__)

POLICY_NAMES = (
    "static-colocated", "static-disagg", "elastic-colocated", "formula-pd", "elastic-plus", "rollplan",
)
ORACLE = "rollplan-oracle"
"""A reference run, not a policy: the rollplan policy told every trajectory's true remaining course
(``OracleRollplan``). Not in ``POLICY_NAMES`` (no system can run it, so it is never a baseline nor the best other
policy); ``rollplan bench replay --oracle`` adds it to each replay."""
ORACLE_STARTED = "rollplan-oracle-started"
"""A reference run, not a policy: the rollplan policy told a trajectory's true remaining course from the moment
it has started (``StartedOracleRollplan``), its own predictions before. ``rollplan bench replay --oracle`` adds
it beside ``ORACLE``: what perfect in-flight knowledge would add to rollplan."""
ORACLES = (ORACLE, ORACLE_STARTED)
"""The reference runs (never policies, baselines or the best other policy)."""


class BasePolicy:
    """Defaults shared by the baselines: FCFS order, least-loaded placement on usable decoding slots.

    ``sources``: the slot sources the policy may use (None: all).
    """

    name = "base"
    sources: frozenset[SlotSource] | None = None
    last_gap: float | None = None
    last_status: str | None = None
    _cand_key: tuple[int, int] = (0, -1)
    _cands: list[SlotState] = []  # noqa: RUF012 - replaced per instance on first use

    def attach(self, sim: Simulator) -> None:
        self.sim = sim

    def may_use(self, s: SlotState) -> bool:
        return self.sources is None or s.source in self.sources

    def accepts_work(self, s: SlotState) -> bool:
        """A slot this policy places new work on: present, decoding, not about to be returned."""
        return s.present and s.role in DECODING and s.return_by is None and self.may_use(s)

    # -- hooks ---------------------------------------------------------------------------------------------
    def on_replan(self, sim: Simulator, reason: str) -> None:
        t0 = time.perf_counter()
        self.decide(sim, reason)
        sim.recorder.replan(time.perf_counter() - t0, self.last_gap, self.last_status)

    def decide(self, sim: Simulator, reason: str) -> None:  # pragma: no cover - overridden
        raise NotImplementedError

    def on_plan_ready(self, sim: Simulator, token: int) -> None:
        """A decision asked for with ``sim.call_policy_at`` takes effect (only policies that solve use it)."""
        return None

    def order(self, sim: Simulator) -> Iterable[int]:
        """Pending trajectories in dispatch order (default FCFS)."""
        return sim.iter_pending()

    def enqueued(self, sim: Simulator, j: int) -> None:
        return None

    def candidates(self, sim: Simulator) -> list[SlotState]:
        """Slots that take new work now: present, decoding, ready, no return deadline, a usable source.
        Cached until any slot's role, readiness, presence or deadline changes (``sim.slot_epoch``)."""
        if self._cand_key != (id(sim), sim.slot_epoch):
            now = sim.now
            src = self.sources
            self._cands = [s for s in sim.live if s.role in DECODING and s.return_by is None and s.ready_at <= now
                           and (src is None or s.source in src)]
            self._cand_key = (id(sim), sim.slot_epoch)
        return self._cands

    def choose_slot(self, sim: Simulator, j: int) -> int | None:
        """Least-loaded (fewest trajectories, then most free KV) usable slot that can take j now; when that one
        has no room, the one with the most free KV if j fits there."""
        cands = self.candidates(sim)
        if not cands:
            return None
        best = roomiest = cands[0]
        best_n = best.n_res
        best_free = room_free = best.kv_free
        # Hot (every dispatch attempt, over tens of slots): reads the counts the simulator keeps per slot
        # (n_res = len(residents), kv_free = kv_cap - reserved); strict comparisons keep the first of equals.
        for s in cands:
            free = s.kv_free
            if free > room_free:
                roomiest, room_free = s, free
            n = s.n_res
            if n <= best_n and (n < best_n or free > best_free):
                best, best_n, best_free = s, n, free
        t = sim.trajs[j]
        need = sim.need_new(t)
        if sim.free_for_new(best) + sim.prefix_bonus(best, t) >= need:
            return best.idx
        if sim.free_for_new(roomiest) + sim.prefix_bonus(roomiest, t) >= need:
            return roomiest.idx
        return None

    def on_traj_done(self, sim: Simulator, j: int) -> None:
        return None

    # -- divided rollout (SimConfig.divide_tokens) -------------------------------------------------------------
    def chunk_admission(self, sim: Simulator, j: int) -> tuple[Headrooms, bool, bool, frozenset[int] | set[int]]:
        """The admission a chunk move is held to (``chunk_move``): (headrooms, j is predicted-critical, the
        batch is bound by its bulk, the slots hosting a predicted-critical trajectory). Baselines: vLLM's
        admission (no headroom; ``slot_free`` counts evictable tool-call KV as free)."""
        return _NO_HEADROOM, False, False, _NO_SLOTS

    def slot_free(self, sim: Simulator, s: SlotState) -> int:
        """KV of ``s`` a new admission may take, before the watermark (``SlotLoad.kv_free``): baselines, as vLLM,
        may evict the KV of residents in tool calls (``Simulator.free_for_new``)."""
        return sim.free_for_new(s) + s.watermark

    def chunk_move(self, sim: Simulator, j: int) -> tuple[int, bool] | None:
        """Divided rollout: where j, which just decoded a chunk (``SimConfig.divide_tokens`` decode steps) on its
        slot and still has its KV there (its home), runs its next chunk. None: on its home, at no cost.
        (slot, by_kv): moved there, by KV transfer when ``by_kv``, else by re-prefill of its context there.

        1. Priced candidates: the slots that take new work (``candidates``) other than home on which j's next
           chunk runs faster than at home by more than the move costs: ``N * (tau_home - tau_s) > move_s``, with
           ``tau`` a slot's decode step once j joins its running batch (the perf model's decode step at the
           batch's mean context, plus the prefill seconds per step its members carry) and ``move_s`` the cheaper
           of the KV transfer (``FastPerf.transfer``, the price the simulator's ``migrate`` charges) and the
           re-prefill of what a resident sibling does not hold there (``FastPerf.prefill``): the planner's move
           price ``m_js`` (the cheaper of the two). When home cannot take j's next turn (KV) or is being returned,
           every candidate counts: waiting costs more than any move.
        2. The decision core picks among them (``rollplan.policy.dispatch.choose_slot``, under this policy's
           admission, ``chunk_admission``): the slot with the fewest residents that admits j, then the most
           free KV. None admits: home.
        3. By KV when the transfer is the cheaper (the planner's ``move_by_kv``)."""
        t = sim.trajs[j]
        home = sim.slots[t.slot]
        need = sim.need_new(t)
        n_tok = sim.cfg.divide_tokens
        ctx = t.ctx
        stay = (home.return_by is None and home.present
                and home.kv_cap - home.reserved + t.reserved + sim.prefix_bonus(home, t) >= need)
        if stay and sim.n_pending:
            return None  # the room j would take elsewhere is wanted by waiting work: a move gains the batch nothing
        tau_home = self._tau_with(home, ctx) if stay else math.inf
        heads, critical, bulk, crit_slots = self.chunk_admission(sim, j)
        loads = []
        prices: dict[int, tuple[float, float]] = {}
        for s in self.candidates(sim):
            if s is home:
                continue
            gain = n_tok * (tau_home - self._tau_with(s, ctx))
            if gain <= 0.0:
                continue
            perf = s.perf
            bonus = sim.prefix_bonus(s, t)
            kv_s = home.perf.transfer(ctx, home.node == s.node)
            re_s = perf.prefill(ctx - bonus, bonus)
            if gain <= min(kv_s, re_s):
                continue
            prices[s.idx] = (kv_s, re_s)
            loads.append(SlotLoad(s.idx, s.kv_cap, self.slot_free(sim, s), s.watermark, s.n_res, bonus,
                                  s.idx in crit_slots))
        if not loads:
            return None
        target = core_choose_slot(need, loads, critical=critical, bulk_bound=bulk, headrooms=heads)
        if target is None:
            return None
        kv_s, re_s = prices[target]  # type: ignore[index]
        return int(target), kv_s <= re_s  # type: ignore[arg-type]

    @staticmethod
    def _tau_with(s: SlotState, ctx: float) -> float:
        """Seconds per decode step of ``s``'s running batch with one more sequence of ``ctx`` KV tokens."""
        n = s.n_run + 1
        return s.perf.decode(n, (s.kv_sum + ctx) / n) + s.rho_sum

    def warm_start(self, history: Sequence[tuple[Any, str]]) -> None:
        """Trajectories finished before the replay window (baselines keep no history)."""
        return None


class StaticColocated(BasePolicy):
    """Dedicated GPUs only, all MIXED (the fixed-resource ROLL baseline)."""

    name = "static-colocated"
    sources = frozenset((SlotSource.DEDICATED,))

    def decide(self, sim: Simulator, reason: str) -> None:
        for s in sim.slots:
            if s.present and self.may_use(s) and s.role is not Role.MIXED:
                sim.set_role(s.idx, Role.MIXED)


class StaticDisagg(BasePolicy):
    """Dedicated GPUs only, a fixed P:D split: the first ``round(N * p / (p + d))`` (>= 1) are PREFILL."""

    name = "static-disagg"

    sources = frozenset((SlotSource.DEDICATED,))

    def __init__(self, pd: tuple[int, int] = (1, 3)) -> None:
        self.pd = pd

    def decide(self, sim: Simulator, reason: str) -> None:
        mine = [s for s in sim.slots if s.present and self.may_use(s)]
        n = len(mine)
        if n == 0:
            return
        p, d = self.pd
        n_p = min(n - 1, max(1, round(n * p / (p + d)))) if n > 1 else 0
        for i, s in enumerate(mine):
            want = Role.PREFILL if i < n_p else (Role.DECODE if n > 1 else Role.MIXED)
            if s.role is not want:
                sim.set_role(s.idx, want)


class ElasticColocated(BasePolicy):
    """Every GPU (dedicated, lent, preemptible), always MIXED, least-loaded, recompute on preemption."""

    name = "elastic-colocated"

    def decide(self, sim: Simulator, reason: str) -> None:
        for s in sim.slots:
            if s.present and s.role is Role.OFF and s.return_by is None:
                sim.set_role(s.idx, Role.MIXED)


class FormulaPD(BasePolicy):
    """Closed-form P:D each interval from measured load (Dynamo-planner-like); no switching-cost awareness.

    n_p = N * (L_p / mu_p) / (L_p / mu_p + L_d / mu_d) rounded, clamped to [1, N-1], where L_p / L_d are the
    prefill / decode tokens per second measured over the last interval, mu_p = tokens/s of one GPU
    prefilling 2048-token chunks and mu_d = tokens/s of one GPU decoding a KV-full batch, both at the mean
    context of the trajectories now running. Before any measurement: ``initial_pd``.
    """

    name = "formula-pd"

    def __init__(self, initial_pd: tuple[int, int] = (1, 3)) -> None:
        self.initial_pd = initial_pd
        self._last_t = 0.0
        self._last_p = 0.0
        self._last_d = 0.0
        self._share: float | None = None

    def attach(self, sim: Simulator) -> None:
        super().attach(sim)
        sim.recorder.track_rates = True

    def _measure(self, sim: Simulator) -> None:
        rec = sim.recorder
        dt = sim.now - self._last_t
        if dt <= 1.0:
            return
        lp = rec.rate("prefill", self._last_t, sim.now)
        ld = rec.rate("decode", self._last_t, sim.now)
        self._last_t = sim.now
        if lp <= 0 and ld <= 0:
            return
        ctxs = [t.ctx for t in sim.trajs if t.state != 6]
        ctx = sum(ctxs) / len(ctxs) if ctxs else 8192.0
        perf = next((s.perf for s in sim.slots if s.present), None)
        if perf is None:
            return
        mu_p = perf.chunk / max(perf.prefill(perf.chunk, ctx), 1e-9)
        b = max(1, min(sim.cfg.max_num_seqs, int(perf.kv_cap // max(ctx, 1.0))))
        mu_d = b / max(perf.decode(b, ctx), 1e-9)
        gp, gd = lp / mu_p, ld / mu_d
        if gp + gd > 0:
            self._share = gp / (gp + gd)

    def decide(self, sim: Simulator, reason: str) -> None:
        if reason == "interval" or self._share is None:
            self._measure(sim)
        usable = [s for s in sim.slots if s.present and s.return_by is None]
        n = len(usable)
        if n == 0:
            return
        if n == 1:
            if usable[0].role is not Role.MIXED:
                sim.set_role(usable[0].idx, Role.MIXED)
            return
        share = self._share
        if share is None:
            p, d = self.initial_pd
            share = p / (p + d)
        n_p = min(n - 1, max(1, round(n * share)))
        prefill = [s for s in usable if s.role is Role.PREFILL]
        others = [s for s in usable if s.role is not Role.PREFILL]
        if len(prefill) > n_p:  # surplus PREFILL slots go back to decode
            for s in prefill[n_p:]:
                sim.set_role(s.idx, Role.DECODE)
            prefill = prefill[:n_p]
        elif len(prefill) < n_p:  # convert the least-loaded others; their trajectories move by KV first
            convert = sorted(others, key=lambda s: (len(s.residents), s.idx))[: n_p - len(prefill)]
            keep = [s for s in others if s not in convert]
            for s in convert:
                for j in list(s.residents):
                    self._evacuate(sim, j, keep)
                sim.set_role(s.idx, Role.PREFILL)
        for s in usable:
            if s.role in (Role.OFF, Role.MIXED):
                sim.set_role(s.idx, Role.DECODE)

    @staticmethod
    def _evacuate(sim: Simulator, j: int, targets: list[SlotState]) -> None:
        """Move j (KV transfer) to the least-loaded target with room; if none has room it re-prefills later."""
        t = sim.trajs[j]
        room = [s for s in targets if s.role in DECODING and s.kv_cap - s.reserved >= t.ctx]
        if room:
            dst = min(room, key=lambda s: (len(s.residents), s.idx))
            sim.migrate(j, dst.idx, by_kv=True)


# The dispatch and admission constants and rules live in the decision core (rollplan.policy.dispatch, where
# their docstrings say what they mean); re-exported here for the policies below and their callers.
_NO_SLOTS: frozenset[int] = frozenset()
_NO_HEADROOM = Headrooms(0.0)
PATH_Z = 0.0
"""``PlannerConfig.path_z`` of the rollplan policy's planner (critical paths at this many spreads above the
predictions): 0, the means. 1.77 (``DISPATCH_Z``) lost 4.6% on a held-out first-epoch scenario of ``rollplan bench
sensitivity`` (every unseen trajectory carries the prior's wide spread) and 0.2-0.5% of the lead in every Bamboo
128 x 16 cell of the replay matrix; 1 moved nothing held out by more than 0.1% (README)."""
REGIMES = ("model", "share")
REGIME = "model"
"""How the rollplan policy decides, at each plan, whether the batch is bound by its bulk (the admission
headrooms' regime, ``rollplan.policy.dispatch.Headrooms.levels``): "model", the regime whose headrooms the step
model predicts to end the batch sooner (``bulk_regime_pays``: the longest path's step time against the bulk's
decode rate, on as many slots as there are critical trajectories); "share", the work bound against
``BULK_SHARE`` of the longest path (``is_bulk_bound``; the rule before, kept for ``rollplan bench
sensitivity``). Both adapters use "model" (the executor falls back to "share" without a perf model)."""


def _group_floors(live: Sequence[Any], progress: Sequence[tuple[float, int, float, int]]) -> dict[str, Totals]:
    """The decision core's ``group_floors`` of ``live`` (unfinished trajectories, with their ``sim.progress``):
    group -> what its most advanced unfinished trajectory has done (group survival)."""
    return group_floors((t.group, dec, tool, float(turns)) for t, (dec, turns, tool, _ctx) in zip(live, progress,
                                                                                                  strict=True))


class RollplanPolicy(BasePolicy):
    """``rollplan.solver.plan`` on the simulator's state, seen through predictions.

    On every re-plan: build a ``ClusterSnapshot`` (present slots with their role, engine state, weights and
    return deadline; unfinished trajectories with their phase, context, where their KV is, and the
    ``Predictor``'s remaining decode/prefill/tool/turn estimates), ``Planner.replan`` it (previous plan as warm
    start), then apply the plan: bring up slots the plan uses (cold start / wake / sync / role switch: real
    time in the simulator), move trajectories the plan moves (KV transfer or re-prefill, as the plan's action
    says), switch slots to PREFILL / OFF last. Between re-plans, pending trajectories are dispatched
    longest-predicted-first (mean + ``DISPATCH_Z`` spreads) to the slot the plan placed them on (any fitting
    slot if that one is full).

    Defaults are the executor's (``ExecutorConfig.planner_backend`` / ``planner_time_limit``: milp, 1 s), so
    a replay measures the planner users run. ``deterministic``: ``PlannerConfig(deterministic=True)`` (the
    time limit is a work budget; the same state gives the same plan whatever the machine's load).
    ``charge_solve``: a plan is computed on the state at the re-plan and takes effect ``time_limit`` seconds
    later (``Simulator.call_policy_at``), while the slots keep running and pending trajectories keep being
    dispatched by the previous plan; re-plans asked for meanwhile are coalesced into one, made when it lands
    (the executor's controller, too, plans one snapshot at a time and queues the reasons that come in). The
    time limit is what is charged, not the measured solve: it is deterministic and it bounds the executor's
    solve, which honours the same limit.
    """

    name = "rollplan"
    predicts_each_trajectory = False
    """Whether two siblings at the same observable point may get different predictions (``OracleRollplan``);
    False: a snapshot predicts once per (history key, group, progress) and shares the result."""

    def __init__(self, backend: str = "milp", time_limit: float = 1.0, switch_weight: float = 0.01,
                 deterministic: bool = True, charge_solve: bool = True, kv_headroom: float = KV_HEADROOM,
                 bulk_headroom: float = BULK_HEADROOM, critical_headroom: float = CRITICAL_HEADROOM,
                 bulk_share: float = BULK_SHARE, critical_share: float = CRITICAL_SHARE,
                 dispatch_z: float = DISPATCH_Z, path_z: float = PATH_Z, regime: str = REGIME,
                 moves: str = MOVES) -> None:
        from rollplan.sim.predict import Predictor
        from rollplan.solver import BACKENDS, Planner, PlannerConfig

        # Checked here, not at the first plan: the planner's error would otherwise be caught and logged at
        # every re-plan while the replay waits forever for a plan.
        if backend not in BACKENDS:
            raise UnknownNameError("planner backend", backend, BACKENDS)
        if regime not in REGIMES:
            raise UnknownNameError("regime", regime, REGIMES)
        if moves not in MOVE_RULES:
            raise UnknownNameError("move rule", moves, MOVE_RULES)
        self.backend = backend
        self.time_limit = time_limit
        self.switch_weight = switch_weight
        self.deterministic = deterministic
        self.charge_solve = charge_solve
        # A plan being solved (``charge_solve``): its token and what applying it does; re-plans asked for
        # while it is solved (their reasons).
        self._token = 0
        self._solving: tuple[int, int, Any] | None = None
        self._asked: list[str] = []
        # The decision core's admission rule (rollplan.policy.dispatch); kv_headroom = 0: no headroom rule at
        # all (the engine's watermark alone).
        self.headrooms = Headrooms(kv_headroom, bulk_headroom, critical_headroom)
        self.kv_headroom = kv_headroom
        self.critical_headroom, self.bulk_headroom = self.headrooms.levels(False)[0], self.headrooms.levels(True)[1]
        self.bulk_share = bulk_share
        self.regime = regime
        self.moves = moves
        self.critical_share = critical_share
        self.dispatch_z = dispatch_z
        self.path_z = path_z
        # Predicted-critical trajectories (``CRITICAL_SHARE``): None = recompute from ``_cp`` when next needed;
        # their slots, cached for one instant (``_crit_slots_at``).
        self._crit: set[int] | None = None
        self._cp_max = 0.0
        self._crit_slots: set[int] = set()
        self._crit_slots_at = -1.0
        self._bulk_bound = False
        self._Planner = Planner
        self._PlannerConfig = PlannerConfig
        self.predictor = Predictor()
        self.planner: Any = None
        self._cp: dict[int, float] = {}
        self._cp_dec: dict[int, float] = {}  # the decode seconds of ``_cp`` (``pessimistic_parts``)
        self._informed: set[int] = set()  # trajectories whose prediction knows them (INFORMED_SOURCES)
        self._floors: dict[str, Totals] = {}
        self._heap: list[tuple[float, int, int]] = []
        self._batch = -1
        self._last_plan_t = -math.inf
        self._left_at_plan = 0
        self._groups_seen_at_plan = -1
        self._kv_lost_at_plan = 0
        self._a_ref = 0.02
        self._spec_a = 0.0  # the acceptance the planner prices speculation at (``_spec_acceptance``)

    def attach(self, sim: Simulator) -> None:
        super().attach(sim)
        cfg = self._PlannerConfig(
            backend=self.backend, time_limit=self.time_limit, switch_weight=self.switch_weight,
            perf=self._spec_provider(sim) if sim.cfg.spec_tokens else (lambda gpu, tp: sim.perf_for(gpu, tp).perf),
            mem_util=sim.cfg.mem_util,
            role_switch_seconds=sim.cfg.role_switch_s,
            clock=time.perf_counter,
            deterministic=self.deterministic,
            path_z=self.path_z,
        )
        self.planner = self._Planner(cfg)

    def _spec_provider(self, sim: Simulator) -> Any:
        """The planner's PerfProvider when the slots speculate (``SimConfig.spec_tokens``): each slot type's
        model wrapped in ``rollplan.models.perf.spec.SpeculativePerf`` at the acceptance ``_spec_acceptance``
        measured at the latest re-plan (the engines' per-request acceptance, here the simulator's per group)
        and the engines' draft length (adaptive as they are), so the planner prices every decode token at the
        speed a speculating engine of that batch size produces it. Memoised per (type, acceptance to 0.01)."""
        from rollplan.models.perf.spec import SpeculativePerf

        memo: dict[tuple[str, int, float], Any] = {}
        k, adaptive = sim.cfg.spec_tokens, sim.cfg.spec_adaptive

        def provider(gpu: str, tp: int) -> Any:
            a = round(self._spec_a, 2)
            key = (gpu, tp, a)
            hit = memo.get(key)
            if hit is None:
                hit = memo[key] = SpeculativePerf(sim.perf_for(gpu, tp).perf, a, k, adaptive)
            return hit

        return provider

    def _spec_acceptance(self, sim: Simulator) -> float:
        """The acceptance the planner prices speculation at: the mean over the predicted-critical trajectories
        (whose decode sets the makespan; their groups' finished siblings feed their drafts), else over every
        unfinished one (the engines measure it per request)."""
        from rollplan.sim.engine import DONE

        trajs = sim.trajs
        crit = [trajs[j].spec_a for j in self._critical() if trajs[j].state != DONE]
        vals = crit or [t.spec_a for t in trajs if t.state != DONE]
        return min(1.0, max(0.0, sum(vals) / len(vals))) if vals else 0.0

    # -- snapshot ----------------------------------------------------------------------------------------------
    def _predict(self, sim: Simulator, j: int, progress: tuple[float, int, float, int] | None = None,
                 pf_done: int | None = None) -> tuple[float, float, float, float, tuple[float, float, float, float]]:
        """j's predicted remaining (decode, prefill, tool, turns, spreads); also its dispatch-order key.
        ``progress``: ``sim.progress`` of j and ``pf_done``: its new tokens prefilled in finished turns, when the
        caller has them."""
        t = sim.trajs[j]
        dec, turns, tool, _ctx = progress if progress is not None else sim.progress(t)
        if pf_done is None:
            pf_done = sim.slots[0].perf.spec_prefill(t.spec)[2][min(turns, t.n - 1)] if turns else 0
        f = self._floors.get(t.group)
        if f is None:
            rem = self.predictor.remaining_raw(t.key, t.group, dec, pf_done, tool, turns)
        else:
            rem = self.predictor.remaining_raw(t.key, t.group, dec, pf_done, tool, turns, f.decode, f.tool, f.turns)
        a = self._a_ref
        sds = rem[4]
        dec_s, tool_s = pessimistic_parts(rem[0], sds[0], rem[2], sds[2], a, self.dispatch_z)
        self._cp[j] = dec_s + tool_s
        self._cp_dec[j] = dec_s
        self._note_source(t.key, t.group, j)
        return rem

    def snapshot(self, sim: Simulator) -> Any:
        from rollplan.models.types import ClusterSnapshot, EngineState, Estimate, Phase, Slot, Trajectory
        from rollplan.sim.engine import DONE, IN_FLIGHT, RUN, TOOL

        slots = []
        for s in sim.live:
            engine = s.engine if s.engine is not EngineState.NONE or s.ready_at <= sim.now else EngineState.WARM
            slots.append(Slot(id=s.id, gpu=s.gpu, node=s.node, tp=s.tp, source=s.source, return_by=s.return_by,
                              role=s.role, engine=engine, weights_version=s.weights))
        live = [t for t in sim.trajs if t.state != DONE]
        progress = [sim.progress(t) for t in live]
        self._floors = _group_floors(live, progress)
        slot_ids = [s.id for s in sim.slots]
        trajs = []
        decoding, in_tool, pending = Phase.DECODING, Phase.IN_TOOL, Phase.PREFILL_PENDING
        cp = self._cp
        # Siblings at the same observable point (most often: samples of one prompt none of which has started)
        # get the same prediction: ``_predict`` is a function of (history key, group, progress, prefill done)
        # while the predictor and the floors stay fixed, as they do during one snapshot. Computed once per
        # such point; the frozen Estimates are shared.
        memo: dict[tuple[Any, ...], tuple[float, tuple[Any, ...], tuple[Estimate, ...]]] = {}
        perf = sim.slots[0].perf
        window = perf.max_context
        # A trajectory whose fields are all as in the previous snapshot of this batch gets the same (frozen)
        # Trajectory object back: about half of them between two re-plans (pending ones not yet started).
        prev_key, prev = getattr(self, "_snap_objs", (None, {}))
        by_trajectory = self.predicts_each_trajectory
        key = (id(sim), sim.batch)
        if prev_key != key:
            prev = {}
        objs: dict[int, tuple[tuple[Any, ...], Any]] = {}
        for t, prog in zip(live, progress, strict=True):
            done_turns = prog[1]
            pf_done = perf.spec_prefill(t.spec)[2][min(done_turns, t.n - 1)] if done_turns else 0
            point = (t.key, t.group, prog[0], done_turns, prog[2], pf_done, t.idx if by_trajectory else 0)
            hit = memo.get(point)
            if hit is None:
                dec, pre, tool, turns, sds = self._predict(sim, t.idx, prog, pf_done)
                hit = memo[point] = (cp[t.idx], (dec, pre, tool, turns, sds),
                                     (Estimate(dec, sds[0]), Estimate(pre, sds[1]),
                                      Estimate(tool, sds[2]), Estimate(turns, sds[3])))
            else:
                cp[t.idx] = hit[0]
                self._note_source(t.key, t.group, t.idx)
            st = t.state
            phase = decoding if (st == RUN or st in IN_FLIGHT) else (in_tool if st == TOOL else pending)
            home = slot_ids[t.slot] if t.slot >= 0 and (t.kv_ok or st in IN_FLIGHT) else None
            until = t.tool_until if st == TOOL else None
            # An engine never holds more than the model's window (the workload is truncated to it); the fluid
            # progress of a running segment can overshoot it by a token at a turn boundary.
            fields = (phase, min(max(1, prog[3]), window), home, until, hit[1])
            old = prev.get(t.idx)
            if old is not None and old[0] == fields:
                traj = old[1]
            else:
                e_dec, e_pre, e_tool, e_turns = hit[2]
                traj = Trajectory(
                    id=t.spec.id, group=t.group, phase=phase, context_tokens=fields[1], slot=home,
                    remaining_decode_tokens=e_dec, remaining_prefill_tokens=e_pre,
                    remaining_tool_seconds=e_tool, remaining_turns=e_turns, tool_until=until,
                )
            objs[t.idx] = (fields, traj)
            trajs.append(traj)
        self._snap_objs = (key, objs)
        return ClusterSnapshot(time=sim.now, model=sim.model, slots=tuple(slots), trajectories=tuple(trajs),
                               weights_version=sim.weights_version)

    # -- decisions ---------------------------------------------------------------------------------------------
    def _new_batch(self, sim: Simulator) -> None:
        if sim.batch != self._batch:
            self._batch = sim.batch
            self._cp = {}
            self._cp_dec = {}
            self._informed = set()
            self._crit = None
            self._floors = {}
            self._heap = []
            self.predictor.start_batch(sim.batch)
            if self.planner is not None:  # None: a policy that never plans (``ElasticPlus``)
                self.planner.reset()
            perf = next((s.perf for s in sim.live), None)
            if perf is not None:
                self._a_ref = reference_step(perf.perf)

    def _worth_replanning(self, sim: Simulator, reason: str) -> bool:
        """Whether this invocation calls the planner. Interval ticks re-plan only when something the plan
        depends on moved: a group's first sibling finished (Seer predictions changed), a tenth of the batch
        finished, or the last plan is 4 ticks old. Slots leaving re-plan only if work was on them (an empty
        slot's departure leaves the current plan valid). Arrivals, notices, reclaims, lending and batch
        starts always re-plan."""
        if self.planner.previous is None:
            return True
        reasons = set(reason.split("+"))
        if reasons <= {"avail:leave", "deadline"}:
            # Slots went away: the current plan stays valid unless work was on them (KV lost now).
            return sim.recorder.counters.get("kv_lost", 0) != self._kv_lost_at_plan
        if reasons != {"interval"}:
            return True
        left = sim.batch_left
        if self.predictor.groups_seen != self._groups_seen_at_plan:
            return True
        if left <= 0.9 * self._left_at_plan:
            return True
        return sim.now - self._last_plan_t >= 4 * sim.replan_interval_s - 1e-9

    def on_replan(self, sim: Simulator, reason: str) -> None:
        self._new_batch(sim)
        if self._solving is not None:
            # A plan is being solved: this re-plan waits for it (and sees what it changed).
            if self._solving[1] == sim.batch:
                self._asked.append(reason)
                return
            self._solving = None  # its batch ended: dropped
        if not sim.batch_active or not self._worth_replanning(sim, reason):
            return
        self._last_plan_t = sim.now
        self._left_at_plan = sim.batch_left
        self._groups_seen_at_plan = self.predictor.groups_seen
        self._kv_lost_at_plan = sim.recorder.counters.get("kv_lost", 0)
        t0 = time.perf_counter()
        self.last_gap = self.last_status = None
        self.decide(sim, reason)
        sim.recorder.replan(time.perf_counter() - t0, self.last_gap, self.last_status)

    def decide(self, sim: Simulator, reason: str) -> None:
        from rollplan.models.errors import RollplanError

        if not sim.live:
            return
        snap = self.snapshot(sim)  # refreshes every unfinished trajectory's ``_cp``
        self._crit = None
        self._rebuild_heap(sim)
        if not snap.trajectories:
            return
        if sim.cfg.spec_tokens:
            self._spec_a = self._spec_acceptance(sim)
        try:
            plan: Any = self.planner.replan(snap)
            self.last_gap = plan.gap
            self.last_status = plan.status.value
        except RollplanError as err:
            plan = err
            self.last_status = "error"
        if self.charge_solve and self.time_limit > 0:
            self._token += 1
            self._solving = (self._token, sim.batch, plan)
            sim.call_policy_at(self.time_limit, self._token)
        else:
            self._apply(sim, plan)

    def on_plan_ready(self, sim: Simulator, token: int) -> None:
        """The plan solved ``time_limit`` seconds ago takes effect (``charge_solve``), unless its batch ended;
        then the re-plans asked for meanwhile, as one (their reasons joined)."""
        solving = self._solving
        if solving is None or solving[0] != token:
            return
        self._solving = None
        if solving[1] == sim.batch and sim.batch_active:
            self._apply(sim, solving[2])
        asked, self._asked = self._asked, []
        if asked and sim.batch_active:
            self.on_replan(sim, "+".join(dict.fromkeys("+".join(asked).split("+"))))

    def _apply(self, sim: Simulator, plan: Any) -> None:
        """Carry out ``plan`` (or, for a planning error, the fallback) on the simulator's state now. The state
        may have moved since the snapshot it was solved on: commands on trajectories that finished or slots
        that left are no-ops (``Simulator.set_role`` / ``migrate`` check), placements only steer trajectories
        still pending."""
        from rollplan.models.errors import RollplanError
        from rollplan.models.types import ActionKind
        from rollplan.solver.core.bounds import BOUND_WORK

        if isinstance(plan, RollplanError):
            err = plan
            if any(s.present and s.role in DECODING for s in sim.slots):
                log.warning("rollplan policy: no plan at t=%.1f (%s); keeping the current state", sim.now, err)
                return
            # Nothing decodes yet (e.g. the first plan: predictions say a trajectory cannot fit, while its true
            # length may): start every present slot that is not being returned as MIXED, so the batch runs.
            log.warning("rollplan policy: no plan at t=%.1f (%s); every usable GPU set to MIXED", sim.now, err)
            for sl in sim.slots:
                if sl.present and sl.return_by is None and self.may_use(sl):
                    sim.set_role(sl.idx, Role.MIXED)
            return
        # Bound by its bulk (REGIME): the bulk regime's headrooms are predicted to end the batch no later than
        # the critical path's, for the longest pessimistic path (the same mean + DISPATCH_Z spreads the dispatch
        # order uses; the plan's own critical-path bound uses the means, which the longest of a group's samples
        # exceeds), the plan's work bound and decoding slots and the predicted-critical count.
        work = plan.bounds.get(BOUND_WORK, 0.0)
        if self.regime == "share":
            self._bulk_bound = is_bulk_bound(work, max(self._cp.values(), default=0.0), self.bulk_share)
        elif self._cp and sim.live:
            j = max(self._cp, key=self._cp.__getitem__)
            dec_s = self._cp_dec.get(j, 0.0)
            self._bulk_bound = bulk_regime_pays(work, dec_s, self._cp[j] - dec_s, perf=sim.live[0].perf.perf,
                                                slots=sum(1 for r in plan.roles.values() if r.decodes),
                                                critical=len(self._critical()), headrooms=self.headrooms)
        if self._cp:
            sim.recorder.regime(sim.batch, self._bulk_bound, len(self._critical()))
        index = sim.slot_index
        by_id = {t.spec.id: t for t in sim.trajs}
        # 1. Slots that will decode: bring them up first (their engines start now).
        for sid, role in plan.roles.items():
            if sid not in index:
                continue
            s = sim.slots[index[sid]]
            if role.decodes and (role is not s.role or s.engine is not EngineState.WARM):
                sim.set_role(s.idx, role)
        # 2. Moves the plan prices (KV transfer or re-prefill).
        moves = {a.trajectory: a for a in plan.actions
                 if a.kind in (ActionKind.MIGRATE_KV, ActionKind.MIGRATE_REPREFILL) and a.trajectory and a.target}
        for tid, a in moves.items():
            t = by_id.get(tid)
            if t is not None and a.target in index:
                # A move of KV its slot does not force (MOVES) is dropped, and counted.
                if t.slot >= 0 and t.kv_ok and self.moves != "all" and not self._carries_out(sim, t, plan):
                    sim.recorder.count("moves_not_carried_out")
                    continue
                sim.migrate(t.idx, index[a.target], by_kv=a.kind is ActionKind.MIGRATE_KV)
        # 3. Slots leaving decode (PREFILL / OFF) last, once their trajectories moved.
        for sid, role in plan.roles.items():
            if sid not in index:
                continue
            s = sim.slots[index[sid]]
            if not role.decodes and role is not s.role:
                sim.set_role(s.idx, role)
        # 4. Where pending trajectories should start.
        for tid, sid in plan.placement.items():
            t = by_id.get(tid)
            if t is not None and t.slot < 0 and sid in index:
                t.preferred = index[sid]

    def enqueued(self, sim: Simulator, j: int) -> None:
        self._new_batch(sim)
        cp = self._cp.get(j)
        if cp is None:
            self._predict(sim, j)
            cp = self._cp[j]
            if self._crit is not None and j in self._informed:
                if cp > self._cp_max:
                    self._crit = None
                elif cp >= self.critical_share * self._cp_max:
                    self._crit.add(j)
                    self._crit_slots_at = -1.0
        heapq.heappush(self._heap, (-cp, sim.trajs[j].pseq, j))

    def _rebuild_heap(self, sim: Simulator) -> None:
        trajs = sim.trajs
        self._heap = [(-self._cp.get(j, 0.0), trajs[j].pseq, j) for j in sim.iter_pending()]
        heapq.heapify(self._heap)

    def order(self, sim: Simulator) -> Iterable[int]:
        """Longest pessimistic remaining critical path first (see ``DISPATCH_Z``)."""
        h = self._heap
        trajs = sim.trajs
        while h:
            _neg, seq, j = h[0]
            if trajs[j].pseq != seq:
                heapq.heappop(h)
                continue
            yield j
            if h and h[0][2] == j and trajs[j].pseq != seq:
                heapq.heappop(h)

    def _note_source(self, key: str, group: str, j: int) -> None:
        if self.predictor.source(key, group) in INFORMED_SOURCES:
            self._informed.add(j)
        else:
            self._informed.discard(j)

    def _carries_out(self, sim: Simulator, t: TrajState, plan: Any) -> bool:
        """Whether the plan's move of ``t`` off the slot holding its KV is carried out (``_apply``, once per
        move of each adopted plan): the decision core's ``carries_out_move`` under ``moves``."""
        src = sim.slots[t.slot]
        return carries_out_move(self.moves, source_leaving=src.return_by is not None or not src.present,
                                source_decodes=plan.roles.get(src.id, src.role).decodes)

    def _critical(self) -> set[int]:
        """The predicted-critical trajectories (``CRITICAL_SHARE`` of the largest path, among those whose
        prediction is informed: ``INFORMED_SOURCES``), recomputed from ``_cp`` when reset."""
        if self._crit is None:
            cp = self._cp
            inf = self._informed
            self._cp_max = max((v for k, v in cp.items() if k in inf), default=0.0)
            self._crit = critical_set(cp, self.critical_share, inf)
            self._crit_slots_at = -1.0
        return self._crit

    def _critical_slots(self, sim: Simulator, crit: set[int]) -> set[int]:
        """The slots ``crit`` are on now (computed once per instant)."""
        if self._crit_slots_at != sim.now:
            trajs = sim.trajs
            self._crit_slots = {trajs[j].slot for j in crit if trajs[j].slot >= 0}
            self._crit_slots_at = sim.now
        return self._crit_slots

    def choose_slot(self, sim: Simulator, j: int) -> int | None:
        """The plan's slot for j if it takes j now and j's prediction is informed (``follows_plan``), else the
        least-loaded (fewest trajectories, then most free KV) usable slot that does. "Takes j": after admitting j, a headroom of the slot's KV stays free for its
        residents' next turns, and the KV of residents in tool calls counts as held. An engine would evict that
        KV for a new request (``SimConfig.tool_kv`` evictable) and the resident would re-prefill its whole
        context when its tool returns. The headroom depends on whether the latest plan finds the batch bound by
        its bulk (``BULK_HEADROOM``) and on whether the slot hosts a predicted-critical trajectory
        (``CRITICAL_SHARE``; for j that is one, every slot counts as such):

        ==================  ======================  ======================
        batch bound by      slot hosts a critical   other slots
        ==================  ======================  ======================
        critical path       ``critical_headroom``   ``kv_headroom``
        bulk                ``kv_headroom``         ``bulk_headroom``
        ==================  ======================  ======================

        A prompt a resident sibling holds on the slot (``prefix_bonus``) is not needed again. The headroom is
        never more than an empty slot would keep after admitting j (its KV less the watermark and j's need), so
        a long trajectory is never held back by a headroom no slot could give. (The executor's controller applies
        the same rule, the decision core's ``choose_slot``, in ``Controller.admit_waiting``, to a trajectory's
        first turn. Here it also applies to a trajectory queued again after its tool-call KV was evicted; the
        executor routes that one straight back to its placement, whose engine queues what it cannot fit.)"""
        t = sim.trajs[j]
        need = sim.need_new(t)
        crit = self._critical()
        hi, lo = self.headrooms.levels(self._bulk_bound)  # (critical GPUs', the others')
        if j in crit:
            lo, crit_slots = hi, _NO_SLOTS  # a critical trajectory: the critical GPUs' headroom everywhere
        else:
            crit_slots = self._critical_slots(sim, crit)
        if t.preferred >= 0 and follows_plan(j in self._informed):
            s = sim.slots[t.preferred]
            room = s.kv_free - s.watermark + sim.prefix_bonus(s, t) - need
            if (s.present and s.role in DECODING and s.ready_at <= sim.now
                    and room >= required_room(hi if s.idx in crit_slots else lo, s.kv_cap, s.watermark, need)):
                return self._admit(j, s.idx, crit)
        # Hot (every dispatch attempt, over tens of slots): the test above inlined. ``prefix_bonus`` is at
        # most t.share, so most slots are rejected without the group lookup.
        share = t.share
        best = None
        best_n = best_free = 0
        for s in self.candidates(sim):
            room = s.kv_free - s.watermark - need
            # rollplan.policy.dispatch.required_room, inlined (hot): never more than an empty GPU could give.
            hc = (hi if s.idx in crit_slots else lo) * s.kv_cap
            if hc > s.kv_cap - s.watermark - need:
                hc = max(0, s.kv_cap - s.watermark - need)
            if room < hc:
                if room + share < hc:
                    continue
                g = s.groups.get(t.group)
                if g is None or room + min(share, g[1]) < hc:
                    continue
            n, free = s.n_res, s.kv_free
            if best is None or n < best_n or (n == best_n and free > best_free):
                best, best_n, best_free = s.idx, n, free
        return None if best is None else self._admit(j, best, crit)

    def _admit(self, j: int, slot: int, crit: set[int]) -> int:
        if j in crit:
            self._crit_slots.add(slot)  # later admissions this instant see it
        return slot

    def chunk_admission(self, sim: Simulator, j: int) -> tuple[Headrooms, bool, bool, frozenset[int] | set[int]]:
        """A chunk move is held to this policy's own admission (``choose_slot``): its headrooms in the latest
        plan's regime, critical slots and trajectories as for a new admission."""
        crit = self._critical()
        return self.headrooms, j in crit, self._bulk_bound, self._critical_slots(sim, crit)

    def slot_free(self, sim: Simulator, s: SlotState) -> int:
        """The KV of residents in tool calls counts as held (as in ``choose_slot``)."""
        return s.kv_free

    def warm_start(self, history: Sequence[tuple[Any, str]]) -> None:
        """Observe finished trajectories of earlier RL steps (the job ran before the replay window)."""
        for k, (spec, key) in enumerate(history):
            self.predictor.observe(key, f"warm:{k}", Totals(float(sum(spec.decode)), float(sum(spec.prefill[1:])),
                                                           float(sum(spec.tool)), float(len(spec.decode))))
        self.predictor.start_batch(-2)

    def on_traj_done(self, sim: Simulator, j: int) -> None:
        t = sim.trajs[j]
        self.predictor.observe(t.key, t.group, Totals(float(sum(t.dec)), float(sum(t.pf[1:])), float(sum(t.tool)),
                                                      float(t.n)))
        self._cp.pop(j, None)
        self._cp_dec.pop(j, None)
        self._informed.discard(j)
        if self._crit is not None and j in self._crit:
            self._crit = None  # the largest may have gone: recompute


class OracleRollplan(RollplanPolicy):
    """The rollplan policy with perfect length prediction: a reference, not a policy (``ORACLE``).

    Every prediction the policy makes (the dispatch order's paths, the predicted-critical set, the regime, the
    planner's snapshot) is the trajectory's true remaining decode tokens, new prefill tokens, tool seconds and
    turns from its course in the replay, with spreads of 0, so the pessimistic path is the true one. Everything
    else (planner, admission, moves) is the rollplan policy's. Its throughput against rollplan's says how much of
    what is left to the window's ceiling is prediction error (per-sample lengths no predictor can know before a
    sample runs) and how much the schedule would leave even with perfect knowledge. The simulator knows each
    course; the executor does not, so it has no counterpart there."""

    name = ORACLE
    predicts_each_trajectory = True

    def _predict(self, sim: Simulator, j: int, progress: tuple[float, int, float, int] | None = None,
                 pf_done: int | None = None) -> tuple[float, float, float, float, tuple[float, float, float, float]]:
        """j's true remaining (decode, prefill, tool, turns, spreads of 0); also its dispatch-order key (the
        true path at the reference step: ``pessimistic_parts`` with no spread)."""
        t = sim.trajs[j]
        dec, turns, tool, _ctx = progress if progress is not None else sim.progress(t)
        spec = t.spec
        if pf_done is None:
            pf_done = sim.slots[0].perf.spec_prefill(spec)[2][min(turns, t.n - 1)] if turns else 0
        rem = (max(0.0, float(sum(spec.decode)) - dec), max(0.0, float(sum(spec.prefill[1:])) - pf_done),
               max(0.0, float(sum(spec.tool)) - tool), float(max(1, t.n - turns)), (0.0, 0.0, 0.0, 0.0))
        dec_s, tool_s = pessimistic_parts(rem[0], 0.0, rem[2], 0.0, self._a_ref, self.dispatch_z)
        self._cp[j] = dec_s + tool_s
        self._cp_dec[j] = dec_s
        self._informed.add(j)
        return rem

    def _note_source(self, key: str, group: str, j: int) -> None:
        self._informed.add(j)  # every prediction is the truth: informed


class StartedOracleRollplan(OracleRollplan):
    """The rollplan policy told a trajectory's true remaining course once it has started, not before: a
    reference, not a policy (``ORACLE_STARTED``).

    A trajectory has started once it has decoded a token or finished a turn. From then on every prediction of
    it is ``OracleRollplan``'s (the truth, spreads of 0); before, it is the rollplan policy's own. Before a
    sample starts, nothing any system observes tells it from its siblings (the same prompt, the same history,
    the same group statistics), so no policy can order pending siblings by their true lengths; after, a
    predictor can learn from the sample's own progress, and this reference is the limit of what such learning
    can give rollplan's schedule. Its throughput between rollplan's and ``ORACLE``'s splits the oracle's gain
    into the part in-flight knowledge could reach and the part only knowing a sample before it starts gives.
    The simulator only (the executor has no course to reveal)."""

    name = ORACLE_STARTED

    def _predict(self, sim: Simulator, j: int, progress: tuple[float, int, float, int] | None = None,
                 pf_done: int | None = None) -> tuple[float, float, float, float, tuple[float, float, float, float]]:
        """The truth (``OracleRollplan._predict``) once j has started; rollplan's prediction before."""
        t = sim.trajs[j]
        progress = progress if progress is not None else sim.progress(t)
        if progress[0] > 0 or progress[1] > 0:
            return super()._predict(sim, j, progress, pf_done)
        return RollplanPolicy._predict(self, sim, j, progress, pf_done)

    def _note_source(self, key: str, group: str, j: int) -> None:
        """Only a prediction of rollplan's own is noted (its source decides whether j counts as informed);
        ``OracleRollplan._predict`` marks the started ones informed itself."""
        RollplanPolicy._note_source(self, key, group, j)


class ElasticPlus(RollplanPolicy):
    """``elastic-colocated`` with the rollplan policy's prediction and dispatch order, and no planner
    (RLBoost+ / Seer-like: the strongest baseline a team without a planner would run).

    - Resources as ``ElasticColocated``: every present GPU not being returned is MIXED (engines started on
      arrival); a slot under notice or reclaim takes no new work; preemption = recompute.
    - Prediction: the same ``Predictor`` the rollplan policy uses, fed the same way (warm start from the
      history before the window, every finished trajectory observed, group statistics per batch, group
      survival floors from the most advanced sibling); refreshed on every policy invocation (batch start,
      availability change, interval tick) for the pending trajectories, which is at least as often as the
      rollplan policy refreshes its own (on its re-plans).
    - Dispatch: longest pessimistic remaining critical path first (mean + ``DISPATCH_Z`` spreads, as
      ``RollplanPolicy.order``), each to the least-loaded slot that admits it under vLLM's default admission
      (the decision core's ``choose_slot`` with no headroom: the simulator's ``admit_watermark``, no plan
      placement; see ``ElasticPlus.choose_slot``).
    - ``planner`` stays None: ``plan()`` is never called (``last_gap`` / ``last_status`` stay None).
    """

    name = "elastic-plus"

    def __init__(self) -> None:
        super().__init__(kv_headroom=0.0)  # the headrooms are never read: choose_slot is the baselines'

    def attach(self, sim: Simulator) -> None:
        BasePolicy.attach(self, sim)  # no Planner is built

    # Chunk moves (divided rollout) under vLLM's admission, as its new admissions (``choose_slot``).
    chunk_admission = BasePolicy.chunk_admission
    slot_free = BasePolicy.slot_free

    def on_replan(self, sim: Simulator, reason: str) -> None:
        self._new_batch(sim)
        BasePolicy.on_replan(self, sim, reason)

    def decide(self, sim: Simulator, reason: str) -> None:
        for s in sim.slots:
            if s.present and s.role is Role.OFF and s.return_by is None:
                sim.set_role(s.idx, Role.MIXED)
        if sim.batch_active:
            self._refresh(sim)

    def _refresh(self, sim: Simulator) -> None:
        """Predictions of every pending trajectory from the predictor's current state and the group floors
        (as ``RollplanPolicy.snapshot`` computes them), then the dispatch heap rebuilt on them."""
        from rollplan.sim.engine import DONE

        live = [t for t in sim.trajs if t.state != DONE]
        progress = [sim.progress(t) for t in live]
        self._floors = _group_floors(live, progress)
        perf = sim.slots[0].perf
        memo: dict[tuple[Any, ...], float] = {}
        cp = self._cp
        for t, prog in zip(live, progress, strict=True):
            if not t.pseq:  # only the queue's order depends on the predictions
                continue
            done_turns = prog[1]
            pf_done = perf.spec_prefill(t.spec)[2][min(done_turns, t.n - 1)] if done_turns else 0
            point = (t.key, t.group, prog[0], done_turns, prog[2], pf_done)
            hit = memo.get(point)
            if hit is None:
                self._predict(sim, t.idx, prog, pf_done)
                memo[point] = cp[t.idx]
            else:
                cp[t.idx] = hit
                self._note_source(t.key, t.group, t.idx)
        self._rebuild_heap(sim)

    def choose_slot(self, sim: Simulator, j: int) -> int | None:
        """The decision core's rule (``rollplan.policy.dispatch.choose_slot``) with no headroom and vLLM's
        admission: a slot admits j when its KV free for a new request (the watermark kept, the KV of
        residents in tool calls evictable under ``SimConfig.tool_kv`` evictable: ``free_for_new``) and the
        prompt a resident sibling holds cover j's need; of those, the fewest residents, then the most free.
        Inlined (hot); a test checks it against the core."""
        t = sim.trajs[j]
        need = sim.need_new(t)
        best = None
        best_n = best_free = 0
        for s in self.candidates(sim):
            free = sim.free_for_new(s)
            if free + t.share < need or free + sim.prefix_bonus(s, t) < need:
                continue
            n = s.n_res
            if best is None or n < best_n or (n == best_n and free > best_free):
                best, best_n, best_free = s.idx, n, free
        return best


def parse_pd(text: str) -> tuple[int, int]:
    """"P:D" -> (P, D), both >= 1."""
    try:
        p, d = (int(x) for x in text.split(":"))
    except ValueError:
        raise UserInputError(f"bad P:D ratio {text!r}", fix="write it as P:D, e.g. 1:3") from None
    if p < 1 or d < 1:
        raise UserInputError(f"bad P:D ratio {text!r}", fix="use P >= 1 and D >= 1")
    return p, d


def make_policy(name: str, **options: Any) -> BasePolicy:
    """A fresh policy object by name (options: ``pd`` for static-disagg/formula-pd; ``planner`` config,
    ``predictor`` options for rollplan; elastic-plus takes none). Raises ``UnknownNameError``."""
    if name == "static-colocated":
        return StaticColocated()
    if name == "static-disagg":
        return StaticDisagg(options.get("pd", (1, 3)))
    if name == "elastic-colocated":
        return ElasticColocated()
    if name == "formula-pd":
        return FormulaPD(options.get("pd", (1, 3)))
    if name == "elastic-plus":
        return ElasticPlus()
    if name in ("rollplan", *ORACLES):
        cls = {"rollplan": RollplanPolicy, ORACLE: OracleRollplan, ORACLE_STARTED: StartedOracleRollplan}[name]
        return cls(**{k: v for k, v in options.items()
                                 if k in ("backend", "time_limit", "switch_weight", "deterministic", "charge_solve",
                                          "kv_headroom", "bulk_headroom", "critical_headroom", "bulk_share",
                                          "critical_share", "dispatch_z", "path_z", "regime", "moves")})
    raise UnknownNameError("policy", name, POLICY_NAMES)


def parse_policies(text: str) -> tuple[str, ...]:
    """"all" or a comma list of policy names (validated, order kept, duplicates dropped)."""
    if text.strip() == "all":
        return POLICY_NAMES
    out: list[str] = []
    for raw in text.split(","):
        name = raw.strip()
        if not name:
            continue
        if name not in POLICY_NAMES:
            raise UnknownNameError("policy", name, POLICY_NAMES)
        if name not in out:
            out.append(name)
    if not out:
        raise UserInputError("no policy given", fix="pass --policies all or a comma list")
    return tuple(out)


__all__ = [
    "BULK_HEADROOM",
    "BULK_SHARE",
    "CRITICAL_HEADROOM",
    "CRITICAL_SHARE",
    "DISPATCH_Z",
    "KV_HEADROOM",
    "ORACLE",
    "ORACLES",
    "ORACLE_STARTED",
    "POLICY_NAMES",
    "REGIME",
    "REGIMES",
    "BasePolicy",
    "ElasticColocated",
    "ElasticPlus",
    "FormulaPD",
    "OracleRollplan",
    "StartedOracleRollplan",
    "StaticColocated",
    "StaticDisagg",
    "make_policy",
    "parse_pd",
    "parse_policies",
]
