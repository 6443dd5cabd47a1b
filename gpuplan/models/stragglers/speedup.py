"""Task-time variability and its speedup functions h(r) (Xu, de Veciana, Lau, Zhou: TPDS 2019, sec. 4.1 of
the research note), Pareto order statistics for cloned jobs (Xu & Lau, arXiv 1406.0609) and Dolly's
straggler probability (Ananthanarayanan et al., NSDI 2013).

Every copy of a task runs at a speed drawn when it starts; a task of nominal size s seconds takes
s * X on a copy, X = 1 / speed the copy's slowdown factor. Two models:

  pareto   X ~ Pareto(x_m, alpha) with x_m = (alpha - 1) / alpha, so E[X] = 1 (a task's nominal size is
           its mean duration). The fastest of r copies is Pareto(x_m, r alpha):
           h(r) = E[X] / E[min of r] = (r alpha - 1) / (r (alpha - 1)).
  uniform  machine speed S ~ U[1 - a, 1 + a] (E[S] = 1), X = 1 / S; h(r) = E[max of r speeds] / E[S]
           = 1 - a + 2 a r / (r + 1).

Pure functions of numbers; no solver, no torch.
"""

from __future__ import annotations

import math
from functools import lru_cache
from typing import Literal

import numpy as np

VariabilityModel = Literal["pareto", "uniform"]

_GRID = 4096  # points of the numerical integrals of the uniform model


class Variability:
    """A task-time variability model: `pareto` with shape `alpha` (> 1) or `uniform` with spread `a` in [0, 1)."""

    __slots__ = ("model", "alpha", "a", "x_m")

    def __init__(self, model: VariabilityModel, alpha: float = 1.5, a: float = 0.5) -> None:
        if model == "pareto":
            if not (math.isfinite(alpha) and alpha > 1):
                raise ValueError(f"pareto alpha {alpha!r}; expected a finite shape > 1 (a finite mean)")
        elif model == "uniform":
            if not (math.isfinite(a) and 0 <= a < 1):
                raise ValueError(f"uniform spread a {a!r}; expected 0 <= a < 1 (speeds in [1-a, 1+a])")
        else:
            raise ValueError(f"variability model {model!r}; expected pareto or uniform")
        self.model, self.alpha, self.a = model, float(alpha), float(a)
        self.x_m = (self.alpha - 1) / self.alpha if model == "pareto" else 0.0

    def __repr__(self) -> str:
        return (f"Variability(pareto, alpha={self.alpha})" if self.model == "pareto"
                else f"Variability(uniform, a={self.a})")

    # -- sampling

    def speeds(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """Return `n` copy speeds (1 / slowdown factor; dimensionless) drawn from the model."""
        if self.model == "pareto":
            u = 1.0 - rng.random(n)  # in (0, 1]
            return 1.0 / (self.x_m * u ** (-1.0 / self.alpha))
        return rng.uniform(1 - self.a, 1 + self.a, n)

    def speed(self, rng: np.random.Generator, at_least_quantile: float = 0.0) -> float:
        """Return one copy speed; with `at_least_quantile` q > 0 the speed is drawn from the model's
        speeds above their q-quantile (a copy placed on a node that is not among the slowest q)."""
        u = float(rng.random())
        u = at_least_quantile + (1 - at_least_quantile) * u  # quantile of the speed, in [q, 1)
        if self.model == "pareto":  # speed quantile u <-> slowdown X quantile 1 - u
            return 1.0 / (self.x_m * max(u, 1e-300) ** (-1.0 / self.alpha))
        return 1 - self.a + 2 * self.a * u

    # -- moments of the slowdown factor X

    def floor(self) -> float:
        """Return the smallest slowdown factor any copy can have (x_m, or 1 / (1 + a)): no task of size s
        finishes in less than s * floor() seconds, however many copies it runs."""
        return self.x_m if self.model == "pareto" else 1.0 / (1 + self.a)

    def mean_factor(self) -> float:
        """Return E[X], the mean slowdown of one copy (1 for pareto; E[1/S] for uniform)."""
        if self.model == "pareto":
            return 1.0
        if self.a == 0:
            return 1.0
        return math.log((1 + self.a) / (1 - self.a)) / (2 * self.a)

    def mean_min_factor(self, r: int) -> float:
        """Return E[min of r slowdown factors]: the mean time (in task sizes) of a task run on r copies."""
        if r < 1:
            raise ValueError(f"copies {r!r}; expected r >= 1")
        if self.model == "pareto":
            ra = r * self.alpha
            return self.x_m * ra / (ra - 1)
        return _uniform_min_factor(self.a, r)

    def h(self, r: int) -> float:
        """Return the speedup function h(r): the rate of progress with r copies (best copy) over one copy's,
        h(1) = 1; non-decreasing and concave. Pareto: (r alpha - 1) / (r (alpha - 1)); uniform:
        1 - a + 2 a r / (r + 1)."""
        if r < 1:
            raise ValueError(f"copies {r!r}; expected r >= 1")
        if self.model == "pareto":
            return (r * self.alpha - 1) / (r * (self.alpha - 1))
        return 1 - self.a + 2 * self.a * r / (r + 1)

    def h_limit(self) -> float:
        """Return sup_r h(r): alpha / (alpha - 1) for pareto, 1 + a for uniform."""
        return self.alpha / (self.alpha - 1) if self.model == "pareto" else 1 + self.a

    def cdf(self, x: float) -> float:
        """Return P(X <= x) for the slowdown factor X of one copy."""
        if self.model == "pareto":
            return 0.0 if x <= self.x_m else 1.0 - (self.x_m / x) ** self.alpha
        if x <= 0:
            return 0.0
        if self.a == 0:
            return 1.0 if x >= 1 else 0.0
        return min(1.0, max(0.0, (1 + self.a - 1.0 / x) / (2 * self.a)))

    def mean_min_with(self, t: float) -> float:
        """Return E[min(t, X)] for a fresh copy's slowdown X (in task sizes; t >= 0): the expected time a
        new copy of a unit task runs beside an old copy that finishes after t."""
        if t <= 0:
            return 0.0
        if self.model == "pareto":
            xm, al = self.x_m, self.alpha
            if t <= xm:
                return t
            return xm + xm ** al * (xm ** (1 - al) - t ** (1 - al)) / (al - 1)
        xs = np.linspace(0.0, t, 257)
        surv = np.array([1.0 - self.cdf(float(x)) for x in xs])
        return float(np.trapezoid(surv, xs)) if hasattr(np, "trapezoid") else float(np.trapz(surv, xs))

    def job_time(self, m: int, r: int) -> float:
        """Return E[T_job(r)] in task sizes: the mean time until all of m unit tasks finish, each on r copies
        (copies of a task killed when its first finishes)."""
        if m < 1:
            raise ValueError(f"tasks {m!r}; expected m >= 1")
        if self.model == "pareto":
            return pareto_job_time(m, r, self.alpha, self.x_m)
        return _uniform_job_time(self.a, m, r)


def pareto_job_time(m: int, r: int, alpha: float, x_m: float = 1.0) -> float:
    """Return E[max over m tasks of min over r copies] of i.i.d. Pareto(x_m, alpha) times (same unit as x_m):
    x_m Gamma(m+1) Gamma(1 - 1/(r alpha)) / Gamma(m+1 - 1/(r alpha))."""
    b = 1.0 / (r * alpha)
    if b >= 1:
        raise ValueError(f"r * alpha = {r * alpha}; expected > 1 (a finite mean)")
    return x_m * math.exp(math.lgamma(m + 1) + math.lgamma(1 - b) - math.lgamma(m + 1 - b))


def pareto_machine_time(r: int, alpha: float, x_m: float = 1.0) -> float:
    """Return the expected machine time per task run on r copies killed when the first finishes (same unit
    as x_m): r * E[min] = r * x_m * r alpha / (r alpha - 1)."""
    ra = r * alpha
    return r * x_m * ra / (ra - 1)


def job_straggler_probability(p: float, copies: int, tasks: int) -> float:
    """Return Dolly's probability that a job of `tasks` tasks, each cloned `copies` times, has a straggler
    when one copy straggles with probability p: 1 - (1 - p^c)^n (a fraction in [0, 1])."""
    return 1.0 - (1.0 - p ** copies) ** tasks


def dolly_copies(p: float, tasks: int, target: float, max_copies: int) -> int:
    """Return the fewest copies c <= max_copies with a job straggler probability at most `target` (max_copies
    when none reaches it)."""
    for c in range(1, max_copies + 1):
        if job_straggler_probability(p, c, tasks) <= target:
            return c
    return max_copies


@lru_cache(maxsize=256)
def _uniform_min_factor(a: float, r: int) -> float:
    """E[1 / max of r U[1-a,1+a] speeds]; the density of the max M is r ((m-1+a)/2a)^(r-1) / 2a."""
    if a == 0:
        return 1.0
    m = np.linspace(1 - a, 1 + a, _GRID)
    dens = r * ((m - 1 + a) / (2 * a)) ** (r - 1) / (2 * a)
    return float(_integrate(dens / m, m))


@lru_cache(maxsize=4096)
def _uniform_job_time(a: float, m: int, r: int) -> float:
    """E[max over m tasks of 1 / max of r speeds]: integral of 1 - F(t)^m, F(t) = 1 - G(1/t)^r."""
    if a == 0:
        return 1.0
    lo, hi = 1 / (1 + a), 1 / (1 - a)
    t = np.linspace(lo, hi, _GRID)
    g = np.clip((1 / t - (1 - a)) / (2 * a), 0.0, 1.0)  # P(S < 1/t)
    F = 1.0 - g ** r
    return float(lo + _integrate(1.0 - F ** m, t))


def _integrate(y: np.ndarray, x: np.ndarray) -> float:
    return float(np.sum((y[1:] + y[:-1]) * np.diff(x)) / 2)


def survival(var: Variability, x: np.ndarray) -> np.ndarray:
    """Return P(X > x) elementwise for the slowdown factor X of one copy (x in task sizes)."""
    x = np.asarray(x, dtype=float)
    if var.model == "pareto":
        return np.where(x <= var.x_m, 1.0, (var.x_m / np.maximum(x, var.x_m)) ** var.alpha)
    if var.a == 0:
        return np.where(x < 1.0, 1.0, 0.0)
    with np.errstate(divide="ignore"):
        inv = np.where(x > 0, 1.0 / np.maximum(x, 1e-300), np.inf)
    return 1.0 - np.clip((1 + var.a - inv) / (2 * var.a), 0.0, 1.0)


_SDA_POINTS = 6000


def sda_expectations(var: Variability, m: int, tau: float, d: int) -> tuple[float, float]:
    """Return (E[T_job], E[machine time per task]) in task sizes for SDA on a job of m unit tasks: one copy
    per task (slowdown X); a task still running at tau (task sizes) is a straggler and gets d fresh copies
    (slowdowns Y_1..Y_d); it ends at the first copy to finish, the others are killed.

    Order statistics: T = X when X <= tau, else tau + min(X - tau, Y_1, .., Y_d), so
    P(T > t) = P(X > t) for t <= tau and P(X > t) P(Y > t - tau)^d after; E[T_job] = int (1 - F_T(t)^m) dt
    (the max over m independent tasks); machine time E[min(X, tau)] + (1 + d) E[(T - tau)^+]. Integrated
    numerically on a geometric grid (the tail beyond tau decays as t^(-alpha (1 + d)), so it converges)."""
    if m < 1 or d < 0 or not (math.isfinite(tau) and tau >= 0):
        raise ValueError(f"SDA m={m!r}, tau={tau!r}, d={d!r}; expected m >= 1, finite tau >= 0, d >= 0")
    lo = max(var.floor(), 1e-6) * 1e-3
    top = max(tau, 1.0) * 1e7
    t = np.concatenate([[0.0], np.geomspace(lo, top, _SDA_POINTS)])
    t = np.union1d(t, [tau])
    sx = survival(var, t)
    late = t > tau
    st = sx.copy()
    st[late] = sx[late] * survival(var, t[late] - tau) ** d
    job = _integrate(1.0 - (1.0 - st) ** m, t)
    before = t <= tau
    machine = _integrate(sx[before], t[before]) + (1 + d) * _integrate(st[t >= tau], t[t >= tau])
    return float(job), float(machine)
