"""Process group, rank and device for the scaling runs: what ``lrt_scale.train``,
``lrt_scale.evaluate``
and ``lrt_scale.gpu_check`` share.

Under torchrun (WORLD_SIZE > 1) ``setup_distributed`` joins the process group the environment
describes (RANK, WORLD_SIZE, LOCAL_RANK; nccl on CUDA, gloo otherwise); without it the same code
runs as one process, and every helper here is then a no-op or returns rank 0 of 1.
"""

from __future__ import annotations

import datetime
import os
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass
class DistContext:
    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    distributed: bool
    backend: str | None

    def print0(self, *args, **kwargs):
        if self.rank == 0:
            print(*args, **kwargs, flush=True)


def select_device(device: str = "auto", local_rank: int = 0) -> torch.device:
    """The device this process runs on: CUDA (this local rank's GPU, TF32 matmuls allowed) when
    asked
    for or, with "auto", when available; the CPU otherwise."""
    if device not in ("auto", "cpu", "cuda"):
        raise ValueError(f"device={device!r} is invalid; allowed: auto, cpu, cuda")
    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError("device='cuda' is invalid; allowed: auto, cpu (CUDA is not available)")
    if device == "cuda" or (device == "auto" and torch.cuda.is_available()):
        torch.cuda.set_device(local_rank)
        torch.set_float32_matmul_precision("high")
        return torch.device("cuda", local_rank)
    return torch.device("cpu")


def setup_distributed(device: str = "auto") -> DistContext:
    """Join the process group torchrun describes (WORLD_SIZE > 1), or run as one process."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank, local_rank = int(os.environ.get("RANK", "0")), int(os.environ.get("LOCAL_RANK", "0"))
    dev = select_device(device, local_rank)
    use_cuda = dev.type == "cuda"
    backend = None
    if world > 1:
        backend = "nccl" if use_cuda else "gloo"
        if not dist.is_initialized():
            dist.init_process_group(
                backend,
                timeout=datetime.timedelta(minutes=30),
                **({"device_id": dev} if use_cuda else {}),
            )
        rank, world = dist.get_rank(), dist.get_world_size()
    return DistContext(rank, world, local_rank, dev, world > 1, backend)


def teardown_distributed(ctx: DistContext) -> None:
    if ctx.distributed and dist.is_initialized():
        dist.destroy_process_group()


def is_distributed() -> bool:
    """Whether this process is in an initialised process group (torchrun), whatever set it up."""
    return dist.is_available() and dist.is_initialized()


def rank_and_world() -> tuple[int, int]:
    """(rank, world size) of the process group, or (0, 1) in one process."""
    return (dist.get_rank(), dist.get_world_size()) if is_distributed() else (0, 1)


def all_reduce_sum(values: torch.Tensor) -> torch.Tensor:
    """Sum a float64 vector over ranks (a no-op in one
    process). gloo and nccl both reduce float64."""
    if is_distributed():
        dist.all_reduce(values)
    return values


def barrier(ctx: DistContext):
    if ctx.distributed:
        dist.barrier()


def on_rank0(ctx: DistContext, fn: Callable):
    """Run fn on rank 0 and hand its result (or its error) to every rank."""
    box = [None, None]
    if ctx.rank == 0:
        try:
            box[0] = fn()
        except Exception as e:  # noqa: BLE001 - re-raised on every rank below
            box[1] = f"{type(e).__name__}: {e}"
            if not ctx.distributed:
                raise
    if ctx.distributed:
        dist.broadcast_object_list(box, src=0)
    if box[1] is not None:
        raise RuntimeError(f"rank 0 failed: {box[1]}")
    return box[0]


def synchronize(device: torch.device) -> None:
    """Wait for the device's queued work (timing); nothing to wait for on the CPU."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def autocast_for(device: torch.device, dtype: str = "auto"):
    """bf16 autocast on CUDA (the paper's mixed precision) unless --dtype float32; none on CPU by
    default."""
    if dtype not in ("auto", "float32", "bfloat16"):
        raise ValueError(f"dtype={dtype!r} is invalid; allowed: auto, float32, bfloat16")
    if dtype == "float32" or (dtype == "auto" and device.type != "cuda"):
        return None
    return torch.autocast(device.type, dtype=torch.bfloat16)
