"""Quantities with units in input files.

Fields carry their unit in their name (`memory_bytes`, `bandwidth_GBps`, `latency_s`,
`peak_tflops`). A number is taken in that unit; a string such as "80 GiB", "25 Gbps" or
"5 us" is converted to it, and a string in a unit of another dimension is refused.

Every quantity is finite and at most its dimension's limit in UPPER_LIMITS in magnitude (far
above any real device, so only typos and attacks are refused): 1e18 bytes, 1e7 GB/s, 1e9 s,
1e6 TFLOP/s. Rates (GB/s, TFLOP/s) are non-negative too; bytes and seconds may be negative
(a block that frees memory has negative `memory_bytes`).
"""

from __future__ import annotations

import math
import re
from typing import Annotated

from pydantic import BeforeValidator

_BYTES = {"b": 1.0, "kb": 1e3, "mb": 1e6, "gb": 1e9, "tb": 1e12,
          "kib": 2.0**10, "mib": 2.0**20, "gib": 2.0**30, "tib": 2.0**40}
# bandwidth in GB/s (1e9 bytes per second)
_GBPS = {"b/s": 1e-9, "kb/s": 1e-6, "mb/s": 1e-3, "gb/s": 1.0, "tb/s": 1e3,
         "kib/s": 2.0**10 / 1e9, "mib/s": 2.0**20 / 1e9, "gib/s": 2.0**30 / 1e9,
         "bps": 1e-9 / 8, "kbps": 1e-6 / 8, "mbps": 1e-3 / 8, "gbps": 1.0 / 8, "tbps": 1e3 / 8,
         "bit/s": 1e-9 / 8, "kbit/s": 1e-6 / 8, "mbit/s": 1e-3 / 8, "gbit/s": 1.0 / 8}
_SECONDS = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9, "min": 60.0, "h": 3600.0}
_TFLOPS = {"flops": 1e-12, "gflops": 1e-3, "tflops": 1.0, "pflops": 1e3,
           "flop/s": 1e-12, "gflop/s": 1e-3, "tflop/s": 1.0, "pflop/s": 1e3}

_QUANTITY = re.compile(r"^\s*([-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)\s*([A-Za-zµ/]+)\s*$")

# Case matters for bits vs bytes ("Gbps" is bits, "GBps" bytes); normalise the common spellings.
_CASE_SENSITIVE = {"GBps": "gb/s", "MBps": "mb/s", "KBps": "kb/s", "TBps": "tb/s", "GiBps": "gib/s",
                   "MiBps": "mib/s", "Gbps": "gbps", "Mbps": "mbps", "Kbps": "kbps", "Tbps": "tbps",
                   "bps": "bps", "Bps": "b/s"}


UPPER_LIMITS = {"B": 1e18, "GB/s": 1e7, "s": 1e9, "TFLOP/s": 1e6}
"""Largest accepted quantity per target unit (bytes, GB/s, seconds, TFLOP/s)."""
SUFFIX_UNITS = {"_bytes": "B", "_GBps": "GB/s", "_gbps": "GB/s", "_s": "s", "_tflops": "TFLOP/s"}
"""Field-name suffix -> the unit its quantities are in (`_gbps` limits are taken x8 for bits)."""


NON_NEGATIVE = frozenset({"GB/s", "TFLOP/s"})
"""Units whose quantities (rates) are never negative."""


def check_quantity(number: float, target: str) -> float:
    """Return `number` (in unit `target`, a key of UPPER_LIMITS) as a float when it is finite,
    within the limit in magnitude and, for a rate, non-negative; raise ValueError saying what was
    expected otherwise."""
    limit = UPPER_LIMITS[target]
    if target in NON_NEGATIVE:
        if not math.isfinite(number) or number < 0 or number > limit:
            raise ValueError(f"a finite, non-negative rate of at most {limit:g} {target}, not {number!r}")
    elif not math.isfinite(number) or abs(number) > limit:
        raise ValueError(f"a finite quantity of at most {limit:g} {target} in magnitude, not {number!r}")
    return float(number)


def _convert(value: object, table: dict[str, float], target: str) -> float:
    if isinstance(value, bool):
        raise ValueError(f"a number in {target} or a string with a unit, not a boolean")
    if isinstance(value, (int, float)):
        return check_quantity(float(value), target)
    if isinstance(value, str):
        m = _QUANTITY.match(value)
        if m is None:
            try:
                number = float(value)
            except ValueError:
                raise ValueError(f"a number in {target} or a quantity like '10 {target}'") from None
            return check_quantity(number, target)
        number, unit = float(m.group(1)), m.group(2)
        key = _CASE_SENSITIVE.get(unit, unit.lower())
        if key not in table:
            known = ", ".join(sorted({u for u in table}))
            raise ValueError(f"a unit of {target} (one of {known}), not '{unit}'")
        return check_quantity(number * table[key], target)
    raise ValueError(f"a number in {target} or a string with a unit")


def to_bytes(value: object) -> float:
    """Return `value` in bytes (numbers are bytes already; strings may say KiB, MB, GiB...)."""
    return _convert(value, _BYTES, "B")


def to_GBps(value: object) -> float:
    """Return a bandwidth in GB/s (1e9 bytes/s); strings may say Gbps (bits), MB/s, GiB/s..."""
    return _convert(value, _GBPS, "GB/s")


def to_seconds(value: object) -> float:
    """Return a duration in seconds; strings may say ms, us, ns, min, h."""
    return _convert(value, _SECONDS, "s")


def to_tflops(value: object) -> float:
    """Return a compute rate in TFLOP/s; strings may say GFLOPS, TFLOPS, PFLOPS."""
    return _convert(value, _TFLOPS, "TFLOP/s")


Bytes = Annotated[float, BeforeValidator(to_bytes)]
GBps = Annotated[float, BeforeValidator(to_GBps)]
Seconds = Annotated[float, BeforeValidator(to_seconds)]
TFLOPS = Annotated[float, BeforeValidator(to_tflops)]

GiB = 2.0**30
