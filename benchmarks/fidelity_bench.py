"""Fidelity benchmark: do gpuplan's predictions hold against measured runs? Four sections, one run:

(a) published measured training runs (Megatron-LM configurations on A100/H100 clusters) evaluated in
    Poseidon's time model: predicted vs published throughput per GPU (target within 15% each);
(b) Lagom's collective model: predicted all_reduce bus bandwidth vs published nccl-tests figures for
    8 GPUs in one node and 2-16 nodes, 1 KiB-1 GiB (target within 25% each);
(c) the docs/index.md profile-solve-run path on this machine: 2-, 3- and 4-stage plans of two
    emulated device types, predicted vs measured (target within 15%), with the machine's load;
(d) Poseidon's plan vs the best classic 3D configuration under a time limit on 1,000-3,000 GPUs.

Run: .venv/bin/python benchmarks/fidelity_bench.py [--only a,b,c,d]
Each section lives in its own module beside this file (fidelity_training, fidelity_lagom,
fidelity_run, fidelity_search) and runs alone too.
"""

from __future__ import annotations

import argparse
import importlib
import sys
import time
from pathlib import Path

SECTIONS = {
    "a": ("fidelity_training", "section_a", "(a) published training runs vs Poseidon's time model"),
    "b": ("fidelity_lagom", "section_b", "(b) published nccl-tests all_reduce bus bandwidth vs Lagom's model"),
    "c": ("fidelity_run", "section_c", "(c) profile-solve-run on this machine: predicted vs measured"),
    "d": ("fidelity_search", "section_d", "(d) Poseidon's search vs the best classic 3D configuration at scale"),
}


def main() -> int:
    """Print every selected section; return 0 (a section that fails prints its error and the rest go on)."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", default="a,b,c,d", help="comma-separated sections to run (default: all)")
    args = parser.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    for key in [k.strip() for k in args.only.split(",") if k.strip()]:
        if key not in SECTIONS:
            parser.error(f"--only takes sections from {', '.join(SECTIONS)}, not {key!r}")
        module, fn, title = SECTIONS[key]
        print(f"\n=== {title} ===", flush=True)
        started = time.perf_counter()
        try:
            lines = getattr(importlib.import_module(module), fn)()
        except Exception as exc:  # one broken section must not hide the others
            print(f"section {key} failed: {type(exc).__name__}: {exc}")
            continue
        for line in lines:
            print(line)
        print(f"(section {key}: {time.perf_counter() - started:.1f} s)", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
