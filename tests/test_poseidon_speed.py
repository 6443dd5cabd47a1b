"""Poseidon's search speed-ups keep it exact: the compiled DAG walk and the batched path bounds give the
same numbers to the last bit, the combo and type-order bounds are lower bounds of every layer mapping,
the pruned search equals the unpruned one, and the listing of the space reads the clock."""

from __future__ import annotations

import itertools
import math
import random

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from gpuplan import api
from gpuplan.models import poseidon as P
from gpuplan.models.poseidon import dag as D
from gpuplan.models.plan import Status
from gpuplan.models.workload import model_config, scaled
from gpuplan.registry import no_progress
from gpuplan.solvers import poseidon as SP
from gpuplan.solvers.poseidon.bounds import list_combos

TYPES = ["A100-80GB", "V100", "T4", "L4", "H100"]


def small(types: dict[str, int], layers: int = 8, batch: int = 16, per_node: int = 2, model: str = "gpt3-350m",
          **extra: object) -> P.PoseidonProblem:
    cfg = scaled(model_config(model), num_layers=layers)
    doc = {"kind": "poseidon", "cluster": {"gpus": types, "gpus_per_node": per_node,
                                           "inter_node": {"bandwidth_GBps": "50 Gbps"}},
           "model": cfg.model_dump(), "global_batch": batch, "seq_len": 1024, "max_stages": 4,
           "max_microbatches": 8, **extra}
    return api.load_problem(doc, "poseidon")  # type: ignore[return-value]


def placed_structures(prob: P.PoseidonProblem):  # type: ignore[no-untyped-def]
    """Yield (placed, order, v, structure) for every structure of a small problem's space: the
    `_PlacedW1` test of its combo before building, the type order and interleave it places, and the
    structure built from them."""
    cm = P.CostModel(prob)
    for m, used in SP.combos(prob, None, SP.type_options(prob)):
        vs = [1] + SP.interleaves(prob, sum(o.stages for o in used), m)
        placed = SP._PlacedW1(cm, m, used)
        for i, order in enumerate(itertools.permutations(range(len(used)))):
            for j, v in enumerate(vs):
                yield placed, order, v, SP._structure_at(prob, cm, (m, used), i * len(vs) + j)


# ---- the compiled DAG walk ---------------------------------------------------------------------

@settings(max_examples=60, deadline=None)
@given(S=st.integers(1, 6), v=st.sampled_from([1, 1, 2, 3]), k=st.integers(1, 3), gpipe=st.booleans(),
       seed=st.integers(0, 10**6))
def test_the_compiled_walk_equals_the_loop_to_the_last_bit(S: int, v: int, k: int, gpipe: bool, seed: int) -> None:
    v = v if S > 1 else 1
    m = S * k if v > 1 else k + S - 1
    schedule = "gpipe" if gpipe and v == 1 else "1f1b"
    rnd = random.Random(seed)
    V = S * v
    fwd, bwd = [rnd.random() for _ in range(V)], [rnd.random() for _ in range(V)]
    p2p, tail = [rnd.random() * rnd.randint(0, 1) for _ in range(V - 1)], [rnd.random() for _ in range(S)]
    walk = D._compiled_walk(schedule, S, m, v)
    loop = D.iteration_time_fast(fwd, bwd, p2p, tail, m, schedule, [], v)  # `record` takes the loop
    assert walk(fwd, bwd, p2p, tail) == loop
    g = D.build_dag(fwd, bwd, p2p, tail, m, schedule, v)
    assert loop == pytest.approx(D.dag_longest_path_s(g), rel=1e-12)


def test_a_shape_is_compiled_after_it_has_been_walked_often() -> None:
    S, m = 3, 7
    key = ("1f1b", S, m, 1)
    D._WALKS.pop(key, None)
    D._WALK_CALLS.pop(key, None)
    args = ([0.1] * S, [0.2] * S, [0.01] * (S - 1), [0.3] * S, m)
    first = D.iteration_time_fast(*args)
    assert key not in D._WALKS  # the loop walked it
    for _ in range(D.COMPILE_AFTER):
        assert D.iteration_time_fast(*args) == first
    assert D._WALKS[key]


# ---- the batched path bounds -------------------------------------------------------------------

def test_batched_cut_bounds_equal_the_single_ones_to_the_last_bit() -> None:
    prob = small({"A100-80GB": 4, "V100": 4, "T4": 2}, layers=12, per_node=2)
    cm = P.CostModel(prob)
    rnd = random.Random(3)
    checked = 0
    for s in SP.structures(prob, cm, interleaved=True):
        if not s.feasible() or s.S < 2:
            continue
        L = prob.model.num_layers
        rows = []
        for _ in range(SP.CUT_BATCH_MIN + 5):
            n = [s.v] * s.S
            for _ in range((L - s.S * s.v) // s.v):
                n[rnd.randrange(s.S)] += s.v
            rows.append(n)
        assert s.cut_bounds(rows) == [s.cut_bound(n) for n in rows]
        checked += 1
    assert checked > 20


# ---- the combo and type-order bounds -------------------------------------------------------------

@settings(max_examples=10, deadline=None)
@given(types=st.lists(st.sampled_from(TYPES), min_size=1, max_size=3, unique=True),
       counts=st.lists(st.sampled_from([2, 4]), min_size=3, max_size=3), layers=st.integers(4, 9),
       batch=st.sampled_from([8, 16]), model=st.sampled_from(["gpt3-350m", "gpt3-1.3b", "llama2-7b"]),
       schedule=st.sampled_from(["1f1b", "gpipe"]))
def test_combo_and_order_bounds_are_below_every_layer_mapping(types, counts, layers, batch, model,
                                                               schedule) -> None:
    prob = small(dict(zip(types, counts)), layers=layers, batch=batch, model=model, schedule=schedule)
    cm = P.CostModel(prob)
    table = list_combos(prob, cm, SP.type_options(prob), None, math.inf)
    assert table.structures == SP.count_structures(prob) and not table.cut
    listed = 0
    for e in table.entries:
        S = sum(o.stages for o in e.used)
        vs = [1] + SP.interleaves(prob, S, e.m)
        for i, order in enumerate(itertools.permutations(range(len(e.used)))):
            for j, v in enumerate(vs):
                s = SP._structure_at(prob, cm, (e.m, e.used), i * len(vs) + j)
                exact, _ = SP.all_cuts_map(s, SP.Stats()) if s.feasible() else (math.inf, [])
                ob = e.order_bound(order, v)
                assert e.bound <= ob * (1 + 1e-12) or ob == math.inf
                assert ob <= exact * (1 + 1e-12), (e.m, [o.device_type for o in e.used], order, v, ob, exact)
                listed += 1
    # what the bound calls infeasible is: no structure of those combos fits
    assert listed + table.infeasible == table.structures


EXHAUSTIVE_MAX = 4_000  # structures: the unpruned reference takes about 4 ms each (four-type spaces: test_poseidon_search_bounds)


@settings(max_examples=10, deadline=None)
@given(types=st.lists(st.sampled_from(TYPES), min_size=2, max_size=4, unique=True),
       counts=st.lists(st.sampled_from([2, 4]), min_size=4, max_size=4), layers=st.integers(4, 12),
       batch=st.sampled_from([8, 16, 24]), per_node=st.sampled_from([2, 4]),
       model=st.sampled_from(["gpt3-350m", "gpt3-1.3b", "llama2-7b"]),
       schedule=st.sampled_from(["1f1b", "1f1b", "gpipe"]))
def test_the_pruned_search_equals_the_unpruned_one(types, counts, layers, batch, per_node, model, schedule) -> None:
    prob = small(dict(zip(types, counts)), layers=layers, batch=batch, per_node=per_node, model=model,
                 schedule=schedule, max_stages=5)
    assume(SP.count_structures(prob) <= EXHAUSTIVE_MAX)  # the unpruned reference evaluates every structure
    try:
        full = SP.solve_poseidon(prob, progress=no_progress, prune=False, workers=1)
    except Exception as exc:  # nothing fits: the pruned search says the same
        with pytest.raises(type(exc)):
            SP.solve_poseidon(prob, progress=no_progress, workers=1)
        return
    pruned = SP.solve_poseidon(prob, progress=no_progress, workers=1)
    assert pruned.status is Status.OPTIMAL and full.status is Status.OPTIMAL
    assert pruned.iteration_time_s == pytest.approx(full.iteration_time_s, rel=1e-12)
    assert api.check(prob, pruned) == []
    s = pruned.solver.stats
    assert s["evaluated"] + s["pruned"] + s["infeasible"] + s["unvisited"] == s["structures"]
    assert s["structures"] == full.solver.stats["structures"] == SP.count_structures(prob)
    assert s["evaluated"] <= full.solver.stats["evaluated"]


# ---- the clock -----------------------------------------------------------------------------------

def test_listing_the_space_stops_at_a_passed_deadline() -> None:
    prob = small({"A100-80GB": 4, "V100": 4, "T4": 4}, layers=8)
    cm = P.CostModel(prob)
    table = list_combos(prob, cm, SP.type_options(prob), None, math.inf, deadline=0.0)
    assert table.cut and table.entries == []
    plan = SP.solve_poseidon(prob, progress=no_progress, time_limit_s=1e-9, workers=1)
    s = plan.solver.stats
    assert plan.status is Status.TIME_LIMIT and api.check(prob, plan) == []
    assert s["evaluated"] + s["pruned"] + s["infeasible"] + s["unvisited"] == s["structures"]
