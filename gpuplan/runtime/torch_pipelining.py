"""The one place that touches torch.distributed.pipelining's private schedule runtime.

`_PipelineScheduleRuntime` runs an arbitrary per-rank action list; its loader was renamed in 2.9
(`_load_actions` -> `_prepare_schedule_with_comms`) and the stage-to-rank map is inferred from the
actions since 2.7. gpuplan is tested with the versions in TESTED; other versions are refused with
a clear message (set GPUPLAN_TORCH_PIPELINING_ANY=1 to try anyway).
"""

from __future__ import annotations

import os
from typing import Any, Callable

TESTED = ("2.13",)


class UnsupportedTorch(RuntimeError):
    """The installed torch is not one this adapter was tested with."""


def check_version() -> str:
    """Return torch's version when it is a tested one; raise UnsupportedTorch otherwise."""
    import torch

    version = torch.__version__.split("+")[0]
    if not version.startswith(TESTED) and os.environ.get("GPUPLAN_TORCH_PIPELINING_ANY") != "1":
        raise UnsupportedTorch(
            f"gpuplan's torch.distributed.pipelining adapter is tested with torch {', '.join(TESTED)}.x; "
            f"this is torch {torch.__version__}. Its schedule runtime is private and changes between "
            "releases; set GPUPLAN_TORCH_PIPELINING_ANY=1 to try anyway")
    return version


def pipeline_stage(module: Any, stage_index: int, num_stages: int, device: Any, group: Any = None) -> Any:
    """Return a torch PipelineStage for `module` as stage `stage_index` of `num_stages`."""
    from torch.distributed.pipelining import PipelineStage

    return PipelineStage(module, stage_index, num_stages, device, group=group)


def runtime_schedule(stages: list[Any], n_microbatches: int, loss_fn: Callable[..., Any],
                     actions: dict[int, list[str]], fmt: str = "compute_only") -> Any:
    """Return a loaded `_PipelineScheduleRuntime` running `actions` ({rank: ["0F0", ...]}).

    fmt is "compute_only" (torch adds sends, receives and gradient reductions) or "compute_comms"
    (the lists already hold them). Call `.step(inputs, target=..., losses=[...])` on it.
    """
    check_version()
    from torch.distributed.pipelining import schedules as sch

    parsed = {r: [sch._Action.from_str(a) for a in acts] for r, acts in actions.items()}
    sched = sch._PipelineScheduleRuntime(stages, n_microbatches, loss_fn=loss_fn)
    if hasattr(sched, "_prepare_schedule_with_comms"):
        sched._prepare_schedule_with_comms(parsed, format=fmt)
    else:  # torch 2.6-2.8
        sched._load_actions(parsed, format=fmt)
    return sched


def _timed(fn: Callable[..., Any], record: Callable[[float, tuple[Any, ...], dict[str, Any]], None]
           ) -> Callable[..., Any]:
    """Return `fn` wrapped so each call passes (seconds, args, kwargs) to `record`."""
    import time

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        out = fn(*args, **kwargs)
        record(time.perf_counter() - t0, args, kwargs)
        return out

    return wrapper


def time_stage_calls(stage: Any, sink: list[tuple[int, str, float]]) -> None:
    """Wrap a PipelineStage's compute calls so each appends (stage index, F|B|I|W|R, seconds) to
    `sink` (R: the gradient reduction at the end of a step).

    The runtime waits for received tensors before these calls, so the times are pure compute as
    executed inside the pipeline (with whatever the machine's load was at that moment).
    """
    i = stage.stage_index
    stage.forward_one_chunk = _timed(stage.forward_one_chunk, lambda t, a, k: sink.append((i, "F", t)))
    stage.backward_one_chunk = _timed(
        stage.backward_one_chunk, lambda t, a, k: sink.append((i, "B" if k.get("full_backward", True) else "I", t)))
    stage.backward_weight_one_chunk = _timed(stage.backward_weight_one_chunk,
                                             lambda t, a, k: sink.append((i, "W", t)))
    stage.perform_reduce_grad = _timed(stage.perform_reduce_grad, lambda t, a, k: sink.append((i, "R", t)))


def time_loss_calls(schedule: Any, sink: list[tuple[int, str, float]]) -> None:
    """Wrap the schedule's loss computation (run after the last stage's forward) so each call appends
    (stage index, "L", seconds) to `sink`."""
    schedule._maybe_compute_loss = _timed(schedule._maybe_compute_loss,
                                          lambda t, a, k: sink.append((a[0].stage_index, "L", t)))


def backward_input(outputs: list[Any], output_grads: list[Any] | None, inputs: list[Any],
                   params: Any) -> tuple[tuple[Any, ...], list[dict[str, Any]]]:
    """Return (input gradients, parameter groups) of a stage's input-gradient pass (torch's split
    backward, `stage_backward_input`): the inputs' gradients only, the intermediates the weight pass
    needs kept in the groups. `outputs` is detached afterwards."""
    from torch.distributed.pipelining._backward import stage_backward_input

    return stage_backward_input(outputs, output_grads, inputs, params)


def backward_weight(params: Any, param_groups: list[dict[str, Any]]) -> None:
    """Accumulate the parameters' gradients from the groups a `backward_input` call kept (torch's
    `stage_backward_weight`)."""
    from torch.distributed.pipelining._backward import stage_backward_weight

    stage_backward_weight(params, param_groups)
