"""Built-in catalog of GPU types: published memory, memory bandwidth, dense peak FLOP/s per dtype.

Figures are the vendors' datasheet numbers for dense math (no 2:4 sparsity), per GPU (a K80
board holds two GK210 GPUs; a catalog K80 is one of them, as cluster schedulers count it).
A dtype a GPU has no tensor cores (or no native arithmetic) for is listed at the rate it really
runs at: bf16 on Kepler, Pascal, Volta and Turing is computed in fp32 units, so it gets the fp32
rate; fp16 on Kepler likewise.
`intra_node_GBps` is the per-GPU unidirectional line rate to peers in the same node (NVLink
links x 25 GB/s, 50 GB/s from NVLink 5 (Blackwell), where the usual server has NVLink, PCIe
otherwise); `nvlinks` is the number of NVLink links per GPU (0: PCIe only); `arch` is the GPU
architecture (NCCL tunes per architecture). `catalog_chip` gives each type's streaming
multiprocessors and L2 cache (the GEMM tile model and Lagom's contention model read them).
"""

from __future__ import annotations

from functools import lru_cache

from gpuplan.units import GiB

# name: (memory GiB, memory GB/s, {dtype: dense TFLOP/s}, intra-node GB/s per direction, $/h, arch, NVLinks)
_SPECS: dict[str, tuple[float, float, dict[str, float], float, float | None, str, int]] = {
    # Tesla K80 datasheet: 8.73 TFLOP/s fp32 at boost, 24 GB, 480 GB/s per board of two GK210 dies;
    # one die: 4.37 TFLOP/s, 12 GB, 240 GB/s. No fp16/bf16 arithmetic: they run at the fp32 rate. PCIe 3.0 x16.
    "K80": (12, 240, {"fp32": 4.37, "fp16": 4.37, "bf16": 4.37}, 8, 0.45, "kepler", 0),
    # Tesla P100 SXM2 datasheet: 10.6 fp32, 21.2 fp16 (packed half2, no tensor cores), 16 GB HBM2
    # 732 GB/s, NVLink 1.0 4 links x 20 GB/s per direction. No bf16 support: fp32 rate.
    "P100": (16, 732, {"fp32": 10.6, "fp16": 21.2, "bf16": 10.6}, 80, 1.46, "pascal", 4),
    # Tesla V100 SXM2 datasheet: 15.7 fp32, 125 fp16 tensor, 900 GB/s, NVLink 2.0 6 links x 25 GB/s.
    # Volta tensor cores have no bf16 mode: bf16 runs at the fp32 rate.
    "V100": (16, 900, {"fp32": 15.7, "fp16": 125.0, "bf16": 15.7}, 150, 2.48, "volta", 6),
    "V100-32GB": (32, 900, {"fp32": 15.7, "fp16": 125.0, "bf16": 15.7}, 150, 2.48, "volta", 6),
    # Tesla T4 datasheet: 8.1 fp32, 65 fp16 tensor, 320 GB/s, PCIe 3.0 x16. Turing has no bf16: fp32 rate.
    "T4": (16, 320, {"fp32": 8.1, "fp16": 65.0, "bf16": 8.1}, 16, 0.35, "turing", 0),
    # A10 datasheet: 31.2 fp32, 62.5 tf32, 125 fp16/bf16 tensor, 600 GB/s, PCIe 4.0 x16.
    "A10": (24, 600, {"fp32": 31.2, "tf32": 62.5, "fp16": 125.0, "bf16": 125.0}, 32, 0.75, "ampere", 0),
    # L4 datasheet (dense = half the sparse figures): 30.3 fp32, 60 tf32, 121 fp16/bf16, 242 fp8, 300 GB/s.
    "L4": (24, 300, {"fp32": 30.3, "tf32": 60.0, "fp16": 121.0, "bf16": 121.0, "fp8": 242.0}, 32, 0.70, "ada", 0),
    # RTX 4090 (Ada whitepaper, dense): 82.6 fp32; fp16/bf16 tensor with fp32 accumulate (as training
    # runs) 165.2, fp8 with fp32 accumulate 330.3; 1008 GB/s, PCIe 4.0.
    "RTX4090": (24, 1008, {"fp32": 82.6, "fp16": 165.2, "bf16": 165.2, "fp8": 330.3}, 32, 0.40, "ada", 0),
    # L40S datasheet (dense): 91.6 fp32, 183 tf32, 362 fp16/bf16, 733 fp8, 864 GB/s, PCIe 4.0.
    "L40S": (48, 864, {"fp32": 91.6, "tf32": 183.0, "fp16": 362.0, "bf16": 362.0, "fp8": 733.0}, 32, 1.20,
             "ada", 0),
    # A100 SXM datasheet: 19.5 fp32, 156 tf32, 312 fp16/bf16; 40 GB 1555 GB/s, 80 GB 2039 GB/s;
    # NVLink 3.0 12 links x 25 GB/s = 300 GB/s per direction.
    "A100-40GB": (40, 1555, {"fp32": 19.5, "tf32": 156.0, "fp16": 312.0, "bf16": 312.0}, 300, 1.80, "ampere", 12),
    "A100-80GB": (80, 2039, {"fp32": 19.5, "tf32": 156.0, "fp16": 312.0, "bf16": 312.0}, 300, 2.20, "ampere", 12),
    # H100 SXM5 datasheet (dense): 67 fp32, 494.7 tf32, 989.4 fp16/bf16, 1978.9 fp8, 3.35 TB/s;
    # NVLink 4.0 18 links x 25 GB/s = 450 GB/s per direction.
    "H100": (80, 3350, {"fp32": 67.0, "tf32": 494.7, "fp16": 989.4, "bf16": 989.4, "fp8": 1978.9}, 450, 3.50,
             "hopper", 18),
    # H100 PCIe datasheet (dense): 51.2 fp32, 378 tf32, 756 fp16/bf16, 1513 fp8, 2.0 TB/s, PCIe 5.0 x16.
    "H100-PCIe": (80, 2000, {"fp32": 51.2, "tf32": 378.0, "fp16": 756.0, "bf16": 756.0, "fp8": 1513.0}, 64, 2.80,
                  "hopper", 0),
    # H200 SXM datasheet: H100's compute, 141 GB HBM3e at 4.8 TB/s, NVLink 450 GB/s per direction.
    "H200": (141, 4800, {"fp32": 67.0, "tf32": 494.7, "fp16": 989.4, "bf16": 989.4, "fp8": 1978.9}, 450, 4.00,
             "hopper", 18),
    # GH200 Grace Hopper datasheet (96 GB HBM3 version): H100's compute, 4.0 TB/s; NVLink 900 GB/s
    # bidirectional to other GPUs (450 per direction).
    "GH200": (96, 4000, {"fp32": 67.0, "tf32": 494.7, "fp16": 989.4, "bf16": 989.4, "fp8": 1978.9}, 450, None,
              "hopper", 18),
    # Blackwell, dense figures (half the datasheets' sparse ones), per GPU. B200 (DGX B200 datasheet: 8 GPUs,
    # 1,440 GB HBM3e at 64 TB/s, fp8 72 PFLOP/s sparse): 180 GB, 8 TB/s, 80 fp32, 1125 tf32, 2250
    # fp16/bf16, 4500 fp8; NVLink 5: 18 links x 50 GB/s = 900 GB/s per direction (1.8 TB/s per GPU).
    "B200": (180, 8000, {"fp32": 80.0, "tf32": 1125.0, "fp16": 2250.0, "bf16": 2250.0, "fp8": 4500.0}, 900, None,
             "blackwell", 18),
    # B300 (Blackwell Ultra; DGX B300 datasheet): B200's dense fp16/bf16/fp8 rates, 288 GB HBM3e at 8 TB/s.
    "B300": (288, 8000, {"fp32": 80.0, "tf32": 1125.0, "fp16": 2250.0, "bf16": 2250.0, "fp8": 4500.0}, 900, None,
             "blackwell", 18),
    # GB200 (GB200 NVL72 specifications, per Blackwell GPU of the superchip): 2500 fp16/bf16, 5000 fp8,
    # 1250 tf32, 186 GB HBM3e at 8 TB/s; NVLink 5 to all 72 GPUs of the rack, 900 GB/s per direction.
    "GB200": (186, 8000, {"fp32": 80.0, "tf32": 1250.0, "fp16": 2500.0, "bf16": 2500.0, "fp8": 5000.0}, 900,
              None, "blackwell", 18),
    # GB300 (GB300 NVL72 specifications): GB200's dense fp16/bf16/fp8 rates, 288 GB HBM3e at 8 TB/s.
    "GB300": (288, 8000, {"fp32": 80.0, "tf32": 1250.0, "fp16": 2500.0, "bf16": 2500.0, "fp8": 5000.0}, 900,
              None, "blackwell", 18),
}

# Streaming multiprocessors and L2 bytes per type (vendor whitepapers / datasheets; Blackwell: 148 SMs,
# what a B200 reports as its multiprocessor count (NVIDIA's datasheets do not state it; taken for every
# Blackwell type here), 126 MB L2 (GB200's, per GPU)).
_CHIP: dict[str, tuple[int, int]] = {
    "K80": (13, int(1.5 * 2**20)),       # one GK210 die: 13 SMX, 1.5 MiB L2
    "P100": (56, 4 * 2**20), "V100": (80, 6 * 2**20), "V100-32GB": (80, 6 * 2**20), "T4": (40, 4 * 2**20),
    "A10": (72, 6 * 2**20), "L4": (58, 48 * 2**20), "RTX4090": (128, 72 * 2**20), "L40S": (142, 96 * 2**20),
    "A100-40GB": (108, 40 * 2**20), "A100-80GB": (108, 40 * 2**20), "H100": (132, 50 * 2**20),
    "H100-PCIe": (114, 50 * 2**20), "H200": (132, 50 * 2**20),
    "GH200": (132, 50 * 2**20),          # the H100 SXM configuration of GH100
    "B200": (148, 126 * 10**6), "B300": (148, 126 * 10**6), "GB200": (148, 126 * 10**6),
    "GB300": (148, 126 * 10**6),
}

ALIASES: dict[str, str] = {
    "A100": "A100-80GB", "A100-40G": "A100-40GB", "A100-80G": "A100-80GB", "A100_40GB": "A100-40GB",
    "A100_80GB": "A100-80GB", "V100-16GB": "V100", "V100_32GB": "V100-32GB", "RTX-4090": "RTX4090",
    "4090": "RTX4090", "H100-SXM": "H100", "H100-80GB": "H100", "H200-SXM": "H200", "GH200-96GB": "GH200",
    "B200-SXM": "B200", "HGX-B200": "B200", "B300-SXM": "B300", "HGX-B300": "B300",
}

_UPPER: dict[str, str] = {k.upper(): k for k in _SPECS}
_ALIAS_UPPER: dict[str, str] = {k.upper(): v for k, v in ALIASES.items()}


def catalog_entry(name: str) -> dict[str, object] | None:
    """Return the catalog fields of GPU type `name` (case-insensitive, aliases allowed), or None."""
    key = canonical_name(name)
    if key is None:
        return None
    mem, bw, peak, link, price, arch, nvlinks = _SPECS[key]
    return {"name": key, "memory_bytes": mem * GiB, "memory_bandwidth_GBps": float(bw),
            "peak_tflops": dict(peak), "intra_node_GBps": float(link), "price_per_hour": price,
            "arch": arch, "nvlinks": nvlinks}


@lru_cache(maxsize=4096)
def canonical_name(name: str) -> str | None:
    """Return the catalog's spelling of a GPU type name, or None when it is not in the catalog."""
    n = name.strip().upper()
    return _UPPER.get(n) or _ALIAS_UPPER.get(n)


def catalog_chip(name: str) -> tuple[int, int] | None:
    """Return (streaming multiprocessors, L2 bytes) of catalog GPU type `name` (aliases allowed), or
    None when it is not in the catalog."""
    key = canonical_name(name)
    return _CHIP[key] if key is not None else None


def catalog_names() -> list[str]:
    """Return every GPU type name of the catalog, in catalog order."""
    return list(_SPECS)
