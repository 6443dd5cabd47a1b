"""Local worker groups: rendezvous on a store the parent holds (no free-port race)."""

from __future__ import annotations

import socket

import pytest

from gpuplan.runtime.launch import WorkerError, rendezvous_store, run_workers


def _sum_of_ranks(rank: int, world_size: int) -> float:
    import torch
    import torch.distributed as dist

    t = torch.tensor([float(rank + 1)])
    dist.all_reduce(t)
    return float(t.item())


def _fail(rank: int, world_size: int) -> None:
    raise ValueError(f"rank {rank} fails on purpose")


def test_the_rendezvous_port_is_held_until_the_store_goes() -> None:
    store = rendezvous_store(30.0)
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        with pytest.raises(OSError):
            s.bind(("127.0.0.1", int(store.port)))


@pytest.mark.slow
def test_workers_join_one_group_and_report_failures() -> None:
    assert run_workers(_sum_of_ranks, 3, timeout_s=120) == [6.0, 6.0, 6.0]
    with pytest.raises(WorkerError, match="fails on purpose"):
        run_workers(_fail, 2, timeout_s=120)
