"""Memory capacity, on-device copy bandwidth, and pinned host-to-device / device-to-host bandwidth.

Copy bandwidth counts the bytes read plus the bytes written (2 x size, as STREAM's copy and the
datasheets' memory bandwidth do); a host transfer counts the bytes moved once.
"""

from __future__ import annotations

import os
from typing import Any

from gpuplan.models.profile import Spread
from gpuplan.profiling.timing import clock_for, measure

MiB = 1 << 20


def capacity_bytes(device: Any) -> int:
    """Return the memory of `device` in bytes: the CUDA device's total memory, or the host's RAM."""
    if str(device).startswith("cuda"):
        import torch

        return int(torch.cuda.get_device_properties(device).total_memory)
    return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))


def copy_bandwidth(device: Any, size_bytes: int = 64 * MiB, *, repeats: int = 5) -> tuple[float, Spread]:
    """Return (GB/s, timing) of copying `size_bytes` within the memory of `device` (read + write)."""
    import torch

    n = size_bytes // 4
    src = torch.ones(n, dtype=torch.float32, device=device)
    dst = torch.empty_like(src)
    timing = measure(lambda: dst.copy_(src), device=device, warmup=2, repeats=repeats, clock=clock_for(device))
    return 2.0 * n * 4 / timing.median_s / 1e9, timing


def host_transfer_bandwidth(device: Any, direction: str, size_bytes: int = 256 * MiB, *,
                            repeats: int = 5) -> tuple[float, Spread]:
    """Return (GB/s, timing) of moving `size_bytes` between pinned host memory and a CUDA device.

    `direction` is "h2d" or "d2h". Raises ValueError for a non-CUDA device.
    """
    import torch

    if not str(device).startswith("cuda"):
        raise ValueError(f"a CUDA device for host transfers, not {device!r}")
    n = size_bytes // 4
    host = torch.ones(n, dtype=torch.float32).pin_memory()
    dev = torch.empty(n, dtype=torch.float32, device=device)
    if direction == "h2d":
        def op() -> Any:
            return dev.copy_(host, non_blocking=True)
    elif direction == "d2h":
        def op() -> Any:
            return host.copy_(dev, non_blocking=True)
    else:
        raise ValueError(f"direction 'h2d' or 'd2h', not {direction!r}")
    timing = measure(op, device=device, warmup=2, repeats=repeats)
    return n * 4 / timing.median_s / 1e9, timing
