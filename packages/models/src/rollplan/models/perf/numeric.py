"""Small numeric fitting tools (numpy only): NNLS, isotonic regression, and a log-space Levenberg-Marquardt
fit of ``launch + smooth_max(terms)`` forms with positive coefficients. Used by ``rollplan.models.perf.fit``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from numpy.typing import NDArray

Array = NDArray[Any]


def nnls(a: Array, b: Array, *, max_iter: int | None = None) -> Array:
    """Non-negative least squares min ||a x - b|| s.t. x >= 0 (Lawson-Hanson active set)."""
    a = np.asarray(a, dtype=float)
    b = np.asarray(b, dtype=float)
    m, n = a.shape
    # Column scaling keeps the active-set steps well conditioned when features differ by orders of magnitude.
    scale = np.linalg.norm(a, axis=0)
    scale[scale == 0] = 1.0
    a = a / scale
    x = np.zeros(n)
    passive = np.zeros(n, dtype=bool)
    w = a.T @ (b - a @ x)
    tol = 10 * np.finfo(float).eps * np.linalg.norm(a, 1) * max(m, n)
    for _ in range(max_iter or 3 * n + 10):
        if passive.all() or np.max(np.where(passive, -np.inf, w)) <= tol:
            break
        j = int(np.argmax(np.where(passive, -np.inf, w)))
        passive[j] = True
        while True:
            z = np.zeros(n)
            z[passive] = np.linalg.lstsq(a[:, passive], b, rcond=None)[0]
            if np.all(z[passive] > 0):
                x = z
                break
            neg = passive & (z <= 0)
            alpha = np.min(x[neg] / (x[neg] - z[neg]))
            x = x + alpha * (z - x)
            passive &= x > tol
            x[~passive] = 0.0
        w = a.T @ (b - a @ x)
    return x / scale


def relative_nnls(features: Sequence[Array], y: Array) -> Array:
    """NNLS on relative errors: min sum(((X c - y) / y)^2), c >= 0."""
    x = np.column_stack([np.asarray(f, dtype=float) for f in features])
    return nnls(x / y[:, None], np.ones_like(y))


def isotonic(y: Sequence[float]) -> Array:
    """Non-decreasing least-squares fit to ``y`` (pool adjacent violators)."""
    vals: list[float] = []
    counts: list[int] = []
    for v in y:
        vals.append(float(v))
        counts.append(1)
        while len(vals) > 1 and vals[-2] > vals[-1]:
            c = counts[-2] + counts[-1]
            vals[-2] = (vals[-2] * counts[-2] + vals[-1] * counts[-1]) / c
            counts[-2] = c
            vals.pop()
            counts.pop()
    return np.repeat(np.array(vals), counts)


def smooth_max_np(terms: Sequence[Array], p: float) -> Array:
    if p <= 1.0:
        return np.sum(terms, axis=0)
    stack = np.vstack(terms)
    top = np.max(stack, axis=0)
    safe = np.where(top > 0, top, 1.0)
    return np.where(top > 0, safe * np.sum((stack / safe) ** p, axis=0) ** (1.0 / p), 0.0)


def fit_launch_smooth_max(
    terms: Sequence[Sequence[Array]], y: Array, p: float, *, init: Array | None = None, iters: int = 200
) -> tuple[Array, float]:
    """Fit ``y ~ c0 + smooth_max_p(sum_i c_1i x_1i, sum_i c_2i x_2i, ...)`` with every c > 0.

    ``terms[j]`` lists the size features summed inside term j. Minimises the squared log error (close to
    relative error) by Levenberg-Marquardt over log-coefficients. Returns (coefficients [c0, c_11, ...], MAPE).
    """
    feats = [np.asarray(x, dtype=float) for term in terms for x in term]
    sizes = [len(term) for term in terms]
    logy = np.log(y)

    def predict(theta: Array) -> Array:
        c = np.exp(np.clip(theta, -700, 700))
        out, i = [], 1
        for size in sizes:
            out.append(sum(c[i + j] * feats[i - 1 + j] for j in range(size)))
            i += size
        return c[0] + smooth_max_np(out, p)

    if init is None:
        med = float(np.median(y))
        init = np.log(np.array([0.2 * med] + [med / max(float(np.median(f)), 1e-300) for f in feats]))
    theta = np.array(init, dtype=float)
    r = np.log(predict(theta)) - logy
    cost = float(r @ r)
    lam = 1e-2
    for _ in range(iters):
        jac = np.empty((len(y), len(theta)))
        for i in range(len(theta)):
            d = np.zeros_like(theta)
            d[i] = 1e-6
            jac[:, i] = (np.log(predict(theta + d)) - logy - r) / 1e-6
        a = jac.T @ jac
        g = jac.T @ r
        try:
            step = np.linalg.solve(a + lam * np.diag(np.diag(a) + 1e-12), -g)
        except np.linalg.LinAlgError:
            lam *= 10
            continue
        new = theta + step
        nr = np.log(predict(new)) - logy
        nc = float(nr @ nr)
        if nc < cost:
            improved = cost - nc
            theta, r, cost = new, nr, nc
            lam = max(lam / 3, 1e-12)
            if improved < 1e-12 * max(cost, 1e-30):
                break
        else:
            lam *= 4
            if lam > 1e12:
                break
    pred = predict(theta)
    return np.exp(theta), float(np.mean(np.abs(pred - y) / y))


def mape(pred: Sequence[float] | Array, ref: Sequence[float] | Array) -> float:
    """Mean absolute percentage error as a fraction (0.05 = 5%)."""
    p = np.asarray(pred, dtype=float)
    r = np.asarray(ref, dtype=float)
    return float(np.mean(np.abs(p - r) / r)) if len(r) else float("nan")
