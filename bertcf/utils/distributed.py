"""Training on several processes (torch.distributed): who this process is, which rows of the
global batch it keeps, the collectives the losses and the loop need, and the DDP wrapping.

Every entry point (run_pretrain.py, run_multitask.py) runs unchanged under ``torchrun
--nproc_per_node N``: its main() calls run_distributed(train, args), which joins the process group
(a no-op for a plain ``python`` launch) and leaves it at the end, and its train() wraps the modules
whose forward the step calls with wrap_ddp() (keeping the unwrapped ones for evaluation,
checkpoints and the Trainer's ``modules``). Every rank draws the same global batch from its
EpochSampler, draws any random views of it
(span masks, an objective's noise) for the whole batch from the same seeded generator, and keeps
its rows with local_rows, so --batch-size stays the global batch and the data are one process's;
the contrastive losses gather candidates from every rank themselves
(gather_with_grad). Only rank 0 evaluates, logs and writes the run directory
(Run, Trainer); the other ranks wait at a barrier meanwhile. Each rank draws its own dropout masks
(seed_dropout). A Ctrl-C, which torchrun forwards to every rank, stops every rank at the same step.
"""
from __future__ import annotations

import os

import torch

from ..errors import UsageError
from .precision import resolve_device


def is_distributed() -> bool:
    """True inside a torch.distributed process group."""
    return torch.distributed.is_available() and torch.distributed.is_initialized()


def dist_info() -> tuple[int, int]:
    """(rank, world size); (0, 1) outside torch.distributed."""
    if is_distributed():
        return torch.distributed.get_rank(), torch.distributed.get_world_size()
    return 0, 1


def launch_world_size() -> int:
    """The number of processes this run has or will have: the group's when one is joined, else
    torchrun's WORLD_SIZE (1 for a plain ``python`` launch), so flags can be checked before any
    data is read or group started."""
    if is_distributed():
        return torch.distributed.get_world_size()
    return max(1, int(os.environ.get("WORLD_SIZE", "1")))


def seed_dropout(seed: int, step: int) -> None:
    """Under torchrun, reseed the global generator (dropout's) for this rank and step. Every rank
    seeds it alike from --seed, so row i of every rank would draw the same dropout masks; a seed
    made of (seed, step, rank) gives each rank its own stream and repeats exactly on --resume.
    In one process this does nothing: its stream stays --seed's, which --resume restores."""
    rank, world = dist_info()
    if world > 1:
        torch.manual_seed(((seed * 1_000_003 + step) * 4099 + rank) % 2**63)


def mean_over_ranks(values: dict, device) -> dict:
    """{name: scalar tensor or number} -> {name: float}, averaged over the ranks of the process
    group in one all_reduce (each rank's loss is its share of the global batch, so the mean is
    the global batch's); in one process, the values as they are. A host sync: call it at the
    logging interval only, and on every rank."""
    names = list(values)
    stacked = torch.stack([torch.as_tensor(values[k], dtype=torch.float32, device=device).reshape(()) for k in names])
    rank, world = dist_info()
    if world > 1:
        torch.distributed.all_reduce(stacked)
        stacked /= world
    return dict(zip(names, stacked.tolist()))


def local_rows(b: int, rank: int = 0, world: int = 1) -> slice:
    """This rank's rows of a global batch of ``b`` (contiguous: rank r holds rows r*b/w ...), for
    tensors and lists alike. Every rank draws the same global batch and keeps these rows."""
    if b % world:
        raise UsageError(f"batch size {b} is not divisible by the {world} processes")
    per = b // world
    return slice(rank * per, (rank + 1) * per)


class _GatherWithGrad(torch.autograd.Function):
    """all_gather along dim 0 whose backward sums the incoming gradient over every rank and
    returns this rank's slice, so each rank's rows receive the gradient of *every* rank's loss."""

    @staticmethod
    def forward(ctx, x):
        world, rank = torch.distributed.get_world_size(), torch.distributed.get_rank()
        ctx.rows = slice(rank * x.shape[0], (rank + 1) * x.shape[0])
        parts = [torch.empty_like(x) for _ in range(world)]
        torch.distributed.all_gather(parts, x.contiguous())
        return torch.cat(parts)

    @staticmethod
    def backward(ctx, grad):
        grad = grad.contiguous().clone()  # all_reduce works in place; the incoming buffer is not ours
        torch.distributed.all_reduce(grad)
        return grad[ctx.rows]


def gather_with_grad(x: torch.Tensor) -> torch.Tensor:
    """Concatenate x [b, ...] from every rank along dim 0 (rank order), differentiably.

    The backward all-reduces (sums) the gradient of the gathered tensor and hands each rank the
    slice of its own rows: rank r's rows get d(sum over ranks of the rank losses)/d(rows). Under
    DDP, which averages parameter gradients over ranks, every rank's loss being the mean over its
    local slice, this is exactly the gradient of one process on the global batch. (Keeping only
    the local copy's gradient, i.e. ``all_gather`` of detached tensors with the local part put
    back, drops the gradient that the other ranks' anchors send to this rank's candidates, and
    is wrong by more than the usual world-size factor.) Every rank must pass the same shape and
    call it the same number of times in the same order (it is a collective, forward and
    backward)."""
    if dist_info()[1] == 1:
        return x
    return _GatherWithGrad.apply(x)


def init_distributed(device=None, backend: str | None = None, timeout_s: float = 1800.0) -> torch.device:
    """Join the process group torchrun describes (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR,
    MASTER_PORT) and return this rank's device.

    ``device``: the --device flag (None, "cpu", "cuda", "cuda:N"). Under torchrun with CUDA every
    rank takes GPU LOCAL_RANK (an explicit index in the flag is ignored then, since one GPU per
    process is the only layout DDP supports here) and the backend is NCCL; on the CPU it is gloo.
    Without torchrun (WORLD_SIZE unset or 1), nothing is started and the resolved device is
    returned, so single-process runs need no special case."""
    import datetime
    import importlib

    device = resolve_device(None if device is None else str(device))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1 or not torch.distributed.is_available():
        return device
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if device.type == "cuda":
        if local_rank >= torch.cuda.device_count():
            raise UsageError(f"LOCAL_RANK {local_rank} but only {torch.cuda.device_count()} GPU(s) are visible")
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    backend = backend or ("nccl" if device.type == "cuda" else "gloo")
    # Imported before the group exists: its functions take ``group=group.WORLD`` as a default, bound at
    # import. DistributedDataParallel's first use imports it (through torch._dynamo); after the group
    # started, those defaults would keep it alive past destroy_process_group, its gloo threads
    # running into the interpreter's exit, where a rank can abort after a finished run.
    importlib.import_module("torch.distributed.nn.functional")
    if not is_distributed():
        kwargs = {"device_id": device} if backend == "nccl" else {}
        torch.distributed.init_process_group(backend, timeout=datetime.timedelta(seconds=timeout_s), **kwargs)
    return device


def is_main_process() -> bool:
    """True on rank 0 (and outside torch.distributed): the process that evaluates, logs and saves."""
    return dist_info()[0] == 0


def wrap_ddp(module: torch.nn.Module, device=None, find_unused_parameters: bool = True, **ddp_kwargs):
    """``module`` wrapped in DistributedDataParallel when torch.distributed is running with more
    than one process and the module has a trainable parameter; otherwise ``module`` itself.

    Keep the unwrapped module for state_dict / save_pretrained / the Trainer's ``modules``; call
    the returned object in the step (several calls before one backward are fine: two views,
    three tasks). Gradients are averaged over ranks; since every rank's loss is the mean over its
    local slice and the contrastive candidates are gathered with gradient, the update equals one
    process on the global batch (tests/training/test_distributed.py).

    ``find_unused_parameters=True`` (the default) is needed whenever a trainable parameter
    takes part in the forward but not in the loss, e.g. minBERT's pooler under mean or [CLS]
    pooling: without it DDP stops at step 2 ("Expected to have finished reduction"), and
    ``static_graph=True`` is worse (silently wrong gradients at step 2, an error at step 3).
    For speed, a command may freeze what its loss never uses
    (``encoder.bert.pooler.requires_grad_(False)``) and pass ``find_unused_parameters=False``."""
    _, world = dist_info()
    if world == 1 or not any(p.requires_grad for p in module.parameters()):
        return module
    from torch.nn.parallel import DistributedDataParallel

    device = torch.device(device) if device is not None else next(module.parameters()).device
    device_ids = [device.index if device.index is not None else torch.cuda.current_device()] \
        if device.type == "cuda" else None
    return DistributedDataParallel(module, device_ids=device_ids, find_unused_parameters=find_unused_parameters,
                                   **ddp_kwargs)


def unwrap(module: torch.nn.Module) -> torch.nn.Module:
    """The module inside DistributedDataParallel and/or torch.compile wrappers."""
    while True:
        if isinstance(module, torch.nn.parallel.DistributedDataParallel):
            module = module.module
        elif hasattr(module, "_orig_mod"):
            module = module._orig_mod
        else:
            return module


def run_distributed(train, args):
    """``train(args, device)`` inside the process group torchrun describes (none for a plain
    ``python`` launch), leaving the group afterwards whatever happens."""
    device = init_distributed(args.device)
    try:
        return train(args, device)
    finally:
        cleanup_distributed()


def cleanup_distributed() -> None:
    """Leave the process group (safe to call when none was started)."""
    if is_distributed():
        torch.distributed.destroy_process_group()
