"""`gpuplan doctor`: what this machine can do — torch and its build, CUDA devices, NCCL, gloo, free
memory, and which commands will work. Reads facts only; starts no process group."""

from __future__ import annotations

import importlib.util
import os
import platform
import sys
from typing import Any

from gpuplan.models.base import Table


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def host_memory_bytes() -> tuple[int | None, int | None]:
    """Return (total, available) host memory in bytes (None when the OS does not say)."""
    try:
        with open("/proc/meminfo") as f:
            info = {line.split(":")[0]: int(line.split()[1]) * 1024 for line in f if line.split()[1:2]}
        return info.get("MemTotal"), info.get("MemAvailable")
    except (OSError, ValueError, IndexError):
        pass
    try:
        page = os.sysconf("SC_PAGE_SIZE")
        return os.sysconf("SC_PHYS_PAGES") * page, os.sysconf("SC_AVPHYS_PAGES") * page
    except (ValueError, OSError, AttributeError):
        return None, None


def torch_facts() -> dict[str, Any]:
    """Return what torch offers here: installed, version, build (cpu/cuda/rocm with its version), CUDA
    devices (name, total and free memory in bytes), NCCL (available, version), gloo (available).
    Imports torch only when it is installed (a planning-only install reports installed: False)."""
    facts: dict[str, Any] = {"installed": _installed("torch"), "version": None, "build": None,
                             "cuda_devices": [], "nccl": {"available": False, "version": None},
                             "gloo": {"available": False}}
    if not facts["installed"]:
        return facts
    try:
        import torch
        import torch.distributed as dist
    except Exception as exc:  # a broken install: report it rather than fail
        facts["error"] = f"{type(exc).__name__}: {exc}"
        return facts
    facts["version"] = str(torch.__version__)
    cuda = getattr(torch.version, "cuda", None)
    hip = getattr(torch.version, "hip", None)
    facts["build"] = f"cuda {cuda}" if cuda else f"rocm {hip}" if hip else "cpu"
    available = dist.is_available()
    facts["gloo"]["available"] = bool(available and dist.is_gloo_available())
    facts["nccl"]["available"] = bool(available and dist.is_nccl_available())
    if facts["nccl"]["available"]:
        try:
            v = torch.cuda.nccl.version()
            facts["nccl"]["version"] = ".".join(str(x) for x in v) if isinstance(v, tuple) else str(v)
        except Exception:  # NCCL missing at run time although the build names it
            facts["nccl"]["version"] = None
    try:
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    except Exception:
        count = 0
    for i in range(count):
        props = torch.cuda.get_device_properties(i)
        try:
            free, total = torch.cuda.mem_get_info(i)
        except Exception:
            free, total = None, props.total_memory
        facts["cuda_devices"].append({"index": i, "name": props.name, "memory_bytes": int(total),
                                      "free_bytes": None if free is None else int(free),
                                      "capability": f"{props.major}.{props.minor}"})
    return facts


def diagnose() -> dict[str, Any]:
    """Return the doctor's report: python, platform, cpus, host memory (bytes), torch facts,
    matplotlib, and `commands`: each command -> {works: bool, why: str}."""
    total, available = host_memory_bytes()
    torch = torch_facts()
    plot = _installed("matplotlib")
    torch_ok = torch["installed"] and "error" not in torch
    need_torch = "needs torch: pip install 'gpuplan[torch]'"
    gpus = len(torch["cuda_devices"])
    commands: dict[str, dict[str, Any]] = {}
    for verb in ("solve", "check", "show", "compare", "simulate", "list"):
        commands[verb] = {"works": True, "why": "planning needs no extra"}
    commands["--png"] = {"works": plot, "why": "matplotlib installed" if plot
                         else "needs matplotlib: pip install 'gpuplan[plot]'"}
    if not torch_ok:
        why = torch.get("error", need_torch)
        for verb in ("profile", "run", "delta"):
            commands[verb] = {"works": False, "why": why}
    else:
        commands["profile"] = {"works": True, "why": f"on {gpus} CUDA GPU(s)" if gpus
                               else "on the CPU (gloo processes stand in for devices)"}
        backend = "nccl" if gpus and torch["nccl"]["available"] else "gloo"
        runs = torch["gloo"]["available"] or (gpus and torch["nccl"]["available"])
        commands["run"] = {"works": bool(runs), "why": f"torch.distributed with {backend}" if runs
                           else "torch.distributed has neither gloo nor NCCL in this build"}
        commands["delta"] = {"works": True,
                             "why": "torch checkpoints" + (" and safetensors" if _installed("safetensors") else
                                                           "; safetensors files need pip install 'gpuplan[torch]'")}
    return {"python": platform.python_version(), "platform": platform.platform(), "cpus": os.cpu_count(),
            "host_memory_bytes": total, "host_free_bytes": available, "torch": torch,
            "matplotlib": plot, "commands": commands, "executable": sys.executable}


def tables(report: dict[str, Any]) -> list[Table]:
    """Return the doctor's report as tables (machine, devices, commands)."""
    t = report["torch"]
    gib = 2.0 ** 30
    rows: list[list[Any]] = [
        ["python", report["python"]], ["platform", report["platform"]], ["CPUs", report["cpus"]],
        ["host memory (GiB)", None if report["host_memory_bytes"] is None else report["host_memory_bytes"] / gib],
        ["host memory free (GiB)", None if report["host_free_bytes"] is None else report["host_free_bytes"] / gib],
        ["torch", t["version"] or ("not installed" if not t["installed"] else t.get("error", "?"))],
        ["torch build", t["build"] or "-"],
        ["CUDA devices", len(t["cuda_devices"])],
        ["NCCL", (f"yes ({t['nccl']['version']})" if t["nccl"]["version"] else "yes") if t["nccl"]["available"]
         else "no"],
        ["gloo", "yes" if t["gloo"]["available"] else "no"],
        ["matplotlib (--png)", "yes" if report["matplotlib"] else "no"],
    ]
    out = [Table("this machine", ["what", "value"], rows)]
    if t["cuda_devices"]:
        out.append(Table("CUDA devices", ["index", "name", "capability", "memory (GiB)", "free (GiB)"],
                         [[d["index"], d["name"], d["capability"], d["memory_bytes"] / gib,
                           None if d["free_bytes"] is None else d["free_bytes"] / gib] for d in t["cuda_devices"]]))
    out.append(Table("commands", ["command", "works", "why"],
                     [[k, v["works"], v["why"]] for k, v in report["commands"].items()]))
    return out
