"""A run's peak memory, for its log and TensorBoard: what an adapter or a method saves (or costs)
over a full fine-tune shows there, on a CPU as on a GPU."""
from __future__ import annotations

import sys

import torch

try:
    import resource
except ImportError:  # Windows: no getrusage
    resource = None


def peak_memory_mb(device) -> dict[str, float]:
    """The peaks so far, in MiB: ``peak_rss_mb``, the process's resident set at its largest (the
    operating system's count, as ``/usr/bin/time`` gives it: weights, activations, the allocator's
    cache and Python's own; absent where the system has no ``getrusage``), and on a CUDA device
    ``peak_memory_mb``, torch's largest allocation on it."""
    peaks = {}
    if resource is not None:
        most = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux, bytes on macOS
        peaks["peak_rss_mb"] = most / 2 ** 20 if sys.platform == "darwin" else most / 2 ** 10
    if torch.device(device).type == "cuda":
        peaks["peak_memory_mb"] = torch.cuda.max_memory_allocated(device) / 2 ** 20
    return peaks
