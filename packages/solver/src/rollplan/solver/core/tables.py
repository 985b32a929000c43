"""Per-instance coefficient tables for the searches: per slot type x trajectory, and per slot.

Slots of one type (``InstanceArrays.type_of``) share every perf coefficient, so a (type, trajectory) table
holds each (j, s) price once per type. Every entry is ``pricing``'s formula on the instance's arrays (the
same floats ``evaluate`` computes). Arrays for the vectorised passes, Python lists for the scalar hot loops
(indexing a list is faster than a numpy scalar). Read-only by contract.
"""

from __future__ import annotations

import numpy as np

from rollplan.models.types import Role
from rollplan.solver.core import pricing
from rollplan.solver.core.instance import Instance, InstanceArrays


class Tables:
    """Coefficient tables of one instance (see the module docstring).

    Per type k x trajectory j (``*_a`` arrays and lists of lists): ``occw`` O w, ``cp`` CP at batch 1,
    ``mix`` / ``dec`` the stall e_js on a MIXED / DECODE slot, ``qm`` / ``qd`` Q_js by role, ``fits`` the KV
    fit, ``move_same`` / ``move_cross`` m_js away from home when the home is on / off the slot's node. Per trajectory: ``D``, ``P``, ``ctx``, ``home``. Per slot: ``ptype`` (its type), ``a``, ``c``,
    ``phic`` (phi c), ``mu``, ``mu_p``, ``same``, ``cross``, ``tp``, ``deadline`` (inf when none),
    ``node_id``, ``on_now``.
    """

    def __init__(self, inst: Instance, arrays: InstanceArrays | None = None) -> None:
        x = arrays if arrays is not None else inst.arrays
        self.inst = inst
        self.x = x
        cfg = inst.config
        self.lam = cfg.switch_weight
        self.pen = cfg.deadline_penalty
        self.rsw = cfg.role_switch_seconds
        self.phi = inst.phi
        self.slots = inst.slots
        self.ptype: list[int] = x.type_of.tolist()
        n_types, n_j = len(x.rep), x.D.size
        self.occw_a = np.empty((n_types, n_j))
        self.cp_a = np.empty((n_types, n_j))
        self.qm_a = np.empty((n_types, n_j))
        self.qd_a = np.empty((n_types, n_j))
        self.mix_a = np.empty((n_types, n_j))
        self.dec_a = np.empty((n_types, n_j))
        self.fits_a = np.empty((n_types, n_j), dtype=bool)
        self.move_same_a = np.empty((n_types, n_j))
        self.move_cross_a = np.empty((n_types, n_j))
        for k, r in enumerate(x.rep.tolist()):
            self.occw_a[k] = pricing.occupancy_work(x.D, x.W, x.kbar, x.tau[r], x.kv[r])
            self.cp_a[k] = pricing.critical_path(x.Dq, x.Wq, x.P, x.a[r], x.c[r], x.mu[r])
            self.mix_a[k] = pricing.stall_seconds(x.P, True, x.mu[r], x.cross[r])
            self.dec_a[k] = pricing.stall_seconds(x.P, False, x.mu[r], x.cross[r])
            phic = inst.phi * x.c[r]
            # Q_j by role (``Instance.own_path``): the slot adds phi (c sum D + sum e) once (``slot_time``).
            self.qm_a[k] = pricing.own_path(self.cp_a[k], x.D, self.mix_a[k], phic, inst.phi)
            self.qd_a[k] = pricing.own_path(self.cp_a[k], x.D, self.dec_a[k], phic, inst.phi)
            self.fits_a[k] = x.peak <= x.kv[r]
            # m_js away from home on a slot of type k: the home on the slot's node (same-node link) or not.
            self.move_same_a[k] = pricing.move_seconds(x.ctx, x.same[r], x.mu[r])
            self.move_cross_a[k] = pricing.move_seconds(x.ctx, x.cross[r], x.mu[r])
        self.occw: list[list[float]] = self.occw_a.tolist()
        self.cp: list[list[float]] = self.cp_a.tolist()
        self.qm: list[list[float]] = self.qm_a.tolist()
        self.qd: list[list[float]] = self.qd_a.tolist()
        self.mix: list[list[float]] = self.mix_a.tolist()
        self.dec: list[list[float]] = self.dec_a.tolist()
        self.fits: list[list[bool]] = self.fits_a.tolist()
        self.move_same: list[list[float]] = self.move_same_a.tolist()
        self.move_cross: list[list[float]] = self.move_cross_a.tolist()
        self.D: list[float] = x.D.tolist()
        self.P: list[float] = x.P.tolist()
        self.ctx: list[float] = x.ctx.tolist()
        self.home: list[int] = x.home.tolist()
        self.node_id: list[int] = x.node.tolist()
        self.a: list[float] = x.a.tolist()
        self.c: list[float] = x.c.tolist()
        self.phic: list[float] = (inst.phi * x.c).tolist()
        self.mu: list[float] = x.mu.tolist()
        self.mu_p: list[float] = x.mu_p.tolist()
        self.same: list[float] = x.same.tolist()
        self.cross: list[float] = x.cross.tolist()
        self.tp: list[float] = x.tp.tolist()
        self.deadline: list[float] = x.deadline.tolist()
        self.on_now: list[bool] = (x.cur_code != 0).tolist()

    def move(self, j: int, s: int) -> float:
        """m_js (``Instance.move_seconds``)."""
        h = self.home[j]
        if h < 0 or h == s:
            return 0.0
        k = self.ptype[s]
        return self.move_same[k][j] if self.node_id[h] == self.node_id[s] else self.move_cross[k][j]

    def moves_of(self, jj: np.ndarray, placement: np.ndarray) -> np.ndarray:
        """m_js for trajectories ``jj[i]`` on slots ``placement[i]`` (vectorised ``move``)."""
        x = self.x
        home = x.home[jj]
        away = (home >= 0) & (home != placement)
        h = np.where(home >= 0, home, 0)
        rate = pricing.transfer_rate(x.node[h] == x.node[placement], x.same[placement], x.cross[placement])
        return np.where(away, pricing.move_seconds(x.ctx[jj], rate, x.mu[placement]), 0.0)

    def start(self, s: int, role: Role) -> float:
        """st_s in ``role`` (0 for OFF)."""
        return self.slots[s].start_seconds(role, self.rsw)
