"""Strategy-proofness probe: no job raises its true throughput by misreporting its speeds.

For random instances, every job searches over misreports (random rescalings of its speed vector,
both under- and over-reporting, then a coordinate search from the best one) and we measure its
true normalised throughput under the mechanism. The partial-allocation mechanism must keep every
gain below 1%; the cooperative EF LP, which is not strategy-proof, must fail the same probe.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from gpuplan import api
from gpuplan.models.oef import arrays, equal_share
from gpuplan.solvers.oef import NashWelfare, classes, lp_allocation, partial_allocation
from test_oef import random_doc


def _mechanism(name: str, a, c, nw):
    """Return f(reported V) -> job rows (time fractions) for the mechanism `name`."""
    first = np.unique(c.of_job, return_index=True)[1]

    def run(V_reported: np.ndarray) -> np.ndarray:
        rep = dataclasses.replace(c, V=V_reported[first])
        if name == "pa":
            Y, _ = partial_allocation(rep, nw=nw)
        else:
            ref = (rep.V * equal_share(a)[first]).sum(axis=1)
            Y, _, _ = lp_allocation(rep, fairness=name, si_ref=ref)
        return Y[c.of_job]

    return run


def best_gain(run, V: np.ndarray, i: int, rng: np.random.Generator, tries: int) -> float:
    """Return job i's largest relative gain in true utility over a search of misreports."""
    truth = float(V[i] @ run(V)[i])
    usable = V[i] > 0

    def gain(scale: np.ndarray) -> float:
        R = V.copy()
        R[i] = V[i] * scale
        R[i] /= R[i][usable].min()
        return float(V[i] @ run(R)[i]) / truth - 1

    best_s, best = np.ones(V.shape[1]), 0.0
    for _ in range(tries):
        s = np.exp(rng.uniform(-1.5, 1.5, V.shape[1]))
        g = gain(s)
        if g > best:
            best_s, best = s, g
    for j in np.nonzero(usable)[0]:
        for f in (0.5, 2.0):
            s = best_s.copy()
            s[j] *= f
            g = gain(s)
            if g > best:
                best_s, best = s, g
    return best


def probe(name: str, instances: int, tries: int, seed: int = 0, stop_above: float | None = None) -> float:
    """Return the largest gain any job found over `instances` random 3-job x 3-type instances
    (one GPU of each type, so the jobs compete for the types they are fastest on)."""
    rng = np.random.default_rng(seed)
    worst = 0.0
    for _ in range(instances):
        problem = api.load_problem(random_doc(rng, 3, sizes=(1,), cap=[1, 1, 1]))
        a = arrays(problem)
        c = classes(a)
        if len(c.count) < 3:
            continue
        run = _mechanism(name, a, c, NashWelfare(c) if name == "pa" else None)
        for i in range(3):
            worst = max(worst, best_gain(run, a.V, i, rng, tries))
            if stop_above is not None and worst > stop_above:
                return worst
    return worst


def test_partial_allocation_passes_the_probe() -> None:
    assert probe("pa", instances=8, tries=8) < 0.01


@pytest.mark.slow
def test_partial_allocation_passes_the_probe_at_scale() -> None:
    assert probe("pa", instances=30, tries=15, seed=1) < 0.01


def test_cooperative_ef_lp_fails_the_probe() -> None:
    assert probe("ef", instances=30, tries=10, stop_above=0.01) > 0.01
