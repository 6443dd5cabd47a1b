"""A Lagom problem as the cost model sees it: per-op links, overlapped windows, the device and constants,
and the iteration time of a list of settings (theta per op)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gpuplan.models.lagom import cost
from gpuplan.models.lagom.cost import Consts

if TYPE_CHECKING:
    from gpuplan.models.lagom.problem import CommOp, LagomProblem


@dataclass(frozen=True)
class Theta:
    """One op's communication parameters: algorithm, protocol, channels, threads per CTA, chunk bytes."""

    algo: str
    proto: str
    channels: int
    threads: int
    chunk_bytes: int


@dataclass(frozen=True)
class Window:
    """A compute segment (or none, for an exposed op) and the indices of the ops under it."""

    name: str
    compute_us: float
    memory_bound: float
    ops: tuple[int, ...]


@dataclass(frozen=True)
class Compiled:
    """The problem as the cost model sees it: per-op links, windows, device, constants."""

    ops: tuple[CommOp, ...]
    links: tuple[cost.Link, ...]
    windows: tuple[Window, ...]
    window_of: tuple[int, ...]
    device: cost.Device
    consts: Consts

    @classmethod
    def build(cls, p: LagomProblem) -> "Compiled":
        """Return the compiled form of problem `p`."""
        links = {g: grp.link(p.hardware) for g, grp in p.groups.items()}
        windows: list[Window] = []
        window_of = [0] * len(p.ops)
        for seg in p.segments:
            idx = tuple(i for i, o in enumerate(p.ops) if o.overlaps == seg.name)
            for i in idx:
                window_of[i] = len(windows)
            windows.append(Window(seg.name, seg.compute_s * 1e6, seg.memory_bound, idx))
        for i, o in enumerate(p.ops):
            if o.overlaps is None:
                window_of[i] = len(windows)
                windows.append(Window(o.name, 0.0, 0.0, (i,)))
        return cls(tuple(p.ops), tuple(links[o.group] for o in p.ops), tuple(windows), tuple(window_of),
                   p.hardware.device(), p.constants)

    def comm_us(self, i: int, t: Theta, channels: Any = None, threads: Any = None, chunk: Any = None) -> Any:
        """Return op i's communication time alone (us) under t (arrays may replace NC, NT, C)."""
        o = self.ops[i]
        return cost.comm_time_us(o.collective, o.size_bytes, t.algo, t.proto, self.links[i], self.consts,
                                 t.channels if channels is None else channels,
                                 t.threads if threads is None else threads,
                                 t.chunk_bytes if chunk is None else chunk)

    def slowdown(self, i: int, t: Theta, channels: Any = None, threads: Any = None, chunk: Any = None) -> Any:
        """Return the slowdown op i inflicts on the computation of its window under t."""
        o, w = self.ops[i], self.windows[self.window_of[i]]
        return cost.slowdown(o.collective, o.size_bytes, t.algo, t.proto, self.links[i], self.consts, self.device,
                             w.memory_bound, t.channels if channels is None else channels,
                             t.threads if threads is None else threads,
                             t.chunk_bytes if chunk is None else chunk)

    def window_us(self, w: int, settings: list[Theta], override: tuple[int, Theta] | None = None,
                  arrays: tuple[Any, Any, Any] | None = None) -> Any:
        """Return window w's time (us) under `settings`; `override` replaces one op's theta, and
        `arrays` (NC, NT, C) broadcast over that op's resource parameters (for vectorized search)."""
        win = self.windows[w]
        stretch = 1 + self.consts.psi if win.compute_us > 0 else 1.0
        comm, progress = 0.0, 0.0
        for i in win.ops:
            t = override[1] if override and override[0] == i else settings[i]
            a = arrays if (override and override[0] == i and arrays) else (None, None, None)
            d = self.comm_us(i, t, *a) * stretch * self.ops[i].count
            comm = comm + d
            progress = progress + d / self.slowdown(i, t, *a)
        return cost.window_time_us(win.compute_us, comm, progress)

    def iteration_us(self, settings: list[Theta]) -> float:
        """Return the iteration time (us): the sum of every window's time."""
        return float(sum(self.window_us(w, settings) for w in range(len(self.windows))))

    def valid(self, i: int, t: Theta) -> list[str]:
        """Return the NCCL rules theta breaks for op i ([] when valid)."""
        o = self.ops[i]
        return cost.setting_problems(o.collective, self.links[i], t.algo, t.proto, t.channels, t.threads,
                                     t.chunk_bytes)

    def nccl_default(self, i: int) -> Theta:
        """Return NCCL's default setting for op i (its analytic model, communication time alone)."""
        o = self.ops[i]
        return Theta(*cost.nccl_default(o.collective, o.size_bytes, self.links[i], self.consts))
