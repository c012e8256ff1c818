"""Device and precision: which device a run uses, which autocast precision, and the autocast
context itself. The encoder (inference) and the training loop both use them."""
from __future__ import annotations

import torch

from ..errors import UsageError


def resolve_device(flag: str | None) -> torch.device:
    if flag is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(flag)
    except RuntimeError:
        raise UsageError(f"--device {flag!r} is not a device (try cpu or cuda)") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise UsageError("--device cuda asked for, but no CUDA GPU is available")
    return device


def resolve_precision(flag: str | None, device) -> str:
    device = torch.device(device)
    if flag is None:
        return "bf16" if device.type == "cuda" and torch.cuda.is_bf16_supported() else "fp32"
    if flag == "fp16" and device.type != "cuda":
        raise UsageError("--precision fp16 needs a GPU (use bf16 or fp32 on the CPU)")
    return flag


def autocast(device, precision: str | None = None):
    """Autocast for the matrix work; losses, pooling and the flow cast to float32 themselves."""
    device = torch.device(device)
    precision = resolve_precision(precision, device)
    if precision == "fp32":
        return torch.autocast(device.type, enabled=False)
    return torch.autocast(device.type, dtype=torch.bfloat16 if precision == "bf16" else torch.float16)

