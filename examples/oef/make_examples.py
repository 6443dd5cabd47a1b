"""Write the OEF examples: `gavel-36.yaml` (a larger one-shot problem) and `trace-100.yaml`.

Run from the repository root: `python examples/oef/make_examples.py` (seeded; same files each time).

Job types and their speeds. The relative speeds per GPU type are approximate and follow the
published shape of the measurements behind Gavel (Narayanan et al., OSDI '20, Fig. 1 and its
simulation throughput table): image models run about 10x faster on a V100 than on a K80, language
and GAN models 3-7x, A3C (RL) about 2x, and the recommendation model slightly faster on a P100 than
on a V100. A100 figures scale the V100 ones by NVIDIA's published A100-vs-V100 training speedups
(about 1.1x for A3C, up to about 2.3x for large transformer and CNN training). Absolute steps/s are
set so a K80 step takes 1-3 s; only the ratios and the job lengths in steps matter to the policies.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import yaml

HERE = Path(__file__).resolve().parent

# steps/s on ONE GPU: K80, P100, V100, A100-80GB
SPEEDS = {
    "resnet50": (0.30, 0.99, 3.0, 6.6),
    "resnet18": (1.00, 3.00, 9.5, 16.0),
    "transformer": (0.50, 1.30, 3.25, 7.5),
    "lm-lstm": (0.80, 1.76, 2.9, 5.2),
    "cyclegan": (0.40, 1.08, 2.0, 3.6),
    "a3c": (0.90, 1.44, 1.7, 1.8),
    "recommendation": (2.00, 5.80, 5.2, 8.4),
}
TYPES = ("K80", "P100", "V100", "A100-80GB")
MIX = {"resnet50": 0.18, "resnet18": 0.14, "transformer": 0.18, "lm-lstm": 0.14, "cyclegan": 0.1,
       "a3c": 0.12, "recommendation": 0.14}
SOURCE = ("relative speeds approximate, after Gavel (Narayanan et al., OSDI '20) Fig. 1 and NVIDIA's "
          "A100-vs-V100 training speedups; see examples/oef/make_examples.py")


def job_types(types: tuple[str, ...] = TYPES) -> dict[str, dict[str, float]]:
    return {name: {t: s for t, s in zip(TYPES, speeds) if t in types} for name, speeds in SPEEDS.items()}


def trace(n: int = 100, seed: int = 2) -> dict:
    rng = np.random.default_rng(seed)
    names = list(MIX)
    jobs, t = [], 0.0
    for i in range(n):
        t += rng.exponential(3600 / 8)                         # about 8 arrivals per hour
        kind = names[rng.choice(len(names), p=list(MIX.values()))]
        gpus = int(rng.choice([1, 2, 4, 8], p=[0.7, 0.15, 0.1, 0.05]))
        hours = float(np.exp(rng.uniform(np.log(0.5), np.log(6.0))))   # length if run alone on V100s
        steps = hours * 3600 * SPEEDS[kind][2] * gpus * 0.9 ** np.log2(gpus)
        jobs.append({"name": f"j{i:03d}", "type": kind, "gpus": gpus, "steps": round(float(steps)),
                     "arrival_s": round(t, 1), "tenant": f"user{int(rng.integers(0, 12)):02d}"})
    return {"name": "trace-100", "source": SOURCE,
            "cluster": {"gpus": {"A100-80GB": 4, "V100": 8, "P100": 8, "K80": 16}, "gpus_per_node": 4},
            "round_s": 360, "scaling_efficiency": 0.9, "job_types": job_types(), "jobs": jobs}


def gavel36(seed: int = 5) -> dict:
    rng = np.random.default_rng(seed)
    names = list(MIX)
    tenants = []
    for u in range(12):
        jobs = []
        for k in range(int(rng.integers(2, 6))):
            kind = names[rng.choice(len(names), p=list(MIX.values()))]
            jobs.append({"name": f"{kind}-{k}", "type": kind, "gpus": int(rng.choice([1, 2, 4, 8], p=[0.55, 0.2, 0.15, 0.1]))})
        tenants.append({"name": f"team{u:02d}", "weight": float(rng.choice([1, 1, 1, 2])), "jobs": jobs})
    types = ("K80", "P100", "V100")
    return {"kind": "oef", "name": "gavel-36", "cluster": {"preset": "gavel-36"},
            "job_types": job_types(types), "tenants": tenants, "rounds": 30}


def write(path: Path, doc: dict, header: str) -> None:
    text = yaml.safe_dump(doc, sort_keys=False, default_flow_style=None, width=110)
    path.write_text(header + text)


if __name__ == "__main__":
    note = f"# Written by examples/oef/make_examples.py; {SOURCE.split(';')[0]}.\n"
    write(HERE / "trace-100.yaml", trace(), note + "# 100 jobs arriving over about 12 h on 36 GPUs of 4 types.\n")
    write(HERE / "gavel-36.yaml", gavel36(), note + "# 12 teams share Gavel's 36:36:36 V100/P100/K80 cluster.\n")
