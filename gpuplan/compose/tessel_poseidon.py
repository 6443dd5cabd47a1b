"""A Tessel problem from a Poseidon plan: its pipeline stages become a 1F1B-shaped placement.

Works on the plan document (plain data), so it needs nothing from Poseidon's code. Each Poseidon
stage (a group of tp x dp GPUs acting as one) is one Tessel device; its forward block lasts the
stage's forward_s plus the time to send activations on (p2p_s), its backward block backward_s plus
the time to send gradients back. Memory is counted in micro-batches in flight: a forward keeps one,
its backward frees it, and each stage may hold what Poseidon's own schedule holds there (1F1B: S - s
for stage s of S), so any Tessel schedule fits the memory Poseidon checked.
"""

from __future__ import annotations

from typing import Any

from gpuplan.errors import InputError
from gpuplan.models.base import validate
from gpuplan.models.tessel import TesselProblem


def problem_from_poseidon(plan: dict[str, Any], *, microbatches: int | None = None,
                          file: str | None = None) -> TesselProblem:
    """Return the Tessel problem of a Poseidon plan document (seconds; memory in micro-batches)."""
    stages = plan.get("stages") or []
    if plan.get("kind") != "poseidon" or not stages or plan.get("status") == "infeasible":
        raise InputError.at(file, "stages", plan.get("kind"), "a feasible Poseidon plan with stages")
    n = len(stages)
    m = int(microbatches or plan.get("num_microbatches") or 1)
    blocks: list[dict[str, Any]] = []
    for s, st in enumerate(stages):
        blocks.append({"name": f"F{s}", "kind": "forward", "devices": [s], "stage": s, "memory_bytes": 1,
                       "duration_s": max(1e-9, float(st.get("forward_s", 0.0)) + float(st.get("p2p_s", 0.0))
                                         * (s < n - 1)),
                       "after": [f"F{s - 1}"] if s else []})
    for s in reversed(range(n)):
        st = stages[s]
        send_back = float(stages[s - 1].get("p2p_s", 0.0)) if s > 0 else 0.0
        blocks.append({"name": f"B{s}", "kind": "backward", "devices": [s], "stage": s, "memory_bytes": -1,
                       "duration_s": max(1e-9, float(st.get("backward_s", 0.0)) + send_back),
                       "after": [f"B{s + 1}"] if s < n - 1 else [f"F{n - 1}"]})
    doc = {"kind": "tessel", "name": f"from poseidon plan ({n} stages)", "devices": n, "microbatches": m,
           "blocks": blocks, "memory_limit_bytes": [float(min(m, n - s)) for s in range(n)]}
    return validate(TesselProblem, doc, file=file)
