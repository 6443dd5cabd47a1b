"""Built-in catalog of GPU types: published memory, memory bandwidth, dense peak FLOP/s per dtype.

Figures are the vendors' datasheet numbers for dense math (no 2:4 sparsity), per GPU (a K80
board holds two GK210 GPUs; a catalog K80 is one of them, as cluster schedulers count it).
`intra_node_GBps` is the per-GPU unidirectional bandwidth to peers in the same node (NVLink
where the usual server has it, PCIe otherwise).
"""

from __future__ import annotations

from gpuplan.units import GiB

# name: (memory GiB, memory GB/s, {dtype: dense TFLOP/s}, intra-node GB/s per direction, $/h)
_SPECS: dict[str, tuple[float, float, dict[str, float], float, float | None]] = {
    "K80": (12, 240, {"fp32": 4.37 / 2, "fp16": 4.37 / 2}, 8, 0.45),
    "P100": (16, 732, {"fp32": 10.6, "fp16": 21.2}, 80, 1.46),
    "V100": (16, 900, {"fp32": 15.7, "fp16": 125.0}, 150, 2.48),
    "V100-32GB": (32, 900, {"fp32": 15.7, "fp16": 125.0}, 150, 2.48),
    "T4": (16, 320, {"fp32": 8.1, "fp16": 65.0}, 16, 0.35),
    "A10": (24, 600, {"fp32": 31.2, "tf32": 62.5, "fp16": 125.0, "bf16": 125.0}, 32, 0.75),
    "L4": (24, 300, {"fp32": 30.3, "tf32": 60.0, "fp16": 121.0, "bf16": 121.0, "fp8": 242.0}, 32, 0.70),
    "RTX4090": (24, 1008, {"fp32": 82.6, "fp16": 165.2, "bf16": 165.2, "fp8": 330.3}, 32, 0.40),
    "L40S": (48, 864, {"fp32": 91.6, "tf32": 183.0, "fp16": 362.0, "bf16": 362.0, "fp8": 733.0}, 32, 1.20),
    "A100-40GB": (40, 1555, {"fp32": 19.5, "tf32": 156.0, "fp16": 312.0, "bf16": 312.0}, 300, 1.80),
    "A100-80GB": (80, 2039, {"fp32": 19.5, "tf32": 156.0, "fp16": 312.0, "bf16": 312.0}, 300, 2.20),
    "H100": (80, 3350, {"fp32": 67.0, "tf32": 494.7, "fp16": 989.4, "bf16": 989.4, "fp8": 1978.9}, 450, 3.50),
    "H100-PCIe": (80, 2000, {"fp32": 51.2, "tf32": 378.0, "fp16": 756.0, "bf16": 756.0, "fp8": 1513.0}, 64, 2.80),
    "H200": (141, 4800, {"fp32": 67.0, "tf32": 494.7, "fp16": 989.4, "bf16": 989.4, "fp8": 1978.9}, 450, 4.00),
}

ALIASES: dict[str, str] = {
    "A100": "A100-80GB", "A100-40G": "A100-40GB", "A100-80G": "A100-80GB", "A100_40GB": "A100-40GB",
    "A100_80GB": "A100-80GB", "V100-16GB": "V100", "V100_32GB": "V100-32GB", "RTX-4090": "RTX4090",
    "4090": "RTX4090", "H100-SXM": "H100", "H100-80GB": "H100", "H200-SXM": "H200", "GH200": "H200",
}


def catalog_entry(name: str) -> dict[str, object] | None:
    """Return the catalog fields of GPU type `name` (case-insensitive, aliases allowed), or None."""
    key = canonical_name(name)
    if key is None:
        return None
    mem, bw, peak, link, price = _SPECS[key]
    return {"name": key, "memory_bytes": mem * GiB, "memory_bandwidth_GBps": float(bw),
            "peak_tflops": dict(peak), "intra_node_GBps": float(link), "price_per_hour": price}


def canonical_name(name: str) -> str | None:
    """Return the catalog's spelling of a GPU type name, or None when it is not in the catalog."""
    upper = {k.upper(): k for k in _SPECS}
    alias = {k.upper(): v for k, v in ALIASES.items()}
    n = name.strip().upper()
    return upper.get(n) or alias.get(n)


def catalog_names() -> list[str]:
    """Return every GPU type name of the catalog, in catalog order."""
    return list(_SPECS)
