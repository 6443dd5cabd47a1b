"""Alpha-beta fit: t(size) = alpha_s + size_bytes / (bandwidth_GBps * 1e9), with the fit's error.

The fit minimises the squared *relative* error over the measured sizes (each row divided by its
measured time), so 4 KiB points, where latency dominates, weigh as much as 64 MiB points, where
bandwidth does. Non-negative least squares keeps alpha >= 0 and 1/bandwidth >= 0.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from scipy.optimize import nnls

from gpuplan.models.profile import AlphaBeta

# A fit with no measurable size term (flat timings) gets this bandwidth rather than infinity.
MAX_BANDWIDTH_GBPS = 1e6


def fit_alpha_beta(sizes_bytes: Sequence[float], times_s: Sequence[float]) -> AlphaBeta:
    """Return the AlphaBeta (alpha in s, bandwidth in GB/s = 1e9 B/s) fitted to (size, time) points.

    max_rel_error and mean_rel_error are |predicted - measured| / measured over the points.
    Raises ValueError when there are fewer than two points or a time is not positive.
    """
    s = np.asarray(sizes_bytes, dtype=float)
    t = np.asarray(times_s, dtype=float)
    if s.shape != t.shape or len(s) < 2:
        raise ValueError(f"at least two (size, time) points of equal count, got {len(s)} sizes, {len(t)} times")
    if np.any(t <= 0) or np.any(s < 0):
        raise ValueError("positive times and non-negative sizes")
    a = np.column_stack([np.ones_like(s), s]) / t[:, None]
    (alpha, inv_bw), _ = nnls(a, np.ones_like(t))
    bandwidth = min(1.0 / (inv_bw * 1e9), MAX_BANDWIDTH_GBPS) if inv_bw > 0 else MAX_BANDWIDTH_GBPS
    predicted = alpha + s / (bandwidth * 1e9)
    rel = np.abs(predicted - t) / t
    return AlphaBeta(alpha_s=float(alpha), bandwidth_GBps=float(bandwidth),
                     max_rel_error=float(rel.max()), mean_rel_error=float(rel.mean()))
