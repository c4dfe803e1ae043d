"""Processes: one, or many under torchrun (DDP, or FSDP2 with --fsdp). NCCL on CUDA, gloo on
CPU. torchrun's environment (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR/PORT) is all it reads:
no --local_rank, no Slurm variables (srun launches torchrun; docs/pretraining.md)."""
from __future__ import annotations

import contextlib
import datetime
import os
from dataclasses import dataclass

import torch
import torch.distributed as torch_dist
from torch import nn


@dataclass
class Context:
    rank: int = 0
    world: int = 1
    local_rank: int = 0
    device: torch.device = torch.device("cpu")
    fsdp: bool = False

    @property
    def distributed(self) -> bool:
        return self.world > 1

    @property
    def main(self) -> bool:
        return self.rank == 0


def setup(device_arg, fsdp: bool) -> Context:
    rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    local = int(os.environ.get("LOCAL_RANK", 0))
    want = device_arg or ("cuda" if torch.cuda.is_available() else "cpu")
    if want.startswith("cuda"):
        if not torch.cuda.is_available():
            raise RuntimeError("--device cuda, but torch sees no CUDA device")
        device = torch.device("cuda", local)
        torch.cuda.set_device(device)
    else:
        device = torch.device(want)
    if world > 1 and not torch_dist.is_initialized():
        timeout = datetime.timedelta(minutes=30)
        torch_dist.init_process_group("nccl" if device.type == "cuda" else "gloo", timeout=timeout,
                                      **_attempt_store(rank, world, timeout))
    return Context(rank, world, local, device, fsdp)


def _attempt_store(rank: int, world: int, timeout) -> dict:
    """torchrun shares its rendezvous TCPStore with the workers, and keeps the same store across
    ``--max_restarts`` restarts (torch 2.11): the restarted workers then read the first attempt's
    gloo and NCCL addresses and fail to connect (pytorch/pytorch#135712, the
    TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 workaround). The keys of each attempt go under a prefix
    of their own instead: the store torch's env:// would open, under ``greenmim/attempt_<n>``."""
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != str(True):
        return {}
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") or 0)
    store = torch_dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world, is_master=False,
                                timeout=timeout)
    return {"store": torch_dist.PrefixStore(f"greenmim/attempt_{attempt}", store), "rank": rank, "world_size": world}


def teardown(ctx: Context) -> None:
    if ctx.distributed and torch_dist.is_initialized():
        torch_dist.destroy_process_group()


def wrap(model: nn.Module, ctx: Context) -> nn.Module:
    """DDP, or FSDP2: each encoder block and decoder block its own unit, then the whole model."""
    if not ctx.distributed and not ctx.fsdp:
        return model
    if ctx.fsdp:
        from torch.distributed.fsdp import fully_shard
        from torch.distributed.device_mesh import init_device_mesh
        mesh = init_device_mesh(ctx.device.type, (ctx.world,))
        if hasattr(model, "fsdp_units"):          # FCMAE: its decoder blocks (fcmae.FCMAE.fsdp_units)
            units = model.fsdp_units()
        else:
            enc = model.encoder                   # Swin: layers[i].blocks; Twins: blocks[i]
            stages = [layer.blocks for layer in enc.layers] if hasattr(enc, "layers") else enc.blocks
            units = [blk for blocks in stages for blk in blocks] + list(model.decoder_blocks)
        for blk in units:
            fully_shard(blk, mesh=mesh)
        fully_shard(model, mesh=mesh)
        return model
    ids = [ctx.device.index] if ctx.device.type == "cuda" else None
    return nn.parallel.DistributedDataParallel(model, device_ids=ids, broadcast_buffers=False)


def broadcast_state(model: nn.Module, ctx: Context) -> None:
    """Rank 0's parameters and buffers on every rank (what DDP does when it wraps a model; the
    ``--cuda_graphs`` path averages gradients itself and wraps nothing)."""
    if ctx.distributed:
        with torch.no_grad():
            for t in model.state_dict().values():
                torch_dist.broadcast(t, 0)


def average_gradients(ctx: Context):
    """``fn(flat)``: the flat gradient buffer averaged over ranks in place (one all-reduce; the
    ``--cuda_graphs`` path calls it after each replayed backward). None in one process."""
    if not ctx.distributed:
        return None

    def fn(flat: torch.Tensor) -> None:
        torch_dist.all_reduce(flat)
        flat.div_(ctx.world)
    return fn


def no_sync(model: nn.Module, ctx: Context, sync: bool):
    """Gradient all-reduce only on the last micro-batch of an accumulation."""
    if sync or not ctx.distributed:
        if ctx.fsdp and hasattr(model, "set_requires_gradient_sync"):
            model.set_requires_gradient_sync(True)
        return contextlib.nullcontext()
    if ctx.fsdp:
        model.set_requires_gradient_sync(False)
        return contextlib.nullcontext()
    return model.no_sync()


def mean(value: torch.Tensor, ctx: Context) -> float:
    """The mean of a scalar over ranks."""
    if ctx.distributed:
        v = value.detach().clone().to(ctx.device, torch.float64)
        torch_dist.all_reduce(v)
        return float(v) / ctx.world
    return float(value)


def all_finite(model: nn.Module, ctx: Context) -> bool:
    """Whether every parameter and floating buffer is finite on every rank (FSDP2: each rank's
    shards; one all-reduce). Checked before each save: no checkpoint holds a NaN weight."""
    tensors = [t.to_local() if hasattr(t, "to_local") else t for t in list(model.parameters()) + list(model.buffers())]
    tensors = [t.detach() for t in tensors if t.is_floating_point() and t.numel()]
    bad = torch.zeros((), dtype=torch.float32, device=ctx.device)
    if tensors:
        worst = torch.stack(torch._foreach_norm(tensors, float("inf"))).float().max()
        bad = (~torch.isfinite(worst)).float().to(ctx.device)
    if ctx.distributed:
        torch_dist.all_reduce(bad)
    return float(bad) == 0.0


def node_cpus(local_world=None):
    """(the cores this process may run on, the processes on this node: torchrun's LOCAL_WORLD_SIZE)."""
    if local_world is None:
        local_world = int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1)
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    return cpus, max(local_world, 1)


def cpu_split(requested_workers, local_world=None):
    """On the CPU: (loader workers, intra-op threads of this process, how they were chosen). The
    cores this process may use, shared among the node's processes (torchrun's LOCAL_WORLD_SIZE),
    go to the workers first and to torch's threads after: the step is what a CPU run waits on, and
    one worker keeps a step fed. OMP_NUM_THREADS wins when it is set. Without this, each process
    kept torch's default (every core) next to its workers, and a 12-step run on 2 cores took
    28-58 s against 10-11 s with one thread."""
    cpus, local_world = node_cpus(local_world)
    share = max(1, cpus // local_world)
    workers = requested_workers if requested_workers is not None else (1 if share < 16 else 2)
    if os.environ.get("OMP_NUM_THREADS"):
        return workers, torch.get_num_threads(), "OMP_NUM_THREADS"
    threads = max(1, share - workers)
    torch.set_num_threads(threads)
    return workers, threads, (f"{cpus} core{'s' if cpus > 1 else ''} / {local_world} process"
                              f"{'es' if local_world > 1 else ''} less {workers} loader worker{'s' if workers != 1 else ''}")


def barrier(ctx: Context) -> None:
    if ctx.distributed:
        torch_dist.barrier()


def unwrap(model: nn.Module) -> nn.Module:
    return model.module if isinstance(model, nn.parallel.DistributedDataParallel) else model
